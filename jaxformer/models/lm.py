"""Decoder-only causal language model: token embedding (+ learned/sinusoidal positions), a
Decoder stack without cross-attention, a final norm and an output projection tied to the
embedding or separate (`lm_head`). GPT-2 (learned positions, LayerNorm, GELU-tanh, Pre-LN,
biases, tied) and LLaMA (RoPE, RMSNorm, SwiGLU, no biases, GQA) are config presets
(configs/lm.yaml, configs/llama.yaml). Twin: torch_ref/models/lm.py.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxformer.config.models import LMConfig
from jaxformer.layers.attention import AttentionMask, make_padding_mask
from jaxformer.layers.kernels import quant_train, ring
from jaxformer.layers.linear import Linear
from jaxformer.layers.positional import default_positions
from jaxformer.layers.special import tanh
from jaxformer.layers.text_embedding import TextEmbedding
from jaxformer.layers.transformer import Decoder
from jaxformer.models.common import (
    LMOutput,
    check_int_input,
    check_mask,
    check_tokens,
    compute_dtype,
    positions_from_mask,
    positions_from_segments,
    set_compute_dtype,
)


class LM(nnx.Module):
    """Causal LM.

    Shapes: ids [B, T] int, attention_mask [B, T] (1 = token; left padding is allowed, the
    positions then count real tokens only; position_ids [B, T] overrides them, as HF's) ->
    logits [B, T, V] float32.
    Packed documents: segment_ids [B, T] int (contiguous runs, one id per document, 0 =
    padding): a token attends only to earlier tokens of its own segment, and positions
    restart at each segment (unless position_ids are given), so each document gets the
    logits it would get alone (layers/attention.py make_segment_mask). No cache.
    Incremental decoding: cache = init_cache(B, L), cache_index = slot of ids[:, 0], and
    attention_mask [B, L] over all cache slots.
    Returns the logits alone for a plain call; with a cache or any return_* flag, an LMOutput
    (models/common.py) holding the logits and what was asked: .cache (the new cache),
    .intermediates ({"embeddings", "layers.i.<sub-layer>", "layers.i", "final_norm"};
    return_attention adds "layers.i.attn_weights" [B, H, T, T], also read as .attention),
    .aux (return_aux, model.moe, no cache: {"router_logits": [n_sparse, B, T, E] float32,
    "expert_load": [n_sparse, E] float32}; layers/moe.py MoE; moe_aux_losses takes them).
    return_hidden (no cache, no intermediates): an LMOutput with .hidden [B, T, D], what the
    output head takes, and no logits: the trainer's chunked loss applies the head itself
    (output_head; layers/kernels/chunked_loss.py).
    """

    def __init__(self, cfg: LMConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        stack = cfg.decoder_config()
        self.embed = TextEmbedding(stack, rngs=rngs)
        self.decoder = Decoder(stack, cross_attention=False, rngs=rngs)
        self.lm_head = None if cfg.tie_embeddings else Linear(
            cfg.d_model, cfg.vocab_size, use_bias=False, axes=("embed", "vocab"), rngs=rngs)
        set_compute_dtype(self, cfg.dtype)

    def __call__(self, ids: jax.Array, attention_mask: jax.Array | None = None, *,
                 return_intermediates: bool = False, cache: list | dict | None = None, cache_index=None,
                 return_attention: bool = False, position_ids: jax.Array | None = None,
                 return_aux: bool = False, segment_ids: jax.Array | None = None, return_hidden: bool = False):
        check_tokens(ids, self.cfg.vocab_size, self.cfg.max_len if cache is None else None)
        b, t = ids.shape
        if return_aux and self.cfg.feedforward.moe is None:
            raise ValueError("return_aux=True needs a mixture-of-experts model (model.moe)")
        slots = t if cache is None else self.decoder.cache_length(cache)  # None: ring caches only
        start = 0 if cache_index is None else cache_index
        if attention_mask is None:
            positions, mask = default_positions(b, t, start), None  # [B, T]
        else:
            if attention_mask.ndim != 2 or attention_mask.shape[0] != b or slots not in (None, attention_mask.shape[1]):
                raise ValueError(f"attention_mask must be [batch, {slots or 'slots'}] (one entry per "
                                 f"{'cache slot' if cache is not None else 'token'}), "
                                 f"got {tuple(attention_mask.shape)}")
            check_mask(attention_mask, None)
            positions = jax.lax.dynamic_slice_in_dim(positions_from_mask(attention_mask), start, t, 1)  # [B, T]
            mask = make_padding_mask(attention_mask)  # [B, 1, 1, L]
        if segment_ids is not None:  # packed documents: no attention across them, positions restart
            check_int_input(segment_ids, "segment id")
            if cache is not None or tuple(segment_ids.shape) != (b, t):
                raise ValueError(f"segment_ids must be [batch, {t}] and used without a cache, got "
                                 f"{tuple(segment_ids.shape)}{' with a cache' if cache is not None else ''}")
            positions = positions_from_segments(segment_ids)
        if cache is None:  # the mask record, in parts, O(T); dense only in layers/dispatch.py
            mask = AttentionMask.self_attention(1, t, causal=True, key_valid=attention_mask,
                                                segment_ids=segment_ids)
        if position_ids is not None:  # the caller's positions (HF's position_ids)
            check_int_input(position_ids, "position id")
            if tuple(position_ids.shape) != (b, t):
                raise ValueError(f"position_ids must be [batch, {t}], got {tuple(position_ids.shape)}")
            positions = position_ids
        # context parallelism (ring attention): the sequence in zigzag order, permuted once here
        # and put back before the logits; the masks go by slot (layers/kernels/ring.py, docs/numerics.md §30)
        n = ring.context_size() if cache is None and not return_intermediates else 1
        order = ring.zigzag_order(t, n) if n > 1 else None
        if order is not None:
            ids, positions, mask = ids[:, order], positions[:, order], ring.permute_mask(mask, order)
        x = ring.shard_sequence(self.embed(ids, positions))  # [B, T, D]
        aux = {} if return_aux else None
        out = self.decoder(x, mask=mask, positions=positions, return_intermediates=return_intermediates,
                           cache=cache, cache_index=cache_index, return_attention=return_attention, aux=aux)
        out = out if isinstance(out, tuple) else (out,)
        h = out[0]
        if order is not None:
            h = ring.shard_sequence(ring.from_zigzag(h, n))  # the logits split over the context axis too
            if return_aux:  # router logits [n_sparse, B, T, E] in sequence order too
                aux["router_logits"] = aux["router_logits"][:, :, np.argsort(order)]
        if return_hidden:
            if cache is not None or return_intermediates:
                raise ValueError("return_hidden=True is for a training loss: no cache, no intermediates")
            return LMOutput(None, aux=aux, hidden=h)
        logits = ring.shard_batch(self.logits(h))  # [B, T, V]
        if cache is None and not return_intermediates and not return_aux:
            return logits
        return LMOutput(logits, cache=out[-1] if cache is not None else None, aux=aux,
                        intermediates={"embeddings": x, **out[1]} if return_intermediates else None)

    def logits(self, h: jax.Array) -> jax.Array:
        """h [B, T, D] -> [B, T, V] float32, via the tied embedding or lm_head; then
        final_logit_softcap * tanh(logits / final_logit_softcap) when set (Gemma2)."""
        return _head_logits(self.cfg, self.embed.embed_tokens if self.lm_head is None else self.lm_head, h)

    def output_head(self):
        """The output head as a pure function of its own state -> (apply, state), with
        apply(state, h) == self.logits(h): the chunked loss (layers/kernels/chunked_loss.py)
        maps it over chunks of h and differentiates `state` as an input."""
        graphdef, state = nnx.split(self.embed.embed_tokens if self.lm_head is None else self.lm_head)
        cfg = self.cfg
        return (lambda state, h: _head_logits(cfg, nnx.merge(graphdef, state), h)), state

    def init_cache(self, batch: int, length: int) -> list | dict:
        """An empty KV cache of `length` slots per layer, in the compute dtype (stacked
        [num_layers, B, G, L, K] leaves with model.scan_layers; Decoder.init_cache)."""
        return self.decoder.init_cache(batch, length, dtype=compute_dtype(self.cfg.dtype))


def _head_logits(cfg: LMConfig, head, h: jax.Array) -> jax.Array:
    """h [B, T, D] -> [B, T, V] float32 through `head`: the tied embedding (its attend) or
    lm_head; then the final soft-cap when set."""
    h = h.astype(compute_dtype(cfg.dtype))
    with quant_train.full_precision():  # the output head stays float under train.quantization
        out = head(h) if isinstance(head, Linear) else head.attend(h)
    out = out.astype(jnp.float32)
    cap = cfg.final_logit_softcap
    return out if cap is None else tanh(out / cap) * cap  # torch's accuracy (docs/numerics.md §44)
