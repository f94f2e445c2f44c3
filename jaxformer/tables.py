"""Constant tables computed once in numpy (float64, then cast) and shared by both trees,
so that JAX and PyTorch start from bit-identical positional constants."""
from __future__ import annotations

import functools
import math

import numpy as np


@functools.lru_cache(maxsize=None)
def sinusoid_table(max_len: int, d_model: int) -> np.ndarray:
    """[max_len, D] table of Vaswani et al. (2017): PE(p, 2i) = sin(p / 10000^(2i/D)),
    PE(p, 2i+1) = cos(p / 10000^(2i/D))."""
    pos = np.arange(max_len, dtype=np.float64)[:, None]
    div = np.exp(np.arange(0, d_model, 2, dtype=np.float64) * (-math.log(10000.0) / d_model))
    table = np.zeros((max_len, d_model), dtype=np.float64)
    table[:, 0::2] = np.sin(pos * div)
    table[:, 1::2] = np.cos(pos * div)[:, : d_model // 2]
    table = table.astype(np.float32)
    table.flags.writeable = False
    return table


@functools.lru_cache(maxsize=None)
def rope_tables(max_len: int, head_dim: int, base: float) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin tables [max_len, K] for rotate-half RoPE (GPT-NeoX / HF LLaMA layout):
    frequency i is shared by dims i and i + K/2."""
    inv_freq = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    angles = np.arange(max_len, dtype=np.float64)[:, None] * inv_freq[None, :]  # [T, K/2]
    angles = np.concatenate([angles, angles], axis=-1)  # [T, K]
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    cos.flags.writeable = False
    sin.flags.writeable = False
    return cos, sin


@functools.lru_cache(maxsize=None)
def alibi_slopes(num_heads: int) -> np.ndarray:
    """Per-head ALiBi slopes (Press et al. 2022). For a head count that is not a power of
    two, take the slopes of the closest smaller power of two, then every other slope of
    the next power of two (as in the paper's reference code)."""
    def pow2_slopes(n: int) -> list[float]:
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start * start ** i for i in range(n)]

    if math.log2(num_heads).is_integer():
        slopes = pow2_slopes(num_heads)
    else:
        closest = 2 ** math.floor(math.log2(num_heads))
        slopes = pow2_slopes(closest) + pow2_slopes(2 * closest)[0::2][: num_heads - closest]
    out = np.asarray(slopes, dtype=np.float32)
    out.flags.writeable = False
    return out


@functools.lru_cache(maxsize=None)
def t5_bucket_table(bidirectional: bool, num_buckets: int, max_distance: int) -> np.ndarray:
    """int32 bucket id of T5's relative position bias (Raffel et al. 2020) for every relative
    distance rel = key_pos - query_pos in [-max_distance, max_distance] (index rel + max_distance).
    Buckets saturate beyond max_distance, so callers clip rel to that range. Computed in numpy,
    so both frameworks bucket identically."""
    rel = np.arange(-max_distance, max_distance + 1, dtype=np.int64)
    buckets = np.zeros_like(rel)
    n = num_buckets
    if bidirectional:
        n //= 2
        buckets += (rel > 0).astype(np.int64) * n
        rel = np.abs(rel)
    else:
        rel = -np.minimum(rel, 0)
    max_exact = n // 2
    is_small = rel < max_exact
    scaled = np.log(np.maximum(rel, 1).astype(np.float32) / max_exact) / np.float32(
        math.log(max_distance / max_exact)) * (n - max_exact)
    large = np.minimum(max_exact + scaled.astype(np.int64), n - 1)
    buckets += np.where(is_small, rel, large)
    out = buckets.astype(np.int32)
    out.flags.writeable = False
    return out
