"""The seed tutorial's TransformerEncoder: scaled token embedding, positions, a stack of
encoder layers and a final norm. Twin: torch_ref/models/encoder.py."""
from __future__ import annotations

import jax
from flax import nnx

from jaxformer.config import TransformerConfig
from jaxformer.layers.attention import make_padding_mask
from jaxformer.layers.transformer import Encoder, TextEmbedding


class TextEncoder(nnx.Module):
    """Shapes: ids [B, T] int, attention_mask [B, T] (1 = token, None = all) -> [B, T, D]."""

    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.embed = TextEmbedding(cfg, rngs=rngs)
        self.encoder = Encoder(cfg, rngs=rngs)

    def __call__(self, ids: jax.Array, attention_mask: jax.Array | None = None, *,
                 return_intermediates: bool = False):
        mask = None if attention_mask is None else make_padding_mask(attention_mask)
        x = self.embed(ids)  # [B, T, D]
        out = self.encoder(x, mask=mask, return_intermediates=return_intermediates)
        if return_intermediates:
            out, inter = out
            return out, {"embeddings": x, **inter}
        return out
