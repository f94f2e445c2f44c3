"""A Transformer sequence classifier: token embedding scaled by sqrt(D), positions, an
encoder stack (Post-LN as in Vaswani et al. 2017, or Pre-LN), pooling of the first token ([CLS]) or a
mean over non-pad tokens, dropout and a linear head `classifier`. Twin:
jaxformer/models/classifier.py.
"""
from __future__ import annotations

import torch
from torch import nn

from jaxformer.config.models import ClassifierConfig, stack_config
from torch_ref.layers.attention import make_padding_mask
from torch_ref.layers.ffn import activation
from torch_ref.layers.norm import make_norm
from torch_ref.layers.text_embedding import TextEmbedding
from torch_ref.layers.transformer import Encoder
from torch_ref.models.common import autocast, check_int_input, check_mask, check_tokens


class Classifier(nn.Module):
    """Sequence classifier.

    Shapes: ids [B, T] int, attention_mask [B, T] (1 = token; None = ids != pad_id),
    token_type_ids [B, T] int (type_vocab_size > 0; None = all 0)
    -> logits [B, num_classes] float32. return_intermediates adds
    {"embeddings", "layers.i", "final_norm", "pooled"}. With cfg.bert.pooler (BERT), the pooled
    vector goes through act(pooler(.)) (pooler_act, tanh by default) and then pooler_norm
    (cfg.pooler_norm, ModernBERT's head) before the dropout and the head.
    """

    def __init__(self, cfg: ClassifierConfig):
        super().__init__()
        self.cfg = cfg
        stack = stack_config(cfg)
        self.embed = TextEmbedding(stack)
        self.encoder = Encoder(stack)
        self.pooler = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.pooler_bias) if cfg.bert.pooler else None
        self.pooler_norm = make_norm(cfg.norms.kind, cfg.d_model, eps=cfg.norms.norm_eps, bias=cfg.norms.norm_bias) \
            if cfg.bert.pooler and cfg.pooler_norm else None
        head_dropout = cfg.dropout if cfg.classifier_dropout is None else cfg.classifier_dropout
        self.dropout = nn.Dropout(head_dropout)
        self.classifier = nn.Linear(cfg.d_model, cfg.num_classes, bias=True)

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                token_type_ids: torch.Tensor | None = None, return_intermediates: bool = False,
                return_attention: bool = False):
        with autocast(self.cfg.dtype, ids.device):
            return self._forward(ids, attention_mask, return_intermediates, token_type_ids, return_attention)

    def _forward(self, ids, attention_mask, return_intermediates, token_type_ids=None, return_attention=False):
        check_tokens(ids, self.cfg.vocab_size, self.cfg.max_len)
        check_mask(attention_mask, ids.shape)
        check_int_input(token_type_ids, "token type id")
        valid = ids != self.cfg.pad_id if attention_mask is None else attention_mask.bool()  # [B, T]
        x = self.embed(ids, token_type_ids=token_type_ids)  # [B, T, D]
        out = self.encoder(x, mask=make_padding_mask(valid), return_intermediates=return_intermediates,
                           return_attention=return_attention)
        h, inter = out if return_intermediates else (out, None)  # [B, T, D]
        if self.cfg.pooling == "cls":
            pooled = h[:, 0]  # [B, D], the first ([CLS]) token
        else:
            w = valid.to(h.dtype)[:, :, None]  # [B, T, 1]
            pooled = torch.sum(h * w, dim=1) / torch.sum(w, dim=1).clamp(min=1.0)  # [B, D]
        if self.pooler is not None:
            act = torch.tanh if self.cfg.pooler_act == "tanh" else activation(self.cfg.pooler_act)
            pooled = act(self.pooler(pooled))  # [B, D]
            if self.pooler_norm is not None:
                pooled = self.pooler_norm(pooled)
        logits = self.classifier(self.dropout(pooled)).float()  # [B, C]
        if return_intermediates:
            return logits, {"embeddings": x, **inter, "pooled": pooled}
        return logits
