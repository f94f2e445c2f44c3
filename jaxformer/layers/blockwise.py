"""Blockwise attention (FlashAttention-2's online softmax in lax ops): INTERFACE STUB.

The stub computes the same function through the plain path's dense mask, so the plumbing
(lowering.py's `attention` switch, AttentionMask through the stacks) can be tested before the
kernel lands. Twin: torch_ref/layers/blockwise.py.
"""
from __future__ import annotations

import jax

from jaxformer.layers import attention as _attention


def blockwise_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask, *, bias=None, scale=None,
                        softcap=None, sinks=None, block_q: int | None = None,
                        block_k: int | None = None) -> jax.Array:
    """softmax(q k^T * scale [softcapped] + bias [+ alibi], masked by `mask`) v, with
    dot_product_attention's semantics (a row with no visible key outputs 0; sinks join every
    denominator). q [B, T, H, K], k [B, S, G, K], v [B, S, G, Kv]; mask an AttentionMask (or
    None = all visible); bias None or broadcastable to [B, H, T, S]; scale None = 1/sqrt(K).
    block_q / block_k: None = lowering.active().attention_blocks. -> [B, T, H, Kv]."""
    dense_bias = None if mask is None else mask.dense_bias()
    bias = dense_bias if bias is None else (bias if dense_bias is None else bias + dense_bias)
    return _attention.dot_product_attention(q, k, v, mask=None if mask is None else mask.dense(), bias=bias,
                                            scale=scale, softcap=softcap, sinks=sinks)
