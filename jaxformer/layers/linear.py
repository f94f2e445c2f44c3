"""Linear layer: a matmul with a hand-written backward, and the [out, in] kernel layout
decoding uses on XLA:CPU.

No torch twin: torch_ref uses nn.Linear, whose weight is already stored [out, in].

Decoding multiplies a few rows by every weight matrix, so it streams weights from memory, and
XLA:CPU streams a weight much faster as the row-major left operand of W^T [N, K] @ x^T than as
the right operand of x [M, K] @ W [K, N]. XLA folds a transpose of the result back into the
slow form and does not hoist the transpose of a loop-invariant weight out of a while loop, so
generation transposes the kernels itself, outside its jitted program, and traces that program
with `lowering.active().transposed_kernels` set: every `Linear` then reads its kernel as
[out, in] and computes optimization_barrier(W^T @ x^T)^T. The sums are the same; only the
order of the fp32 additions inside the dot may differ (~1e-7 relative). The switch, the kept
copies and the decision when to use them live in jaxformer/lowering.py; measured figures in
bench/README.md, "Decode layout on CPU".
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer import lowering
from jaxformer.layers.kernels import partitioning, quant, quant_train


def weight_stationary_matmul(x: jax.Array, w_t: jax.Array, precision=None) -> jax.Array:
    """x [..., K] @ w_t[N, K]^T -> [..., N], computed as (w_t @ x^T)^T with the weight as the
    row-major left operand; the barrier stops XLA from folding the transpose back."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])  # [M, K]
    y = jax.lax.optimization_barrier(jnp.matmul(w_t, x2.T, precision=precision))  # [N, M]
    return y.T.reshape(*lead, w_t.shape[0])


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def matmul(x: jax.Array, w: jax.Array, precision=None) -> jax.Array:
    """x [..., in] @ w [in, out] -> [..., out], with the backward written out.

    Why. Autodiff gives dx = dy @ w^T as a dot contracting w's last axis, a form XLA:CPU runs
    at about half the speed of the forward's (same bits; figures in bench/README.md). Here
    w^T is materialized first (an optimization barrier keeps XLA from folding the transpose
    back into the dot), so dx is a plain [..., out] @ [out, in] product. dw = x^T dy is
    unchanged.
    """
    return jax.lax.dot_general(x, w, (((x.ndim - 1,), (0,)), ((), ())), precision=precision)


def _matmul_fwd(x, w, precision):
    return matmul(x, w, precision), (x, w)


def _matmul_bwd(precision, res, dy):
    x, w = res
    w_t = jax.lax.optimization_barrier(jnp.swapaxes(w, 0, 1))  # [out, in], materialized
    dx = jax.lax.dot_general(dy, w_t, (((dy.ndim - 1,), (0,)), ((), ())), precision=precision)
    x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])  # [M, in], [M, out]
    dw = jax.lax.dot_general(x2, dy2, (((0,), (0,)), ((), ())), precision=precision)  # [in, out]
    return dx.astype(x.dtype), dw.astype(w.dtype)


matmul.defvjp(_matmul_fwd, _matmul_bwd)


class Linear(nnx.Linear):
    """nnx.Linear (kernel [in, out], bias [out]; same parameters, same checkpoint keys), with
    `matmul`'s backward and the [out, in] decode layout of the module docstring.

    axes: the kernel's logical axes (in, out) (layers/kernels/partitioning.py); the bias is replicated.
    None leaves the parameters unannotated, which the trainer refuses on a mesh."""

    def __init__(self, in_features: int, out_features: int, *, axes: tuple | None = None, **kwargs):
        if axes is not None:
            kwargs.setdefault("kernel_metadata", partitioning.metadata(axes))
            kwargs.setdefault("bias_metadata", partitioning.metadata((None,)))
        super().__init__(in_features, out_features, **kwargs)

    def __call__(self, x: jax.Array, stop_bias_gradient: bool = False) -> jax.Array:
        """x [..., in] -> [..., out]. stop_bias_gradient: use the bias value but cut its
        gradient (the attention key bias; see attention.key_projection)."""
        return self.project(x, self.kernel.get_value(), None if self.bias is None else self.bias.get_value(),
                            stop_bias_gradient)

    def project(self, x: jax.Array, kernel, bias, stop_bias_gradient: bool = False) -> jax.Array:
        """x @ kernel + bias with this layer's settings, for given values of its parameters (the
        frozen base of layers/lora.py passes them through stop_gradient)."""
        if isinstance(kernel, quant.QuantizedWeight):  # a bf16/int8 decode copy [out, in]
            return self._reduced(x, kernel, bias, stop_bias_gradient)
        x, kernel, bias = self.promote_dtype((x, kernel, bias), dtype=self.dtype)
        if lowering.active().transposed_kernels:
            y = weight_stationary_matmul(x, kernel, self.precision)  # kernel [out, in]
        elif quant_train.active():  # train.quantization: int8 / fp8 products (qwix)
            y = quant_train.matmul(x, kernel, quant_train.active())
        else:
            y = matmul(x, kernel, self.precision)
        if bias is None:
            return y
        bias = jax.lax.stop_gradient(bias) if stop_bias_gradient else bias
        return y + bias.astype(y.dtype)


    def _reduced(self, x: jax.Array, kernel, bias, stop_bias_gradient: bool) -> jax.Array:
        """The product with a reduced-precision decode weight (jaxformer/layers/kernels/quant.py), in
        fp32, cast back to x's dtype."""
        y = quant.matmul(x, kernel, functools.partial(weight_stationary_matmul, precision=self.precision),
                         self.precision)
        if bias is not None:
            bias = bias.astype(jnp.float32)
            y = y + (jax.lax.stop_gradient(bias) if stop_bias_gradient else bias)
        return y.astype(x.dtype)


def linear_modules(model: nnx.Module) -> list[Linear]:
    """Every `Linear` of the model, in nnx.iter_modules order (the order the decode-layout
    kernel copies of jaxformer.generation are listed and set back in)."""
    return [m for _, m in nnx.iter_modules(model) if isinstance(m, Linear)]


def transpose_kernels(model: nnx.Module) -> None:
    """Swap the last two axes of every `Linear` kernel in place (stacked [L, in, out] kernels of
    scanned layers included): the layout `lowering.tracing(transposed_kernels=True)` expects."""
    for module in linear_modules(model):
        module.kernel.set_value(jnp.swapaxes(module.kernel.get_value(), -1, -2))


def attend(table, x: jax.Array) -> jax.Array:
    """Tied output projection x [..., D] @ table[V, D]^T -> [..., V]. The table is already
    [out, in], so with transposed kernels it takes the weight-stationary form directly; a
    quant.QuantizedWeight table (reduced-precision decoding) goes through quant.matmul."""
    if isinstance(table, quant.QuantizedWeight):  # a bf16/int8 decode copy of the tied table
        return quant.matmul(x, table, weight_stationary_matmul).astype(x.dtype)
    table = table.astype(x.dtype)
    if lowering.active().transposed_kernels:
        return weight_stationary_matmul(x, table)
    return jnp.einsum("...d,vd->...v", x, table)
