"""Differential attention (Ye et al. 2024, arXiv 2410.05258): two softmax maps per head, the
second subtracted (see the JAX twin, jaxformer/layers/diff_attention.py)."""
from __future__ import annotations

import torch
from torch import nn

from jaxformer.config.attention import Dropouts, Projections, Rope, Scores
from torch_ref.layers.attention import MultiHeadAttention, dot_product_attention
from torch_ref.layers.norm import RMSNorm
from torch_ref.layers.positional import RotaryEmbedding
from torch_ref.layers.scores import ScoreMods


class DifferentialAttention(MultiHeadAttention):
    """MultiHeadAttention whose weights are the difference of two softmax maps; lambda_init:
    lambda's constant part and the output scale's (1 - lambda_init); dropout: the dropout on the
    output (MultiHeadAttention's dropouts.out). Params: lambda_q1, lambda_k1, lambda_q2,
    lambda_k2 [K/2], subln.weight [K]."""

    def __init__(self, d_model: int, num_heads: int, *, lambda_init: float, num_kv_heads: int | None = None,
                 head_dim: int | None = None, projections: Projections = Projections(),  # noqa: B008 (a frozen dataclass)
                 dropout: float = 0.0, rope: Rope | None = None, scores: Scores = Scores()):  # noqa: B008 (a frozen dataclass)
        if scores.sinks:
            raise ValueError("differential attention takes no attention sinks")
        super().__init__(d_model, num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, projections=projections,
                         dropouts=Dropouts(out=dropout), scores=scores)
        if self.head_dim % 2:
            raise ValueError(f"differential attention splits each head in two halves: head_dim {self.head_dim} is odd")
        half = self.head_dim // 2
        self.lambda_init = lambda_init
        self.scale = half ** -0.5 if scores.scale is None else scores.scale
        self.rope = RotaryEmbedding(half, rope.max_len, rope.base, rope.scaling, rope.rotary_dim) if rope else None
        self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2 = (
            nn.Parameter(0.1 * torch.randn(half)) for _ in range(4))
        self.subln = RMSNorm(self.head_dim, eps=1e-5)  # per head, over K

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """RoPE on each half of x [B, T, n, K] on its own."""
        b, t, n, k = x.shape
        return self.rope(x.reshape(b, t, 2 * n, k // 2), positions).reshape(b, t, n, k)  # [B, T, n, K]

    def attend(self, q, k, v, mask, bias, *, return_weights: bool, mode: str):
        """1) the two maps' outputs, 2) their difference, 3) the per-head norm, scaled."""
        half = self.head_dim // 2
        kw = dict(mask=mask, bias=bias, scores=ScoreMods(self.scale, self.softcap), return_weights=return_weights,
                  mode=mode)
        first = dot_product_attention(q[..., :half], k[..., :half], v, **kw)  # [B, T, H, K]
        second = dot_product_attention(q[..., half:], k[..., half:], v, **kw)
        lam = (torch.exp(torch.sum(self.lambda_q1 * self.lambda_k1))
               - torch.exp(torch.sum(self.lambda_q2 * self.lambda_k2)) + self.lambda_init)
        (o1, w1), (o2, w2) = (first, second) if return_weights else ((first, None), (second, None))
        out = o1 - (lam * o2).to(o1.dtype)  # [B, T, H, K]
        out = (self.subln(out) * (1 - self.lambda_init)).to(o1.dtype)
        return out, None if w1 is None else w1 - lam * w2
