"""Parity cases for packed documents (LM segment_ids): the segment mask (a token attends only
to earlier tokens of its own document) and positions that restart at each document, in the
GPT-2 (learned positions), LLaMA (RoPE, GQA), gpt-oss (attention sinks, sliding / full
layers), MLA and MoE LMs. Outputs and every gradient; a one-token segment and a padding token
(segment 0, whose query row sees no key) are in the batch.

Restarted positions matter to absolute positions (learned, sinusoidal): RoPE scores depend on
i - j only, so under the segment mask a RoPE model gives the same outputs (to rounding) with or
without the restart; lm_gpt2_segments is the case that sees it (mutation
segment_positions_not_restarted).

Segments are the windows data.packing: segments trains on (jaxformer/train/data/tokens_data.py);
tests/test_packing.py checks that a packed row gives each document the logits and loss it gets
alone.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from jaxformer.config.models import LMConfig
from jaxformer.parity.cases import case, mirror_fn
from jaxformer.parity.cases_mla import MLA_Q_LORA
from jaxformer.parity.cases_models import model_pair, token_ids
from jaxformer.parity.cases_moe import LM_MOE
from jaxformer.parity.cases_sinks import GPT_OSS_ATTN, big_sinks

B, T, V = 2, 7, 64
# row 0: two documents; row 1: three (the last one token long), then one padding token
SEGMENTS = np.array([[1, 1, 1, 2, 2, 2, 2], [1, 1, 2, 2, 2, 3, 0]], np.int32)


def packed(**extra):
    return lambda r: {"ids": token_ids(B, T, V)(r), "segment_ids": SEGMENTS, **extra}


case("segment_mask", "attention", mirror_fn("layers.attention.make_segment_mask"),
     lambda r: {"segment_ids": SEGMENTS}, grads=False)
case("positions_from_segments", "lm_model", mirror_fn("models.common.positions_from_segments"),
     lambda r: {"segment_ids": SEGMENTS}, grads=False)
case("lm_gpt2_segments", "lm_model", model_pair("lm", LMConfig.tiny("gpt2")), packed())
case("lm_llama_gqa_segments", "lm_model", model_pair("lm", LMConfig.tiny("llama")), packed())
case("lm_sinks_layer_types_segments", "lm_model", big_sinks(model_pair("lm", GPT_OSS_ATTN)), packed())
case("lm_mla_segments", "lm_model",
     model_pair("lm", LMConfig.tiny("llama", num_kv_heads=None, mla=MLA_Q_LORA)), packed())
case("lm_moe_segments", "moe", model_pair("lm", dataclasses.replace(LM_MOE, num_layers=2)),
     packed(return_aux=np.array(True)))

# The LM loss over weighted targets (layers/loss.py): an answers-only loss mask (chat data) with
# packed segments, and label smoothing; gradients with respect to the logits.
LOSS_MASK = np.array([[0, 0, 1, 1, 1, 0, 1, 1], [1, 1, 0, 0, 1, 1, 1, 0]], np.int32)
LOSS_SEGMENTS = np.concatenate([SEGMENTS, SEGMENTS[:, -1:]], axis=1)  # [B, T + 1]


def loss_inputs(r):
    return {"logits": r.randn(B, T, V).astype(np.float32), "tokens": token_ids(B, T + 1, V)(r),
            "loss_mask": LOSS_MASK, "segment_ids": LOSS_SEGMENTS}


case("loss_mask_segments_smoothed", "loss", mirror_fn("layers.loss.masked_token_loss", label_smoothing=0.1),
     loss_inputs)
case("loss_mask_plain", "loss", mirror_fn("layers.loss.masked_token_loss"),
     lambda r: {"logits": r.randn(B, T, V).astype(np.float32), "tokens": token_ids(B, T + 1, V)(r),
                "loss_mask": LOSS_MASK})
