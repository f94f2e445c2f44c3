"""The encoder-decoder Transformer of "Attention Is All You Need" (Vaswani et al. 2017):
scaled token embeddings (one table shared by source and target, or `src_embed`/`tgt_embed`),
sinusoidal positions, an Encoder with a source padding mask from pad_id, a causal Decoder
with cross-attention, and an output projection tied to the target embedding or `lm_head`.
Twin: torch_ref/models/seq2seq.py.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer.config.models import Seq2SeqConfig
from jaxformer.layers.attention import make_padding_mask
from jaxformer.layers.kernels import quant_train
from jaxformer.layers.linear import Linear
from jaxformer.layers.positional import default_positions
from jaxformer.layers.text_embedding import TextEmbedding
from jaxformer.layers.transformer import Decoder, Encoder
from jaxformer.models.common import LMOutput, check_mask, check_tokens, compute_dtype, set_compute_dtype


class Seq2Seq(nnx.Module):
    """Encoder-decoder.

    Shapes: src_ids [B, S] int, tgt_ids [B, T] int (starting with bos_id), src_mask [B, S]
    (1 = token; None = src_ids != pad_id) -> logits [B, T, V_tgt] float32. The target side
    is causal only: its pad tokens come after the real ones, so they never reach them.
    return_intermediates adds {"src_embeddings", "encoder.layers.i", "encoder.final_norm",
    "tgt_embeddings", "decoder.layers.i", "decoder.final_norm"}, and each layer's sub-layer
    outputs ("encoder.layers.i.attn", ...; layers/transformer.py); return_attention adds the
    attention weights ("decoder.layers.i.attn_weights", "decoder.layers.i.cross_attn_weights").
    """

    def __init__(self, cfg: Seq2SeqConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        enc, dec = cfg.encoder_config(), cfg.decoder_config()
        self.embed = TextEmbedding(enc, rngs=rngs) if cfg.share_embeddings else None
        self.src_embed = None if cfg.share_embeddings else TextEmbedding(enc, rngs=rngs)
        self.tgt_embed = None if cfg.share_embeddings else TextEmbedding(dec, rngs=rngs)
        self.encoder = Encoder(enc, rngs=rngs)
        self.decoder = Decoder(dec, cross_attention=True, rngs=rngs)
        self.lm_head = None if cfg.tie_output else Linear(
            cfg.d_model, cfg.resolved_tgt_vocab, use_bias=False, axes=("embed", "vocab"), rngs=rngs)
        set_compute_dtype(self, cfg.dtype)

    def source_embedding(self) -> TextEmbedding:
        return self.embed if self.embed is not None else self.src_embed

    def target_embedding(self) -> TextEmbedding:
        return self.embed if self.embed is not None else self.tgt_embed

    def encode(self, src_ids: jax.Array, src_mask: jax.Array | None = None, *,
               return_intermediates: bool = False, return_attention: bool = False):
        """-> memory [B, S, D], memory_mask [B, 1, 1, S] bool (and intermediates)."""
        check_tokens(src_ids, self.cfg.vocab_size, self.cfg.max_len, "source token id")
        check_mask(src_mask, src_ids.shape, "src_mask")
        b, s = src_ids.shape
        valid = src_ids != self.cfg.pad_id if src_mask is None else src_mask.astype(bool)  # [B, S]
        memory_mask = make_padding_mask(valid)  # [B, 1, 1, S]
        x = self.source_embedding()(src_ids, default_positions(b, s))  # [B, S, D]
        out = self.encoder(x, mask=memory_mask, return_intermediates=return_intermediates,
                           return_attention=return_attention)
        if not return_intermediates:
            return out, memory_mask
        memory, inter = out
        return memory, memory_mask, {"src_embeddings": x, **{f"encoder.{k}": v for k, v in inter.items()}}

    def decode(self, tgt_ids: jax.Array, memory: jax.Array | None, memory_mask: jax.Array, *,
               return_intermediates: bool = False, cache: list | dict | None = None, cache_index=None,
               return_attention: bool = False, return_hidden: bool = False):
        """tgt_ids [B, T] -> logits [B, T, V_tgt]; with return_intermediates or a cache an
        LMOutput (models/common.py: logits, the new cache, the intermediates; None where not
        asked). With a cache (init_cache), `memory` may be None: its keys/values are in the cache.
        return_hidden (no cache, no intermediates): an LMOutput with .hidden [B, T, D] and no
        logits, for the chunked loss (output_head; layers/kernels/chunked_loss.py)."""
        check_tokens(tgt_ids, self.cfg.resolved_tgt_vocab, self.cfg.max_len if cache is None else None,
                     "target token id")
        b, t = tgt_ids.shape
        positions = default_positions(b, t, 0 if cache_index is None else cache_index)  # [B, T]
        y = self.target_embedding()(tgt_ids, positions)  # [B, T, D]
        out = self.decoder(y, memory, memory_mask=memory_mask, positions=positions,
                           return_intermediates=return_intermediates, cache=cache, cache_index=cache_index,
                           return_attention=return_attention)
        out = out if isinstance(out, tuple) else (out,)
        if return_hidden:
            if cache is not None or return_intermediates:
                raise ValueError("return_hidden=True is for a training loss: no cache, no intermediates")
            return LMOutput(None, hidden=out[0])
        logits = self.logits(out[0])  # [B, T, V]
        if return_intermediates:
            out = (out[0], {"tgt_embeddings": y, **{f"decoder.{k}": v for k, v in out[1].items()}},
                   *out[2:])
        if not return_intermediates and cache is None:
            return logits
        return LMOutput(logits, cache=out[-1] if cache is not None else None,
                        intermediates=out[1] if return_intermediates else None)

    def __call__(self, src_ids: jax.Array, tgt_ids: jax.Array, src_mask: jax.Array | None = None, *,
                 return_intermediates: bool = False, return_attention: bool = False, return_hidden: bool = False):
        if return_attention and not return_intermediates:
            raise ValueError("return_attention=True needs return_intermediates=True")
        if not return_intermediates:
            memory, memory_mask = self.encode(src_ids, src_mask)
            return self.decode(tgt_ids, memory, memory_mask, return_hidden=return_hidden)
        memory, memory_mask, enc_inter = self.encode(src_ids, src_mask, return_intermediates=True,
                                                     return_attention=return_attention)
        out = self.decode(tgt_ids, memory, memory_mask, return_intermediates=True, return_attention=return_attention)
        return out.logits, {**enc_inter, **out.intermediates}

    def logits(self, h: jax.Array) -> jax.Array:
        """h [B, T, D] -> [B, T, V_tgt] float32, via the tied target embedding or lm_head."""
        return _head_logits(self.cfg, self.target_embedding().embed_tokens if self.lm_head is None else self.lm_head, h)

    def output_head(self):
        """The output head as a pure function of its own state -> (apply, state), with
        apply(state, h) == self.logits(h): the chunked loss (layers/kernels/chunked_loss.py)
        maps it over chunks of h and differentiates `state` as an input."""
        graphdef, state = nnx.split(self.target_embedding().embed_tokens if self.lm_head is None else self.lm_head)
        cfg = self.cfg
        return (lambda state, h: _head_logits(cfg, nnx.merge(graphdef, state), h)), state

    def init_cache(self, memory: jax.Array, length: int) -> list | dict:
        """Decoder KV cache: `length` empty self-attention slots per layer, plus the
        cross-attention keys/values of memory [B, S, D], projected once (with
        model.scan_layers one dict of stacked [num_layers, ...] leaves; Decoder.init_cache)."""
        return self.decoder.init_cache(memory.shape[0], length, memory, dtype=compute_dtype(self.cfg.dtype))


def _head_logits(cfg: Seq2SeqConfig, head, h: jax.Array) -> jax.Array:
    """h [B, T, D] -> [B, T, V_tgt] float32 through `head`: the tied target embedding (its
    attend) or lm_head."""
    h = h.astype(compute_dtype(cfg.dtype))
    if cfg.scale_decoder_output:  # T5 v1.0 (docs/numerics.md §22)
        h = h * cfg.d_model ** -0.5
    with quant_train.full_precision():  # the output head stays float under train.quantization
        return (head(h) if isinstance(head, Linear) else head.attend(h)).astype(jnp.float32)
