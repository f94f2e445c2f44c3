"""Token and learned position embeddings, with the same range checks as the JAX tree.
Twin: jaxformer/layers/embedding.py."""
from __future__ import annotations

import math

import torch
from torch import nn

from torch_ref.layers.kernels import quant


def check_ids(ids: torch.Tensor, upper: int, what: str = "token id", field: str = "vocab_size") -> None:
    """Raise ValueError if an entry of `ids` lies outside [0, upper) (same message as JAX)."""
    if ids.numel() == 0:
        return
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= upper:
        bad = lo if lo < 0 else hi
        raise ValueError(f"{what} {bad} is out of range [0, {upper}) ({field}={upper})")


def check_length(length: int, max_len: int, what: str = "sequence length") -> None:
    if length > max_len:
        raise ValueError(f"{what} {length} exceeds max_len={max_len}")


class Embedding(nn.Module):
    """Lookup table with optional sqrt(D) scaling.
    Shapes: ids [B, T] -> [B, T, D]; attend(x [B, T, D]) -> [B, T, V]."""

    def __init__(self, num_embeddings: int, dim: int, *, scale: bool = False, init_std: float = 1.0):
        super().__init__()
        self.num_embeddings = num_embeddings
        self.multiplier = math.sqrt(dim) if scale else None
        self.weight = nn.Parameter(torch.randn(num_embeddings, dim) * init_std)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        check_ids(ids, self.num_embeddings)
        # x: [B, T, D]; a QuantizedWeight is a tied table's bf16/int8 decode copy
        x = self.weight.lookup(ids) if isinstance(self.weight, quant.QuantizedWeight) else self.weight[ids]
        if self.multiplier is not None:  # sqrt(D) in the stream's dtype, as HF Gemma
            x = x * torch.tensor(self.multiplier, dtype=x.dtype)  # rounds it to its compute dtype (docs/numerics.md §21)
        return x

    def attend(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(self.weight, quant.QuantizedWeight):  # a bf16/int8 decode copy of the tied table
            return quant.matmul(x, self.weight).to(x.dtype)
        return torch.einsum("btd,vd->btv", x, self.weight.to(x.dtype))
