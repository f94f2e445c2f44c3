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

Named intermediates (return_intermediates=True on a stack), per layer i, in depth order (a
layer sows them, layers/sow.py, under stack.SUBLAYERS' names; the stack collects them):
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

from jaxformer import tables
from jaxformer.config import Dropouts, Projections, QKNorm, Rope, Scores, TransformerConfig
from jaxformer.layers import kv_cache, stack
from jaxformer.layers.attention import AttentionMask, MultiHeadAttention
from jaxformer.layers.diff_attention import DifferentialAttention
from jaxformer.layers.ffn import FeedForward
from jaxformer.layers.kernels import partitioning
from jaxformer.layers.mla import MultiHeadLatentAttention
from jaxformer.layers.moe import MoE
from jaxformer.layers.norm import make_norm
from jaxformer.layers.positional import T5RelativePositionBias, default_positions
from jaxformer.layers.sow import sow


def make_attention(cfg: TransformerConfig, *, self_attn: bool, local: bool = False,
                   rngs: nnx.Rngs) -> MultiHeadAttention:
    """The attention of a layer; `local`: a sliding-window layer, which rotates with its own
    RoPE when the config gives one (cfg.layer_rope: Gemma3, ModernBERT; docs/numerics.md §33)."""
    if cfg.attention.mla is not None:  # multi-head latent attention replaces every self-attention
        if not self_attn:
            raise ValueError("mla is self-attention only; a decoder with cross-attention cannot use it")
        return MultiHeadLatentAttention(
            cfg.d_model, cfg.attention.num_heads, cfg.attention.mla,
            rope=Rope(cfg.max_len, cfg.positions.rope_base, cfg.positions.rope_scaling),
            bias=cfg.resolved_qkv_bias, out_bias=cfg.resolved_out_bias,
            attn_dropout=cfg.attention.attn_dropout, dropout=cfg.dropout,
            scores=Scores(cfg.score_scale, cfg.attention.attn_logit_softcap), rngs=rngs)
    use_rope = self_attn and cfg.positions.kind == "rope"
    rope_base, rope_scaling = cfg.layer_rope(local)
    qk_norm = (QKNorm(cfg.norms.kind, cfg.norms.norm_eps, cfg.attention.qk_norm_full)
               if cfg.attention.qk_norm or cfg.attention.qk_norm_full else None)
    projections = Projections(cfg.resolved_qkv_bias, cfg.resolved_out_bias)
    if cfg.attention.diff_attn is not None:  # two softmax maps per head, subtracted (layers/diff_attention.py)
        return DifferentialAttention(
            cfg.d_model, cfg.attention.num_heads, lambda_init=cfg.attention.diff_attn,
            num_kv_heads=cfg.attention.num_kv_heads, head_dim=cfg.attention.head_dim,
            projections=projections, dropout=cfg.dropout,
            rope=Rope(cfg.max_len, rope_base, rope_scaling) if use_rope else None,
            scores=Scores(cfg.score_scale, cfg.attention.attn_logit_softcap), rngs=rngs)
    return MultiHeadAttention(
        cfg.d_model, cfg.attention.num_heads, num_kv_heads=cfg.attention.num_kv_heads, head_dim=cfg.attention.head_dim,
        projections=projections, dropouts=Dropouts(cfg.attention.attn_dropout, cfg.dropout),
        rope=Rope(cfg.max_len, rope_base, rope_scaling, cfg.positions.rotary_dim) if use_rope else None,
        qk_norm=qk_norm,
        scores=Scores(cfg.score_scale, cfg.attention.attn_logit_softcap, cfg.attention.attn_sinks and self_attn),
        rngs=rngs)


def make_ffn(cfg: TransformerConfig, *, sparse: bool = False, rngs: nnx.Rngs) -> FeedForward | MoE:
    """The dense FFN, or for a sparse layer (cfg.sparse_layers()) the mixture of experts."""
    if sparse:
        return MoE(cfg.d_model, cfg.feedforward.moe, dropout=cfg.dropout, rngs=rngs)
    return FeedForward(cfg.d_model, cfg.feedforward.d_ff, kind=cfg.feedforward.kind, bias=cfg.resolved_ffn_bias,
                       inner_dropout=cfg.feedforward.ffn_dropout, dropout=cfg.dropout, rngs=rngs)


def _norm(cfg: TransformerConfig, rngs: nnx.Rngs):
    return make_norm(cfg.norms.kind, cfg.d_model, eps=cfg.norms.norm_eps, bias=cfg.norms.norm_bias, rngs=rngs)


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
    """The LayerScale on a sublayer's output (None unless cfg.norms.layer_scale is set)."""
    return LayerScale(cfg.d_model, init=cfg.norms.layer_scale, rngs=rngs) if cfg.norms.layer_scale is not None else None


def residual(cfg: TransformerConfig, norm, sublayer, x: jax.Array, post_norm=None,
             layer_scale=None) -> tuple[jax.Array, jax.Array]:
    """Apply `sublayer` with its residual connection in the configured norm position (sandwich:
    `post_norm` on the sublayer's output too; post_sublayer: `norm` is None, only `post_norm`;
    `layer_scale` scales the sublayer's output). The residual stream keeps x's dtype (a
    bf16-compute sublayer adds into an fp32 stream, as under torch autocast). -> (the new
    stream, the sublayer's output before the add: what the layer sows). norm None under
    Pre-LN: the sublayer reads x itself (ModernBERT's first layer, first_attn_norm=False)."""
    pre = cfg.norms.norm_position != "post"
    h = sublayer(norm(x) if pre and norm is not None else x).astype(x.dtype)
    if layer_scale is not None:
        h = layer_scale(h)
    if post_norm is not None:
        h = post_norm(h)
    return (x + h if pre else norm(x + h)), h


def _pre_norm(cfg: TransformerConfig, rngs: nnx.Rngs):
    """The norm before a sublayer (Pre-LN, sandwich) or after the add (Post-LN); None for
    post_sublayer, whose only norm is on the sublayer's output."""
    return None if cfg.norms.norm_position == "post_sublayer" else _norm(cfg, rngs)


def _post_norm(cfg: TransformerConfig, rngs: nnx.Rngs):
    """The norm on a sublayer's output (sandwich, post_sublayer; None otherwise)."""
    return _norm(cfg, rngs) if cfg.norms.norm_position in ("sandwich", "post_sublayer") else None


def parallel_residual(x, attn_norm, attn, ffn_norm, ffn):
    """GPT-NeoX's parallel block (use_parallel_residual): both sublayers read the layer input,
    x + attn(attn_norm(x)) + ffn(ffn_norm(x)), summed in HF's order (docs/numerics.md §35).
    -> (the sum, the attn output, the ffn output: what the layer sows)."""
    a = attn(attn_norm(x)).astype(x.dtype)
    f = ffn(ffn_norm(x)).astype(x.dtype)
    return f + a + x, a, f


def _attend(layer: nnx.Module, attn, name: str, return_attention: bool, h, *args, **kw):
    """attn(h, *args, **kw); with return_attention, `layer` sows its weights [B, H, T, S] as `name`."""
    if not return_attention:
        return attn(h, *args, **kw)
    out, weights = attn(h, *args, return_weights=True, **kw)
    sow(layer, name, weights)
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
                 return_attention: bool = False) -> jax.Array:
        """Under a capture (layers/sow.py) the layer sows its sub-layer intermediates
        (stack.SUBLAYERS' names); return_attention adds the attention weights."""
        attend = lambda h: _attend(self, self.self_attn, "attn_weights", return_attention, h,
                                   mask=mask, bias=bias, positions=positions)
        if self.cfg.norms.parallel_residual:
            x, a, f = parallel_residual(x, self.attn_norm, attend, self.ffn_norm, self.ffn)
            sow(self, "attn_output", a)
            sow(self, "ffn_output", f)
            return x
        x, h = residual(self.cfg, self.attn_norm, attend, x, self.post_attn_norm, self.attn_layer_scale)
        sow(self, "attn_output", h)
        sow(self, "attn_residual", x)
        x, h = residual(self.cfg, self.ffn_norm, self.ffn, x, self.post_ffn_norm, self.ffn_layer_scale)
        sow(self, "ffn_output", h)
        return x


class DecoderLayer(nnx.Module):
    """Masked self-attention, cross-attention to `memory` (skipped if the layer has none),
    then FFN. x [B, T, D], memory [B, S, D] -> [B, T, D].

    With cache={"self": KVCache, "cross": KVCache (fixed)} (kv_cache.py) and
    step=kv_cache.Step(index, mode) (the slot of the first new token, the call's mode: see
    MultiHeadAttention), returns (x, new_cache); `memory` is then not needed
    ("cross" holds its keys/values, from init_cache). local: a sliding-window layer (its
    attention's RoPE: make_attention).
    """

    def __init__(self, cfg: TransformerConfig, *, cross_attention: bool = True, sparse: bool = False,
                 local: bool = False, attn_norm: bool = True, rngs: nnx.Rngs):
        if cross_attention and cfg.norms.parallel_residual:
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
                 step: kv_cache.Step | None = None, return_attention: bool = False):
        """Under a capture (layers/sow.py) the layer sows its sub-layer intermediates
        (stack.SUBLAYERS' names); return_attention adds the attention weights."""
        if cache is not None and step is None:
            raise ValueError("a DecoderLayer cache needs step=kv_cache.Step(index, mode)")
        new_cache = {}

        def self_block(h):
            if cache is None:
                return _attend(self, self.self_attn, "attn_weights", return_attention, h,
                               mask=mask, bias=bias, positions=positions)
            out, new_cache["self"] = self.self_attn(h, mask=mask, bias=bias, positions=positions,
                                                    cache=cache["self"], cache_index=step.index,
                                                    mode=step.mode)
            return out

        def cross_block(h):
            if cache is None:
                return _attend(self, self.cross_attn, "cross_attn_weights", return_attention, h,
                               memory, mask=memory_mask, bias=memory_bias)
            out, new_cache["cross"] = self.cross_attn(h, mask=memory_mask, bias=memory_bias,
                                                      cache=cache["cross"])
            return out

        if self.cfg.norms.parallel_residual:  # no cross-attention (checked in __init__)
            x, a, f = parallel_residual(x, self.attn_norm, self_block, self.ffn_norm, self.ffn)
            sow(self, "attn_output", a)
            sow(self, "ffn_output", f)
            return x if cache is None else (x, new_cache)
        x, h = residual(self.cfg, self.attn_norm, self_block, x, self.post_attn_norm, self.attn_layer_scale)
        sow(self, "attn_output", h)
        sow(self, "attn_residual", x)
        if self.cross_attn is not None:
            if memory is None and cache is None:
                raise ValueError("DecoderLayer with cross-attention needs `memory`")
            x, h = residual(self.cfg, self.cross_attn_norm, cross_block, x, self.post_cross_attn_norm,
                            self.cross_attn_layer_scale)
            sow(self, "cross_attn_output", h)
            sow(self, "cross_attn_residual", x)
        x, h = residual(self.cfg, self.ffn_norm, self.ffn, x, self.post_ffn_norm, self.ffn_layer_scale)
        sow(self, "ffn_output", h)
        return x if cache is None else (x, new_cache)

    def init_cache(self, batch: int, length: int, memory: jax.Array | None = None,
                   dtype=jnp.float32, *, ring: bool = False) -> dict:
        """An empty cache of `length` slots (ring: a sliding-window ring), and memory's
        cross-attention keys (kv_cache.layer_cache)."""
        return kv_cache.layer_cache(self, batch, length, memory, dtype, ring)


class _Stack(nnx.Module):
    """Shared plumbing: positional biases (ALiBi, T5) computed once per stack, final norm."""

    def __init__(self, cfg: TransformerConfig, *, causal: bool = False, rngs: nnx.Rngs):
        self.cfg = cfg
        self.causal = causal  # add the causal mask to self-attention (decoders)
        self.scan_layers = cfg.scan_layers
        self.remat_policy: str | None = None  # set by the trainer (train.remat)
        self.rel_bias = T5RelativePositionBias(
            cfg.positions.rel_num_buckets, cfg.positions.rel_max_distance, cfg.attention.num_heads,
            bidirectional=not self.causal, rngs=rngs) if cfg.positions.kind == "t5" else None
        self.final_norm = _norm(cfg, rngs) if cfg.norms.final_norm else None

    def mask_record(self, x: jax.Array, mask, positions, offset=0, keys: int | None = None):
        """-> (AttentionMask, bias, positions) of self-attention over x [B, T, D]: the one mask
        record the layers take (each with its window: AttentionMask.for_layer), made dense only
        in layers/dispatch.py. Queries sit at slots offset..; keys at the queries' slots, or with
        a cache at absolute slots 0..keys - 1 (the layers re-read it at their cache's slots,
        AttentionMask.at_keys). ALiBi's slopes join the record; a T5 bias over positions is
        `bias` (with a cache over slots: slot_bias)."""
        b, t, _ = x.shape
        positions = default_positions(b, t, offset) if positions is None else positions
        record = AttentionMask.of(mask, t, causal=self.causal, offset=offset, keys=keys)
        bias = None
        if self.cfg.positions.kind == "alibi":
            record = dataclasses.replace(
                record, alibi_slopes=jnp.asarray(tables.alibi_slopes(self.cfg.attention.num_heads)))
        elif self.rel_bias is not None and keys is None:
            bias = self.rel_bias(positions, positions)
        return record, bias, positions

    def slot_bias(self, q_slots: jax.Array, k_slots: jax.Array) -> jax.Array | None:
        """The T5 bias [1, H, T, S] of queries at q_slots [1, T] over keys at k_slots [S] (slot
        distances equal position distances, padding being on the left); None without T5."""
        return None if self.rel_bias is None else self.rel_bias(q_slots, k_slots[None])

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
        record, bias, positions = self.mask_record(x, mask, positions)
        window, inter = self.cfg.attention.sliding_window, {} if return_intermediates else None
        x = stack.run_layers(self, x, lambda layer, h, local: layer(
            h, mask=record.for_layer(local, window), bias=bias, positions=positions,
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
        """aux: a dict that receives the sparse layers' sown router logits and expert load (AUX,
        stacked [n_sparse, ...]; stack.run_layers); not with a cache."""
        _check_attention_flags(return_intermediates, return_attention)
        if return_attention and cache is not None:
            raise ValueError("return_attention is not supported together with a KV cache")
        if aux is not None and cache is not None:
            raise ValueError("the MoE auxiliary outputs (return_aux) are not supported together with a KV cache")
        if cache is not None and cache_index is None:
            raise ValueError("a decoder cache needs cache_index (the slot of the first new token)")
        mode, inter = kv_cache.mode_of(cache, x.shape[1]), {} if return_intermediates else None
        if mode == kv_cache.TRAIN:
            record, bias, positions = self.mask_record(x, mask, positions)
            window = self.cfg.attention.sliding_window
            x = stack.run_layers(self, x, lambda layer, h, local, rows: layer(
                h, memory, mask=rows[0].for_layer(local, window), bias=rows[1], memory_mask=memory_mask,
                positions=rows[2], return_attention=return_attention), inter, aux, rows=(record, bias, positions))
            return self.finish(x, inter)
        x, new_cache = self.cached_layers(x, memory, mask, memory_mask, positions, cache, cache_index, mode, inter)
        out = self.finish(x, inter)
        return (*out, new_cache) if inter is not None else (out, new_cache)

    def cached_layers(self, x, memory, mask, memory_mask, positions, cache, cache_index, mode: str, inter):
        """The layers over their caches (prefill or decode). A layer's mask is the stack's record
        read at the slots its cache's entries hold once this call's tokens are written
        (KVCache.key_slots, AttentionMask.at_keys; its T5 bias too): one per cache layout, as
        every layer of a layout (ring or linear, its length) holds the same slots."""
        t, window = x.shape[1], self.cfg.attention.sliding_window
        keys = mask.shape[-1] if mask is not None else t
        record, _, positions = self.mask_record(x, mask, positions, cache_index, keys=keys)
        layouts = {}

        def layout(self_cache):
            key = (self_cache.ring, self_cache.size)
            if key not in layouts:
                k_slots = self_cache.key_slots(cache_index, t, mode)
                layouts[key] = (record.at_keys(k_slots), self.slot_bias(record.q_slots, k_slots))
            return layouts[key]

        def call(layer, h, layer_cache, local, inputs):
            m, bb = inputs
            return layer(h, memory, mask=m.for_layer(local, window), bias=bb, memory_mask=memory_mask,
                         positions=positions, cache=layer_cache, step=kv_cache.Step(cache_index, mode))

        flags = stack.layer_flags(self.cfg, self.scan_layers)
        if self.scan_layers:
            inputs = layout(jax.tree.map(lambda a: a[0], cache["self"]))  # layer 0's slots: every layer's
            return stack.scan_cached(self, x, cache, lambda *a: call(*a, inputs), inter, flags)
        new_cache = []
        for i, layer in enumerate(self.layers):
            x, layer_cache = call(layer, x, cache[i], flags[i], layout(cache[i]["self"]))
            new_cache.append(layer_cache)
            if inter is not None:
                inter[f"layers.{i}"] = x
        return x, new_cache

    def cache_length(self, cache: list | dict) -> int | None:
        """L, the slots of the cache's linear layers; None when every layer rings (kv_cache.cache_length)."""
        return kv_cache.cache_length(cache)

    def init_cache(self, batch: int, length: int, memory: jax.Array | None = None,
                   dtype=jnp.float32) -> list | dict:
        """An empty cache per layer, rings for sliding-window layers (kv_cache.stack_cache)."""
        return kv_cache.stack_cache(self, batch, length, memory, dtype)
