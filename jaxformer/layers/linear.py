"""Linear layer: a matmul with a hand-written backward, and a decode-time weight layout for
XLA:CPU.

No torch twin: torch_ref uses nn.Linear, whose weight is already stored [out, in], the layout
this module switches to while decoding.

Why. Decoding multiplies a few rows (M = batch) by every weight matrix, so it streams weights
from memory. On XLA:CPU, x [M, K] @ W [K, N] goes through Eigen with W as the right operand,
and at M = 8 that streams W at 4-5 GB/s. The same product written as W^T [N, K] @ x^T -> [N, M],
with W^T stored row-major, streams at 18-22 GB/s (measured on the 2-core CI machine, GPT-2
small sizes: 3.4x faster at M = 8, 1.1-1.4x at M = 1; bench/generate.py). XLA folds a
transpose of that result back into the slow form, and it does not hoist the transpose of a
loop-invariant weight out of a while loop. So generation transposes the kernels itself, before
its decode loop and outside the jitted program (jaxformer.generation.decode_kernels, which
keeps the copies for later calls), and traces the program inside `transposed_kernels()`,
under which every `Linear` reads its kernel as [out, in] and computes
optimization_barrier(W^T @ x^T)^T. The sums are the same; only the order of the fp32
additions inside the dot may differ (~1e-7 relative).
"""
from __future__ import annotations

import contextlib
import contextvars
import functools

import jax
import jax.numpy as jnp
from flax import nnx

_TRANSPOSED: contextvars.ContextVar[bool] = contextvars.ContextVar("jaxformer_transposed", default=False)


@contextlib.contextmanager
def transposed_kernels(active: bool = True):
    """While tracing inside this context, `Linear` kernels are [..., out, in] (see module doc)."""
    token = _TRANSPOSED.set(active)
    try:
        yield
    finally:
        _TRANSPOSED.reset(token)


def kernels_transposed() -> bool:
    return _TRANSPOSED.get()


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
    at about half the speed of the forward's (measured: the seed FFN's forward + backward took
    345 ms with autodiff's form, 236 ms with this one, same bits). Here w^T is materialized
    first (an optimization barrier keeps XLA from folding the transpose back into the dot),
    so dx is a plain [..., out] @ [out, in] product. dw = x^T dy is unchanged.
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
    `matmul`'s backward and the transposed decode layout of the module docstring."""

    def __call__(self, x: jax.Array, stop_bias_gradient: bool = False) -> jax.Array:
        """x [..., in] -> [..., out]. stop_bias_gradient: use the bias value but cut its
        gradient (the attention key bias; see attention.key_projection)."""
        kernel = self.kernel[...]
        bias = self.bias[...] if self.bias is not None else None
        x, kernel, bias = self.promote_dtype((x, kernel, bias), dtype=self.dtype)
        if kernels_transposed():
            y = weight_stationary_matmul(x, kernel, self.precision)  # kernel [out, in]
        else:
            y = matmul(x, kernel, self.precision)
        if bias is None:
            return y
        bias = jax.lax.stop_gradient(bias) if stop_bias_gradient else bias
        return y + bias.astype(y.dtype)


def linear_modules(model: nnx.Module) -> list[Linear]:
    """Every `Linear` of the model, in nnx.iter_modules order (the order the decode-layout
    kernel copies of jaxformer.generation are listed and set back in)."""
    return [m for _, m in nnx.iter_modules(model) if isinstance(m, Linear)]


def transpose_kernels(model: nnx.Module) -> None:
    """Swap the last two axes of every `Linear` kernel in place (stacked [L, in, out] kernels of
    scanned layers included): the layout `transposed_kernels()` expects."""
    for module in linear_modules(model):
        module.kernel.set_value(jnp.swapaxes(module.kernel.get_value(), -1, -2))


def attend(table: jax.Array, x: jax.Array) -> jax.Array:
    """Tied output projection x [..., D] @ table[V, D]^T -> [..., V]. The table is already
    [out, in], so under `transposed_kernels()` it takes the weight-stationary form directly."""
    table = table.astype(x.dtype)
    if kernels_transposed():
        return weight_stationary_matmul(x, table)
    return jnp.einsum("...d,vd->...v", x, table)
