"""GPT-NeoX / Pythia (`GPTNeoXForCausalLM`, jaxformer/hf/gpt_neox.py) against transformers 5.x:
partial rotary (rotary_pct 0.25 and 0.5: 6 of 24 and 6 of 12 dims rotated, 3 frequencies),
the parallel residual on and off, the per-head fused query_key_value, tied and untied heads,
RoPE scaling with partial rotary (docs/numerics.md §35).

The tiny random HF models are rows of tests/hf_rows.py: tests/test_hf_table.py checks their fp32
logits with a left-padded row (within 1e-5 x max(1, max|logit|)), greedy and beam ids against HF
generate's, and the export loading back in transformers with identical logits and rotary width.
Here: the legacy config keys, the refusals, and the config and export checks. Worst measured
|logit| difference (printed by check_hf_logits, -s): 9.5e-7 at max |logit| 3.9
(pct50_sequential_tied_linear; docs/numerics.md §35).
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hf_helpers import built
from hf_rows import row

from jaxformer import hf
from jaxformer.config import ConfigError

ROW = row("gpt_neox/pct25_parallel_untied")
V = ROW.config["vocab_size"]


def test_legacy_rotary_keys_and_refusals(tmp_path_factory):
    """4.x files spell the factor rotary_pct and the base rotary_emb_base, the head embed_out,
    and carry mask / inv_freq buffers (skipped); options jaxformer does not implement are
    refused by name."""
    with open(os.path.join(built(ROW, tmp_path_factory)[1], "config.json")) as f:
        raw = json.load(f)
    legacy = {k: v for k, v in raw.items() if k != "rope_parameters"}
    fam, arch = hf.family_for_architecture(raw)
    _, cfg, _ = fam.config_from_hf({**legacy, "rotary_pct": 0.5, "rotary_emb_base": 700}, arch)
    assert (cfg.positions.rotary_dim, cfg.positions.rope_base) == (12, 700.0)
    _, cfg, _ = fam.config_from_hf({**legacy, "rotary_pct": 1.0}, arch)
    assert cfg.positions.rotary_dim is None  # the whole head
    fn = fam.tensor_fn("lm", cfg, arch)  # older files' head name and buffers (untied config)
    x = np.zeros((V, 48), np.float32)
    assert list(fn("embed_out.weight", x)) == ["lm_head.weight"]
    for buffer in ("attention.bias", "attention.masked_bias", "attention.rotary_emb.inv_freq"):
        assert fn(f"gpt_neox.layers.1.{buffer}", x) is None
    refused = {"rotary_pct": {**legacy, "rotary_pct": 0.125},  # int(24 * 0.125) = 3: odd
               "rope_parameters": {**raw, "rope_parameters": dict(raw["rope_parameters"], partial_rotary_factor=0.0)},
               "hidden_act": {**raw, "hidden_act": "silu"}, "is_decoder": {**raw, "is_decoder": True},
               "head_dim": {**raw, "head_dim": 12}}
    for word, changed in refused.items():
        with pytest.raises(ConfigError, match=word):
            fam.config_from_hf(changed, arch)


def test_config_checks_and_export_refusals_name_the_field():
    """rotary_dim: even, in (0, head_dim], RoPE only; parallel_residual: pre-norm only; and an
    LM whose family cannot write rotary_dim / parallel_residual (Qwen3's, GPT-2's) is refused
    by name (a LLaMA-style LM with rotary_dim exports as Phi-3, Phi-4-mini's partial rotary)."""
    from jaxformer.config.models import LMConfig
    from jaxformer.convert import ConversionError
    for kw in (dict(rotary_dim=3), dict(rotary_dim=10), dict(rotary_dim=0), dict(rotary_dim=4, position="alibi")):
        with pytest.raises(ConfigError, match="rotary_dim"):
            LMConfig.tiny("llama", **kw)  # head_dim 8
    with pytest.raises(ConfigError, match="parallel_residual"):
        LMConfig.tiny("llama", parallel_residual=True, norm_position="post")
    with pytest.raises(ConfigError, match="qk_norm_full"):
        LMConfig.tiny("llama", qk_norm=True, qk_norm_full=True)
    for cfg, word in ((LMConfig.tiny("llama", rotary_dim=4, qk_norm=True), "rotary_dim"),
                      (LMConfig.tiny("gpt2", parallel_residual=True), "parallel_residual")):  # learned positions
        with pytest.raises(ConversionError, match=word):
            hf.config_to_hf("lm", cfg)
    # export's partial_rotary_factor gives rotary_dim back through HF's int(head_dim * factor)
    from jaxformer.hf.common import partial_factor
    assert all(int(h * partial_factor(r, h)) == r for h in range(2, 300) for r in range(2, h + 1, 2))
