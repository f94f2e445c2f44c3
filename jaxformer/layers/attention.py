"""Multi-head attention (self, cross, GQA, RoPE, q/k norms, sinks) and the key projection.
Twin: torch_ref/layers/attention.py. The attention itself (which path computes it: plain,
blockwise, ring) is layers/dispatch.py's `dot_product_attention`; the masks live in
layers/masks.py, the score modifiers in layers/scores.py (all re-exported here where callers
took them from this module).

Masks are boolean, True = may attend, broadcastable to [B, H, T, S]. Masks are combined as
booleans before they touch the scores (docs/numerics.md §4). A query row with no visible key
outputs exactly 0 (never NaN, never the mean of V), in both frameworks. With attention sinks
(gpt-oss) such a row gives all its weight to the sink, so it outputs 0 too (docs/numerics.md §28).

How the same maths is lowered is chosen at trace time by jaxformer/lowering.py: the backend
of the fused path, and the one-token form over a KV cache that reads the cache in place on
XLA:CPU (measured figures: bench/README.md, "Decode layout on CPU").
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer.config.attention import Dropouts, Projections, QKNorm, Rope, Scores
from jaxformer.layers import kv_cache
from jaxformer.layers.dispatch import dot_product_attention  # re-exported
from jaxformer.layers.kernels import partitioning
from jaxformer.layers.kv_cache import KVCache
from jaxformer.layers.linear import Linear
from jaxformer.layers.masks import (  # noqa: F401 (re-exported)
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
from jaxformer.layers.scores import ScoreMods  # re-exported


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
        head_dim: K; None = D // H.
        projections: a config.Projections (bias, out_bias): biases on the q/k/v projections
            (and on o_proj when out_bias is None) and on o_proj.
        dropouts: a config.Dropouts (attn, out): dropout on the attention weights and on the
            output.
        rope: a config.Rope (max_len, base, scaling, rotary_dim): rotary positions for
            self-attention; None = none.
        qk_norm: a config.QKNorm (kind, eps, full): norms of q and k before RoPE, per head
            (Qwen3) or over all heads (OLMo 2, docs/numerics.md §35); None = none.
        scores: a config.Scores (scale, softcap, sinks): the score scale (None = 1/sqrt(K); T5
            uses 1), soft-capping (Gemma2) and a learned per-head logit `sinks` [H] in every
            softmax denominator (gpt-oss's attention sinks, HF `self_attn.sinks`); see
            dot_product_attention.
    torch.nn.MultiheadAttention's own options (kdim / vdim, add_bias_kv, add_zero_attn) are
    jaxformer.interop.TorchMultiheadAttention's, a subclass: it sets `slots` and
    `append_slots`, which this class calls in step 2c.
    Shapes: x [B, T, D], kv [B, S, D] (None = self-attention), value [B, S, D] (None = kv)
    -> [B, T, D].

    KV cache (incremental decoding): `cache` a kv_cache.KVCache ({"k", "v"} head-major
    [B, G, L, K], the layout a decode step reads without a transpose; bench/README.md), `mode`
    kv_cache.PREFILL or DECODE (None = from T: one token decodes):
      * a self-attention cache (init_cache) with cache_index (int scalar, may be traced): the new
        keys/values (RoPE'd at `positions`) are written at slots cache_index.. (each at slot %
        L: a linear cache and a sliding-window layer's ring are one path, KVCache.write) and the
        queries read the cache (KVCache.attend); `mask` covers the keys read
        (AttentionMask.at_keys of KVCache.key_slots).
      * a fixed cache (memory_cache): cross-attention keys/values projected once from the
        encoder memory; `kv` is then not used.
    With a cache the call returns (out, new_cache).
    """

    slots = 0  # key/value slots appended after the projected keys (interop.TorchMultiheadAttention)

    def __init__(self, d_model: int, num_heads: int, *, num_kv_heads: int | None = None,
                 head_dim: int | None = None, projections: Projections = Projections(),  # noqa: B008 (a frozen dataclass)
                 dropouts: Dropouts = Dropouts(), rope: Rope | None = None, qk_norm: QKNorm | None = None,  # noqa: B008 (a frozen dataclass)
                 scores: Scores = Scores(), rngs: nnx.Rngs):  # noqa: B008 (a frozen dataclass)
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if head_dim is None:
            if d_model % num_heads:
                raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
            head_dim = d_model // num_heads
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale, self.softcap = scores.scale, scores.softcap
        bias = projections.bias
        self.q_proj = Linear(d_model, num_heads * head_dim, use_bias=bias, axes=("embed", "heads"), rngs=rngs)
        self.k_proj = Linear(d_model, num_kv_heads * head_dim, use_bias=bias, axes=("embed", "heads"), rngs=rngs)
        self.v_proj = Linear(d_model, num_kv_heads * head_dim, use_bias=bias, axes=("embed", "heads"), rngs=rngs)
        # one learned logit per query head in every softmax denominator (gpt-oss), [H]
        self.sinks = partitioning.param(0.02 * jax.random.normal(rngs.params(), (num_heads,)),
                                        (None,)) if scores.sinks else None
        self.o_proj = Linear(num_heads * head_dim, d_model, use_bias=projections.resolved_out_bias,
                             axes=("heads", "embed"), rngs=rngs)
        # norms of q and k before RoPE: per head (Qwen3), weights [K]; or over all heads at
        # once (qk_norm.full, OLMo 2), weights [H * K] and [G * K]
        self.qk_norm_full = qk_norm is not None and qk_norm.full
        q_width, k_width = (num_heads * head_dim, num_kv_heads * head_dim) if self.qk_norm_full else (head_dim, head_dim)
        self.q_norm, self.k_norm = ((make_norm(qk_norm.kind, q_width, eps=qk_norm.eps, bias=False, rngs=rngs),
                                     make_norm(qk_norm.kind, k_width, eps=qk_norm.eps, bias=False, rngs=rngs))
                                    if qk_norm else (None, None))
        self.rope = (RotaryEmbedding(head_dim, rope.max_len, rope.base, rope.scaling, rope.rotary_dim)
                     if rope else None)
        self.attn_dropout = nnx.Dropout(dropouts.attn, rngs=rngs)
        self.dropout = nnx.Dropout(dropouts.out, rngs=rngs)

    def project_kv(self, kv: jax.Array, value: jax.Array | None = None) -> dict:
        """Keys of kv [B, S, D] and values of value [B, S, D] (None = kv; other widths in
        interop.TorchMultiheadAttention) -> {"k", "v"}: [B, S, G, K] (no RoPE, no appended slots)."""
        b, s, _ = kv.shape
        # step 2 of __call__ rotates these keys; a k_norm is not linear in b_k either
        rotated = self.rope is not None or self.k_norm is not None
        # the slots of step 2c carry no b_k, so softmax does not cancel q . b_k (§23)
        rotated = rotated or self.slots > 0
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

    def init_cache(self, batch: int, length: int, dtype=jnp.float32, *, ring: bool = False) -> KVCache:
        """An empty self-attention cache of `length` slots, {"k", "v"} [B, G, L, K] (ring: a
        sliding-window layer's ring of window slots)."""
        shape = (batch, self.num_kv_heads, length, self.head_dim)  # [B, G, L, K]
        return KVCache.empty({"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}, ring=ring)

    def memory_cache(self, memory: jax.Array, dtype=jnp.float32) -> KVCache:
        """The fixed cache of memory [B, S, D]'s keys/values, projected once: [B, G, S, K]."""
        return KVCache.memory({name: jnp.swapaxes(a, 1, 2).astype(dtype) for name, a in self.project_kv(memory).items()})

    def rotate(self, x: jax.Array, positions: jax.Array) -> jax.Array:
        """RoPE on q or k [B, T, n, K] (a variant that rotates otherwise overrides this)."""
        return self.rope(x, positions)

    def attend(self, q, k, v, mask, bias, *, return_weights: bool, head_major: bool, mode: str):
        """Step 3: q [B, T, H, K] over k, v ([B, S, G, K], or [B, G, S, K] head_major) -> (out
        [B, T, H, K], weights [B, H, T, S] or None); a variant of the attention itself
        (layers/diff_attention.py) overrides this."""
        scores = ScoreMods(self.scale, self.softcap, None if self.sinks is None else self.sinks[...])
        out = dot_product_attention(q, k, v, mask=mask, bias=bias, scores=scores, return_weights=return_weights,
                                    dropout=self.attn_dropout, kv_head_major=head_major, mode=mode)
        return out if return_weights else (out, None)

    def __call__(self, x: jax.Array, kv: jax.Array | None = None, *, mask=None,
                 bias: jax.Array | None = None, positions: jax.Array | None = None,
                 return_weights: bool = False, cache: KVCache | None = None, cache_index=None,
                 value: jax.Array | None = None, mode: str | None = None):
        b, t, _ = x.shape
        if cache is not None and return_weights:
            raise ValueError("return_weights is not supported together with a KV cache")
        if cache is not None and self.slots:
            raise ValueError("add_bias_kv / add_zero_attn are not supported together with a KV cache")
        mode = kv_cache.mode_of(cache, t) if mode is None else mode
        read_only = cache is not None and cache.fixed
        if cache is not None and not read_only and cache_index is None:
            raise ValueError("a self-attention cache needs cache_index (the slot of the first new token)")
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
            q = self.rotate(q, positions)
            if not read_only:
                k = self.rotate(k, positions)
        # 2b) write the new keys/values into the cache and read the keys the queries see
        head_major = read_only
        if cache is not None and not read_only:
            keys, head_major, cache = cache.attend({"k": k, "v": v}, cache_index, mode)
            k, v = keys["k"], keys["v"]  # [B, G, L, K] (head_major) or [B, L + T, G, K]
        # 2c) append torch.nn's learned and zero key/value slots (interop.TorchMultiheadAttention)
        if self.slots:
            k, v, mask, bias = self.append_slots(k, v, mask, bias)  # [B, S + n, G, K]
        # 3) attend
        out, weights = self.attend(q, k.astype(q.dtype), v.astype(q.dtype), mask, bias,
                                   return_weights=return_weights, head_major=head_major, mode=mode)
        # 4) merge heads and project out
        out = self.dropout(self.o_proj(out.reshape(b, t, self.num_heads * self.head_dim)))
        if cache is not None:
            return out, cache
        return (out, weights) if return_weights else out
