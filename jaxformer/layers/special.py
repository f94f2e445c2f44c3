"""tanh in float32 to within 1 ulp, the accuracy of torch's CPU kernel, and the tanh GELU on it.

Parity forces this (docs/numerics.md §44): XLA:CPU's tanh is a rational approximation up to 4.6
ulp off (mean 0.70) where torch's is 0.51 (mean 0.20); the soft-caps and the tanh GELU carry
that into Gemma's logits. Written with float32 operations only (a polynomial, exp, one
division), so it runs on every backend. The coefficients were fitted here (least squares on
Chebyshev nodes, reweighted towards minimax) and rounded to float32; tests/test_special.py
bounds the error over a grid.

tanh: |x| < 1: x + x z P(z), z = x^2, P of degree 8; else 1 - 2 / (1 + exp(2|x|)) (|x| clipped
at 10, past which float32's tanh is 1); the sign of x. Its derivative is jax's rule, 1 - tanh^2,
which is torch's too. float64 inputs use jnp.tanh; other float dtypes compute in float32 and
round once.

The exact GELU keeps jax.nn.gelu's x/2 erfc(-x / sqrt 2) with XLA's erfc: over the same grid it
is nearer float64 than torch's x/2 (1 + erf(x / sqrt 2)) (3.8e-7 against 1.2e-6 at worst), and
stays so with an erf within 1 ulp (4.5e-7).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

_TANH_SMALL = (-0.3333333432674408, 0.13333329558372498, -0.05396723374724388, 0.021859509870409966,
               -0.008813641034066677, 0.0034503545612096786, -0.0012077727587893605, 0.0003158069448545575,
               -4.282769077690318e-05)


def _horner(coefs: tuple[float, ...], z: jax.Array) -> jax.Array:
    acc = jnp.full_like(z, coefs[-1])
    for c in reversed(coefs[:-1]):
        acc = acc * z + c
    return acc


def _in_float32(f32_fn, f64_fn, x: jax.Array) -> jax.Array:
    x = jnp.asarray(x)
    if x.dtype == jnp.float64:
        return f64_fn(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(jnp.float32)
    return f32_fn(x.astype(jnp.float32)).astype(x.dtype)


def _tanh32(x: jax.Array) -> jax.Array:
    a = jnp.abs(x)
    s = jnp.minimum(a, 1.0)
    z = s * s
    small = s + s * z * _horner(_TANH_SMALL, z)
    b = jnp.clip(a, 1.0, 10.0)
    big = 1 - 2 / (1 + jnp.exp(2 * b))
    return jnp.copysign(jnp.where(a < 1.0, small, big), x)


@jax.custom_jvp
def tanh(x: jax.Array) -> jax.Array:
    """tanh(x), float32 within 1 ulp (jnp.tanh on XLA:CPU: 4.6)."""
    return _in_float32(_tanh32, jnp.tanh, x)


@tanh.defjvp
def _tanh_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    y = tanh(x)
    return y, t * (1 - y * y)


def gelu_tanh(x: jax.Array) -> jax.Array:
    """x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), torch's approximate='tanh'."""
    return 0.5 * x * (1 + tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * (x * x * x))))
