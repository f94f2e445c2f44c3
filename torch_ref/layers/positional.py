"""Positional schemes: sinusoidal, learned absolute, RoPE, ALiBi, T5 relative bias.
Twin: jaxformer/layers/positional.py."""
from __future__ import annotations

import torch
import torch.nn.functional as F
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
    """RoPE in the rotate-half layout; `scaling` (a RopeScaling) rescales the frequencies as
    transformers does (docs/numerics.md §20; longrope's short/long switch §34). rotary_dim R
    (None = K): only the first R dims of each head rotate, the other K - R pass through
    (docs/numerics.md §35).
    Shapes: x [B, T, H, K], positions [B, T] -> [B, T, H, K]."""

    def __init__(self, head_dim: int, max_len: int, base: float = 10000.0, scaling=None,
                 rotary_dim: int | None = None):
        super().__init__()
        self.head_dim, self.max_len, self.base, self.scaling = head_dim, max_len, base, scaling
        self.rotary_dim = head_dim if rotary_dim is None else rotary_dim
        dynamic = scaling is not None and scaling.rope_type == "dynamic"
        cos, sin = tables.rope_tables(max_len, self.rotary_dim, base, None if dynamic else scaling)
        self.register_buffer("cos", torch.from_numpy(cos.copy()), persistent=False)
        self.register_buffer("sin", torch.from_numpy(sin.copy()), persistent=False)
        if scaling is not None and scaling.rope_type == "longrope":  # the long factors' tables (§34)
            cos, sin = tables.rope_tables(max_len, self.rotary_dim, base, scaling, True)
            self.register_buffer("cos_long", torch.from_numpy(cos.copy()), persistent=False)
            self.register_buffer("sin_long", torch.from_numpy(sin.copy()), persistent=False)

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [B, T] -> cos, sin [B, T, R] float32."""
        if self.scaling is not None and self.scaling.rope_type == "longrope":
            # HF longrope_frequency_update: the long factors for the whole call once seq_len =
            # largest position + 1 of the batch exceeds original_max_len, else the short ones
            use_long = positions.max() + 1 > self.scaling.original_max_len
            return (torch.where(use_long, self.cos_long[positions], self.cos[positions]),
                    torch.where(use_long, self.sin_long[positions], self.sin[positions]))
        if self.scaling is None or self.scaling.rope_type != "dynamic":
            return self.cos[positions], self.sin[positions]
        # dynamic NTK (HF dynamic_rope_update): the base grows with seq_len = largest position + 1
        # of the whole batch once that exceeds original_max_len; fp32 as HF computes it
        factor, m, k = self.scaling.factor, self.scaling.original_max_len, self.rotary_dim
        seq_len = positions.max() + 1
        grown = self.base * ((factor * seq_len.float() / m) - (factor - 1)) ** (k / (k - 2))
        inv_grown = 1.0 / grown ** torch.from_numpy(tables.rope_exponents(k).copy()).to(positions.device)  # [K/2]
        inv_plain = torch.from_numpy(tables.rope_inv_freq(k, self.base)[0].copy()).float().to(positions.device)
        inv_freq = torch.where(seq_len > m, inv_grown, inv_plain)  # [K/2]
        angles = positions[..., None].float() * inv_freq  # [B, T, R/2]
        angles = torch.cat([angles, angles], dim=-1)  # [B, T, R]
        return angles.cos(), angles.sin()

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        check_ids(positions, self.max_len, "position", "max_len")
        cos, sin = self.cos_sin(positions)
        cos, sin = cos[:, :, None, :], sin[:, :, None, :]  # [B, T, 1, R]
        dtype = x.dtype
        rot, rest = x[..., :self.rotary_dim].float(), x[..., self.rotary_dim:]  # [B, T, H, R], [.., K - R]
        rot = (rot * cos + rotate_half(rot) * sin).to(dtype)
        return rot if self.rotary_dim == self.head_dim else torch.cat([rot, rest], dim=-1)


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


def resize_bicubic(grid: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Resample a grid of vectors with torch's F.interpolate(mode="bicubic",
    align_corners=False, size=(height, width)) in float32, as HF DINOv2 resamples its
    position table (docs/numerics.md §37). Shapes: grid [h, w, D] -> [height, width, D].
    """
    dtype = grid.dtype
    x = grid.permute(2, 0, 1)[None].float()  # [1, D, h, w]
    x = F.interpolate(x, size=(height, width), mode="bicubic", align_corners=False)  # [1, D, height, width]
    return x[0].permute(1, 2, 0).to(dtype)


def default_positions(batch: int, length: int, offset=0, device=None) -> torch.Tensor:
    return (torch.arange(length, device=device)[None, :] + offset).expand(batch, length)


def padding_positions(ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """RoBERTa's positions (docs/numerics.md §36): ids [B, T] -> [B, T] int64. Real tokens
    (ids != pad_id) count from pad_id + 1 wherever they sit, pad tokens sit at pad_id."""
    real = (ids != pad_id).long()  # [B, T]
    return torch.cumsum(real, dim=1) * real + pad_id


__all__ = ["SinusoidalPositionalEncoding", "LearnedPositionalEmbedding", "RotaryEmbedding",
           "T5RelativePositionBias", "alibi_bias", "rotate_half", "default_positions", "padding_positions",
           "check_length", "resize_bicubic"]
