"""Scaled dot-product attention and multi-head attention (self, cross, GQA); the masks live in
layers/masks.py (re-exported here). `dot_product_attention` is the one place that chooses the
path: plain (fused or explicit), blockwise or ring. Twin: torch_ref/layers/attention.py.

Masks are boolean, True = may attend, broadcastable to [B, H, T, S]. Masks are combined as
booleans before they touch the scores (docs/numerics.md §4). A query row with no visible key
outputs exactly 0 (never NaN, never the mean of V), in both frameworks. With attention sinks
(gpt-oss) such a row gives all its weight to the sink, so it outputs 0 too (docs/numerics.md §28).

How the same maths is lowered is chosen at trace time by jaxformer/lowering.py: the backend
of the fused path, and the one-token form over a KV cache that reads the cache in place on
XLA:CPU (measured figures: bench/README.md, "Decode layout on CPU").
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer import lowering
from jaxformer.layers import partitioning
from jaxformer.layers.blockwise import blockwise_attention
from jaxformer.layers.linear import Linear
from jaxformer.layers.masks import (  # noqa: F401
    AttentionMask,
    alibi_block,
    combine_masks,
    make_causal_mask,
    make_padding_mask,
    make_segment_mask,
    make_sliding_window_mask,
)
from jaxformer.layers.norm import make_norm
from jaxformer.layers.positional import RotaryEmbedding, default_positions
from jaxformer.layers.ring import ring_attention
from jaxformer.layers.scores import sink_softmax, soft_cap


# ----------------------------------------------------------------------------- core
def dot_product_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, mask: jax.Array | None = None,
                          bias: jax.Array | None = None, scale: float | None = None,
                          return_weights: bool = False, dropout: nnx.Dropout | None = None,
                          kv_head_major: bool = False, implementation: str | None = None,
                          softcap: float | None = None, sinks: jax.Array | None = None):
    """softmax(q k^T * scale + bias, masked) v  (Vaswani et al. 2017, eq. 1).

    Args:
        q: [B, T, H, K].  k, v: [B, S, G, K] with H a multiple of G (grouped-query attention);
            v may have a width of its own (MLA's v_head_dim), and so then has the output.
        mask: bool, broadcastable to [B, H, T, S], True = attend; or an AttentionMask (its
            parts), which runs the blockwise path (jaxformer/layers/blockwise.py), or ring
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
    Returns: out [B, T, H, K] (and weights [B, H, T, S]).
    """
    switches = lowering.active()  # how this trace lowers the same maths (jaxformer/lowering.py)
    dropout_active = dropout is not None and dropout.rate > 0 and not dropout.deterministic
    if isinstance(mask, AttentionMask):  # the parts of a mask (blockwise / ring paths)
        dense = switches.attention == "plain" and switches.context_axis is None
        if not (return_weights or dropout_active or kv_head_major or dense):
            path = ring_attention if switches.context_axis is not None else blockwise_attention
            return path(q, k, v, mask, bias=bias, scale=scale, softcap=softcap, sinks=sinks)
        if dropout_active and not dense:
            raise ValueError("blockwise attention does not apply attention dropout (it would need "
                             "the plain path's [B, H, T, S] random mask); set the model's "
                             "attention dropout to 0 or use attention: plain")
        mask, extra = mask.dense(), mask.dense_bias()
        bias = extra if bias is None else (bias if extra is None else bias + extra)
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


def _fused_attention(q, k, v, mask, bias, scale: float, backend: str | None):
    """1) fused path (cuDNN / XLA); it returns mean(V) on a fully masked row, so zero it. Masks
    and bias are 4-D here."""
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


def key_projection(linear: Linear, x: jax.Array, *, rotated: bool = False) -> jax.Array:
    """x @ W_k + b_k, with the gradient of b_k cut where that is exact (docs/numerics.md §15).

    The key bias adds q . b_k to every score of a query row, which softmax cancels: its true
    gradient is exactly 0 and its computed one pure rounding noise (~1e-9). Adam divides that
    noise by its own RMS and takes lr-sized random steps, so two frameworks (or two BLAS
    builds) drift apart by ~lr per step on b_k alone while every output stays identical.
    Cutting the gradient is exact and keeps b_k a plain, convertible parameter. Scores that
    add a bias independent of b_k (ALiBi, T5, Swin's table, masks) keep q . b_k constant.

    rotated: the keys are rotated per position afterwards (RoPE). q . R_s b_k then varies with
    the key position s, the true gradient is not 0 and the bias keeps it (not cut).
    """
    return linear(x, stop_bias_gradient=not rotated)


class MultiHeadAttention(nnx.Module):
    """Multi-head attention with separate q/k/v/o projections (docs/numerics.md §8), grouped-query
    attention and optional rotary positions.

    Args:
        d_model: D.  num_heads: H.  num_kv_heads: G (<= H, divides H); None = H.
        head_dim: K; None = D // H.  bias: biases on the q/k/v projections (and on o_proj when
            out_bias is None).  out_bias: the o_proj bias; None = bias.
        attn_dropout: dropout on the attention weights.  dropout: dropout on the output.
        rope_max_len: enable RoPE for self-attention with tables of this length.
        rope_base: RoPE base.  rope_scaling: a RopeScaling or None (docs/numerics.md §20).
        qk_norm: a norm kind ("rmsnorm", Qwen3) applied per head to q and k before RoPE, with
            eps norm_eps; None = none.
        qk_norm_full: the qk_norm is one norm over all heads' q (H * K) and k (G * K), applied
            before the head split (OLMo 2, docs/numerics.md §35); False = per head.
        rotary_dim: RoPE rotates the first rotary_dim dims of each head; None = all (§35).
        scale: score scale; None = 1/sqrt(K) (T5 uses 1).
        kdim, vdim: input widths of k_proj and v_proj; None = D (torch.nn.MultiheadAttention's
            kdim / vdim, for keys and values that come from a stream of another width).
        add_bias_kv: append one learned key slot `bias_k` and value slot `bias_v` ([G * K]) to
            the projected keys and values, always visible (nn.MultiheadAttention's add_bias_kv).
        add_zero_attn: then append one all-zero key and value slot, always visible (score 0).
        softcap: attention logit soft-capping (Gemma2), see dot_product_attention.
        sinks: a learned per-head logit `sinks` [H] in every softmax denominator (gpt-oss's
            attention sinks, HF `self_attn.sinks`), see dot_product_attention.
    Shapes: x [B, T, D], kv [B, S, kdim] (None = self-attention), value [B, S, vdim] (None =
    kv) -> [B, T, D]. The appended slots extend S by one each; mask and bias get them visible.

    KV cache (incremental decoding), a dict {"k", "v"} of head-major [B, G, L, K] arrays (the
    layout a decode step reads without a transpose; bench/README.md):
      * with cache_index (int scalar, may be traced): self-attention decode step. The new
        keys/values (RoPE'd at `positions`) are written into slots cache_index..cache_index+T
        and the queries attend over all L slots; `mask` must hide the unwritten ones.
      * without cache_index: a read-only cache, e.g. cross-attention keys/values projected
        once from the encoder memory by `project_kv`; `kv` is then not used.
      * rolling=True (a sliding-window layer): the cache is a ring of W slots; absolute slot a
        lives in ring slot a % W. One new token is written first and attends over the ring (the
        slot it overwrites is W back, just out of the window); T > 1 new tokens attend over the
        ring followed by themselves ([B, W + T] keys), then their last min(T, W) are written.
        `mask` covers those keys (Decoder.rolling_inputs).
    With a cache the call returns (out, new_cache).
    """

    def __init__(self, d_model: int, num_heads: int, *, num_kv_heads: int | None = None,
                 head_dim: int | None = None, bias: bool = True, attn_dropout: float = 0.0,
                 dropout: float = 0.0, rope_max_len: int | None = None, rope_base: float = 10000.0,
                 scale: float | None = None, out_bias: bool | None = None, rope_scaling=None,
                 qk_norm: str | None = None, norm_eps: float = 1e-6, kdim: int | None = None,
                 vdim: int | None = None, add_bias_kv: bool = False, add_zero_attn: bool = False,
                 softcap: float | None = None, sinks: bool = False, qk_norm_full: bool = False,
                 rotary_dim: int | None = None,
                 rngs: nnx.Rngs):
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if head_dim is None:
            if d_model % num_heads:
                raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
            head_dim = d_model // num_heads
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")
        if rope_max_len and (add_bias_kv or add_zero_attn):
            raise ValueError("add_bias_kv / add_zero_attn append key slots that have no position; "
                             "they cannot be combined with RoPE (rope_max_len)")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale, self.softcap = scale, softcap
        self.q_proj = Linear(d_model, num_heads * head_dim, use_bias=bias, axes=("embed", "heads"), rngs=rngs)
        self.k_proj = Linear(d_model if kdim is None else kdim, num_kv_heads * head_dim, use_bias=bias,
                             axes=("embed", "heads"), rngs=rngs)
        self.v_proj = Linear(d_model if vdim is None else vdim, num_kv_heads * head_dim, use_bias=bias,
                             axes=("embed", "heads"), rngs=rngs)
        # learned key/value slots appended after the projected keys/values (add_bias_kv), [G * K]
        self.bias_k = partitioning.param(0.02 * jax.random.normal(rngs.params(), (num_kv_heads * head_dim,)),
                                         (None,)) if add_bias_kv else None
        self.bias_v = partitioning.param(0.02 * jax.random.normal(rngs.params(), (num_kv_heads * head_dim,)),
                                         (None,)) if add_bias_kv else None
        self.add_zero_attn = add_zero_attn
        # one learned logit per query head in every softmax denominator (gpt-oss), [H]
        self.sinks = partitioning.param(0.02 * jax.random.normal(rngs.params(), (num_heads,)),
                                        (None,)) if sinks else None
        self.o_proj = Linear(num_heads * head_dim, d_model, use_bias=bias if out_bias is None else out_bias,
                             axes=("heads", "embed"), rngs=rngs)
        # norms of q and k before RoPE: per head (Qwen3), weights [K]; or over all heads at
        # once (qk_norm_full, OLMo 2), weights [H * K] and [G * K]
        self.qk_norm_full = qk_norm_full
        q_width, k_width = (num_heads * head_dim, num_kv_heads * head_dim) if qk_norm_full else (head_dim, head_dim)
        self.q_norm = make_norm(qk_norm, q_width, eps=norm_eps, bias=False, rngs=rngs) if qk_norm else None
        self.k_norm = make_norm(qk_norm, k_width, eps=norm_eps, bias=False, rngs=rngs) if qk_norm else None
        self.rope = (RotaryEmbedding(head_dim, rope_max_len, rope_base, rope_scaling, rotary_dim)
                     if rope_max_len else None)
        self.attn_dropout = nnx.Dropout(attn_dropout, rngs=rngs)
        self.dropout = nnx.Dropout(dropout, rngs=rngs)

    def project_kv(self, kv: jax.Array, value: jax.Array | None = None) -> dict:
        """Keys of kv [B, S, kdim] and values of value [B, S, vdim] (None = kv)
        -> {"k", "v"}: [B, S, G, K] (no RoPE, no appended slots)."""
        b, s, _ = kv.shape
        # step 2 of __call__ rotates these keys; a k_norm is not linear in b_k either
        rotated = self.rope is not None or self.k_norm is not None
        # the slots of step 2c carry no b_k, so softmax does not cancel q . b_k (§23)
        rotated = rotated or self.bias_k is not None or self.add_zero_attn
        k = self.split_heads(key_projection(self.k_proj, kv, rotated=rotated), self.k_norm,
                             self.num_kv_heads)  # [B, S, G, K]
        value = kv if value is None else value
        return {"k": k, "v": self.v_proj(value).reshape(b, s, self.num_kv_heads, self.head_dim)}  # [B, S, G, K]

    def split_heads(self, x, norm, heads: int):
        """x [B, S, n * K] -> [B, S, n, K] (n = heads), normed by `norm` (None = none) over
        the full width before the split (qk_norm_full) or per head after it."""
        b, s, _ = x.shape
        if norm is not None and self.qk_norm_full:
            x = norm(x)
        x = x.reshape(b, s, heads, self.head_dim)  # [B, S, n, K]
        return x if norm is None or self.qk_norm_full else norm(x)

    def append_slots(self, k: jax.Array, v: jax.Array, mask, bias):
        """k, v [B, S, G, K] -> [B, S + n, G, K] with the bias_k/bias_v slot, then the zero slot
        (torch's order); mask and bias (broadcastable to [B, H, T, S]) get the n new keys
        visible with bias 0, unless they already have S + n columns (then they say it)."""
        if isinstance(mask, AttentionMask):  # the slots have no place in the parts: make it dense
            extra = mask.dense_bias()
            mask, bias = mask.dense(), extra if bias is None else (bias if extra is None else bias + extra)
        b, _, g, d = k.shape
        new_k, new_v = [k], [v]
        if self.bias_k is not None:
            new_k.append(jnp.broadcast_to(self.bias_k[...].reshape(1, 1, g, d), (b, 1, g, d)).astype(k.dtype))
            new_v.append(jnp.broadcast_to(self.bias_v[...].reshape(1, 1, g, d), (b, 1, g, d)).astype(v.dtype))
        if self.add_zero_attn:
            new_k.append(jnp.zeros((b, 1, g, d), k.dtype))
            new_v.append(jnp.zeros((b, 1, g, d), v.dtype))
        n, s = len(new_k) - 1, k.shape[1]

        def pad(m, value):  # -> 4-D, S columns, then n more (a mask of S + n covers them itself)
            m = m.reshape((1,) * (4 - m.ndim) + m.shape)
            if m.shape[-1] == s + n:
                return m
            m = jnp.broadcast_to(m, m.shape[:3] + (s,))
            return jnp.concatenate([m, jnp.full(m.shape[:3] + (n,), value, m.dtype)], axis=-1)
        mask = None if mask is None else pad(mask, True)
        bias = None if bias is None else pad(bias, 0)
        return jnp.concatenate(new_k, axis=1), jnp.concatenate(new_v, axis=1), mask, bias

    def __call__(self, x: jax.Array, kv: jax.Array | None = None, *, mask: jax.Array | None = None,
                 bias: jax.Array | None = None, positions: jax.Array | None = None,
                 return_weights: bool = False, cache: dict | None = None, cache_index=None,
                 value: jax.Array | None = None, rolling: bool = False):
        b, t, _ = x.shape
        if cache is not None and return_weights:
            raise ValueError("return_weights is not supported together with a KV cache")
        extra_slots = self.bias_k is not None or self.add_zero_attn
        if cache is not None and extra_slots:
            raise ValueError("add_bias_kv / add_zero_attn are not supported together with a KV cache")
        read_only = cache is not None and cache_index is None
        # 1) project and split heads
        q = self.split_heads(self.q_proj(x), self.q_norm, self.num_heads)  # [B, T, H, K]
        if read_only:
            k, v = cache["k"], cache["v"]  # [B, G, S, K], projected once
        else:
            kv_heads = self.project_kv(x if kv is None else kv, value)
            k, v = kv_heads["k"], kv_heads["v"]  # [B, S, G, K]
        # 2) rotate q and k (self-attention only)
        if self.rope is not None:
            positions = default_positions(b, t) if positions is None else positions
            q = self.rope(q, positions)
            if not read_only:
                k = self.rope(k, positions)
        # 2b) write the new keys/values into their cache slots
        head_major = cache is not None
        if cache is not None and rolling and t > 1:  # ring then the new tokens; written after
            ring = {"k": cache["k"], "v": cache["v"]}
            k_new, v_new = k, v
            k = jnp.concatenate([jnp.swapaxes(ring["k"], 1, 2).astype(k.dtype), k], axis=1)  # [B, W+T, G, K]
            v = jnp.concatenate([jnp.swapaxes(ring["v"], 1, 2).astype(v.dtype), v], axis=1)  # [B, W+T, G, K]
            head_major = False
            w = ring["k"].shape[2]
            m = min(t, w)
            ring_slots = (cache_index + jnp.arange(t - m, t)) % w  # distinct ring slots
            cache = {name: ring[name].at[:, :, ring_slots].set(jnp.swapaxes(new[:, t - m:], 1, 2).astype(ring[name].dtype))
                     for name, new in (("k", k_new), ("v", v_new))}  # [B, G, W, K]
        elif cache is not None and not read_only:
            w = cache["k"].shape[2]
            start = (0, 0, cache_index % w if rolling else cache_index, 0)
            k = jax.lax.dynamic_update_slice(cache["k"], jnp.swapaxes(k, 1, 2).astype(cache["k"].dtype), start)  # [B, G, L, K]
            v = jax.lax.dynamic_update_slice(cache["v"], jnp.swapaxes(v, 1, 2).astype(cache["v"].dtype), start)  # [B, G, L, K]
            cache = {"k": k, "v": v}
        # 2c) append the learned and the zero key/value slots
        if extra_slots:
            k, v, mask, bias = self.append_slots(k, v, mask, bias)  # [B, S + n, G, K]
        # 3) attend
        out = dot_product_attention(q, k.astype(q.dtype), v.astype(q.dtype), mask=mask, bias=bias,
                                    scale=self.scale, return_weights=return_weights,
                                    dropout=self.attn_dropout, kv_head_major=head_major, softcap=self.softcap,
                                    sinks=None if self.sinks is None else self.sinks[...])
        out, weights = out if return_weights else (out, None)
        # 4) merge heads and project out
        out = self.dropout(self.o_proj(out.reshape(b, t, self.num_heads * self.head_dim)))
        if cache is not None:
            return out, cache
        return (out, weights) if return_weights else out
