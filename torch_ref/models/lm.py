"""Decoder-only causal language model: token embedding (+ learned/sinusoidal positions), a
Decoder stack without cross-attention, a final norm and an output projection tied to the
embedding or separate (`lm_head`). GPT-2 (learned positions, LayerNorm, GELU-tanh, Pre-LN,
biases, tied) and LLaMA (RoPE, RMSNorm, SwiGLU, no biases, GQA) are config presets
(configs/lm.yaml, configs/llama.yaml). Twin: jaxformer/models/lm.py.
"""
from __future__ import annotations

import torch
from torch import nn

from jaxformer.config.models import LMConfig
from torch_ref.layers.attention import AttentionMask, make_padding_mask
from torch_ref.layers.positional import default_positions
from torch_ref.layers.text_embedding import TextEmbedding
from torch_ref.layers.transformer import Decoder
from torch_ref.models.common import (
    LMOutput,
    autocast,
    check_int_input,
    check_mask,
    check_tokens,
    compute_dtype,
    positions_from_mask,
    positions_from_segments,
)


class LM(nn.Module):
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
    """

    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.cfg = cfg
        stack = cfg.decoder_config()
        self.embed = TextEmbedding(stack)
        self.decoder = Decoder(stack, cross_attention=False)
        self.lm_head = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                return_intermediates: bool = False, cache: list | None = None, cache_index=None,
                return_attention: bool = False, position_ids: torch.Tensor | None = None,
                return_aux: bool = False, segment_ids: torch.Tensor | None = None):
        with autocast(self.cfg.dtype, ids.device):
            return self._forward(ids, attention_mask, return_intermediates, cache, cache_index, return_attention,
                                 position_ids, return_aux, segment_ids)

    def _forward(self, ids, attention_mask, return_intermediates, cache, cache_index, return_attention=False,
                 position_ids=None, return_aux=False, segment_ids=None):
        check_tokens(ids, self.cfg.vocab_size, self.cfg.max_len if cache is None else None)
        b, t = ids.shape
        if return_aux and self.cfg.feedforward.moe is None:
            raise ValueError("return_aux=True needs a mixture-of-experts model (model.moe)")
        slots = t if cache is None else self.decoder.cache_length(cache)  # None: ring caches only
        start = 0 if cache_index is None else cache_index
        if attention_mask is None:
            positions, mask = default_positions(b, t, start, device=ids.device), None  # [B, T]
        else:
            if attention_mask.dim() != 2 or attention_mask.shape[0] != b or slots not in (None, attention_mask.shape[1]):
                raise ValueError(f"attention_mask must be [batch, {slots or 'slots'}] (one entry per "
                                 f"{'cache slot' if cache is not None else 'token'}), "
                                 f"got {tuple(attention_mask.shape)}")
            check_mask(attention_mask, None)
            positions = positions_from_mask(attention_mask)[:, start:start + t]  # [B, T]
            mask = make_padding_mask(attention_mask)  # [B, 1, 1, L]
        if segment_ids is not None:  # packed documents: no attention across them, positions restart
            check_int_input(segment_ids, "segment id")
            if cache is not None or tuple(segment_ids.shape) != (b, t):
                raise ValueError(f"segment_ids must be [batch, {t}] and used without a cache, got "
                                 f"{tuple(segment_ids.shape)}{' with a cache' if cache is not None else ''}")
            positions = positions_from_segments(segment_ids)
        if cache is None:  # the mask record, in parts; dense only in layers/dispatch.py
            mask = AttentionMask.self_attention(1, t, causal=True, key_valid=attention_mask,
                                                segment_ids=segment_ids, device=ids.device)
        if position_ids is not None:  # the caller's positions (HF's position_ids)
            check_int_input(position_ids, "position id")
            if tuple(position_ids.shape) != (b, t):
                raise ValueError(f"position_ids must be [batch, {t}], got {tuple(position_ids.shape)}")
            positions = position_ids
        x = self.embed(ids, positions)  # [B, T, D]
        aux = {} if return_aux else None
        out = self.decoder(x, mask=mask, positions=positions, return_intermediates=return_intermediates,
                           cache=cache, cache_index=cache_index, return_attention=return_attention, aux=aux)
        out = out if isinstance(out, tuple) else (out,)
        logits = self.logits(out[0])  # [B, T, V]
        if cache is None and not return_intermediates and not return_aux:
            return logits
        return LMOutput(logits, cache=out[-1] if cache is not None else None, aux=aux,
                        intermediates={"embeddings": x, **out[1]} if return_intermediates else None)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """h [B, T, D] -> [B, T, V] float32, via the tied embedding or lm_head; then
        final_logit_softcap * tanh(logits / final_logit_softcap) when set (Gemma2)."""
        h = h.to(compute_dtype(self.cfg.dtype))
        out = self.embed.embed_tokens.attend(h) if self.lm_head is None else self.lm_head(h)
        out = out.float()
        cap = self.cfg.final_logit_softcap
        return out if cap is None else torch.tanh(out / cap) * cap

    def init_cache(self, batch: int, length: int) -> list:
        """An empty KV cache of `length` slots per layer, in the compute dtype."""
        return self.decoder.init_cache(batch, length, dtype=compute_dtype(self.cfg.dtype))
