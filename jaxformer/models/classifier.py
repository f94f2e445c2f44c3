"""A Transformer sequence classifier: token embedding scaled by sqrt(D), positions, an
encoder stack (Post-LN as in Vaswani et al. 2017, or Pre-LN), pooling of the first token ([CLS]) or a
mean over non-pad tokens, dropout and a linear head `classifier`. Twin:
torch_ref/models/classifier.py.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer.config.models import ClassifierConfig, stack_config
from jaxformer.layers.attention import make_padding_mask
from jaxformer.layers.ffn import activation
from jaxformer.layers.linear import Linear
from jaxformer.layers.norm import make_norm
from jaxformer.layers.special import tanh
from jaxformer.layers.text_embedding import TextEmbedding
from jaxformer.layers.transformer import Encoder
from jaxformer.models.common import check_int_input, check_mask, check_tokens, set_compute_dtype


class Classifier(nnx.Module):
    """Sequence classifier.

    Shapes: ids [B, T] int, attention_mask [B, T] (1 = token; None = ids != pad_id),
    token_type_ids [B, T] int (type_vocab_size > 0; None = all 0)
    -> logits [B, num_classes] float32. return_intermediates adds
    {"embeddings", "layers.i.<sub-layer>", "layers.i", "final_norm", "pooled"};
    return_attention adds "layers.i.attn_weights" [B, H, T, T]. With cfg.bert.pooler (BERT), the pooled
    vector goes through act(pooler(.)) (pooler_act, tanh by default) and then pooler_norm
    (cfg.pooler_norm, ModernBERT's head) before the dropout and the head.
    """

    def __init__(self, cfg: ClassifierConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        stack = stack_config(cfg)
        self.embed = TextEmbedding(stack, rngs=rngs)
        self.encoder = Encoder(stack, rngs=rngs)
        self.pooler = Linear(cfg.d_model, cfg.d_model, use_bias=cfg.pooler_bias, axes=("embed", None),
                             rngs=rngs) if cfg.bert.pooler else None
        self.pooler_norm = make_norm(cfg.norms.kind, cfg.d_model, eps=cfg.norms.norm_eps, bias=cfg.norms.norm_bias,
                                     rngs=rngs) \
            if cfg.bert.pooler and cfg.pooler_norm else None
        head_dropout = cfg.dropout if cfg.classifier_dropout is None else cfg.classifier_dropout
        self.dropout = nnx.Dropout(head_dropout, rngs=rngs)
        self.classifier = Linear(cfg.d_model, cfg.num_classes, use_bias=True, axes=("embed", None), rngs=rngs)
        set_compute_dtype(self, cfg.dtype)

    def __call__(self, ids: jax.Array, attention_mask: jax.Array | None = None, *,
                 token_type_ids: jax.Array | None = None, return_intermediates: bool = False,
                 return_attention: bool = False):
        check_tokens(ids, self.cfg.vocab_size, self.cfg.max_len)
        check_mask(attention_mask, ids.shape)
        check_int_input(token_type_ids, "token type id")
        valid = ids != self.cfg.pad_id if attention_mask is None else attention_mask.astype(bool)  # [B, T]
        x = self.embed(ids, token_type_ids=token_type_ids)  # [B, T, D]
        out = self.encoder(x, mask=make_padding_mask(valid), return_intermediates=return_intermediates,
                           return_attention=return_attention)
        h, inter = out if return_intermediates else (out, None)  # [B, T, D]
        if self.cfg.pooling == "cls":
            pooled = h[:, 0]  # [B, D], the first ([CLS]) token
        else:
            w = valid.astype(h.dtype)[:, :, None]  # [B, T, 1]
            pooled = jnp.sum(h * w, axis=1) / jnp.maximum(jnp.sum(w, axis=1), 1.0)  # [B, D]
        if self.pooler is not None:
            act = tanh if self.cfg.pooler_act == "tanh" else activation(self.cfg.pooler_act)
            pooled = act(self.pooler(pooled))  # [B, D]
            if self.pooler_norm is not None:
                pooled = self.pooler_norm(pooled)
        logits = self.classifier(self.dropout(pooled)).astype(jnp.float32)  # [B, C]
        if return_intermediates:
            return logits, {"embeddings": x, **inter, "pooled": pooled}
        return logits
