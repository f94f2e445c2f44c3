"""OLMo 2 (`Olmo2ForCausalLM`, jaxformer/hf/olmo2.py) against transformers 5.x: norms on the
sublayer outputs and none on their inputs (norm_position="post_sublayer"), q/k RMSNorm over the
full projected width before the head split and RoPE (qk_norm_full), with GQA / MQA, a head_dim
that is not hidden_size / heads, RoPE scaling, tied and untied heads (docs/numerics.md §35).

The tiny random HF models are rows of tests/hf_rows.py: tests/test_hf_table.py checks their fp32
logits with a left-padded row (within 1e-5 x max(1, max|logit|)), the export loading back in
transformers with identical logits, and on one config greedy and beam ids equal to HF
generate's; here, the refusals. Worst measured |logit| difference (printed by check_hf_logits,
-s): 1.3e-6 at max |logit| 2.6 (mqa_bias_tied_yarn; docs/numerics.md §35).
"""
from __future__ import annotations

import json
import os

import pytest
from hf_helpers import built
from hf_rows import row

from jaxformer import hf
from jaxformer.config import ConfigError


def test_refusals_name_the_option(tmp_path_factory):
    with open(os.path.join(built(row("olmo2/gqa_head_dim6_linear"), tmp_path_factory)[1], "config.json")) as f:
        raw = json.load(f)
    fam, arch = hf.family_for_architecture(raw)
    refused = {"hidden_act": {**raw, "hidden_act": "gelu"},
               "partial_rotary_factor": {**raw, "rope_parameters": dict(raw["rope_parameters"],
                                                                        partial_rotary_factor=0.5)},
               "use_sliding_window": {**raw, "use_sliding_window": True}}
    for word, changed in refused.items():
        with pytest.raises(ConfigError, match=word):
            fam.config_from_hf(changed, arch)
