"""Differential attention (Ye et al. 2024, "Differential Transformer", arXiv 2410.05258): two
softmax maps per head, the second subtracted. Twin: torch_ref/layers/diff_attention.py.

Each head's q and k split into two halves of width K/2 (q1 | q2, k1 | k2); v keeps the full
width K:
    out = (softmax(q1 k1^T s) - lambda softmax(q2 k2^T s)) v,   s = (K/2)^-1/2
    lambda = exp(lambda_q1 . lambda_k1) - exp(lambda_q2 . lambda_k2) + lambda_init
then a per-head RMSNorm over the K outputs (the paper's GroupNorm, `subln`), times
(1 - lambda_init). The two maps are two calls of dot_product_attention with the same mask
record, so every path computes them (plain, blockwise, ring, the KV cache's ring and linear
layouts): (w1 - lambda w2) v = w1 v - lambda w2 v. RoPE rotates each half on its own, K/2 wide,
as the paper's code (multihead_diffattn.py) does. The paper's depth schedule of lambda_init
(0.8 - 0.6 exp(-0.3 depth)) is the caller's: one value per module.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer.config.attention import Dropouts, Projections, Rope, Scores
from jaxformer.layers.attention import MultiHeadAttention, dot_product_attention
from jaxformer.layers.kernels import partitioning
from jaxformer.layers.norm import RMSNorm
from jaxformer.layers.positional import RotaryEmbedding
from jaxformer.layers.scores import ScoreMods


class DifferentialAttention(MultiHeadAttention):
    """MultiHeadAttention whose weights are the difference of two softmax maps (module docstring).

    Args (MultiHeadAttention's, without sinks, q/k norms or attention dropout):
        lambda_init: the constant part of lambda and the output scale's (1 - lambda_init).
        dropout: the dropout on the output (MultiHeadAttention's dropouts.out).
    Params: q/k/v/o_proj as MultiHeadAttention's (head width K, even), lambda_q1, lambda_k1,
    lambda_q2, lambda_k2 [K/2] (N(0, 0.1^2)), subln.scale [K].
    Shapes: x [B, T, D] -> [B, T, D]; weights [B, H, T, S] (w1 - lambda w2).
    """

    def __init__(self, d_model: int, num_heads: int, *, lambda_init: float, num_kv_heads: int | None = None,
                 head_dim: int | None = None, projections: Projections = Projections(),  # noqa: B008 (a frozen dataclass)
                 dropout: float = 0.0, rope: Rope | None = None, scores: Scores = Scores(), rngs: nnx.Rngs):  # noqa: B008 (a frozen dataclass)
        if scores.sinks:
            raise ValueError("differential attention takes no attention sinks")
        super().__init__(d_model, num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, projections=projections,
                         dropouts=Dropouts(out=dropout), scores=scores, rngs=rngs)
        if self.head_dim % 2:
            raise ValueError(f"differential attention splits each head in two halves: head_dim {self.head_dim} is odd")
        half = self.head_dim // 2
        self.lambda_init = lambda_init
        self.scale = half ** -0.5 if scores.scale is None else scores.scale
        if rope:  # each half rotates K/2 wide (the base class's attribute held None: static)
            self.rope = nnx.data(RotaryEmbedding(half, rope.max_len, rope.base, rope.scaling, rope.rotary_dim))
        self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2 = (
            partitioning.param(0.1 * jax.random.normal(rngs.params(), (half,)), (None,)) for _ in range(4))
        self.subln = RMSNorm(self.head_dim, eps=1e-5, rngs=rngs)  # per head, over K

    def rotate(self, x: jax.Array, positions: jax.Array) -> jax.Array:
        """RoPE on each half of x [B, T, n, K] on its own."""
        b, t, n, k = x.shape
        return self.rope(x.reshape(b, t, 2 * n, k // 2), positions).reshape(b, t, n, k)  # [B, T, n, K]

    def attend(self, q, k, v, mask, bias, *, return_weights: bool, head_major: bool, mode: str):
        """1) the two maps' outputs, 2) their difference, 3) the per-head norm, scaled."""
        half = self.head_dim // 2
        kw = dict(mask=mask, bias=bias, scores=ScoreMods(self.scale, self.softcap), return_weights=return_weights,
                  kv_head_major=head_major, mode=mode)
        first = dot_product_attention(q[..., :half], k[..., :half], v, **kw)  # [B, T, H, K]
        second = dot_product_attention(q[..., half:], k[..., half:], v, **kw)
        lam = (jnp.exp(jnp.sum(self.lambda_q1[...] * self.lambda_k1[...]))
               - jnp.exp(jnp.sum(self.lambda_q2[...] * self.lambda_k2[...])) + self.lambda_init)
        (o1, w1), (o2, w2) = (first, second) if return_weights else ((first, None), (second, None))
        out = o1 - (lam * o2).astype(o1.dtype)  # [B, T, H, K]
        out = (self.subln(out) * (1 - self.lambda_init)).astype(o1.dtype)
        return out, None if w1 is None else w1 - lam * w2
