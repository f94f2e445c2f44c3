"""Phi-3 (jaxformer/hf/phi3.py) against transformers 5.x: fused qkv_proj / gate_up_proj split at
import and fused again at export, longrope RoPE in both regimes (docs/numerics.md §34), sliding
window, GQA/MQA, tied heads, residual dropout; refusals that name the option.

Tiny random HF models built from configs (no download): the rows "phi3/*" of tests/hf_rows.py,
whose forward logits with a left-padded row (1e-5 x max(1, max|logit|), fp32, §19) and export
round trip (the fused keys) tests/test_hf_table.py checks; here the short regime's logits, HF
generate ids in each regime, and the refusals. short_factor != long_factor, and prompts on both sides
of original_max_position_embeddings, so a wrong regime moves the logits by 0.5-1.1. Worst measured
|logit| differences (fp32, max |logit| 1.9-2.5): 1.2e-6 (see §34).
"""
from __future__ import annotations

import json
import os

import pytest
from helpers import check_hf_logits, hf_lm_logits
from hf_helpers import built, check_generate, lm_logits
from hf_rows import longrope, row

from jaxformer.config import ConfigError
from jaxformer.config.models import GenerationConfig, check_longrope_switch
from jaxformer.generation import generate
from jaxformer.hf import phi3
from jaxformer.parity import setup_precision

T = pytest.importorskip("transformers")
IDS, MASK = row("phi3/longrope_gqa_hd10_partial").inputs()
SHORT = (slice(None), slice(0, 7))  # 7 tokens: max position + 1 <= original_max
# the longrope rows -> (greedy regime, tokens), beam tokens in the long one or None
GEN = {"longrope_gqa_hd10_partial": (("short", 2), 5), "longrope_attn_factor_window_mqa_tied": (("long", 6), None)}


@pytest.fixture(autouse=True)
def _precision():
    setup_precision()


@pytest.mark.parametrize("tag", sorted(GEN))
def test_longrope_regimes_and_generation_match_hf(tag, tmp_path_factory):
    """Logits in the short regime (the long one, the whole prompt: tests/test_hf_table.py);
    greedy (with the model's eos) and beam (no eos: every hypothesis runs to the end) ids equal
    HF generate's, each in one regime: short = prompt + new tokens within original_max, long =
    prompt beyond it; a generation crossing original_max is refused in both trees."""
    from torch_ref import generation as tgen
    from torch_ref.models import build_model as tbuild
    hf_model, _, (model, name, cfg) = built(row(f"phi3/{tag}"), tmp_path_factory)
    ids, mask = IDS[SHORT], MASK[SHORT]
    check_hf_logits(f"{tag} T={ids.shape[1]}", hf_lm_logits(hf_model, ids, mask), lm_logits(model, ids, mask), mask)
    (regime, n), beam = GEN[tag]
    part = SHORT if regime == "short" else (slice(None), slice(None))
    check_generate(hf_model, model, IDS[part], MASK[part], greedy=n)
    check_generate(hf_model, model, IDS, MASK, beam=beam)
    # crossing original_max mid-generation: refused in both trees (§34)
    within = cfg.positions.rope_scaling.original_max_len - 7 + 1  # 7 + within - 1 = original_max
    check_longrope_switch(cfg, 7, GenerationConfig(max_new_tokens=within))
    with pytest.raises(ValueError, match="prefill_chunk: longrope"):  # chunks would switch on their own
        generate(model, IDS, MASK, gen=GenerationConfig(max_new_tokens=2, prefill_chunk=4))
    for run, m in ((generate, model), (tgen.generate, tbuild(name, cfg))):
        with pytest.raises(ValueError, match=f"crosses original_max_len={cfg.positions.rope_scaling.original_max_len}"):
            run(m, ids, mask, gen=GenerationConfig(max_new_tokens=within + 1))


REFUSED = {  # config.json changes -> the option the error names
    # int(head_dim 10 * factor) must be even and nonzero
    "partial_rotary": dict(partial_rotary_factor=0.75, rope_parameters=None), "partial_rotary_in_params": dict(
        rope_parameters=dict(longrope(5, 0), partial_rotary_factor=0.5)),
    "rope_type": dict(rope_parameters=dict(rope_type="linear", rope_theta=10.0, factor=2.0)),
    "short_factor_len": dict(rope_parameters=dict(longrope(5, 0), short_factor=[1.0, 2.0])),
    "unknown_rope_key": dict(rope_parameters=dict(longrope(5, 0), beta_fast=3.0)),
    "head_dim": dict(head_dim=16), "layer_types": dict(layer_types=["full_attention"] * 2),
    "sliding_window": dict(sliding_window=0),
}
WORDS = {"partial_rotary_in_params": "partial_rotary_factor", "short_factor_len": "short_factor",
         "unknown_rope_key": "beta_fast", "rope_type": "'linear'"}


def test_refusals_name_the_option_and_legacy_names_load(tmp_path_factory):
    _, path, _ = built(row("phi3/longrope_gqa_hd10_partial"), tmp_path_factory)
    with open(os.path.join(path, "config.json")) as f:
        raw = json.load(f)
    for case, changes in REFUSED.items():
        with pytest.raises(ConfigError, match=WORDS.get(case, case)):
            phi3.config_from_hf({**raw, **changes}, "Phi3ForCausalLM")
    # 4.x rope_scaling with Phi-3's old name "su" (HF renames it longrope); the top-level
    # original_max_position_embeddings wins over the one inside, as in Phi3Config
    _, want, _ = phi3.config_from_hf(raw, "Phi3ForCausalLM")
    legacy = {k: v for k, v in raw.items() if k != "rope_parameters"}
    legacy["rope_scaling"] = dict(raw["rope_parameters"], type="su", original_max_position_embeddings=99)
    del legacy["rope_scaling"]["rope_type"]
    _, got, notes = phi3.config_from_hf(legacy, "Phi3ForCausalLM")
    assert got == want and got.positions.rope_scaling.original_max_len == 9 and any("99" in n for n in notes)
