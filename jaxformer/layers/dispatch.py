"""Scaled dot-product attention: the one place that chooses how it is computed. Plain (the
fused kernel, or the explicit ops where weights, dropout, a soft-cap, sinks or the KV-cache
layout need them), blockwise (layers/kernels/blockwise.py, which itself takes Pallas' splash kernel on
a TPU when lowering asks for it) or ring attention over a context axis (layers/kernels/ring.py), as
`lowering.active()` says. Twin: torch_ref/layers/dispatch.py.

Masks are boolean, True = may attend, broadcastable to [B, H, T, S], or an AttentionMask (the
mask's parts) for the blockwise and ring paths. A query row with no visible key outputs exactly
0 (never NaN, never the mean of V), in both frameworks; with attention sinks (gpt-oss) such a
row gives all its weight to the sink, so it outputs 0 too (docs/numerics.md §4, §28). Score
modifiers (soft-cap, sinks, ALiBi) come from layers/scores.py on every path.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer import lowering
from jaxformer.layers.kernels.blockwise import blockwise_attention
from jaxformer.layers.kernels.ring import ring_attention
from jaxformer.layers.kv_cache import TRAIN
from jaxformer.layers.masks import AttentionMask
from jaxformer.layers.scores import sink_softmax, soft_cap


def dot_product_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, mask: jax.Array | None = None,
                          bias: jax.Array | None = None, scale: float | None = None,
                          return_weights: bool = False, dropout: nnx.Dropout | None = None,
                          kv_head_major: bool = False, implementation: str | None = None,
                          softcap: float | None = None, sinks: jax.Array | None = None, mode: str = TRAIN):
    """softmax(q k^T * scale + bias, masked) v  (Vaswani et al. 2017, eq. 1).

    Args:
        q: [B, T, H, K].  k, v: [B, S, G, K] with H a multiple of G (grouped-query attention);
            v may have a width of its own (MLA's v_head_dim), and so then has the output.
        mask: bool, broadcastable to [B, H, T, S], True = attend; or an AttentionMask (its
            parts), which runs the blockwise path (jaxformer/layers/kernels/blockwise.py), or ring
            attention with a context axis, as `lowering.active()` says; made dense otherwise
            (return_weights, active dropout, a KV cache, attention "plain" without a context axis).
        bias: float, broadcastable to [B, H, T, S], added to the scores (ALiBi, T5, user bias).
        scale: default 1/sqrt(K).
        return_weights: also return the [B, H, T, S] weights (explicit path).
        dropout: applied to the weights; an active dropout forces the explicit path.
        kv_head_major: k, v are [B, G, S, K] (the KV cache layout); takes the explicit path,
            which then needs no transpose of the cache (one step reads it in place).
        implementation: kernel of the fused path (lowering.fused_attention's backend); None =
            `lowering.active().fused_attention` (itself None by default: "auto", cuDNN on an
            NVIDIA GPU where it runs, else XLA).
        softcap: scaled scores -> softcap * tanh(scores / softcap) before bias and mask
            (Gemma2's attention logit soft-capping, docs/numerics.md §21); explicit path.
        sinks: [H] logits, one per query head, that join every row's softmax denominator as an
            extra column with no value (gpt-oss's attention sinks, docs/numerics.md §28). The
            explicit path: neither jax.nn.dot_product_attention nor cuDNN takes a sink, so any
            `implementation` falls back to these XLA ops.
        mode: the call's kv_cache mode; only a train call's mask goes to a kernel (use_kernel).
    Returns: out [B, T, H, K] (and weights [B, H, T, S]).
    """
    switches = lowering.active()  # how this trace lowers the same maths (jaxformer/lowering.py)
    dropout_active = dropout is not None and dropout.rate > 0 and not dropout.deterministic
    if use_kernel(mask, switches.attention, switches.context_axis, mode, return_weights=return_weights,
                  dropout_active=dropout_active, kv_head_major=kv_head_major):
        path = ring_attention if switches.context_axis is not None else blockwise_attention
        return path(q, k, v, mask, bias=bias, scale=scale, softcap=softcap, sinks=sinks)
    mask, bias = dense_mask(mask, bias)
    if mask is not None:
        if mask.dtype != jnp.bool_:
            raise TypeError(f"mask must be boolean (True = attend), got {mask.dtype}; "
                            "pass additive scores as bias=")
        mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)  # -> 4-D
    if bias is not None:
        bias = bias.reshape((1,) * (4 - bias.ndim) + bias.shape)
    num_heads, num_kv = q.shape[2], k.shape[1 if kv_head_major else 2]
    if num_heads % num_kv:
        raise ValueError(f"query heads {num_heads} are not a multiple of key/value heads {num_kv}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if sinks is not None and sinks.shape != (num_heads,):
        raise ValueError(f"sinks must be [H] = ({num_heads},), one logit per query head, got {sinks.shape}")
    fused = not return_weights and not dropout_active and not kv_head_major
    if fused and softcap is None and sinks is None:
        return _fused_attention(q, k, v, mask, bias, scale, switches.fused_attention if implementation is None
                                else implementation)
    elementwise = kv_head_major and q.shape[1] == 1 and switches.elementwise_attention
    return _explicit_attention(q, k, v, mask, bias, scale, softcap, sinks, dropout if dropout_active else None,
                               return_weights, kv_head_major, elementwise)


def use_kernel(mask, attention: str, context_axis, mode: str, *, return_weights: bool, dropout_active: bool,
               kv_head_major: bool) -> bool:
    """The one "dense or parts" rule (both trees): a train call's AttentionMask of parts alone
    goes to the kernel the lowering asks for (attention blockwise / splash, or ring attention
    over a context axis), unless the call needs what only the plain path has (its weights) or
    reads a cache in place (kv_head_major). Every other mask becomes dense (dense_mask)."""
    if not (isinstance(mask, AttentionMask) and mask.parts_only and mode == TRAIN):
        return False
    if attention == "plain" and context_axis is None:
        return False
    if dropout_active:
        raise ValueError("blockwise attention does not apply attention dropout (it would need "
                         "the plain path's [B, H, T, S] random mask); set the model's "
                         "attention dropout to 0 or use attention: plain")
    return not (return_weights or kv_head_major)


def dense_mask(mask, bias):
    """(mask, bias) as the plain path takes them: an AttentionMask made dense (None: nothing
    masked) and its ALiBi bias added to `bias`; any other mask as it is."""
    if not isinstance(mask, AttentionMask):
        return mask, bias
    extra = mask.dense_bias()
    return mask.dense(), extra if bias is None else (bias if extra is None else bias + extra)


def _fused_attention(q, k, v, mask, bias, scale: float, backend: str | None):
    """1) fused path (cuDNN / XLA); it returns mean(V) on a fully masked row, so zero it. Masks
    and bias are 4-D here. XLA's form rounds as the explicit path does: under jit the two give
    the same bits, outputs and gradients (docs/numerics.md §44)."""
    visible = None if mask is None else jnp.any(mask, axis=-1, keepdims=True)  # [B?, H?, T, 1]
    if mask is not None:
        mask = jnp.broadcast_to(mask, mask.shape[:2] + (q.shape[1], k.shape[1]))
    # the fused kernels take one head width: zero columns pad the narrower of q/k and v
    # (they add 0 to every score and sum; MLA's v_head_dim differs from its qk width)
    d_qk, d_v = q.shape[-1], v.shape[-1]
    width = max(d_qk, d_v)
    pad = lambda a: a if a.shape[-1] == width else jnp.pad(a, ((0, 0),) * 3 + ((0, width - a.shape[-1]),))
    lowering.note_kernel(f"plain (fused: {backend or 'auto'})")
    out = lowering.fused_attention(pad(q), pad(k), pad(v), bias=bias, mask=mask, scale=scale,
                                   backend=backend)[..., :d_v]
    if visible is not None:
        out = out * jnp.swapaxes(jnp.broadcast_to(visible, visible.shape[:2] + (q.shape[1], 1)),
                                 1, 2).astype(out.dtype)  # [B, T, H?, 1]
    return out


def _explicit_attention(q, k, v, mask, bias, scale: float, softcap, sinks, dropout, return_weights: bool,
                        kv_head_major: bool, elementwise: bool):
    """2) explicit path: scores, soft-cap, bias, mask fill, softmax (with sinks), zero masked
    weights, dropout (`dropout`: the active module or None), weighted sum. Query head h reads
    key/value head h // R (R = H / G query heads per group). elementwise: one query over the
    cache (lowering's elementwise_attention) as a broadcast multiply and a sum over the cache
    axis instead of two dots, which XLA:CPU feeds with copies of the cache."""
    lowering.note_kernel("plain (explicit)")
    if not kv_head_major:
        k, v = jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)  # [B, G, S, K]
    b, t, num_heads, d = q.shape
    num_kv, s = k.shape[1], k.shape[2]
    r = num_heads // num_kv
    q = q.reshape(b, t, num_kv, r, d)  # [B, T, G, R, K]
    if elementwise:  # one query: sum_k q k, read from the cache in place, products and sums in fp32
        q_bgr = jnp.swapaxes(q, 1, 2)[:, :, :, :, None, :].astype(jnp.float32)  # [B, G, R, 1, 1, K]
        scores = jnp.sum(q_bgr * k[:, :, None, None].astype(jnp.float32), axis=-1) * scale  # [B, G, R, 1, S]
    else:
        scores = jnp.einsum("btgrk,bgsk->bgrts", q, k).astype(jnp.float32) * scale  # [B, G, R, T, S]
    scores = scores.reshape(b, num_heads, t, s)  # [B, H, T, S]
    scores, _ = soft_cap(scores, softcap)
    if bias is not None:
        scores = scores + bias.astype(jnp.float32)
    if mask is not None:
        scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
    weights = sink_softmax(scores, sinks)  # [B, H, T, S]
    if mask is not None:
        weights = jnp.where(mask, weights, 0.0)  # fully masked rows -> 0
    weights = weights.astype(v.dtype)
    if dropout is not None:
        weights = dropout(weights)
    if elementwise:  # sum_s w v, read from the cache in place, in fp32
        out = jnp.sum(weights.reshape(b, num_kv, r, t, s, 1).astype(jnp.float32)
                      * v[:, :, None, None].astype(jnp.float32), axis=-2).astype(v.dtype)  # [B, G, R, 1, K]
        out = jnp.moveaxis(out, 3, 1)  # [B, 1, G, R, K]
    else:
        out = jnp.einsum("bgrts,bgsk->btgrk", weights.reshape(b, num_kv, r, t, s), v)  # [B, T, G, R, K]
    out = out.reshape(b, t, num_heads, v.shape[-1])  # [B, T, H, K] (K of v)
    return (out, weights) if return_weights else out
