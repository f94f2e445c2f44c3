"""Encoder and decoder layers (Pre-LN or Post-LN) and their stacks.
Twin: torch_ref/layers/transformer.py.

Post-LN (the seeds, Vaswani et al. 2017):  x = norm(x + dropout(sublayer(x)))
Pre-LN  (GPT-2, LLaMA, Xiong et al. 2020): x = x + dropout(sublayer(norm(x)))
The dropout on the sublayer output lives inside the sublayer (MultiHeadAttention.dropout,
FeedForward.dropout).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer.config import TransformerConfig
from jaxformer.layers.attention import (MultiHeadAttention, combine_masks, make_causal_mask,
                                        make_sliding_window_mask)
from jaxformer.layers.ffn import FeedForward
from jaxformer.layers.norm import make_norm
from jaxformer.layers.positional import T5RelativePositionBias, alibi_bias, default_positions


def make_attention(cfg: TransformerConfig, *, self_attn: bool, rngs: nnx.Rngs) -> MultiHeadAttention:
    use_rope = self_attn and cfg.position == "rope"
    return MultiHeadAttention(
        cfg.d_model, cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
        bias=cfg.bias, attn_dropout=cfg.attn_dropout, dropout=cfg.dropout,
        rope_max_len=cfg.max_len if use_rope else None, rope_base=cfg.rope_base, rngs=rngs)


def make_ffn(cfg: TransformerConfig, *, rngs: nnx.Rngs) -> FeedForward:
    return FeedForward(cfg.d_model, cfg.d_ff, kind=cfg.ffn, bias=cfg.bias,
                       inner_dropout=cfg.ffn_dropout, dropout=cfg.dropout, rngs=rngs)


def _norm(cfg: TransformerConfig, rngs: nnx.Rngs):
    return make_norm(cfg.norm, cfg.d_model, eps=cfg.norm_eps, bias=cfg.norm_bias, rngs=rngs)


def residual(cfg: TransformerConfig, norm, sublayer, x: jax.Array) -> jax.Array:
    """Apply `sublayer` with its residual connection in the configured norm position."""
    if cfg.norm_position == "pre":
        return x + sublayer(norm(x))
    return norm(x + sublayer(x))


class EncoderLayer(nnx.Module):
    """Self-attention then FFN, each with a residual and a norm. x [B, T, D] -> [B, T, D]."""

    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.self_attn = make_attention(cfg, self_attn=True, rngs=rngs)
        self.attn_norm = _norm(cfg, rngs)
        self.ffn = make_ffn(cfg, rngs=rngs)
        self.ffn_norm = _norm(cfg, rngs)

    def __call__(self, x: jax.Array, *, mask=None, bias=None, positions=None) -> jax.Array:
        x = residual(self.cfg, self.attn_norm,
                     lambda h: self.self_attn(h, mask=mask, bias=bias, positions=positions), x)
        return residual(self.cfg, self.ffn_norm, self.ffn, x)


class DecoderLayer(nnx.Module):
    """Masked self-attention, cross-attention to `memory` (skipped if the layer has none),
    then FFN. x [B, T, D], memory [B, S, D] -> [B, T, D]."""

    def __init__(self, cfg: TransformerConfig, *, cross_attention: bool = True, rngs: nnx.Rngs):
        self.cfg = cfg
        self.self_attn = make_attention(cfg, self_attn=True, rngs=rngs)
        self.attn_norm = _norm(cfg, rngs)
        self.cross_attn = make_attention(cfg, self_attn=False, rngs=rngs) if cross_attention else None
        self.cross_attn_norm = _norm(cfg, rngs) if cross_attention else None
        self.ffn = make_ffn(cfg, rngs=rngs)
        self.ffn_norm = _norm(cfg, rngs)

    def __call__(self, x: jax.Array, memory: jax.Array | None = None, *, mask=None, bias=None,
                 memory_mask=None, memory_bias=None, positions=None) -> jax.Array:
        x = residual(self.cfg, self.attn_norm,
                     lambda h: self.self_attn(h, mask=mask, bias=bias, positions=positions), x)
        if self.cross_attn is not None:
            if memory is None:
                raise ValueError("DecoderLayer with cross-attention needs `memory`")
            x = residual(self.cfg, self.cross_attn_norm,
                         lambda h: self.cross_attn(h, memory, mask=memory_mask, bias=memory_bias), x)
        return residual(self.cfg, self.ffn_norm, self.ffn, x)


class _Stack(nnx.Module):
    """Shared plumbing: positional biases (ALiBi, T5) computed once per stack, final norm."""

    causal: bool = False

    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.rel_bias = T5RelativePositionBias(
            cfg.rel_num_buckets, cfg.rel_max_distance, cfg.num_heads,
            bidirectional=not self.causal, rngs=rngs) if cfg.position == "t5" else None
        self.final_norm = _norm(cfg, rngs) if cfg.final_norm else None

    def self_attention_inputs(self, x: jax.Array, mask, positions):
        """-> (mask, bias, positions) for self-attention over x [B, T, D]."""
        b, t, _ = x.shape
        positions = default_positions(b, t) if positions is None else positions
        if self.causal:
            mask = combine_masks(mask, make_causal_mask(t))
        if self.cfg.sliding_window is not None:
            mask = combine_masks(mask, make_sliding_window_mask(t, t, self.cfg.sliding_window)
                                 if self.causal else _band_mask(t, self.cfg.sliding_window))
        bias = None
        if self.cfg.position == "alibi":
            bias = alibi_bias(self.cfg.num_heads, positions, positions)
        elif self.rel_bias is not None:
            bias = self.rel_bias(positions, positions)
        return mask, bias, positions

    def finish(self, x, intermediates):
        if self.final_norm is not None:
            x = self.final_norm(x)
            if intermediates is not None:
                intermediates["final_norm"] = x
        return (x, intermediates) if intermediates is not None else x


def _band_mask(t: int, window: int) -> jax.Array:
    """Bidirectional sliding window: |i - j| < window. -> [1, 1, T, T]."""
    d = jnp.abs(jnp.arange(t)[:, None] - jnp.arange(t)[None, :])
    return (d < window)[None, None]


class Encoder(_Stack):
    """A stack of EncoderLayers with an optional final norm.

    Shapes: x [B, T, D], mask bool broadcastable to [B, H, T, T] -> [B, T, D]; with
    return_intermediates, also {"layers.i": [B, T, D], "final_norm": [B, T, D]}.
    """

    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        super().__init__(cfg, rngs=rngs)
        self.layers = nnx.List([EncoderLayer(cfg, rngs=rngs) for _ in range(cfg.num_layers)])

    def __call__(self, x, *, mask=None, positions=None, return_intermediates: bool = False):
        mask, bias, positions = self.self_attention_inputs(x, mask, positions)
        inter = {} if return_intermediates else None
        for i, layer in enumerate(self.layers):
            x = layer(x, mask=mask, bias=bias, positions=positions)
            if inter is not None:
                inter[f"layers.{i}"] = x
        return self.finish(x, inter)


class Decoder(_Stack):
    """A stack of causal DecoderLayers, with cross-attention to `memory` unless
    cross_attention=False (decoder-only LMs).

    Shapes: x [B, T, D], memory [B, S, D], mask/memory_mask bool -> [B, T, D].
    """

    causal = True

    def __init__(self, cfg: TransformerConfig, *, cross_attention: bool = True, rngs: nnx.Rngs):
        super().__init__(cfg, rngs=rngs)
        self.layers = nnx.List([DecoderLayer(cfg, cross_attention=cross_attention, rngs=rngs)
                                for _ in range(cfg.num_layers)])

    def __call__(self, x, memory=None, *, mask=None, memory_mask=None, positions=None,
                 return_intermediates: bool = False):
        mask, bias, positions = self.self_attention_inputs(x, mask, positions)
        inter = {} if return_intermediates else None
        for i, layer in enumerate(self.layers):
            x = layer(x, memory, mask=mask, bias=bias, memory_mask=memory_mask, positions=positions)
            if inter is not None:
                inter[f"layers.{i}"] = x
        return self.finish(x, inter)


class TextEmbedding(nnx.Module):
    """Token embedding (optionally * sqrt(D)), plus absolute positions when the scheme has them
    (sinusoidal, learned), then dropout. RoPE/ALiBi/T5 act inside attention instead.

    Shapes: ids [B, T] int, positions [B, T] int -> [B, T, D].
    """

    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        from jaxformer.layers.embedding import Embedding
        from jaxformer.layers.positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.d_model, scale=cfg.scale_embedding, rngs=rngs)
        if cfg.position == "sinusoidal":
            self.embed_positions = SinusoidalPositionalEncoding(cfg.max_len, cfg.d_model)
        elif cfg.position == "learned":
            self.embed_positions = LearnedPositionalEmbedding(cfg.max_len, cfg.d_model, rngs=rngs)
        else:
            self.embed_positions = None
        self.dropout = nnx.Dropout(cfg.embed_dropout, rngs=rngs)
        self.max_len = cfg.max_len

    def __call__(self, ids: jax.Array, positions: jax.Array | None = None) -> jax.Array:
        b, t = ids.shape
        if positions is None:
            if t > self.max_len:
                raise ValueError(f"sequence length {t} exceeds max_len={self.max_len}")
            positions = default_positions(b, t)
        x = self.embed_tokens(ids)  # [B, T, D]
        if self.embed_positions is not None:
            x = x + self.embed_positions(positions)
        return self.dropout(x)
