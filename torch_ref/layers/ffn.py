"""Position-wise feed-forward networks: ReLU, GELU (exact / tanh), SiLU, SwiGLU, GeGLU.
Twin: jaxformer/layers/ffn.py."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

GATED = ("swiglu", "geglu", "geglu_tanh")


def gelu_exact(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="none")


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def activation(kind: str):
    """The nonlinearity of an FFN kind. GELU variants are named, never defaulted."""
    return {"relu": F.relu, "gelu": gelu_exact, "gelu_tanh": gelu_tanh, "silu": F.silu, "swiglu": F.silu,
            "geglu": gelu_exact, "geglu_tanh": gelu_tanh}[kind]


class FeedForward(nn.Module):
    """FFN(x) = down(act(up(x)))  or, gated, down(act(gate(x)) * up(x)). x [B, T, D] -> [B, T, D]."""

    def __init__(self, d_model: int, d_ff: int, *, kind: str, bias: bool = True,
                 inner_dropout: float = 0.0, dropout: float = 0.0):
        super().__init__()
        self.kind = kind
        self.gate_proj = nn.Linear(d_model, d_ff, bias=bias) if kind in GATED else None
        self.up_proj = nn.Linear(d_model, d_ff, bias=bias)
        self.down_proj = nn.Linear(d_ff, d_model, bias=bias)
        self.inner_dropout = nn.Dropout(inner_dropout)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_proj is not None:
            h = activation(self.kind)(self.gate_proj(x)) * self.up_proj(x)  # [B, T, F]
        else:
            h = activation(self.kind)(self.up_proj(x))  # [B, T, F]
        return self.dropout(self.down_proj(self.inner_dropout(h)))
