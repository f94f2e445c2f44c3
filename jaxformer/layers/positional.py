"""Positional schemes: sinusoidal, learned absolute, RoPE, ALiBi, T5 relative bias.
Constant tables come from jaxformer.tables (numpy) so both trees share them bit for bit.
Twin: torch_ref/layers/positional.py."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer import tables
from jaxformer.layers.embedding import Embedding, check_ids, check_length
from jaxformer.layers.kernels import partitioning


class SinusoidalPositionalEncoding(nnx.Module):
    """Fixed sin/cos positions (Vaswani et al. 2017). No parameters.

    Shapes: positions [B, T] int -> [B, T, D].
    """

    def __init__(self, max_len: int, dim: int):
        self.max_len, self.dim = max_len, dim

    def __call__(self, positions: jax.Array) -> jax.Array:
        check_ids(positions, self.max_len, "position", "max_len")
        return jnp.take(jnp.asarray(tables.sinusoid_table(self.max_len, self.dim)), positions, axis=0)


class LearnedPositionalEmbedding(nnx.Module):
    """Learned absolute positions (GPT-2, BERT, ViT). Shapes: positions [B, T] -> [B, T, D]."""

    def __init__(self, max_len: int, dim: int, *, init_std: float = 0.02, rngs: nnx.Rngs):
        self.max_len = max_len
        self.embedding = partitioning.param(
            jax.random.normal(rngs.params(), (max_len, dim), jnp.float32) * init_std, (None, "embed"))

    def __call__(self, positions: jax.Array) -> jax.Array:
        check_ids(positions, self.max_len, "position", "max_len")
        return jnp.take(self.embedding[...], positions, axis=0)


def absolute_positions(kind: str, max_len: int, d_model: int, *, rngs: nnx.Rngs) -> nnx.Module | None:
    """The absolute position table a `position` config names: "sinusoidal" (fixed), "learned",
    or None for the relative schemes (RoPE, ALiBi, T5 bias) and "none"."""
    if kind == "sinusoidal":
        return SinusoidalPositionalEncoding(max_len, d_model)
    if kind == "learned":
        return LearnedPositionalEmbedding(max_len, d_model, rngs=rngs)
    return None


def rotate_half(x: jax.Array) -> jax.Array:
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([-x2, x1], axis=-1)


class RotaryEmbedding(nnx.Module):
    """RoPE (Su et al. 2021) in the rotate-half layout of GPT-NeoX / HF LLaMA (docs/numerics.md §6):
    dims i and i + R/2 form a rotated pair. No parameters. `scaling` (a RopeScaling) rescales
    the frequencies as transformers does (docs/numerics.md §20); "dynamic" recomputes them
    from this call's largest position; "longrope" picks its short or long tables by it (§34).
    rotary_dim R (None = K): only the first R dims of each head rotate, with the frequencies of
    an R-wide head; the other K - R pass through (GPT-NeoX's partial rotary, docs/numerics.md §35).

    Shapes: x [B, T, H, K], positions [B, T] -> [B, T, H, K].
    """

    def __init__(self, head_dim: int, max_len: int, base: float = 10000.0, scaling=None,
                 rotary_dim: int | None = None):
        self.head_dim, self.max_len, self.base, self.scaling = head_dim, max_len, base, scaling
        self.rotary_dim = head_dim if rotary_dim is None else rotary_dim

    def cos_sin(self, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
        """positions [B, T] -> cos, sin [B, T, R] float32."""
        if self.scaling is not None and self.scaling.rope_type == "longrope":
            # HF longrope_frequency_update: the long factors for the whole call once seq_len =
            # largest position + 1 of the batch exceeds original_max_len, else the short ones
            use_long = jnp.max(positions) + 1 > self.scaling.original_max_len
            cos, sin = tables.rope_tables(self.max_len, self.rotary_dim, self.base, self.scaling)
            cos_long, sin_long = tables.rope_tables(self.max_len, self.rotary_dim, self.base, self.scaling, True)
            take = lambda t: jnp.take(jnp.asarray(t), positions, axis=0)
            return (jnp.where(use_long, take(cos_long), take(cos)),
                    jnp.where(use_long, take(sin_long), take(sin)))
        if self.scaling is None or self.scaling.rope_type != "dynamic":
            cos, sin = tables.rope_tables(self.max_len, self.rotary_dim, self.base, self.scaling)
            return jnp.take(jnp.asarray(cos), positions, axis=0), jnp.take(jnp.asarray(sin), positions, axis=0)
        # dynamic NTK (HF dynamic_rope_update): the base grows with seq_len = largest position + 1
        # of the whole batch once that exceeds original_max_len; fp32 as HF computes it
        factor, m, k = self.scaling.factor, self.scaling.original_max_len, self.rotary_dim
        seq_len = jnp.max(positions) + 1
        grown = self.base * ((factor * seq_len.astype(jnp.float32) / m) - (factor - 1)) ** (k / (k - 2))
        inv_grown = 1.0 / grown ** jnp.asarray(tables.rope_exponents(k))  # [K/2]
        inv_plain = jnp.asarray(tables.rope_inv_freq(k, self.base)[0], jnp.float32)
        inv_freq = jnp.where(seq_len > m, inv_grown, inv_plain)  # [K/2]
        angles = positions[..., None].astype(jnp.float32) * inv_freq  # [B, T, R/2]
        angles = jnp.concatenate([angles, angles], axis=-1)  # [B, T, R]
        return jnp.cos(angles), jnp.sin(angles)

    def __call__(self, x: jax.Array, positions: jax.Array) -> jax.Array:
        check_ids(positions, self.max_len, "position", "max_len")
        cos, sin = self.cos_sin(positions)
        cos, sin = cos[:, :, None, :], sin[:, :, None, :]  # [B, T, 1, R]
        dtype = x.dtype
        rot, rest = x[..., :self.rotary_dim].astype(jnp.float32), x[..., self.rotary_dim:]  # [B, T, H, R], [.., K - R]
        rot = (rot * cos + rotate_half(rot) * sin).astype(dtype)
        return rot if self.rotary_dim == self.head_dim else jnp.concatenate([rot, rest], axis=-1)


def alibi_bias(num_heads: int, q_positions: jax.Array, k_positions: jax.Array) -> jax.Array:
    """ALiBi (Press et al. 2022): bias = -slope_h * |q_pos - k_pos|. Symmetric, so it serves
    bidirectional encoders; under a causal mask it equals the paper's causal form.

    Shapes: q_positions [B, T], k_positions [B, S] -> [B, H, T, S].
    """
    slopes = jnp.asarray(tables.alibi_slopes(num_heads))[None, :, None, None]  # [1, H, 1, 1]
    dist = jnp.abs(q_positions[:, None, :, None] - k_positions[:, None, None, :])  # [B, 1, T, S]
    return -slopes * dist.astype(jnp.float32)


class T5RelativePositionBias(nnx.Module):
    """T5 bucketed relative position bias (Raffel et al. 2020), one scalar per head and bucket.

    Args:
        num_buckets, max_distance: T5's bucketing (32, 128).  num_heads: H.
        bidirectional: True for encoders, False for causal decoders.
    Shapes: q_positions [B, T], k_positions [B, S] -> [B, H, T, S].
    """

    def __init__(self, num_buckets: int, max_distance: int, num_heads: int, *,
                 bidirectional: bool, rngs: nnx.Rngs):
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.bidirectional = bidirectional
        self.relative_attention_bias = Embedding(num_buckets, num_heads, axes=(None, None), rngs=rngs)

    def __call__(self, q_positions: jax.Array, k_positions: jax.Array) -> jax.Array:
        table = jnp.asarray(tables.t5_bucket_table(self.bidirectional, self.num_buckets,
                                                   self.max_distance))
        rel = k_positions[:, None, :] - q_positions[:, :, None]  # [B, T, S]
        rel = jnp.clip(rel, -self.max_distance, self.max_distance) + self.max_distance
        buckets = jnp.take(table, rel, axis=0)  # [B, T, S]
        bias = jnp.take(self.relative_attention_bias.embedding[...], buckets, axis=0)  # [B, T, S, H]
        return jnp.transpose(bias, (0, 3, 1, 2))


def resize_bicubic(grid: jax.Array, height: int, width: int) -> jax.Array:
    """Resample a grid of vectors bicubically as torch's F.interpolate(mode="bicubic",
    align_corners=False, size=(height, width)) does (HF DINOv2's position interpolation),
    in float32. Hand-written as two small matrix products with tables.bicubic_weights:
    jax.image.resize's "cubic" uses another kernel (Keys A = -0.5 against torch's -0.75) and
    other edges (taps dropped and renormalised, not clamped), docs/numerics.md §37.

    Shapes: grid [h, w, D] -> [height, width, D].
    """
    h, w, _ = grid.shape
    dtype = grid.dtype
    wy = jnp.asarray(tables.bicubic_weights(h, height))  # [height, h]
    wx = jnp.asarray(tables.bicubic_weights(w, width))  # [width, w]
    x = jnp.einsum("oh,hwd->owd", wy, grid.astype(jnp.float32))  # [height, w, D]
    x = jnp.einsum("pw,owd->opd", wx, x)  # [height, width, D]
    return x.astype(dtype)


def default_positions(batch: int, length: int, offset=0) -> jax.Array:
    return jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32)[None, :] + offset, (batch, length))


def padding_positions(ids: jax.Array, pad_id: int) -> jax.Array:
    """RoBERTa's positions (docs/numerics.md §36): ids [B, T] -> [B, T] int32. Real tokens
    (ids != pad_id) count from pad_id + 1 wherever they sit, pad tokens sit at pad_id."""
    real = (ids != pad_id).astype(jnp.int32)  # [B, T]
    return jnp.cumsum(real, axis=1) * real + pad_id


__all__ = ["SinusoidalPositionalEncoding", "LearnedPositionalEmbedding", "RotaryEmbedding",
           "T5RelativePositionBias", "alibi_bias", "rotate_half", "default_positions", "padding_positions",
           "check_length", "resize_bicubic"]
