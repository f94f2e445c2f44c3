"""Encoder and decoder layers (Pre-LN or Post-LN) and their stacks.
Twin: torch_ref/layers/transformer.py.

Post-LN (Vaswani et al. 2017):             x = norm(x + dropout(sublayer(x)))
Pre-LN  (GPT-2, LLaMA, Xiong et al. 2020): x = x + dropout(sublayer(norm(x)))
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

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer.config import TransformerConfig
from jaxformer.layers.attention import (MultiHeadAttention, combine_masks, make_causal_mask,
                                        make_sliding_window_mask)
from jaxformer.layers.ffn import FeedForward
from jaxformer.layers import partitioning
from jaxformer.layers.norm import make_norm
from jaxformer.layers.embedding import Embedding
from jaxformer.layers.positional import T5RelativePositionBias, absolute_positions, alibi_bias, default_positions


def make_attention(cfg: TransformerConfig, *, self_attn: bool, rngs: nnx.Rngs) -> MultiHeadAttention:
    use_rope = self_attn and cfg.position == "rope"
    return MultiHeadAttention(
        cfg.d_model, cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
        bias=cfg.resolved_qkv_bias, out_bias=cfg.resolved_out_bias, attn_dropout=cfg.attn_dropout,
        dropout=cfg.dropout, rope_max_len=cfg.max_len if use_rope else None, rope_base=cfg.rope_base,
        rope_scaling=cfg.rope_scaling, qk_norm=cfg.norm if cfg.qk_norm else None, norm_eps=cfg.norm_eps, rngs=rngs)


def make_ffn(cfg: TransformerConfig, *, rngs: nnx.Rngs) -> FeedForward:
    return FeedForward(cfg.d_model, cfg.d_ff, kind=cfg.ffn, bias=cfg.resolved_ffn_bias,
                       inner_dropout=cfg.ffn_dropout, dropout=cfg.dropout, rngs=rngs)


def _norm(cfg: TransformerConfig, rngs: nnx.Rngs):
    return make_norm(cfg.norm, cfg.d_model, eps=cfg.norm_eps, bias=cfg.norm_bias, rngs=rngs)


# the sub-layer intermediates of one layer, in depth order (module docstring)
SUBLAYERS = ("attn_weights", "attn", "attn_residual", "cross_attn_weights", "cross_attn",
             "cross_attn_residual", "ffn")


def residual(cfg: TransformerConfig, norm, sublayer, x: jax.Array, record: dict | None = None,
             name: str = "") -> jax.Array:
    """Apply `sublayer` with its residual connection in the configured norm position. The
    residual stream keeps x's dtype (a bf16-compute sublayer adds into an fp32 stream, as
    under torch autocast). With `record`, the sublayer's output (before the add) goes to
    record[name]."""
    h = sublayer(norm(x) if cfg.norm_position == "pre" else x).astype(x.dtype)
    if record is not None:
        record[name] = h
    return x + h if cfg.norm_position == "pre" else norm(x + h)


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
    """Self-attention then FFN, each with a residual and a norm. x [B, T, D] -> [B, T, D]."""

    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.self_attn = make_attention(cfg, self_attn=True, rngs=rngs)
        self.attn_norm = _norm(cfg, rngs)
        self.ffn = make_ffn(cfg, rngs=rngs)
        self.ffn_norm = _norm(cfg, rngs)

    def __call__(self, x: jax.Array, *, mask=None, bias=None, positions=None,
                 record: dict | None = None, return_attention: bool = False) -> jax.Array:
        """record: a dict that receives the sub-layer intermediates (SUBLAYERS names);
        return_attention adds the attention weights to it."""
        x = residual(self.cfg, self.attn_norm,
                     lambda h: _attend(self.self_attn, record, "attn_weights", return_attention, h,
                                       mask=mask, bias=bias, positions=positions), x, record, "attn")
        put_record(record, "attn_residual", x)
        return residual(self.cfg, self.ffn_norm, self.ffn, x, record, "ffn")


class DecoderLayer(nnx.Module):
    """Masked self-attention, cross-attention to `memory` (skipped if the layer has none),
    then FFN. x [B, T, D], memory [B, S, D] -> [B, T, D].

    With cache={"self": {"k", "v"} [B, G, L, K], "cross": {"k", "v"} [B, G, S, K]} and
    cache_index (see MultiHeadAttention), returns (x, new_cache); `memory` is then not needed
    ("cross" holds its keys/values, from init_cache).
    """

    def __init__(self, cfg: TransformerConfig, *, cross_attention: bool = True, rngs: nnx.Rngs):
        self.cfg = cfg
        self.self_attn = make_attention(cfg, self_attn=True, rngs=rngs)
        self.attn_norm = _norm(cfg, rngs)
        self.cross_attn = make_attention(cfg, self_attn=False, rngs=rngs) if cross_attention else None
        self.cross_attn_norm = _norm(cfg, rngs) if cross_attention else None
        self.ffn = make_ffn(cfg, rngs=rngs)
        self.ffn_norm = _norm(cfg, rngs)

    def __call__(self, x: jax.Array, memory: jax.Array | None = None, *, mask=None, bias=None,
                 memory_mask=None, memory_bias=None, positions=None, cache: dict | None = None,
                 cache_index=None, record: dict | None = None, return_attention: bool = False):
        new_cache = {}

        def self_block(h):
            if cache is None:
                return _attend(self.self_attn, record, "attn_weights", return_attention, h,
                               mask=mask, bias=bias, positions=positions)
            out, new_cache["self"] = self.self_attn(h, mask=mask, bias=bias, positions=positions,
                                                    cache=cache["self"], cache_index=cache_index)
            return out

        def cross_block(h):
            if cache is None:
                return _attend(self.cross_attn, record, "cross_attn_weights", return_attention, h,
                               memory, mask=memory_mask, bias=memory_bias)
            out, new_cache["cross"] = self.cross_attn(h, mask=memory_mask, bias=memory_bias,
                                                      cache=cache["cross"])
            return out

        x = residual(self.cfg, self.attn_norm, self_block, x, record, "attn")
        put_record(record, "attn_residual", x)
        if self.cross_attn is not None:
            if memory is None and cache is None:
                raise ValueError("DecoderLayer with cross-attention needs `memory`")
            x = residual(self.cfg, self.cross_attn_norm, cross_block, x, record, "cross_attn")
            put_record(record, "cross_attn_residual", x)
        x = residual(self.cfg, self.ffn_norm, self.ffn, x, record, "ffn")
        return x if cache is None else (x, new_cache)

    def init_cache(self, batch: int, length: int, memory: jax.Array | None = None,
                   dtype=jnp.float32) -> dict:
        """An empty self-attention cache of `length` slots, plus the cross-attention keys and
        values of memory [B, S, D] (projected once)."""
        attn = self.self_attn
        shape = (batch, attn.num_kv_heads, length, attn.head_dim)  # [B, G, L, K]
        cache = {"self": {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}}
        if self.cross_attn is not None:
            if memory is None:
                raise ValueError("init_cache of a DecoderLayer with cross-attention needs `memory`")
            kv = self.cross_attn.project_kv(memory)
            cache["cross"] = {name: jnp.swapaxes(a, 1, 2).astype(dtype) for name, a in kv.items()}  # [B, G, S, K]
        return cache


class _Stack(nnx.Module):
    """Shared plumbing: positional biases (ALiBi, T5) computed once per stack, final norm."""

    causal: bool = False

    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.scan_layers = cfg.scan_layers
        self.remat_policy: str | None = None  # set by the trainer (train.remat)
        self.rel_bias = T5RelativePositionBias(
            cfg.rel_num_buckets, cfg.rel_max_distance, cfg.num_heads,
            bidirectional=not self.causal, rngs=rngs) if cfg.position == "t5" else None
        self.final_norm = _norm(cfg, rngs) if cfg.final_norm else None

    def self_attention_inputs(self, x: jax.Array, mask, positions, cache_index=None,
                              cache_len: int | None = None):
        """-> (mask, bias, positions) for self-attention over x [B, T, D]. With a cache, the
        keys are its cache_len slots and query i sits in slot cache_index + i; ALiBi/T5 biases
        then use slot distances (equal to position distances, padding being on the left)."""
        b, t, _ = x.shape
        offset = 0 if cache_index is None else cache_index
        s = t if cache_len is None else cache_len
        positions = default_positions(b, t, offset) if positions is None else positions
        if self.causal:
            mask = combine_masks(mask, make_causal_mask(t, s, offset))
        if self.cfg.sliding_window is not None:
            mask = combine_masks(mask, make_sliding_window_mask(t, s, self.cfg.sliding_window, offset)
                                 if self.causal else _band_mask(t, self.cfg.sliding_window))
        q_pos, k_pos = positions, positions
        if cache_index is not None:
            q_pos, k_pos = default_positions(1, t, offset), default_positions(1, s)  # slots
        bias = None
        if self.cfg.position == "alibi":
            bias = alibi_bias(self.cfg.num_heads, q_pos, k_pos)
        elif self.rel_bias is not None:
            bias = self.rel_bias(q_pos, k_pos)
        return mask, bias, positions

    def make_layers(self, make, rngs: nnx.Rngs):
        """num_layers layers from make(rngs): a list, or with scan_layers one module whose
        params carry a leading layer axis [L, ...] (nnx.vmap over split RNG streams)."""
        n = self.cfg.num_layers
        if not self.scan_layers:
            return nnx.List([make(rngs) for _ in range(n)])

        @nnx.split_rngs(splits=n)
        @nnx.vmap(in_axes=(0,), out_axes=0, axis_size=n,
                  transform_metadata={nnx.PARTITION_NAME: partitioning.LAYERS_AXIS})
        def stacked(rngs):
            return make(rngs)
        return stacked(rngs)

    def run_layers(self, x, call, intermediates: dict | None):
        """x -> call(layer, x) for every layer, as a Python loop or (scan_layers) one lax.scan
        over the stacked params. With remat_policy, each layer's activations are recomputed
        in the backward pass (jax.checkpoint with that policy), also inside the scan.
        With intermediates, call(layer, x, record) fills `record` with the layer's sub-layer
        outputs, stored as "layers.i.<name>" (SUBLAYERS order) before "layers.i"."""
        policy = getattr(jax.checkpoint_policies, self.remat_policy) if self.remat_policy else None
        keep = intermediates is not None
        if not self.scan_layers:
            for i, layer in enumerate(self.layers):
                record = {} if keep else None
                x = _remat_call(layer, x, call, policy, record) if policy else \
                    (call(layer, x, record) if keep else call(layer, x))
                if keep:
                    _store_layer(intermediates, i, record, x)
            return x
        graphdef, state = nnx.split(self.layers)

        def body(h, layer_state):
            layer = nnx.merge(graphdef, jax.tree.map(lambda a: a, layer_state))
            record = {} if keep else None
            h = call(layer, h, record) if keep else call(layer, h)
            return h, ((h, record) if keep else None, nnx.state(layer))

        if policy:
            body = jax.checkpoint(body, policy=policy)
        x, (ys, new_state) = jax.lax.scan(body, x, state)
        nnx.update(self.layers, new_state)  # advanced dropout RNG counts
        if keep:
            hs, records = ys  # stacked along a leading layer axis
            for i in range(self.cfg.num_layers):
                _store_layer(intermediates, i, {k: v[i] for k, v in records.items()}, hs[i])
        return x

    def finish(self, x, intermediates):
        if self.final_norm is not None:
            x = self.final_norm(x)
            if intermediates is not None:
                intermediates["final_norm"] = x
        return (x, intermediates) if intermediates is not None else x


def _remat_call(layer, x, call, policy, record: dict | None = None):
    """call(layer, x) under jax.checkpoint, threading the layer's state (dropout RNG) through;
    with `record`, call(layer, x, record) and the recorded sub-layer outputs come out too."""
    graphdef, state = nnx.split(layer)

    def f(state, h):
        inner = nnx.merge(graphdef, jax.tree.map(lambda a: a, state))
        rec = {} if record is not None else None
        y = call(inner, h, rec) if rec is not None else call(inner, h)
        return y, rec, nnx.state(inner)

    y, rec, new_state = jax.checkpoint(f, policy=policy)(state, x)
    nnx.update(layer, new_state)
    if record is not None:
        record.update(rec)
    return y


def _store_layer(intermediates: dict, i: int, record: dict, x) -> None:
    """layers.i.<sub-layer> in SUBLAYERS (depth) order, then layers.i itself."""
    for name in SUBLAYERS:
        if name in record:
            intermediates[f"layers.{i}.{name}"] = record[name]
    intermediates[f"layers.{i}"] = x


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
        self.layers = self.make_layers(lambda r: EncoderLayer(cfg, rngs=r), rngs)

    def __call__(self, x, *, mask=None, positions=None, return_intermediates: bool = False,
                 return_attention: bool = False):
        _check_attention_flags(return_intermediates, return_attention)
        mask, bias, positions = self.self_attention_inputs(x, mask, positions)
        inter = {} if return_intermediates else None
        x = self.run_layers(x, lambda layer, h, record=None: layer(
            h, mask=mask, bias=bias, positions=positions, record=record,
            return_attention=return_attention), inter)
        return self.finish(x, inter)


class Decoder(_Stack):
    """A stack of causal DecoderLayers, with cross-attention to `memory` unless
    cross_attention=False (decoder-only LMs).

    Shapes: x [B, T, D], memory [B, S, D], mask/memory_mask bool -> [B, T, D].

    Incremental decoding: cache = init_cache(...) (one dict per layer; for a scanned stack one
    dict of [num_layers, ...] leaves) and cache_index (int scalar, may be traced): x holds the T new tokens, which sit in slots cache_index.., and
    `mask` is a key mask over the L cache slots (e.g. [B, 1, 1, L] from left padding); the
    causal part is added here. Returns (x, new_cache) (or (x, intermediates, new_cache)).
    """

    causal = True

    def __init__(self, cfg: TransformerConfig, *, cross_attention: bool = True, rngs: nnx.Rngs):
        super().__init__(cfg, rngs=rngs)
        self.layers = self.make_layers(lambda r: DecoderLayer(cfg, cross_attention=cross_attention, rngs=r),
                                       rngs)

    def __call__(self, x, memory=None, *, mask=None, memory_mask=None, positions=None,
                 return_intermediates: bool = False, cache: list | dict | None = None, cache_index=None,
                 return_attention: bool = False):
        _check_attention_flags(return_intermediates, return_attention)
        if return_attention and cache is not None:
            raise ValueError("return_attention is not supported together with a KV cache")
        cache_len = None if cache is None else cache_slots(cache)
        if cache is not None and cache_index is None:
            raise ValueError("a decoder cache needs cache_index (the slot of the first new token)")
        mask, bias, positions = self.self_attention_inputs(x, mask, positions, cache_index, cache_len)
        inter = {} if return_intermediates else None
        if cache is None:
            x = self.run_layers(x, lambda layer, h, record=None: layer(
                h, memory, mask=mask, bias=bias, memory_mask=memory_mask, positions=positions,
                record=record, return_attention=return_attention), inter)
            return self.finish(x, inter)

        def call(layer, h, layer_cache):
            return layer(h, memory, mask=mask, bias=bias, memory_mask=memory_mask, positions=positions,
                         cache=layer_cache, cache_index=cache_index)

        if self.scan_layers:
            x, new_cache = self._scan_cached(x, cache, call, inter)
        else:
            new_cache = []
            for i, layer in enumerate(self.layers):
                x, layer_cache = call(layer, x, cache[i])
                new_cache.append(layer_cache)
                if inter is not None:
                    inter[f"layers.{i}"] = x
        out = self.finish(x, inter)
        return (*out, new_cache) if inter is not None else (out, new_cache)

    def _scan_cached(self, x, cache: dict, call, intermediates: dict | None):
        """The cached call of a scanned stack: one lax.scan over the layers, each step taking
        its layer's params and its slice of the stacked cache ([L, B, G, S, K] leaves) and
        giving back that slice updated. -> (x, new stacked cache). The layer copies inside the
        scan are not written back: decoding draws no dropout (generate runs in eval mode), and
        a decode loop traces this call inside its own loop, where the model's variables belong
        to an outer trace and cannot be set."""
        graphdef, state = nnx.split(self.layers)
        keep = intermediates is not None

        def body(h, xs):
            layer_state, layer_cache = xs
            layer = nnx.merge(graphdef, jax.tree.map(lambda a: a, layer_state))
            h, layer_cache = call(layer, h, layer_cache)
            return h, (h if keep else None, layer_cache)

        x, (ys, new_cache) = jax.lax.scan(body, x, (state, cache))
        if keep:
            for i in range(self.cfg.num_layers):
                intermediates[f"layers.{i}"] = ys[i]
        return x, new_cache

    def init_cache(self, batch: int, length: int, memory: jax.Array | None = None,
                   dtype=jnp.float32) -> list | dict:
        """Per layer: an empty self-attention cache of `length` slots [B, G, L, K] and, with
        cross-attention, the keys/values of memory [B, S, D]. A list of per-layer dicts, or
        for a scanned stack (scan_layers) one dict of stacked leaves [num_layers, B, G, ., K]
        that the cached call scans over."""
        if not self.scan_layers:
            return [layer.init_cache(batch, length, memory, dtype) for layer in self.layers]
        graphdef, state = nnx.split(self.layers)

        def one(layer_state):
            return nnx.merge(graphdef, layer_state).init_cache(batch, length, memory, dtype)
        return jax.vmap(one)(state)


def cache_slots(cache: list | dict) -> int:
    """The number of self-attention slots of a decoder cache (a per-layer list, or the stacked
    dict of a scanned stack): the second-last axis of its keys."""
    first = cache if isinstance(cache, dict) else cache[0]
    return first["self"]["k"].shape[-2]


class TextEmbedding(nnx.Module):
    """Token embedding (optionally * sqrt(D)), plus token type embeddings (BERT,
    type_vocab_size > 0), plus absolute positions when the scheme has them (sinusoidal,
    learned), then an optional norm (BERT, embed_norm) and dropout. RoPE/ALiBi/T5 act inside
    attention instead. The sum's order (tokens + types + positions) is HF BERT's.

    Shapes: ids [B, T] int, positions [B, T] int, token_type_ids [B, T] int (None = all 0)
    -> [B, T, D].
    """

    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.d_model, scale=cfg.scale_embedding, rngs=rngs)
        self.embed_positions = absolute_positions(cfg.position, cfg.max_len, cfg.d_model, rngs=rngs)
        self.embed_token_types = Embedding(cfg.type_vocab_size, cfg.d_model, init_std=0.02,
                                           axes=(None, "embed"), rngs=rngs) \
            if cfg.type_vocab_size else None
        self.norm = _norm(cfg, rngs) if cfg.embed_norm else None
        self.dropout = nnx.Dropout(cfg.embed_dropout, rngs=rngs)
        self.max_len = cfg.max_len

    def __call__(self, ids: jax.Array, positions: jax.Array | None = None,
                 token_type_ids: jax.Array | None = None) -> jax.Array:
        b, t = ids.shape
        if positions is None:
            if t > self.max_len:
                raise ValueError(f"sequence length {t} exceeds max_len={self.max_len}")
            positions = default_positions(b, t)
        x = self.embed_tokens(ids)  # [B, T, D]
        if self.embed_token_types is not None:
            types = jnp.zeros_like(ids) if token_type_ids is None else token_type_ids  # [B, T]
            x = x + self.embed_token_types(types)
        elif token_type_ids is not None:
            raise ValueError("token_type_ids given, but the config has no token types (type_vocab_size=0)")
        if self.embed_positions is not None:
            x = x + self.embed_positions(positions)
        if self.norm is not None:
            x = self.norm(x)
        return self.dropout(x)
