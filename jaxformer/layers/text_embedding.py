"""The input embedding of the text stacks: tokens (+ token types) (+ absolute positions), norm,
dropout. Twin: torch_ref/layers/text_embedding.py."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer.config import TransformerConfig
from jaxformer.layers.embedding import Embedding
from jaxformer.layers.norm import make_norm
from jaxformer.layers.positional import absolute_positions, default_positions, padding_positions


class TextEmbedding(nnx.Module):
    """Token embedding (optionally * sqrt(D)), plus token type embeddings (BERT,
    type_vocab_size > 0), plus absolute positions when the scheme has them (sinusoidal,
    learned), then an optional norm (BERT, embed_norm) and dropout. RoPE/ALiBi/T5 act inside
    attention instead. The sum's order (tokens + types + positions) is HF BERT's. With
    positions_from_padding (RoBERTa), the positions come from the ids: the non-pad tokens
    count from pad_id + 1, pads sit at pad_id (docs/numerics.md §36).

    Shapes: ids [B, T] int, positions [B, T] int, token_type_ids [B, T] int (None = all 0)
    -> [B, T, D].
    """

    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.d_model, scale=cfg.scale_embedding, rngs=rngs)
        self.embed_positions = absolute_positions(cfg.positions.kind, cfg.max_len, cfg.d_model, rngs=rngs)
        self.embed_token_types = Embedding(cfg.bert.type_vocab_size, cfg.d_model, init_std=0.02,
                                           axes=(None, "embed"), rngs=rngs) \
            if cfg.bert.type_vocab_size else None
        self.norm = make_norm(cfg.norms.kind, cfg.d_model, eps=cfg.norms.norm_eps, bias=cfg.norms.norm_bias,
                              rngs=rngs) \
            if cfg.bert.embed_norm else None
        self.dropout = nnx.Dropout(cfg.embed_dropout, rngs=rngs)
        self.max_len = cfg.max_len
        self.pad_id = cfg.pad_id if cfg.positions.positions_from_padding else None

    def __call__(self, ids: jax.Array, positions: jax.Array | None = None,
                 token_type_ids: jax.Array | None = None) -> jax.Array:
        b, t = ids.shape
        if positions is None:
            if t > self.max_len:
                raise ValueError(f"sequence length {t} exceeds max_len={self.max_len}")
            positions = default_positions(b, t) if self.pad_id is None else padding_positions(ids, self.pad_id)
        elif self.pad_id is not None:
            raise ValueError("positions given, but the config derives them from the padding "
                             "(positions_from_padding)")
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
