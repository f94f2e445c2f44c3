"""Blockwise attention, the torch twin of jaxformer/layers/blockwise.py: INTERFACE STUB (the
plain path on the dense mask) until the kernel lands."""
from __future__ import annotations

import torch

from torch_ref.layers import attention as _attention


def blockwise_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask, *, bias=None, scale=None,
                        softcap=None, sinks=None, block_q: int | None = None,
                        block_k: int | None = None) -> torch.Tensor:
    """jaxformer/layers/blockwise.py's function in torch. q [B, T, H, K], k [B, S, G, K],
    v [B, S, G, Kv]; mask a torch_ref AttentionMask (or None). -> [B, T, H, Kv]."""
    dense_bias = None if mask is None else mask.dense_bias()
    bias = dense_bias if bias is None else (bias if dense_bias is None else bias + dense_bias)
    return _attention.dot_product_attention(q, k, v, mask=None if mask is None else mask.dense(), bias=bias,
                                            scale=scale, softcap=softcap, sinks=sinks)
