"""Convolutions with explicit padding pairs (docs/numerics.md §5: nnx.Conv pads 'SAME' by default,
torch pads 0). Kernels are stored in flax layout: [k..., C_in, C_out] (HWIO); the converter
transposes them to torch's [C_out, C_in, k...] (OIHW). Twin: torch_ref/layers/conv.py."""
from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer.layers.kernels import partitioning


def _tuple(v, n: int) -> tuple:
    return tuple(v) if isinstance(v, Sequence) else (v,) * n


class _ConvNd(nnx.Module):
    ndim: int = 0

    def __init__(self, in_channels: int, out_channels: int, kernel_size, *, stride=1,
                 padding=0, dilation=1, bias: bool = True, rngs: nnx.Rngs):
        n = self.ndim
        self.kernel_size = _tuple(kernel_size, n)
        self.stride = _tuple(stride, n)
        self.dilation = _tuple(dilation, n)
        pad = padding if isinstance(padding, Sequence) else (padding,) * n
        # each entry: an int (same both sides) or a (low, high) pair, e.g. (k-1, 0) for causal
        self.padding = tuple((p, p) if isinstance(p, int) else tuple(p) for p in pad)
        fan_in = in_channels * math.prod(self.kernel_size)
        bound = 1.0 / math.sqrt(fan_in)
        k1, k2 = jax.random.split(rngs.params())
        # logical axes: output channels on "embed" (a patch embedding's output is the model width)
        self.kernel = partitioning.param(jax.random.uniform(
            k1, self.kernel_size + (in_channels, out_channels), jnp.float32, -bound, bound),
            (None,) * (n + 1) + ("embed",))
        self.bias = partitioning.param(jax.random.uniform(
            k2, (out_channels,), jnp.float32, -bound, bound), (None,)) if bias else None

    def __call__(self, x: jax.Array) -> jax.Array:
        """x [B, *spatial, C_in] (channels last) -> [B, *spatial', C_out]."""
        spatial = "DHW"[-self.ndim:] if self.ndim > 1 else "W"
        dn = ("N" + spatial + "C", spatial + "IO", "N" + spatial + "C")
        y = jax.lax.conv_general_dilated(
            x, self.kernel[...].astype(x.dtype), window_strides=self.stride, padding=self.padding,
            rhs_dilation=self.dilation, dimension_numbers=dn)
        if self.bias is not None:
            y = y + self.bias[...].astype(y.dtype)
        return y


class Conv1d(_ConvNd):
    """1-D convolution. x [B, T, C_in] -> [B, T', C_out]; kernel [k, C_in, C_out]."""
    ndim = 1


class Conv2d(_ConvNd):
    """2-D convolution. x [B, H, W, C_in] -> [B, H', W', C_out]; kernel [kh, kw, C_in, C_out]."""
    ndim = 2
