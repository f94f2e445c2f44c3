"""Convolutions with explicit padding pairs, channels-last inputs like the JAX tree.
Weights in torch layout [C_out, C_in, k...] (OIHW). Twin: jaxformer/layers/conv.py."""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn


def _tuple(v, n: int) -> tuple:
    return tuple(v) if isinstance(v, Sequence) else (v,) * n


class _ConvNd(nn.Module):
    ndim: int = 0

    def __init__(self, in_channels: int, out_channels: int, kernel_size, *, stride=1,
                 padding=0, dilation=1, bias: bool = True):
        super().__init__()
        n = self.ndim
        self.kernel_size = _tuple(kernel_size, n)
        self.stride = _tuple(stride, n)
        self.dilation = _tuple(dilation, n)
        pad = padding if isinstance(padding, Sequence) else (padding,) * n
        self.padding = tuple((p, p) if isinstance(p, int) else tuple(p) for p in pad)
        bound = 1.0 / math.sqrt(in_channels * math.prod(self.kernel_size))
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels, *self.kernel_size).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(out_channels).uniform_(-bound, bound)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, *spatial, C_in] (channels last) -> [B, *spatial', C_out]."""
        x = x.movedim(-1, 1)  # channels first for torch
        flat_pad = [p for pair in reversed(self.padding) for p in pair]  # F.pad: last dim first
        if any(flat_pad):
            x = F.pad(x, flat_pad)
        conv = F.conv1d if self.ndim == 1 else F.conv2d
        y = conv(x, self.weight.to(x.dtype), None if self.bias is None else self.bias.to(x.dtype),
                 stride=self.stride, dilation=self.dilation)
        return y.movedim(1, -1)


class Conv1d(_ConvNd):
    """1-D convolution. x [B, T, C_in] -> [B, T', C_out]; weight [C_out, C_in, k]."""
    ndim = 1


class Conv2d(_ConvNd):
    """2-D convolution. x [B, H, W, C_in] -> [B, H', W', C_out]; weight [C_out, C_in, kh, kw]."""
    ndim = 2
