"""The seed tutorial's TransformerEncoder: scaled token embedding, positions, a stack of
encoder layers and a final norm. Twin: jaxformer/models/encoder.py."""
from __future__ import annotations

import torch
from torch import nn

from jaxformer.config import TransformerConfig
from torch_ref.layers.attention import make_padding_mask
from torch_ref.layers.transformer import Encoder, TextEmbedding


class TextEncoder(nn.Module):
    """Shapes: ids [B, T] int, attention_mask [B, T] (1 = token, None = all) -> [B, T, D]."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = TextEmbedding(cfg)
        self.encoder = Encoder(cfg)

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                return_intermediates: bool = False):
        mask = None if attention_mask is None else make_padding_mask(attention_mask)
        x = self.embed(ids)  # [B, T, D]
        out = self.encoder(x, mask=mask, return_intermediates=return_intermediates)
        if return_intermediates:
            out, inter = out
            return out, {"embeddings": x, **inter}
        return out
