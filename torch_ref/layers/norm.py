"""Normalisation layers with explicit eps (docs/numerics.md §1). Twin: jaxformer/layers/norm.py."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class LayerNorm(nn.Module):
    """LayerNorm over the last axis with an explicit eps. Shapes: x [..., D] -> [..., D]."""

    def __init__(self, dim: int, *, eps: float, bias: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        y = F.layer_norm(x.float(), x.shape[-1:], self.weight, self.bias, self.eps)
        return y.to(dtype)


class RMSNorm(nn.Module):
    """RMSNorm: x / sqrt(mean(x^2) + eps) * weight. Shapes: x [..., D] -> [..., D].
    unit_offset: multiply by (1 + weight) instead, weight initialised to 0 (Gemma's norm)."""

    def __init__(self, dim: int, *, eps: float, unit_offset: bool = False):
        super().__init__()
        self.eps, self.unit_offset = eps, unit_offset
        self.weight = nn.Parameter((torch.zeros if unit_offset else torch.ones)(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        y = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + self.eps)
        scale = self.weight.float()
        return (y * (1.0 + scale if self.unit_offset else scale)).to(dtype)


def make_norm(kind: str, dim: int, *, eps: float, bias: bool = True) -> nn.Module:
    if kind == "layernorm":
        return LayerNorm(dim, eps=eps, bias=bias)
    if kind in ("rmsnorm", "rmsnorm_offset"):
        return RMSNorm(dim, eps=eps, unit_offset=kind == "rmsnorm_offset")
    raise ValueError(f"norm: unknown kind {kind!r}")
