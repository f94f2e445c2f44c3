"""Reduced-precision decode weights: bf16 or int8 copies of the matmul weights that
torch_ref.generation decodes with. Weight-only: activations, accumulation, norms, biases,
attention and the KV cache stay fp32. Twin: jaxformer/layers/kernels/quant.py (same scales, same
rounding; docs/numerics.md §24).

Which weights: every nn.Linear (attention projections, FFN, an untied lm_head) and a tied
output table (its lookup then reads the same reduced table). An untied input embedding,
position tables, norms and biases stay fp32.

int8: symmetric, per output channel (per row of the [out, in] weight):
    scale[n] = max_k |W[n, k]| / 127   (1 where the row is all zero)
    q[n, k]  = round_half_to_even(W[n, k] / scale[n])   in [-127, 127]
    y        = (x @ float32(q)^T) * scale                  (fp32 products and sums)
  torch.round rounds half to even, as jnp.round does; the division and the scale are IEEE fp32.
bf16: W rounded to bf16 (nearest, ties to even), y = x @ float32(W_bf16)^T in fp32. (The JAX
  twin stores the same bits as uint16 for XLA:CPU's sake; torch keeps a bfloat16 tensor.)
"""
from __future__ import annotations

import dataclasses

import torch
from torch import nn

from jaxformer.config.models import WEIGHTS_DTYPES

INT8_MAX = 127


@dataclasses.dataclass
class QuantizedWeight:
    """A matmul weight [out, in] at reduced precision.

    data: int8 q (with `scale`), or bfloat16 (scale None).
    scale: [out] float32 per-output-channel scale of int8, else None.
    """

    data: torch.Tensor
    scale: torch.Tensor | None = None

    @property
    def shape(self):
        return self.data.shape

    @property
    def device(self):
        return self.data.device

    def values(self) -> torch.Tensor:
        """float32 [out, in] of the stored values: int8 q (not yet scaled) or the bf16 weights
        widened exactly."""
        return self.data.float()

    def dequantized(self) -> torch.Tensor:
        """float32 [out, in]: the weight this copy stands for."""
        w = self.values()
        return w if self.scale is None else w * self.scale[..., None]

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows of a table [V, D] at ids [...] -> float32 [..., D] (a tied embedding's lookup)."""
        w = QuantizedWeight(self.data[ids], None if self.scale is None else self.scale[ids])
        return w.dequantized()


def quantize_int8(w: torch.Tensor) -> QuantizedWeight:
    """w [..., out, in] float -> int8 QuantizedWeight, symmetric, one scale per output row."""
    w = w.detach().float()
    amax = w.abs().amax(dim=-1)  # [..., out]
    scale = torch.where(amax > 0, amax / INT8_MAX, torch.ones_like(amax))
    q = torch.clamp(torch.round(w / scale[..., None]), -INT8_MAX, INT8_MAX).to(torch.int8)
    return QuantizedWeight(q, scale)


def to_bf16(w: torch.Tensor) -> QuantizedWeight:
    """w [..., out, in] float -> bf16 QuantizedWeight (round to nearest even)."""
    return QuantizedWeight(w.detach().to(torch.bfloat16))


def reduce_weight(w: torch.Tensor, weights_dtype: str):
    """w [..., out, in] -> its decode copy in weights_dtype (fp32: w itself)."""
    if weights_dtype == "fp32":
        return w
    if weights_dtype == "bf16":
        return to_bf16(w)
    if weights_dtype == "int8":
        return quantize_int8(w)
    raise ValueError(f"weights dtype must be one of {WEIGHTS_DTYPES}, got {weights_dtype!r}")


def matmul(x: torch.Tensor, w: QuantizedWeight) -> torch.Tensor:
    """x [..., in] @ w [out, in]^T -> [..., out] in float32: the stored values widened to fp32,
    multiplied in fp32, then the int8 scale per output."""
    y = x.float() @ w.values().T
    return y if w.scale is None else y * w.scale


class QuantizedLinear(nn.Module):
    """nn.Linear with a reduced-precision weight (the JAX twin keeps its Linear and swaps the
    kernel's value; torch's nn.Linear.forward cannot take a QuantizedWeight)."""

    def __init__(self, linear: nn.Linear, weights_dtype: str):
        super().__init__()
        self.weight = reduce_weight(linear.weight, weights_dtype)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] -> [..., out], computed in fp32, cast back to x's dtype."""
        y = matmul(x, self.weight)
        if self.bias is not None:
            y = y + self.bias.float()
        return y.to(x.dtype)
