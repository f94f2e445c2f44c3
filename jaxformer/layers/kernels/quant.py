"""Reduced-precision decode weights: bf16 or int8 copies of the matmul weights that
jaxformer.generation decodes with. Weight-only: activations, accumulation, norms, biases,
attention and the KV cache stay fp32. Twin: torch_ref/layers/kernels/quant.py (same scales, same
rounding, so the two frameworks' int8 logits agree to fp32 summation order; docs/numerics.md §24).

Which weights: every `Linear` kernel (attention projections, FFN, an untied lm_head) and a
tied output table (the token embedding that is also the output projection; its lookup then
reads the same reduced table, so one copy serves both). An untied input embedding stays fp32:
a lookup reads B rows per token, so reducing it saves no bandwidth. Position tables, norms and
biases stay fp32.

int8: symmetric, per output channel (per row of the [out, in] weight):
    scale[n] = max_k |W[n, k]| / 127   (1 where the row is all zero)
    q[n, k]  = round_half_to_even(W[n, k] / scale[n])   in [-127, 127]
    y        = (x @ float32(q)^T) * scale                  (fp32 products and sums)
  round half to even is jnp.round's and torch.round's rule; the division and the scale are
  IEEE fp32 in both, so q and scale are bit-identical across the frameworks
  (tests/test_quant.py checks ties).
bf16: W rounded to bf16 (nearest, ties to even: the fp32 -> bf16 cast of both frameworks),
  y = x @ float32(W_bf16)^T in fp32. Stored as the bf16 bit pattern in uint16 and widened
  with a shift: given a bf16 operand, XLA folds the widening into the dot and runs a bf16
  dot, which XLA:CPU computes ~9x slower than fp32 (bench/README.md, "Reduced-precision
  decode on CPU"); the integer form is exact and opaque to that rewrite.
Where the widening to fp32 runs (each decode step, or once per generate call on XLA:CPU,
which fuses no widening into a dot) is lowering.widen_each_step's choice.

Why not qwix (0.1.8): its PTQ provider intercepts jax.lax.dot_general / einsum calls whose
right operand is a module parameter. jaxformer's decode layout multiplies with the weight as
the LEFT operand (jaxformer/layers/linear.py, weight_stationary_matmul), Linear's training
matmul is a custom_vjp (the parameter is re-bound to a new tracer inside it, so qwix cannot
recognise it), and a tied output table is read by a gather as well as a product. Its int8
symmetric bound is also 127.5 with a clip to [-128, 127], where this scheme keeps the grid
symmetric. The maths here is a few lines; its twin in torch is the same few lines.
"""
from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from jaxformer import lowering
from jaxformer.config.models import WEIGHTS_DTYPES

INT8_MAX = 127


@flax.struct.dataclass
class QuantizedWeight:
    """A matmul weight [..., out, in] at reduced precision.

    data: int8 q (with `scale`), or the bf16 bit pattern as uint16 (scale None).
    scale: [..., out] float32 per-output-channel scale of int8, else None.
    Leading axes (a scanned stack's [L, ...]) slice like any pytree leaf.
    """

    data: jax.Array
    scale: jax.Array | None = None

    @property
    def shape(self):
        return self.data.shape

    def values(self) -> jax.Array:
        """float32 [..., out, in] of the stored values: int8 q (not yet scaled) or the bf16
        weights widened exactly."""
        data = self.data
        if data.dtype == jnp.uint16:
            return jax.lax.bitcast_convert_type(data.astype(jnp.uint32) << 16, jnp.float32)
        return data.astype(jnp.float32)

    def dequantized(self) -> jax.Array:
        """float32 [..., out, in]: the weight this copy stands for (one jitted program per
        shape where called eagerly, as at export, not a compiled program per op)."""
        return _dequantized(self)

    def lookup(self, ids: jax.Array) -> jax.Array:
        """Rows of a table [V, D] at ids [...] -> float32 [..., D] (a tied embedding's lookup)."""
        w = QuantizedWeight(jnp.take(self.data, ids, axis=0),
                            None if self.scale is None else jnp.take(self.scale, ids, axis=0))
        return w.dequantized()


@jax.jit
def _dequantized(w: QuantizedWeight) -> jax.Array:
    values = w.values()  # exact; then one rounding of q * scale, as eagerly
    return values if w.scale is None else values * w.scale[..., None]


# quantize_int8 and to_bf16 are jitted (inlined where a caller traces them): called eagerly on a
# model's kernels (layers/lora.py quantize_base, loading a reduced-precision run), each op would
# otherwise be its own compiled program per shape. Same values: every op rounds once, exactly
# as eagerly, and the barriers keep the divisions divisions (docs/numerics.md §24).
@jax.jit
def quantize_int8(w: jax.Array) -> QuantizedWeight:
    """w [..., out, in] float -> int8 QuantizedWeight, symmetric, one scale per output row."""
    w = w.astype(jnp.float32)
    amax = jnp.max(jnp.abs(w), axis=-1)  # [..., out]
    # IEEE division with full-shape divisors behind barriers: XLA:CPU divides by a broadcast
    # scalar or row as a multiply by its reciprocal, which rounds differently from torch's
    # division (4% of GPT-2 small's scales differed by one ulp; docs/numerics.md §24)
    scale = jnp.where(amax > 0, amax / _materialized(jnp.full_like(amax, INT8_MAX)), 1.0)
    q = jnp.round(w / _materialized(jnp.broadcast_to(scale[..., None], w.shape)))
    return QuantizedWeight(jnp.clip(q, -INT8_MAX, INT8_MAX).astype(jnp.int8), scale)


def _materialized(x: jax.Array) -> jax.Array:
    return jax.lax.optimization_barrier(x)


@jax.jit
def to_bf16(w: jax.Array) -> QuantizedWeight:
    """w [..., out, in] float -> bf16 QuantizedWeight (round to nearest even)."""
    return QuantizedWeight(jax.lax.bitcast_convert_type(w.astype(jnp.bfloat16), jnp.uint16))


def reduce_weight(w: jax.Array, weights_dtype: str):
    """w [..., out, in] -> its decode copy in weights_dtype (fp32: w itself)."""
    if weights_dtype == "fp32":
        return w
    if weights_dtype == "bf16":
        return to_bf16(w)
    if weights_dtype == "int8":
        return quantize_int8(w)
    raise ValueError(f"weights dtype must be one of {WEIGHTS_DTYPES}, got {weights_dtype!r}")


def matmul(x: jax.Array, w: QuantizedWeight, weight_stationary, precision=None) -> jax.Array:
    """x [..., in] @ w [out, in]^T -> [..., out] in float32: the stored values widened to fp32,
    multiplied in fp32, then the int8 scale per output. Under lowering's transposed_kernels the
    product is weight_stationary(x, w) (linear.weight_stationary_matmul: the weight as the
    row-major left operand), else a plain einsum."""
    x = x.astype(jnp.float32)
    data = w.data
    if lowering.widen_each_step():
        # Tie the stored weight to x: a decode loop's weights are loop-invariant, and XLA would
        # hoist their widening out of the loop and stream fp32 copies at every step. Through
        # the barrier the widening depends on x, so it stays next to the product it feeds.
        data, x = jax.lax.optimization_barrier((data, x))
    values = QuantizedWeight(data, w.scale).values()
    if lowering.active().transposed_kernels:
        y = weight_stationary(x, values)
    else:
        y = jnp.einsum("...k,nk->...n", x, values, precision=precision)
    return y if w.scale is None else y * w.scale
