"""Encoder and decoder layers (Pre-LN or Post-LN) and their stacks.
Twin: torch_ref/layers/transformer.py.

Post-LN (Vaswani et al. 2017):             x = norm(x + dropout(sublayer(x)))
Pre-LN  (GPT-2, LLaMA, Xiong et al. 2020): x = x + dropout(sublayer(norm(x)))
Sandwich (Gemma2):                         x = x + post_norm(dropout(sublayer(norm(x))))
Post-sublayer (OLMo 2):                    x = x + post_norm(dropout(sublayer(x)))
Parallel (GPT-NeoX, pre-norm):             x = x + attn(attn_norm(x)) + ffn(ffn_norm(x))
(docs/numerics.md §35: the last two; a post-sublayer layer has no attn_norm / ffn_norm.)

Sliding-window layers (cfg.local_layers(): every layer with sliding_window, or the
sliding_attention entries of layer_types) see the window - 1 keys before a query and the
query itself; with a KV cache their cache is a ring of window slots (docs/numerics.md §21).
The decode cache lives in kv_cache.py, the layer loop / scan / remat in stack.py.
The dropout on the sublayer output lives inside the sublayer (MultiHeadAttention.dropout,
FeedForward.dropout).

Named intermediates (return_intermediates=True on a stack), per layer i, in depth order:
  layers.i.attn_weights        [B, H, T, T] self-attention weights (return_attention=True only)
  layers.i.attn                [B, T, D] self-attention sub-layer output, before the residual add
  layers.i.attn_residual       [B, T, D] after the add (and the norm, Post-LN)
  layers.i.cross_attn_weights  [B, H, T, S] (decoder with cross-attention, return_attention=True)
  layers.i.cross_attn          [B, T, D] cross-attention sub-layer output, before the add
  layers.i.cross_attn_residual [B, T, D] after the add (and norm)
  layers.i.ffn                 [B, T, D] FFN sub-layer output, before the add
  layers.i                     [B, T, D] the layer's output (after the FFN's add and norm)
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer import lowering, tables
from jaxformer.config import QKNorm, Rope, Scores, TransformerConfig
from jaxformer.layers import kv_cache, stack
from jaxformer.layers.attention import (
    AttentionMask,
    MultiHeadAttention,
    combine_masks,
    make_causal_mask,
    make_sliding_window_mask,
)
from jaxformer.layers.ffn import FeedForward
from jaxformer.layers.kernels import partitioning
from jaxformer.layers.mla import MultiHeadLatentAttention
from jaxformer.layers.moe import MoE
from jaxformer.layers.norm import make_norm
from jaxformer.layers.positional import T5RelativePositionBias, alibi_bias, default_positions


def make_attention(cfg: TransformerConfig, *, self_attn: bool, local: bool = False,
                   rngs: nnx.Rngs) -> MultiHeadAttention:
    """The attention of a layer; `local`: a sliding-window layer, which rotates with its own
    RoPE when the config gives one (cfg.layer_rope: Gemma3, ModernBERT; docs/numerics.md §33)."""
    if cfg.mla is not None:  # multi-head latent attention replaces every self-attention
        if not self_attn:
            raise ValueError("mla is self-attention only; a decoder with cross-attention cannot use it")
        return MultiHeadLatentAttention(
            cfg.d_model, cfg.num_heads, cfg.mla, rope=Rope(cfg.max_len, cfg.rope_base, cfg.rope_scaling),
            bias=cfg.resolved_qkv_bias, out_bias=cfg.resolved_out_bias,
            attn_dropout=cfg.attn_dropout, dropout=cfg.dropout, scale=cfg.score_scale,
            softcap=cfg.attn_logit_softcap, rngs=rngs)
    use_rope = self_attn and cfg.position == "rope"
    rope_base, rope_scaling = cfg.layer_rope(local)
    qk_norm = QKNorm(cfg.norm, cfg.norm_eps, cfg.qk_norm_full) if cfg.qk_norm or cfg.qk_norm_full else None
    return MultiHeadAttention(
        cfg.d_model, cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
        bias=cfg.resolved_qkv_bias, out_bias=cfg.resolved_out_bias, attn_dropout=cfg.attn_dropout,
        dropout=cfg.dropout, rope=Rope(cfg.max_len, rope_base, rope_scaling, cfg.rotary_dim) if use_rope else None,
        qk_norm=qk_norm, scores=Scores(cfg.score_scale, cfg.attn_logit_softcap, cfg.attn_sinks and self_attn), rngs=rngs)


def make_ffn(cfg: TransformerConfig, *, sparse: bool = False, rngs: nnx.Rngs) -> FeedForward | MoE:
    """The dense FFN, or for a sparse layer (cfg.sparse_layers()) the mixture of experts."""
    if sparse:
        return MoE(cfg.d_model, cfg.moe, dropout=cfg.dropout, rngs=rngs)
    return FeedForward(cfg.d_model, cfg.d_ff, kind=cfg.ffn, bias=cfg.resolved_ffn_bias,
                       inner_dropout=cfg.ffn_dropout, dropout=cfg.dropout, rngs=rngs)


def ffn_sublayer(ffn, record: dict | None):
    """The FFN as a sublayer; an MoE also puts its router logits and expert load in `record`."""
    return (lambda h: ffn(h, record=record)) if isinstance(ffn, MoE) else ffn


def _norm(cfg: TransformerConfig, rngs: nnx.Rngs):
    return make_norm(cfg.norm, cfg.d_model, eps=cfg.norm_eps, bias=cfg.norm_bias, rngs=rngs)


class LayerScale(nnx.Module):
    """LayerScale (Touvron et al. 2021, "Going deeper with Image Transformers"): a learned
    per-channel scale on a sublayer's output, y = x * gamma (HF DINOv2's lambda1, timm's gamma;
    docs/numerics.md §37).

    Args:
        dim: D.  init: the initial value of every gamma entry (HF layerscale_value).
    Shapes: x [..., D] -> [..., D].
    """

    def __init__(self, dim: int, *, init: float, rngs: nnx.Rngs | None = None):
        self.gamma = partitioning.param(jnp.full((dim,), init, jnp.float32), ("embed",))

    def __call__(self, x: jax.Array) -> jax.Array:
        return (x * self.gamma[...]).astype(x.dtype)


def _layer_scale(cfg: TransformerConfig, rngs: nnx.Rngs):
    """The LayerScale on a sublayer's output (None unless cfg.layer_scale is set)."""
    return LayerScale(cfg.d_model, init=cfg.layer_scale, rngs=rngs) if cfg.layer_scale is not None else None


def residual(cfg: TransformerConfig, norm, sublayer, x: jax.Array, record: dict | None = None,
             name: str = "", post_norm=None, layer_scale=None) -> jax.Array:
    """Apply `sublayer` with its residual connection in the configured norm position (sandwich:
    `post_norm` on the sublayer's output too; post_sublayer: `norm` is None, only `post_norm`;
    `layer_scale` scales the sublayer's output). The residual stream keeps x's dtype (a
    bf16-compute sublayer adds into an fp32 stream, as under torch autocast). With `record`,
    the sublayer's output (before the add) goes to record[name]. norm None under Pre-LN: the
    sublayer reads x itself (ModernBERT's first layer, first_attn_norm=False)."""
    pre = cfg.norm_position != "post"
    h = sublayer(norm(x) if pre and norm is not None else x).astype(x.dtype)
    if layer_scale is not None:
        h = layer_scale(h)
    if post_norm is not None:
        h = post_norm(h)
    if record is not None:
        record[name] = h
    return x + h if pre else norm(x + h)


def _pre_norm(cfg: TransformerConfig, rngs: nnx.Rngs):
    """The norm before a sublayer (Pre-LN, sandwich) or after the add (Post-LN); None for
    post_sublayer, whose only norm is on the sublayer's output."""
    return None if cfg.norm_position == "post_sublayer" else _norm(cfg, rngs)


def _post_norm(cfg: TransformerConfig, rngs: nnx.Rngs):
    """The norm on a sublayer's output (sandwich, post_sublayer; None otherwise)."""
    return _norm(cfg, rngs) if cfg.norm_position in ("sandwich", "post_sublayer") else None


def parallel_residual(x, attn_norm, attn, ffn_norm, ffn, record: dict | None = None):
    """GPT-NeoX's parallel block (use_parallel_residual): both sublayers read the layer input,
    x + attn(attn_norm(x)) + ffn(ffn_norm(x)), summed in HF's order (docs/numerics.md §35)."""
    a = put_record(record, "attn", attn(attn_norm(x)).astype(x.dtype))
    f = put_record(record, "ffn", ffn(ffn_norm(x)).astype(x.dtype))
    return f + a + x


def pick_mask(local, if_local, if_full):
    """The mask of a layer: if_local for a sliding-window layer. `local` is a Python bool, or
    a traced one inside the scan over stacked layers (then a select)."""
    if if_local is if_full or isinstance(local, bool):
        return if_local if local else if_full
    if isinstance(if_full, AttentionMask):  # the same parts, the window only on local layers
        return dataclasses.replace(if_local, window=jnp.where(local, if_local.window, jnp.iinfo(jnp.int32).max))
    return jnp.where(local, if_local, True if if_full is None else if_full)


def put_record(record: dict | None, name: str, value):
    """record[name] = value when recording intermediates; -> value either way."""
    if record is not None:
        record[name] = value
    return value


def _attend(attn, record: dict | None, name: str, return_attention: bool, h, *args, **kw):
    """attn(h, *args, **kw); with return_attention, its weights [B, H, T, S] go to record[name]."""
    if not return_attention:
        return attn(h, *args, **kw)
    out, record[name] = attn(h, *args, return_weights=True, **kw)
    return out


class EncoderLayer(nnx.Module):
    """Self-attention then FFN, each with a residual and a norm. x [B, T, D] -> [B, T, D].
    sparse, local, attn_norm: this layer's options (TransformerConfig.layer_options; local: a
    sliding-window layer with its own RoPE, make_attention)."""

    def __init__(self, cfg: TransformerConfig, *, sparse: bool = False, local: bool = False,
                 attn_norm: bool = True, rngs: nnx.Rngs):
        self.cfg = cfg
        self.self_attn = make_attention(cfg, self_attn=True, local=local, rngs=rngs)
        self.attn_norm = _pre_norm(cfg, rngs) if attn_norm else None
        self.post_attn_norm = _post_norm(cfg, rngs)
        self.attn_layer_scale = _layer_scale(cfg, rngs)
        self.ffn = make_ffn(cfg, sparse=sparse, rngs=rngs)
        self.ffn_norm = _pre_norm(cfg, rngs)
        self.post_ffn_norm = _post_norm(cfg, rngs)
        self.ffn_layer_scale = _layer_scale(cfg, rngs)

    def __call__(self, x: jax.Array, *, mask=None, bias=None, positions=None,
                 record: dict | None = None, return_attention: bool = False) -> jax.Array:
        """record: a dict that receives the sub-layer intermediates (stack.SUBLAYERS names);
        return_attention adds the attention weights to it."""
        attend = lambda h: _attend(self.self_attn, record, "attn_weights", return_attention, h,  # noqa: E731
                                   mask=mask, bias=bias, positions=positions)
        if self.cfg.parallel_residual:
            return parallel_residual(x, self.attn_norm, attend, self.ffn_norm, ffn_sublayer(self.ffn, record),
                                     record)
        x = residual(self.cfg, self.attn_norm, attend, x, record, "attn", self.post_attn_norm,
                     self.attn_layer_scale)
        put_record(record, "attn_residual", x)
        return residual(self.cfg, self.ffn_norm, ffn_sublayer(self.ffn, record), x, record, "ffn",
                        self.post_ffn_norm, self.ffn_layer_scale)


class DecoderLayer(nnx.Module):
    """Masked self-attention, cross-attention to `memory` (skipped if the layer has none),
    then FFN. x [B, T, D], memory [B, S, D] -> [B, T, D].

    With cache={"self": {"k", "v"} [B, G, L, K], "cross": {"k", "v"} [B, G, S, K]} and
    cache_index (see MultiHeadAttention), returns (x, new_cache); `memory` is then not needed
    ("cross" holds its keys/values, from init_cache). rolling: the self-attention cache is a
    ring of sliding_window slots (MultiHeadAttention). local: a sliding-window layer (its
    attention's RoPE: make_attention).
    """

    def __init__(self, cfg: TransformerConfig, *, cross_attention: bool = True, sparse: bool = False,
                 local: bool = False, attn_norm: bool = True, rngs: nnx.Rngs):
        if cross_attention and cfg.parallel_residual:
            raise ValueError("parallel_residual (GPT-NeoX) is for layers without cross-attention")
        self.cfg = cfg
        self.self_attn = make_attention(cfg, self_attn=True, local=local, rngs=rngs)
        self.attn_norm = _pre_norm(cfg, rngs) if attn_norm else None
        self.post_attn_norm = _post_norm(cfg, rngs)
        self.attn_layer_scale = _layer_scale(cfg, rngs)
        self.cross_attn = make_attention(cfg, self_attn=False, rngs=rngs) if cross_attention else None
        self.cross_attn_norm = _pre_norm(cfg, rngs) if cross_attention else None
        self.post_cross_attn_norm = _post_norm(cfg, rngs) if cross_attention else None
        self.cross_attn_layer_scale = _layer_scale(cfg, rngs) if cross_attention else None
        self.ffn = make_ffn(cfg, sparse=sparse, rngs=rngs)
        self.ffn_norm = _pre_norm(cfg, rngs)
        self.post_ffn_norm = _post_norm(cfg, rngs)
        self.ffn_layer_scale = _layer_scale(cfg, rngs)

    def __call__(self, x: jax.Array, memory: jax.Array | None = None, *, mask=None, bias=None,
                 memory_mask=None, memory_bias=None, positions=None, cache: dict | None = None,
                 cache_index=None, record: dict | None = None, return_attention: bool = False,
                 rolling: bool = False):
        new_cache = {}

        def self_block(h):
            if cache is None:
                return _attend(self.self_attn, record, "attn_weights", return_attention, h,
                               mask=mask, bias=bias, positions=positions)
            out, new_cache["self"] = self.self_attn(h, mask=mask, bias=bias, positions=positions,
                                                    cache=cache["self"], cache_index=cache_index,
                                                    rolling=rolling)
            return out

        def cross_block(h):
            if cache is None:
                return _attend(self.cross_attn, record, "cross_attn_weights", return_attention, h,
                               memory, mask=memory_mask, bias=memory_bias)
            out, new_cache["cross"] = self.cross_attn(h, mask=memory_mask, bias=memory_bias,
                                                      cache=cache["cross"])
            return out

        if self.cfg.parallel_residual:  # no cross-attention (checked in __init__)
            x = parallel_residual(x, self.attn_norm, self_block, self.ffn_norm, ffn_sublayer(self.ffn, record),
                                  record)
            return x if cache is None else (x, new_cache)
        x = residual(self.cfg, self.attn_norm, self_block, x, record, "attn", self.post_attn_norm,
                     self.attn_layer_scale)
        put_record(record, "attn_residual", x)
        if self.cross_attn is not None:
            if memory is None and cache is None:
                raise ValueError("DecoderLayer with cross-attention needs `memory`")
            x = residual(self.cfg, self.cross_attn_norm, cross_block, x, record, "cross_attn",
                         self.post_cross_attn_norm, self.cross_attn_layer_scale)
            put_record(record, "cross_attn_residual", x)
        x = residual(self.cfg, self.ffn_norm, ffn_sublayer(self.ffn, record), x, record, "ffn",
                     self.post_ffn_norm, self.ffn_layer_scale)
        return x if cache is None else (x, new_cache)

    def init_cache(self, batch: int, length: int, memory: jax.Array | None = None,
                   dtype=jnp.float32) -> dict:
        """An empty cache of `length` slots (and memory's cross-attention keys; kv_cache.layer_cache)."""
        return kv_cache.layer_cache(self, batch, length, memory, dtype)


class _Stack(nnx.Module):
    """Shared plumbing: positional biases (ALiBi, T5) computed once per stack, final norm."""

    def __init__(self, cfg: TransformerConfig, *, causal: bool = False, rngs: nnx.Rngs):
        self.cfg = cfg
        self.causal = causal  # add the causal mask to self-attention (decoders)
        self.scan_layers = cfg.scan_layers
        self.remat_policy: str | None = None  # set by the trainer (train.remat)
        self.rel_bias = T5RelativePositionBias(
            cfg.rel_num_buckets, cfg.rel_max_distance, cfg.num_heads,
            bidirectional=not self.causal, rngs=rngs) if cfg.position == "t5" else None
        self.final_norm = _norm(cfg, rngs) if cfg.final_norm else None

    def self_attention_inputs(self, x: jax.Array, mask, positions, cache_index=None,
                              cache_len: int | None = None):
        """-> (mask of full layers, mask of sliding-window layers, bias, positions) for
        self-attention over x [B, T, D]. With a cache, the keys are its cache_len slots and
        query i sits in slot cache_index + i; ALiBi/T5 biases then use slot distances (equal to
        position distances, padding being on the left)."""
        b, t, _ = x.shape
        offset = 0 if cache_index is None else cache_index
        s = t if cache_len is None else cache_len
        positions = default_positions(b, t, offset) if positions is None else positions
        parts = self.mask_parts(mask, t) if cache_index is None else None
        if parts is not None:  # blockwise / ring attention: the mask stays in parts (lowering.py)
            local = parts.with_window(self.cfg.sliding_window) if any(self.cfg.local_layers()) else parts
            bias = None
            if self.cfg.position == "alibi":
                slopes = jnp.asarray(tables.alibi_slopes(self.cfg.num_heads))
                parts, local = (dataclasses.replace(m, alibi_slopes=slopes) for m in (parts, local))
            elif self.rel_bias is not None:
                bias = self.rel_bias(positions, positions)
            return parts, local, bias, positions
        if self.causal:
            mask = combine_masks(mask, make_causal_mask(t, s, offset))
        local_mask = mask
        if any(self.cfg.local_layers()):
            window = self.cfg.sliding_window
            local_mask = combine_masks(mask, make_sliding_window_mask(t, s, window, offset)
                                       if self.causal else _band_mask(t, window))
        q_pos, k_pos = positions, positions
        if cache_index is not None:
            q_pos, k_pos = default_positions(1, t, offset), default_positions(1, s)  # slots
        bias = None
        if self.cfg.position == "alibi":
            bias = alibi_bias(self.cfg.num_heads, q_pos, k_pos)
        elif self.rel_bias is not None:
            bias = self.rel_bias(q_pos, k_pos)
        return mask, local_mask, bias, positions

    def mask_parts(self, mask, t: int) -> AttentionMask | None:
        """The self-attention mask as AttentionMask parts when this trace computes attention
        blockwise (lowering.active().attention; no cache): from parts the caller gave, from a key
        padding mask [B, 1, 1, T], or from none. None (the plain path's dense masks) otherwise,
        and for any other dense mask."""
        if lowering.active().attention == "plain" and lowering.active().context_axis is None:
            return None
        if isinstance(mask, AttentionMask):
            return dataclasses.replace(mask, causal=self.causal)
        if mask is None:
            return AttentionMask.self_attention(1, t, causal=self.causal)
        if mask.ndim == 4 and mask.shape[1:3] == (1, 1):
            return AttentionMask.self_attention(1, t, causal=self.causal, key_valid=mask[:, 0, 0, :])
        return None

    def finish(self, x, intermediates):
        if self.final_norm is not None:
            x = self.final_norm(x)
            if intermediates is not None:
                intermediates["final_norm"] = x
        return (x, intermediates) if intermediates is not None else x


def _check_attention_flags(return_intermediates: bool, return_attention: bool) -> None:
    if return_attention and not return_intermediates:
        raise ValueError("return_attention=True needs return_intermediates=True (the weights are "
                         "returned among the intermediates, as layers.i.attn_weights)")


def _band_mask(t: int, window: int) -> jax.Array:
    """Bidirectional sliding window: |i - j| < window. -> [1, 1, T, T]."""
    d = jnp.abs(jnp.arange(t)[:, None] - jnp.arange(t)[None, :])
    return (d < window)[None, None]


class Encoder(_Stack):
    """A stack of EncoderLayers with an optional final norm.

    Shapes: x [B, T, D], mask bool broadcastable to [B, H, T, T] -> [B, T, D]; with
    return_intermediates, also {"layers.i.<sub-layer>", "layers.i": [B, T, D],
    "final_norm": [B, T, D]} (module docstring); return_attention adds the weights.
    """

    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        super().__init__(cfg, rngs=rngs)
        self.layers = stack.make_layers(cfg, lambda r, options: EncoderLayer(cfg, **options, rngs=r), rngs)

    def __call__(self, x, *, mask=None, positions=None, return_intermediates: bool = False,
                 return_attention: bool = False):
        _check_attention_flags(return_intermediates, return_attention)
        mask, local_mask, bias, positions = self.self_attention_inputs(x, mask, positions)
        inter = {} if return_intermediates else None
        x = stack.run_layers(self, x, lambda layer, h, record, local: layer(
            h, mask=pick_mask(local, local_mask, mask), bias=bias, positions=positions, record=record,
            return_attention=return_attention), inter)
        return self.finish(x, inter)


class Decoder(_Stack):
    """A stack of causal DecoderLayers, with cross-attention to `memory` unless
    cross_attention=False (decoder-only LMs). causal=False adds no causal mask: self-attention
    sees what `mask` allows (torch.nn.TransformerDecoder without a tgt_mask).

    Shapes: x [B, T, D], memory [B, S, D], mask/memory_mask bool -> [B, T, D].

    Incremental decoding: cache = init_cache(...) (one dict per layer; for a scanned stack one
    dict of [num_layers, ...] leaves) and cache_index (int scalar, may be traced): x holds the
    T new tokens, which sit in slots cache_index.., and `mask` is a key mask over the L cache
    slots (e.g. [B, 1, 1, L] from left padding); the causal part is added here. A
    sliding-window layer's cache is a ring of window slots when the cache is longer than the
    window (its decode memory is O(window)); a scanned stack rings only when every layer is a
    sliding one (mixed scanned layers keep L slots each, windowed by the mask). Returns
    (x, new_cache) (or (x, intermediates, new_cache)).
    """

    def __init__(self, cfg: TransformerConfig, *, cross_attention: bool = True, causal: bool = True,
                 rngs: nnx.Rngs):
        super().__init__(cfg, causal=causal, rngs=rngs)
        self.layers = stack.make_layers(
            cfg, lambda r, options: DecoderLayer(cfg, cross_attention=cross_attention, **options, rngs=r), rngs)

    def __call__(self, x, memory=None, *, mask=None, memory_mask=None, positions=None,
                 return_intermediates: bool = False, cache: list | dict | None = None, cache_index=None,
                 return_attention: bool = False, aux: dict | None = None):
        """aux: a dict that receives the sparse layers' router logits and expert load (AUX,
        stacked [n_sparse, ...]; stack.run_layers); not with a cache."""
        _check_attention_flags(return_intermediates, return_attention)
        if return_attention and cache is not None:
            raise ValueError("return_attention is not supported together with a KV cache")
        if aux is not None and cache is not None:
            raise ValueError("the MoE auxiliary outputs (return_aux) are not supported together with a KV cache")
        if cache is not None and cache_index is None:
            raise ValueError("a decoder cache needs cache_index (the slot of the first new token)")
        cache_len = None if cache is None else kv_cache.cache_length(self.cfg, cache, self.scan_layers)
        t = x.shape[1]
        all_rings = cache is not None and cache_len is None  # then only the positions are used
        full_mask, local_mask, bias, positions = self.self_attention_inputs(
            x, None if all_rings else mask, positions, cache_index, t if all_rings else cache_len)
        inter = {} if return_intermediates else None
        if cache is None:
            x = stack.run_layers(self, x, lambda layer, h, record, local: layer(
                h, memory, mask=pick_mask(local, local_mask, full_mask), bias=bias, memory_mask=memory_mask,
                positions=positions, record=record, return_attention=return_attention), inter, aux)
            return self.finish(x, inter)
        rolling = kv_cache.rolling_layers(self.cfg, cache, self.scan_layers)
        ring_mask, ring_bias = (kv_cache.rolling_inputs(self.cfg, self.rel_bias, mask, t, cache_index)
                                if any(rolling) else (None, None))

        def call(layer, h, layer_cache, local, ring):
            if ring:
                m, bb = ring_mask, ring_bias
            else:
                m, bb = pick_mask(local, local_mask, full_mask), bias
            return layer(h, memory, mask=m, bias=bb, memory_mask=memory_mask, positions=positions,
                         cache=layer_cache, cache_index=cache_index, rolling=ring)

        flags = stack.layer_flags(self.cfg, self.scan_layers)
        if self.scan_layers:
            x, new_cache = stack.scan_cached(self, x, cache, call, inter, flags, rolling[0])
        else:
            new_cache = []
            for i, layer in enumerate(self.layers):
                x, layer_cache = call(layer, x, cache[i], flags[i], rolling[i])
                new_cache.append(layer_cache)
                if inter is not None:
                    inter[f"layers.{i}"] = x
        out = self.finish(x, inter)
        return (*out, new_cache) if inter is not None else (out, new_cache)

    def cache_length(self, cache: list | dict) -> int | None:
        """L, the slots of the cache's full layers; None when every layer rings (kv_cache.cache_length)."""
        return kv_cache.cache_length(self.cfg, cache, self.scan_layers)

    def init_cache(self, batch: int, length: int, memory: jax.Array | None = None,
                   dtype=jnp.float32) -> list | dict:
        """An empty cache per layer, rings for sliding-window layers (kv_cache.stack_cache)."""
        return kv_cache.stack_cache(self, batch, length, memory, dtype)
