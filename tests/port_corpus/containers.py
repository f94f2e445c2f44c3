"""Containers as people nest them: an nn.ModuleList of residual blocks, each an nn.Sequential
with integer-indexed children (LayerNorm, Linear, ReLU, Linear), and a head that is an
nn.Sequential built from an OrderedDict of named children. The state_dict keys are
`blocks.0.1.weight` and `head.proj.weight`."""
from collections import OrderedDict

import numpy as np
import torch
import torch.nn as nn


class ResidualMLPStack(nn.Module):
    def __init__(self, d=32, depth=2, n_out=10):
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 2 * d), nn.ReLU(), nn.Linear(2 * d, d)) for _ in range(depth))
        self.head = nn.Sequential(OrderedDict([
            ("norm", nn.LayerNorm(d)),
            ("proj", nn.Linear(d, n_out)),
            ("act", nn.Tanh()),
        ]))

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return self.head(x.mean(dim=1))


def make():
    torch.manual_seed(9)
    model = ResidualMLPStack()
    x = np.random.RandomState(9).standard_normal((2, 8, 32)).astype(np.float32)
    return model.eval(), {"x": x}
