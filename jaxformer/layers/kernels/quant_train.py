"""Quantized training (train.quantization; issue 50 §6): the products of every `Linear` (the
attention projections and the FFN) run in int8 or fp8, in the forward pass and in both
products of the backward pass, with the master weights and the optimiser in float as before.

The maths is qwix's (`dot_general_qt`, its quantized-training dot with a custom VJP), not ours:
  int8: both operands quantized symmetrically to int8 with absmax scales per channel (the
        activation per row, the weight per output column), an int8 x int8 -> int32 dot,
        rescaled to float; the backward's incoming gradient quantized the same way, so dx and
        dW are int8 dots too. As MaxText's `quantization: int8` (AQT) does.
  fp8:  the forward's operands in float8_e4m3fn, the gradients in float8_e5m2 (the usual fp8
        training recipe: e5m2's range for gradients), scaled by absmax; for GPU targets (H100
        and H200 run fp8 at twice bf16's rate; the TPUs this project targets have no fp8 units).
What stays in float: the output head and the embeddings (the usual choice: the logits'
precision matters most to the loss), attention's own products (QK^T, PV), norms, MoE experts'
ragged dots, and the decode path (generation uses layers/kernels/quant.py's weight copies).

`training(mode)` sets the mode while a step is traced (train/steps.py enters it with the
lowering switches); `full_precision()` turns it off for a part of the model (the output head).
Measured budgets against the float run: docs/numerics.md §48; tests/test_quant_train.py.
"""
from __future__ import annotations

import contextlib
import contextvars

import jax
import jax.numpy as jnp

MODES = ("int8", "fp8")

_MODE: contextvars.ContextVar[str | None] = contextvars.ContextVar("jaxformer_quant_train", default=None)


def active() -> str | None:
    """The quantized-training mode in force while tracing (None: float products)."""
    return _MODE.get()


@contextlib.contextmanager
def training(mode: str | None):
    """While tracing inside: every Linear's product in `mode` (None: float)."""
    if mode not in (None,) + MODES:
        raise ValueError(f"quantization must be one of {MODES} or null, got {mode!r}")
    token = _MODE.set(mode)
    try:
        yield
    finally:
        _MODE.reset(token)


def full_precision():
    """Float products inside, whatever the mode (the output head)."""
    return training(None)


def _config(mode: str):
    from qwix._src.core.dot_general_qt import DotGeneralQtConfig
    fwd, grad = (jnp.int8, jnp.int8) if mode == "int8" else (jnp.float8_e4m3fn, jnp.float8_e5m2)
    return DotGeneralQtConfig(lhs_qtype=fwd, rhs_qtype=fwd, dlhs_grad_qtype=grad, drhs_grad_qtype=grad)


def matmul(x: jax.Array, w: jax.Array, mode: str) -> jax.Array:
    """x [..., in] @ w [in, out] -> [..., out] in x's dtype, quantized as `mode` says."""
    from qwix._src.core.dot_general_qt import dot_general_qt
    y = dot_general_qt(x, w, (((x.ndim - 1,), (0,)), ((), ())), _config(mode))
    return y.astype(x.dtype)
