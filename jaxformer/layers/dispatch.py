"""Scaled dot-product attention: the one place that chooses how it is computed. Plain (the
fused kernel, or the explicit ops where weights, dropout, a soft-cap, sinks or the KV-cache
layout need them), blockwise (layers/kernels/blockwise.py, which itself takes Pallas' splash kernel on
a TPU when lowering asks for it) or ring attention over a context axis (layers/kernels/ring.py), as
`lowering.active()` says; with attention "auto" each call's own choice (`choose_attention`: splash
on TPU, cuDNN flash on GPU, blockwise from a measured length on, plain below), noted with its
reason for the compile report. Twin: torch_ref/layers/dispatch.py.

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
import numpy as np
from flax import nnx

from jaxformer import lowering
from jaxformer.layers.kernels.blockwise import blockwise_attention, splash_refusal
from jaxformer.layers.kernels.ring import ring_attention
from jaxformer.layers.kv_cache import TRAIN
from jaxformer.layers.masks import AttentionMask
from jaxformer.layers.scores import ScoreMods, sink_softmax, soft_cap


def dot_product_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, mask: jax.Array | None = None,
                          bias: jax.Array | None = None, scores: ScoreMods = ScoreMods(),  # noqa: B008 (a frozen dataclass)
                          return_weights: bool = False, dropout: nnx.Dropout | None = None,
                          kv_head_major: bool = False, mode: str = TRAIN):
    """softmax(q k^T * scale + bias, masked) v  (Vaswani et al. 2017, eq. 1).

    Args:
        q: [B, T, H, K].  k, v: [B, S, G, K] with H a multiple of G (grouped-query attention);
            v may have a width of its own (MLA's v_head_dim), and so then has the output.
        mask: bool, broadcastable to [B, H, T, S], True = attend; or an AttentionMask (its
            parts), which runs the blockwise path (jaxformer/layers/kernels/blockwise.py), or ring
            attention with a context axis, as `lowering.active()` says; made dense otherwise
            (return_weights, active dropout, a KV cache, attention "plain" without a context axis).
        bias: float, broadcastable to [B, H, T, S], added to the scores (ALiBi, T5, user bias).
        scores: the score modifiers (layers/scores.py ScoreMods): scale (default 1/sqrt(K));
            softcap: scaled scores -> softcap * tanh(scores / softcap) before bias and mask
            (Gemma2's attention logit soft-capping, docs/numerics.md §21), explicit path;
            sinks: [H] logits, one per query head, that join every row's softmax denominator
            as an extra column with no value (gpt-oss's attention sinks, docs/numerics.md §28),
            explicit path: neither jax.nn.dot_product_attention nor cuDNN takes a sink, so any
            fused backend falls back to these XLA ops.
        return_weights: also return the [B, H, T, S] weights (explicit path).
        dropout: applied to the weights; an active dropout forces the explicit path.
        kv_head_major: k, v are [B, G, S, K] (the KV cache layout); takes the explicit path,
            which then needs no transpose of the cache (one step reads it in place).
        mode: the call's kv_cache mode; only a train call's mask goes to a kernel (use_kernel).
    The fused path's kernel is `lowering.active().fused_attention` (lowering.fused_attention's
    backend; None by default: "auto", cuDNN on an NVIDIA GPU where it runs, else XLA): pick
    another with `lowering.tracing(fused_attention=...)`.
    Returns: out [B, T, H, K] (and weights [B, H, T, S]).
    """
    switches = lowering.active()  # how this trace lowers the same maths (jaxformer/lowering.py)
    dropout_active = dropout is not None and dropout.rate > 0 and not dropout.deterministic
    attention = switches.attention
    if attention == "auto":  # this call's kernel, then the call as if it had been asked for
        attention, why = choose_attention(q, k, v, mask, bias=bias, scores=scores, mode=mode,
                                          return_weights=return_weights, dropout_active=dropout_active,
                                          kv_head_major=kv_head_major)
        if attention == "cudnn":
            out, refused = _cudnn_attention(q, k, v, mask, scores.scale)
            if refused is None:
                with lowering.chosen_because(why):
                    lowering.note_kernel("cudnn")
                return out
            attention, why = _without_platform_kernel(k.shape[1], f"cuDNN refused at trace time: {refused}")
        with lowering.chosen_because(why), lowering.tracing(attention=attention):
            return dot_product_attention(q, k, v, mask=mask, bias=bias, scores=scores, return_weights=return_weights,
                                         dropout=dropout, kv_head_major=kv_head_major, mode=mode)
    if use_kernel(mask, attention, switches.context_axis, mode, return_weights=return_weights,
                  dropout_active=dropout_active, kv_head_major=kv_head_major):
        path = ring_attention if switches.context_axis is not None else blockwise_attention
        return path(q, k, v, mask, bias=bias, scale=scores.scale, softcap=scores.softcap, sinks=scores.sinks)
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
    scale = 1.0 / math.sqrt(q.shape[-1]) if scores.scale is None else scores.scale
    softcap, sinks = scores.softcap, scores.sinks
    if sinks is not None and sinks.shape != (num_heads,):
        raise ValueError(f"sinks must be [H] = ({num_heads},), one logit per query head, got {sinks.shape}")
    fused = not return_weights and not dropout_active and not kv_head_major
    if fused and softcap is None and sinks is None:
        return _fused_attention(q, k, v, mask, bias, scale, switches.fused_attention)
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


def choose_attention(q, k, v, mask, *, bias=None, scores: ScoreMods = ScoreMods(), mode: str = TRAIN,  # noqa: B008 (a frozen dataclass)
                     return_weights: bool = False, dropout_active: bool = False,
                     kv_head_major: bool = False) -> tuple[str, str]:
    """Attention "auto"'s choice for one call -> (kernel, why): a lowering attention switch,
    or "cudnn"; deterministic, from the platform being traced for (lowering.platform()), the
    shapes, dtypes and the mask's static parts.
      * a call no kernel takes (use_kernel's rule: a dense mask, a KV cache, its weights asked,
        attention dropout): plain;
      * over a context axis: ring attention (its steps blockwise);
      * TPU: Pallas' splash kernel wherever it takes the call (blockwise.splash_refusal);
      * GPU: cuDNN flash attention through jax.nn.dot_product_attention wherever its rule
        takes the call (cudnn_refusal: bf16/fp16, head dims, a causal or full mask, a causal
        window);
      * otherwise, or where the platform's kernel refuses: blockwise attention from
        lowering.AUTO_BLOCKWISE_MIN_KEYS keys on (faster on CPU from there, and O(T) memory
        everywhere), plain below."""
    dense = not (isinstance(mask, AttentionMask) and mask.parts_only)
    for failed, why in ((dense, "a dense mask"), (mode != TRAIN, "a KV cache"),
                        (return_weights, "the attention weights asked for"), (dropout_active, "attention dropout"),
                        (kv_head_major, "a head-major KV cache")):
        if failed:
            return "plain", f"{why}: only the plain path takes it"
    if lowering.active().context_axis is not None:
        return "blockwise", "the sequence is split over a context axis"
    platform = lowering.platform()
    if platform == "tpu":
        refused = splash_refusal(q, k, v, mask, bias)
        if refused is None:
            return "splash", "the TPU kernel takes this call"
        return _without_platform_kernel(k.shape[1], f"splash refused: {refused}")
    if platform == "gpu":
        refused = cudnn_refusal(q, k, v, mask, bias, scores.softcap, scores.sinks)
        if refused is None:
            return "cudnn", "cuDNN flash attention takes this call"
        return _without_platform_kernel(k.shape[1], f"cuDNN refused: {refused}")
    return _without_platform_kernel(k.shape[1], None)


def _without_platform_kernel(keys: int, refused: str | None) -> tuple[str, str]:
    """Blockwise from AUTO_BLOCKWISE_MIN_KEYS keys on, plain below; `refused`: why the
    platform's own kernel did not take the call."""
    limit = lowering.AUTO_BLOCKWISE_MIN_KEYS
    choice, rel = ("blockwise", ">=") if keys >= limit else ("plain", "<")
    return choice, (f"{refused}; " if refused else "") + f"{keys} keys {rel} {limit}"


def cudnn_refusal(q, k, v, mask: AttentionMask, bias, softcap, sinks) -> str | None:
    """Why cuDNN flash attention (jax.nn.dot_product_attention, implementation "cudnn") would
    not take this call as "auto" passes it (is_causal and a causal window, no dense mask), or
    None: its dtypes (bf16 / fp16), head dims (equal, at most 128 and a multiple of 8: every
    GPU's; Hopper's 256 is not assumed), and a mask of the default slots with no padding,
    segments, bias, ALiBi, soft-cap or sinks."""
    t, d = q.shape[1], q.shape[3]
    s = k.shape[1]
    window = _concrete(mask.window)
    checks = (
        (q.dtype not in (jnp.bfloat16, jnp.float16), f"dtype {q.dtype} (bf16 / fp16 only)"),
        (v.shape[-1] != d, "value head dim differs"),
        (d > 128 or d % 8, f"head dim {d}"),
        (bias is not None or mask.alibi_slopes is not None, "attention bias"),
        (softcap is not None, "soft-cap"),
        (sinks is not None, "sinks"),
        (mask.k_valid is not None, "key padding"),
        (mask.q_segments is not None, "segment ids"),
        (not (_default(mask.q_slots, t) and _default(mask.k_slots, s)), "slots not 0..T-1"),
        (mask.window is not None and window is None, "traced window"),
        (window is not None and not mask.causal, "a window without the causal mask"),
        (mask.causal and t != s, "causal with queries and keys of different lengths"),
    )
    for failed, why in checks:
        if failed:
            return why
    return None


def _concrete(x):
    """x as NumPy when known at trace time, else None."""
    if x is None or isinstance(x, np.ndarray):
        return x
    try:
        return np.asarray(x)
    except jax.errors.TracerArrayConversionError:
        return None


def _default(slots, n: int) -> bool:
    slots = _concrete(slots)
    return slots is not None and slots.shape[-1] == n and bool((slots.reshape(-1, n) == np.arange(n)).all())


def _cudnn_attention(q, k, v, mask: AttentionMask, scale):
    """cuDNN flash attention with the mask as is_causal (and a causal window) -> (out, None),
    or (None, why) where it refuses at trace time (no cuDNN, a shape its kernels lack)."""
    window = _concrete(mask.window)
    try:
        out = lowering.fused_attention(q, k, v, scale=scale, backend="cudnn", is_causal=mask.causal,
                                       local_window_size=None if window is None else (int(window) - 1, 0))
    except (ValueError, NotImplementedError, RuntimeError) as e:
        return None, (str(e).strip().splitlines() or [type(e).__name__])[0][:120]
    return out, None


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
