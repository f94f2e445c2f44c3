"""A Transformer text encoder: scaled token embedding, positions, a stack of
encoder layers and a final norm. Twin: torch_ref/models/encoder.py."""
from __future__ import annotations

import jax
from flax import nnx

from jaxformer.config import TransformerConfig
from jaxformer.layers.attention import make_padding_mask
from jaxformer.layers.linear import Linear
from jaxformer.layers.special import tanh
from jaxformer.layers.text_embedding import TextEmbedding
from jaxformer.layers.transformer import Encoder
from jaxformer.models.common import check_int_input, check_mask, check_tokens


class TextEncoder(nnx.Module):
    """Shapes: ids [B, T] int, attention_mask [B, T] (1 = token, None = all),
    token_type_ids [B, T] int (type_vocab_size > 0; None = all 0) -> [B, T, D].

    With cfg.bert.pooler (BERT's BertModel), returns (hidden [B, T, D], pooled [B, D]) where
    pooled = tanh(pooler(hidden[:, 0])), the [CLS] summary.
    """

    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.embed = TextEmbedding(cfg, rngs=rngs)
        self.encoder = Encoder(cfg, rngs=rngs)
        self.pooler = Linear(cfg.d_model, cfg.d_model, use_bias=True, axes=("embed", None),
                             rngs=rngs) if cfg.bert.pooler else None

    def __call__(self, ids: jax.Array, attention_mask: jax.Array | None = None, *,
                 token_type_ids: jax.Array | None = None, return_intermediates: bool = False,
                 return_attention: bool = False):
        check_tokens(ids, self.cfg.vocab_size, self.cfg.max_len)
        check_mask(attention_mask, ids.shape)
        check_int_input(token_type_ids, "token type id")
        mask = None if attention_mask is None else make_padding_mask(attention_mask)
        x = self.embed(ids, token_type_ids=token_type_ids)  # [B, T, D]
        out = self.encoder(x, mask=mask, return_intermediates=return_intermediates,
                           return_attention=return_attention)
        h, inter = out if return_intermediates else (out, None)  # [B, T, D]
        result = h if self.pooler is None else (h, tanh(self.pooler(h[:, 0])))  # pooled [B, D]
        if return_intermediates:
            return result, {"embeddings": x, **inter}
        return result
