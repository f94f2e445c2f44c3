"""An MLP block with nn.Dropout in two places (hidden and output), for the train-mode port.
In eval mode it is an ordinary corpus entry. In train mode torch and JAX draw different random
masks, so the test checks what can be checked honestly (tests/test_port_corpus.py): at p = 0
the train-mode port equals torch's train-mode output (the train graph, less the randomness);
with only the output dropout on, every output element is either 0 or the eval output / (1 - p),
the zero fraction is p within binomial bounds, and two calls draw different masks."""
import numpy as np
import torch
import torch.nn as nn


class DropoutMLP(nn.Module):
    def __init__(self, d=32, hidden=64, p_hidden=0.1, p_out=0.1):
        super().__init__()
        self.fc1 = nn.Linear(d, hidden)
        self.act = nn.GELU(approximate="tanh")
        self.drop_hidden = nn.Dropout(p_hidden)
        self.fc2 = nn.Linear(hidden, d)
        self.drop_out = nn.Dropout(p_out)

    def forward(self, x):
        return self.drop_out(self.fc2(self.drop_hidden(self.act(self.fc1(x)))))


def inputs():
    return {"x": np.random.RandomState(8).standard_normal((2, 8, 32)).astype(np.float32)}


def make(p_hidden=0.1, p_out=0.1):
    torch.manual_seed(8)
    return DropoutMLP(p_hidden=p_hidden, p_out=p_out).eval(), inputs()
