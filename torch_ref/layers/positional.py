"""Positional schemes: sinusoidal, learned absolute, RoPE, ALiBi, T5 relative bias.
Twin: jaxformer/layers/positional.py."""
from __future__ import annotations

import torch
from torch import nn

from jaxformer import tables
from torch_ref.layers.embedding import Embedding, check_ids, check_length


class SinusoidalPositionalEncoding(nn.Module):
    """Fixed sin/cos positions. Shapes: positions [B, T] -> [B, T, D]."""

    def __init__(self, max_len: int, dim: int):
        super().__init__()
        self.max_len, self.dim = max_len, dim
        self.register_buffer("table", torch.from_numpy(tables.sinusoid_table(max_len, dim).copy()),
                             persistent=False)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        check_ids(positions, self.max_len, "position", "max_len")
        return self.table[positions]


class LearnedPositionalEmbedding(nn.Module):
    """Learned absolute positions. Shapes: positions [B, T] -> [B, T, D]."""

    def __init__(self, max_len: int, dim: int, *, init_std: float = 0.02):
        super().__init__()
        self.max_len = max_len
        self.weight = nn.Parameter(torch.randn(max_len, dim) * init_std)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        check_ids(positions, self.max_len, "position", "max_len")
        return self.weight[positions]


def absolute_positions(kind: str, max_len: int, d_model: int) -> nn.Module | None:
    """The absolute position table a `position` config names: "sinusoidal" (fixed), "learned",
    or None for the relative schemes (RoPE, ALiBi, T5 bias) and "none"."""
    if kind == "sinusoidal":
        return SinusoidalPositionalEncoding(max_len, d_model)
    if kind == "learned":
        return LearnedPositionalEmbedding(max_len, d_model)
    return None


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


class RotaryEmbedding(nn.Module):
    """RoPE in the rotate-half layout. Shapes: x [B, T, H, K], positions [B, T] -> [B, T, H, K]."""

    def __init__(self, head_dim: int, max_len: int, base: float = 10000.0):
        super().__init__()
        self.head_dim, self.max_len, self.base = head_dim, max_len, base
        cos, sin = tables.rope_tables(max_len, head_dim, base)
        self.register_buffer("cos", torch.from_numpy(cos.copy()), persistent=False)
        self.register_buffer("sin", torch.from_numpy(sin.copy()), persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        check_ids(positions, self.max_len, "position", "max_len")
        cos = self.cos[positions][:, :, None, :]  # [B, T, 1, K]
        sin = self.sin[positions][:, :, None, :]
        dtype = x.dtype
        x = x.float()
        return (x * cos + rotate_half(x) * sin).to(dtype)


def alibi_bias(num_heads: int, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
    """bias = -slope_h * |q_pos - k_pos|. Shapes: [B, T], [B, S] -> [B, H, T, S]."""
    slopes = torch.from_numpy(tables.alibi_slopes(num_heads).copy()).to(q_positions.device)
    dist = (q_positions[:, None, :, None] - k_positions[:, None, None, :]).abs()  # [B, 1, T, S]
    return -slopes[None, :, None, None] * dist.float()


class T5RelativePositionBias(nn.Module):
    """T5 bucketed relative position bias. Shapes: [B, T], [B, S] -> [B, H, T, S]."""

    def __init__(self, num_buckets: int, max_distance: int, num_heads: int, *, bidirectional: bool):
        super().__init__()
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.bidirectional = bidirectional
        self.relative_attention_bias = Embedding(num_buckets, num_heads)
        table = tables.t5_bucket_table(bidirectional, num_buckets, max_distance)
        self.register_buffer("bucket_table", torch.from_numpy(table.astype("int64")), persistent=False)

    def forward(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
        rel = k_positions[:, None, :] - q_positions[:, :, None]  # [B, T, S]
        rel = rel.clamp(-self.max_distance, self.max_distance) + self.max_distance
        buckets = self.bucket_table[rel]  # [B, T, S]
        bias = self.relative_attention_bias.weight[buckets]  # [B, T, S, H]
        return bias.permute(0, 3, 1, 2)


def default_positions(batch: int, length: int, offset=0, device=None) -> torch.Tensor:
    return (torch.arange(length, device=device)[None, :] + offset).expand(batch, length)


__all__ = ["SinusoidalPositionalEncoding", "LearnedPositionalEmbedding", "RotaryEmbedding",
           "T5RelativePositionBias", "alibi_bias", "rotate_half", "default_positions",
           "check_length"]
