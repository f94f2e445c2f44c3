"""Parity cases for multi-head latent attention (DeepSeek-V2/V3, layers/mla.py): outputs and
every gradient, with and without q_lora_rank, interleaved rope pairs, YaRN with mscale /
mscale_all_dim (the softmax-scale correction, docs/numerics.md §27), padding and a causal
mask, biases, the attention weights; and a tiny MLA LM (dense FFN) with left padding. transformers' own
DeepseekV3Attention is checked in tests/test_mla.py.
"""
from __future__ import annotations

import numpy as np

from jaxformer.config import Rope, RopeScaling
from jaxformer.config.models import TINY_SIZES, LMConfig
from jaxformer.config.moe import MLAConfig
from jaxformer.parity.cases import case, mirror, model_pair, normal, padding
from jaxformer.parity.cases_models import left_padding, token_ids

B, T, D, H = 2, 7, 32, 4
V = TINY_SIZES["vocab_size"]
# odd widths: nope != rope != v, none equal to D / H, so a swapped split cannot pass
MLA_Q_LORA = MLAConfig(kv_lora_rank=12, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=10, q_lora_rank=16)
MLA_PLAIN_Q = MLAConfig(kv_lora_rank=10, qk_nope_head_dim=8, qk_rope_head_dim=6, v_head_dim=6)
MLA_INTERLEAVED = MLAConfig(kv_lora_rank=12, qk_nope_head_dim=6, qk_rope_head_dim=8, v_head_dim=10,
                            q_lora_rank=16, rope_interleave=True)
# DeepSeek-V3's form: mscale = mscale_all_dim, so the rope tables' factor is 1 and the whole
# correction is the score scale's mscale ** 2; a second case keeps the two apart
YARN_DEEPSEEK = RopeScaling("yarn", 4.0, original_max_len=4, beta_fast=32.0, beta_slow=1.0,
                            mscale=1.0, mscale_all_dim=1.0)
YARN_SPLIT = RopeScaling("yarn", 8.0, original_max_len=4, mscale=0.7, mscale_all_dim=1.3)


def _mask(lengths):
    """Right padding and the causal mask, [B, 1, T, T] bool."""
    return padding(B, T, lengths).astype(bool)[:, None, None, :] & np.tril(np.ones((T, T), bool))[None, None]


def _layer(mla, rope_scaling=None, **kw):
    return mirror("layers.mla.MultiHeadLatentAttention", D, H, mla, rope=Rope(16, scaling=rope_scaling), **kw)


def _x_mask(lengths=(7, 7)):
    return lambda r: {"x": normal(B, T, D)(r), "mask": _mask(list(lengths))}


# four layer cases cover the options between them (each case costs the suite seconds)
case("mla_q_lora_yarn_padding", "mla", _layer(MLA_Q_LORA, rope_scaling=YARN_DEEPSEEK), _x_mask((7, 3)))
case("mla_plain_q_yarn_split_bias_padding", "mla",
     _layer(MLA_PLAIN_Q, rope_scaling=YARN_SPLIT, bias=True, out_bias=False), _x_mask((6, 7)))
case("mla_interleaved_rope_weights", "mla", _layer(MLA_INTERLEAVED),
     lambda r: {"x": normal(B, T, D)(r), "mask": _mask([5, 7]), "return_weights": True})
case("lm_mla_left_padding", "lm_model", model_pair("lm", LMConfig.tiny("llama", num_kv_heads=None, mla=MLA_Q_LORA)),
     lambda r: {"ids": token_ids(B, T, V, lengths=[7, 4], left=True)(r), "attention_mask": left_padding(B, T, [7, 4])})
