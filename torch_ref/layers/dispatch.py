"""Scaled dot-product attention: the one place that chooses how it is computed. Plain (torch's
fused SDPA, or the explicit ops where weights, a soft-cap or sinks need them) or blockwise
(layers/kernels/blockwise.py), as `lowering.active()` says. Twin: jaxformer/layers/dispatch.py (which
also has ring attention over a context axis). Masks are boolean, True = may attend; a row with
no visible key outputs exactly 0 (with attention sinks too: the sink takes all its weight)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from torch_ref import lowering
from torch_ref.layers.kernels.blockwise import blockwise_attention
from torch_ref.layers.kv_cache import TRAIN
from torch_ref.layers.masks import AttentionMask
from torch_ref.layers.scores import ScoreMods, sink_softmax, soft_cap


def dot_product_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                          mask: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                          scores: ScoreMods = ScoreMods(), return_weights: bool = False,  # noqa: B008 (a frozen dataclass)
                          dropout: nn.Dropout | None = None, mode: str = TRAIN):
    """softmax(q k^T * scale + bias, masked) v.

    Args: q [B, T, H, K]; k, v [B, S, G, K]; mask bool / bias float broadcastable to [B, H, T, S].
    scores: the score modifiers (layers/scores.py ScoreMods): scale (default 1/sqrt(K));
    softcap: scaled scores -> softcap * tanh(scores / softcap) before bias and mask (Gemma2,
    docs/numerics.md §21), explicit path; sinks: [H] logits, one per query head, an extra
    softmax column with no value (gpt-oss, docs/numerics.md §28), explicit path (SDPA takes no sink).
    mode: the call's kv_cache mode; only a train call's mask goes to a kernel (use_kernel).
    Returns: out [B, T, H, K] (and weights [B, H, T, S]).
    """
    dropout_active = dropout is not None and dropout.p > 0 and dropout.training
    attention = lowering.active().attention
    if attention == "auto":  # jaxformer's rule where the platform has no kernel of its own
        attention = "blockwise" if k.shape[1] >= lowering.AUTO_BLOCKWISE_MIN_KEYS and not dropout_active else "plain"
    if use_kernel(mask, attention, None, mode, return_weights=return_weights,
                  dropout_active=dropout_active, kv_head_major=False):
        return blockwise_attention(q, k, v, mask, bias=bias, scale=scores.scale, softcap=scores.softcap,
                                   sinks=scores.sinks)
    mask, bias = dense_mask(mask, bias)
    if mask is not None:
        if mask.dtype != torch.bool:
            raise TypeError(f"mask must be boolean (True = attend), got {mask.dtype}; "
                            "pass additive scores as bias=")
        mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    if bias is not None:
        bias = bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape))
    num_heads, num_kv = q.shape[2], k.shape[2]
    if num_heads % num_kv:
        raise ValueError(f"query heads {num_heads} are not a multiple of key/value heads {num_kv}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scores.scale is None else scores.scale
    softcap, sinks = scores.softcap, scores.sinks
    if sinks is not None and tuple(sinks.shape) != (num_heads,):
        raise ValueError(f"sinks must be [H] = ({num_heads},), one logit per query head, got {tuple(sinks.shape)}")
    if not return_weights and softcap is None and sinks is None:
        return _fused_attention(q, k, v, mask, bias, scale, dropout.p if dropout_active else 0.0)
    return _explicit_attention(q, k, v, mask, bias, scale, softcap, sinks, dropout if dropout_active else None,
                               return_weights)


def use_kernel(mask, attention: str, context_axis, mode: str, *, return_weights: bool, dropout_active: bool,
               kv_head_major: bool) -> bool:
    """The one "dense or parts" rule (both trees; torch has no context axis: None): a train
    call's AttentionMask of parts alone goes to the blockwise kernel unless the lowering asks
    for plain attention, or the call needs the plain path's weights or reads a cache in place."""
    if not (isinstance(mask, AttentionMask) and mask.parts_only and mode == TRAIN):
        return False
    if attention == "plain" and context_axis is None:
        return False
    if dropout_active:
        raise ValueError("blockwise attention does not apply attention dropout; set the model's "
                         "attention dropout to 0 or use attention: plain")
    return not (return_weights or kv_head_major)


def dense_mask(mask, bias):
    """(mask, bias) as the plain path takes them: an AttentionMask made dense (None: nothing
    masked) and its ALiBi bias added to `bias`; any other mask as it is."""
    if not isinstance(mask, AttentionMask):
        return mask, bias
    extra = mask.dense_bias()
    return mask.dense(), extra if bias is None else (bias if extra is None else bias + extra)


def _fused_attention(q, k, v, mask, bias, scale: float, dropout_p: float):
    """1) fused path (SDPA); bias and mask merged by filling, never adding, min values; a row
    with no visible key zeroed. Masks and bias are 4-D here."""
    visible = None if mask is None else mask.any(dim=-1, keepdim=True)  # [B?, H?, T, 1]
    attn_mask = None
    fill = torch.finfo(q.dtype).min  # in q's dtype: float32's min overflows bf16 (autocast)
    if bias is not None:
        attn_mask = bias.to(q.dtype)
        if mask is not None:
            attn_mask = attn_mask.masked_fill(~mask, fill)
    elif mask is not None:
        attn_mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, fill)
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=attn_mask,
        dropout_p=dropout_p, scale=scale, enable_gqa=k.shape[2] != q.shape[2]).transpose(1, 2)  # [B, T, H, K]
    if visible is not None:
        out = out * visible.expand(visible.shape[:2] + (q.shape[1], 1)).transpose(1, 2).to(out.dtype)
    return out


def _explicit_attention(q, k, v, mask, bias, scale: float, softcap, sinks, dropout, return_weights: bool):
    """2) explicit path: scores, soft-cap, bias, mask fill, softmax (with sinks), zero masked
    weights, dropout (`dropout`: the active module or None), weighted sum."""
    num_heads, num_kv = q.shape[2], k.shape[2]
    if num_kv != num_heads:
        k = k.repeat_interleave(num_heads // num_kv, dim=2)  # [B, S, H, K]
        v = v.repeat_interleave(num_heads // num_kv, dim=2)
    scores = torch.einsum("bthk,bshk->bhts", q, k).float() * scale  # [B, H, T, S]
    scores, _ = soft_cap(scores, softcap)
    if bias is not None:
        scores = scores + bias.float()
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(torch.float32).min)
    weights = sink_softmax(scores, sinks)  # [B, H, T, S]
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)  # fully masked rows -> 0
    weights = weights.to(v.dtype)
    if dropout is not None:
        weights = dropout(weights)
    out = torch.einsum("bhts,bshk->bthk", weights, v)  # [B, T, H, K]
    return (out, weights) if return_weights else out
