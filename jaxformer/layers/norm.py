"""Normalisation layers with explicit eps (docs/numerics.md §1). Twin: torch_ref/layers/norm.py."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer.layers import partitioning


class LayerNorm(nnx.Module):
    """LayerNorm (Ba et al. 2016) over the last axis, variance as mean((x - mean)^2) like torch.

    Args:
        dim: D, the normalised width.
        eps: added to the variance; pass it explicitly (torch 1e-5, flax 1e-6 by default).
        bias: learn an additive bias.
    Shapes: x [..., D] -> [..., D].
    """

    def __init__(self, dim: int, *, eps: float, bias: bool = True, rngs: nnx.Rngs | None = None):
        self.eps = eps
        self.scale = partitioning.param(jnp.ones((dim,), jnp.float32), ("norm",))
        self.bias = partitioning.param(jnp.zeros((dim,), jnp.float32), ("norm",)) if bias else None

    def __call__(self, x: jax.Array) -> jax.Array:
        dtype = x.dtype
        x = x.astype(jnp.float32)  # statistics in fp32, also under bf16 compute
        mean = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
        y = (x - mean) * jax.lax.rsqrt(var + self.eps) * self.scale[...]
        if self.bias is not None:
            y = y + self.bias[...]
        return y.astype(dtype)


class RMSNorm(nnx.Module):
    """RMSNorm (Zhang & Sennrich 2019): x / sqrt(mean(x^2) + eps) * scale.

    Args:
        unit_offset: multiply by (1 + scale) instead, scale initialised to 0 (Gemma's norm; the
            stored weight is Gemma's, so conversion copies it). All in fp32.
    Shapes: x [..., D] -> [..., D].
    """

    def __init__(self, dim: int, *, eps: float, unit_offset: bool = False, rngs: nnx.Rngs | None = None):
        self.eps, self.unit_offset = eps, unit_offset
        self.scale = partitioning.param((jnp.zeros if unit_offset else jnp.ones)((dim,), jnp.float32), ("norm",))

    def __call__(self, x: jax.Array) -> jax.Array:
        dtype = x.dtype
        x = x.astype(jnp.float32)
        y = x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + self.eps)
        scale = self.scale[...].astype(jnp.float32)
        return (y * (1.0 + scale if self.unit_offset else scale)).astype(dtype)


def make_norm(kind: str, dim: int, *, eps: float, bias: bool = True,
              rngs: nnx.Rngs | None = None) -> nnx.Module:
    if kind == "layernorm":
        return LayerNorm(dim, eps=eps, bias=bias, rngs=rngs)
    if kind in ("rmsnorm", "rmsnorm_offset"):
        return RMSNorm(dim, eps=eps, unit_offset=kind == "rmsnorm_offset", rngs=rngs)
    raise ValueError(f"norm: unknown kind {kind!r}")
