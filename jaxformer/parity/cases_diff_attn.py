"""Parity cases for differential attention (Diff Transformer, arXiv 2410.05258;
layers/diff_attention.py): two softmax maps per head subtracted, lambda re-parameterised, a
per-head RMSNorm scaled by (1 - lambda_init). Outputs and every gradient (the four lambda
vectors and subln's scale included), in the module (padded, causal, GQA, RoPE on each half) and
an LM of alternating sliding / full layers with left padding.
"""
from __future__ import annotations

import numpy as np

from jaxformer.config import Rope
from jaxformer.config.models import LMConfig
from jaxformer.parity.cases import case, mirror, normal, padding
from jaxformer.parity.cases_models import left_padding, model_pair, token_ids

B, T, D, H = 2, 7, 32, 4
V = 64
CAUSAL = np.tril(np.ones((T, T), bool))[None, None]
PADDED = padding(B, T, [7, 4]).astype(bool)[:, None, None, :] & CAUSAL

case("diff_attn_padded", "attention", mirror("layers.diff_attention.DifferentialAttention", D, H, lambda_init=0.8),
     lambda r: {"x": normal(B, T, D)(r), "mask": padding(B, T, [7, 3]).astype(bool)[:, None, None, :]})
case("diff_attn_rope_gqa_causal", "attention",
     mirror("layers.diff_attention.DifferentialAttention", D, H, lambda_init=0.2, num_kv_heads=2, rope=Rope(16)),
     lambda r: {"x": normal(B, T, D)(r), "mask": PADDED})
DIFF_LM = LMConfig.tiny("llama", num_kv_heads=2, num_layers=2, sliding_window=3, diff_attn=0.8,
                        layer_types=("sliding_attention", "full_attention"), tie_embeddings=False)
case("lm_diff_attn_layer_types_left_padding", "lm_model", model_pair("lm", DIFF_LM),
     lambda r: {"ids": token_ids(B, T, V, lengths=[7, 4], left=True)(r),
                "attention_mask": left_padding(B, T, [7, 4])})
