"""Position-wise feed-forward networks: ReLU, GELU (exact / tanh), SiLU, SwiGLU, GeGLU.
Twin: torch_ref/layers/ffn.py."""
from __future__ import annotations

import jax
from flax import nnx

from jaxformer.layers import special
from jaxformer.layers.linear import Linear

GATED = ("swiglu", "geglu", "geglu_tanh")


def gelu_exact(x: jax.Array) -> jax.Array:
    """x/2 erfc(-x / sqrt 2): nearer float64 than torch's erf form (docs/numerics.md §44)."""
    return jax.nn.gelu(x, approximate=False)


def gelu_tanh(x: jax.Array) -> jax.Array:
    """GELU's tanh form with tanh to torch's accuracy (parity forces it: docs/numerics.md §44)."""
    return special.gelu_tanh(x)


def activation(kind: str):
    """The nonlinearity of an FFN kind. GELU variants are named, never defaulted (docs/numerics.md §2)."""
    return {"relu": jax.nn.relu, "gelu": gelu_exact, "gelu_tanh": gelu_tanh, "silu": jax.nn.silu, "swiglu": jax.nn.silu,
            "geglu": gelu_exact, "geglu_tanh": gelu_tanh}[kind]


def _gated(kind: str, gate: jax.Array, up: jax.Array) -> jax.Array:
    return activation(kind)(gate) * up


class FeedForward(nnx.Module):
    """FFN(x) = down(act(up(x)))  or, gated (Shazeer 2020), down(act(gate(x)) * up(x)).

    Args:
        d_model: D.  d_ff: F.  kind: relu | gelu | gelu_tanh | silu | swiglu | geglu | geglu_tanh.
        bias: biases on the projections.  inner_dropout: after the activation.
        dropout: on the output.
    Shapes: x [B, T, D] -> [B, T, D].
    """

    def __init__(self, d_model: int, d_ff: int, *, kind: str, bias: bool = True,
                 inner_dropout: float = 0.0, dropout: float = 0.0, rngs: nnx.Rngs):
        self.kind = kind
        self.gate_proj = Linear(d_model, d_ff, use_bias=bias, axes=("embed", "mlp"), rngs=rngs) if kind in GATED else None
        self.up_proj = Linear(d_model, d_ff, use_bias=bias, axes=("embed", "mlp"), rngs=rngs)
        self.down_proj = Linear(d_ff, d_model, use_bias=bias, axes=("mlp", "embed"), rngs=rngs)
        self.inner_dropout = nnx.Dropout(inner_dropout, rngs=rngs)
        self.dropout = nnx.Dropout(dropout, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        # the activation (and the gating product) recomputed in the backward pass: its gradient
        # keeps the projections' outputs only, not the activation's intermediates (jax.nn.silu
        # keeps x, sigmoid(x) and its output: 3 [B, T, F] arrays; docs/numerics.md §29)
        act = jax.checkpoint(_gated, static_argnums=0) if self.gate_proj is not None else \
            jax.checkpoint(activation(self.kind))
        # h: [B, T, F]
        h = act(self.kind, self.gate_proj(x), self.up_proj(x)) if self.gate_proj is not None else act(self.up_proj(x))
        return self.dropout(self.down_proj(self.inner_dropout(h)))
