"""Normalisation layers with explicit eps (docs/numerics.md §1). Twin: torch_ref/layers/norm.py."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer.layers.kernels import partitioning


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
        return _layer_norm(x, self.scale[...], None if self.bias is None else self.bias[...], self.eps)


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
        return _rms_norm(x, self.scale[...], self.eps, self.unit_offset)


# The norms' elementwise work is recomputed in the backward pass (jax.checkpoint): their
# gradients then keep only the input x (which the residual stream keeps anyway), not the fp32
# copy, the normalised x and the scaled output besides it (3 [B, T, D] arrays per norm in a
# training step; the same ops run again, so values and gradients are unchanged; docs/numerics.md §29).
@functools.partial(jax.checkpoint, static_argnums=(3,))
def _layer_norm(x, scale, bias, eps):
    dtype = x.dtype
    x = x.astype(jnp.float32)  # statistics in fp32, also under bf16 compute
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    y = (x - mean) * jax.lax.rsqrt(var + eps) * scale
    if bias is not None:
        y = y + bias
    return y.astype(dtype)


@functools.partial(jax.checkpoint, static_argnums=(2, 3))
def _rms_norm(x, scale, eps, unit_offset):
    dtype = x.dtype
    x = x.astype(jnp.float32)
    y = x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + eps)
    scale = scale.astype(jnp.float32)
    return (y * (1.0 + scale if unit_offset else scale)).astype(dtype)


def make_norm(kind: str, dim: int, *, eps: float, bias: bool = True,
              rngs: nnx.Rngs | None = None) -> nnx.Module:
    if kind == "layernorm":
        return LayerNorm(dim, eps=eps, bias=bias, rngs=rngs)
    if kind in ("rmsnorm", "rmsnorm_offset"):
        return RMSNorm(dim, eps=eps, unit_offset=kind == "rmsnorm_offset", rngs=rngs)
    raise ValueError(f"norm: unknown kind {kind!r}")
