"""Phi-3 (jaxformer/hf/phi3.py) against transformers 5.x: fused qkv_proj / gate_up_proj split at
import and fused again at export, longrope RoPE in both regimes (docs/numerics.md §34), sliding
window, GQA/MQA, tied heads, residual dropout; refusals that name the option.

Tiny random HF models built from configs (no download), each built once; per config one test
checks forward logits with a left-padded row (1e-5 x max(1, max|logit|), fp32, §19), HF
generate ids and the export round trip. short_factor != long_factor, and prompts on both sides
of original_max_position_embeddings, so a wrong regime moves the logits by 0.5-1.1. Worst measured
|logit| differences (fp32, max |logit| 1.9-2.5): 1.2e-6 (see §34).
"""
from __future__ import annotations

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from helpers import check_hf_logits, hf_lm_logits, randomize, realigned

from jaxformer import hf
from jaxformer.config import ConfigError
from jaxformer.config.models import GenerationConfig, check_longrope_switch
from jaxformer.generation import generate
from jaxformer.hf import phi3
from jaxformer.parity import setup_precision

T = pytest.importorskip("transformers")
V = 97
RNG = np.random.RandomState(7)
IDS = RNG.randint(3, V, size=(2, 11))
MASK = np.ones_like(IDS)
MASK[1, :3] = 0  # a left-padded row
BASE = dict(vocab_size=V, intermediate_size=56, num_hidden_layers=2, bos_token_id=1, eos_token_id=2,
            pad_token_id=0, max_position_embeddings=40)


def _longrope(n: int, seed: int, **kw) -> dict:
    r = np.random.RandomState(seed)
    return dict(rope_type="longrope", rope_theta=100.0, short_factor=[float(x) for x in 1 + r.rand(n)],
                long_factor=[float(x) for x in 2 + 20 * r.rand(n)], **kw)


# name -> config kwargs. head_dim 10 with Phi-4-mini's partial rotary (factor 0.6: 6 of 10 dims
# rotate, 3 factors) and 12 (6 factors); original_max 9 and 8: the 11-token prompt runs the long
# factors, its first 7 tokens (tested too) the short ones
CASES = {
    "longrope_gqa_hd10_partial": dict(BASE, hidden_size=40, num_attention_heads=4, num_key_value_heads=2,
                                      original_max_position_embeddings=9,
                                      rope_parameters=_longrope(3, 0, partial_rotary_factor=0.6)),
    "longrope_attn_factor_window_mqa_tied": dict(
        BASE, hidden_size=36, num_attention_heads=3, num_key_value_heads=1, num_hidden_layers=3,
        original_max_position_embeddings=8, sliding_window=5, tie_word_embeddings=True, resid_pdrop=0.1,
        rope_parameters=_longrope(6, 1, factor=3.0, attention_factor=1.3)),
    "default_rope_window_dropout": dict(BASE, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                                        sliding_window=4, resid_pdrop=0.1, embd_pdrop=0.2,
                                        original_max_position_embeddings=6),
}

GEN = {"longrope_gqa_hd10_partial": ("short", True), "longrope_attn_factor_window_mqa_tied": ("long", False),
       "default_rope_window_dropout": (None, False)}  # -> (greedy regime, beam in the long one)


@pytest.fixture(autouse=True)
def _precision():
    setup_precision()


@nnx.jit
def _call(model, ids, mask):
    return model(ids, mask)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("phi3")
    out = {}
    for tag, kw in CASES.items():
        model = randomize(T.Phi3ForCausalLM(T.Phi3Config(**kw)), seed=3)
        model.save_pretrained(root / tag)
        out[tag] = (model, str(root / tag))
    return out


def _hf_generate(hf_model, ids, mask, n, **kw):
    hf_model.generation_config.pad_token_id = 0
    with torch.no_grad():
        return hf_model.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), max_new_tokens=n,
                                 do_sample=False, **kw)[:, ids.shape[1]:].numpy()


@pytest.mark.parametrize("tag", sorted(CASES))
def test_phi3_matches_hf(tag, saved, tmp_path):
    """Logits in both longrope regimes; greedy and beam ids equal HF generate's; a generation
    crossing original_max is refused; the export (fused keys) loads in transformers with HF's
    own logits."""
    hf_model, path = saved[tag]
    model, name, cfg = hf.from_pretrained(path)
    kw = CASES[tag]
    assert name == "lm" and cfg.sliding_window == kw.get("sliding_window") and cfg.dropout == kw.get("resid_pdrop", 0)
    short = (slice(None), slice(0, 7))  # 7 tokens: max position + 1 <= original_max
    for part in ((slice(None), slice(None)), short)[:2 if cfg.rope_scaling else 1]:
        ids, mask = IDS[part], MASK[part]
        check_hf_logits(f"{tag} T={ids.shape[1]}", hf_lm_logits(hf_model, ids, mask),
                        np.asarray(_call(model, jnp.asarray(ids), jnp.asarray(mask))), mask)

    # greedy (with the model's eos) and beam (no eos: every hypothesis runs to the end) ids, each
    # in one regime: short = prompt + new tokens within original_max, long = prompt beyond it
    greedy, beam = GEN[tag]
    if greedy:
        part = short if greedy == "short" else (slice(None), slice(None))
        n = 2 if greedy == "short" else 6
        ref = _hf_generate(hf_model, IDS[part], MASK[part], n)
        ours = generate(model, IDS[part], MASK[part], gen=GenerationConfig(max_new_tokens=n))
        np.testing.assert_array_equal(ours[:, :ref.shape[1]], ref)
    if beam:
        eos = hf_model.generation_config.eos_token_id
        hf_model.generation_config.eos_token_id = None
        try:
            ref = _hf_generate(hf_model, IDS, MASK, 5, num_beams=3, length_penalty=1.0)
        finally:
            hf_model.generation_config.eos_token_id = eos
        ours, _ = generate(model, IDS, MASK, gen=GenerationConfig(max_new_tokens=5, strategy="beam", num_beams=3,
                                                                  eos_id=V + 7, length_penalty=1.0))
        np.testing.assert_array_equal(ours, ref)
    if cfg.rope_scaling is not None:  # crossing original_max mid-generation: refused in both trees (§34)
        from torch_ref import generation as tgen
        from torch_ref.models import build_model as tbuild
        within = cfg.rope_scaling.original_max_len - 7 + 1  # 7 + within - 1 = original_max
        check_longrope_switch(cfg, 7, GenerationConfig(max_new_tokens=within))
        with pytest.raises(ValueError, match="prefill_chunk: longrope"):  # chunks would switch on their own
            generate(model, IDS, MASK, gen=GenerationConfig(max_new_tokens=2, prefill_chunk=4))
        for run, m in ((generate, model), (tgen.generate, tbuild(name, cfg))):
            with pytest.raises(ValueError, match=f"crosses original_max_len={cfg.rope_scaling.original_max_len}"):
                run(m, IDS[short], MASK[short], gen=GenerationConfig(max_new_tokens=within + 1))

    out = str(tmp_path / "out")
    hf.save_pretrained(model, name, cfg, out)
    with open(os.path.join(out, "config.json")) as f:
        exported = json.load(f)
    assert exported["architectures"] == ["Phi3ForCausalLM"]  # longrope or resid_pdrop: only Phi-3 has them
    back = realigned(T.AutoModelForCausalLM.from_pretrained(out).eval())
    assert "qkv_proj" in str(back) and "gate_up_proj" in str(back)
    np.testing.assert_array_equal(hf_lm_logits(back, IDS, MASK), hf_lm_logits(realigned(hf_model), IDS, MASK))


REFUSED = {  # config.json changes -> the option the error names
    # int(head_dim 10 * factor) must be even and nonzero
    "partial_rotary": dict(partial_rotary_factor=0.75, rope_parameters=None), "partial_rotary_in_params": dict(
        rope_parameters=dict(_longrope(5, 0), partial_rotary_factor=0.5)),
    "rope_type": dict(rope_parameters=dict(rope_type="linear", rope_theta=10.0, factor=2.0)),
    "short_factor_len": dict(rope_parameters=dict(_longrope(5, 0), short_factor=[1.0, 2.0])),
    "unknown_rope_key": dict(rope_parameters=dict(_longrope(5, 0), beta_fast=3.0)),
    "head_dim": dict(head_dim=16), "layer_types": dict(layer_types=["full_attention"] * 2),
    "sliding_window": dict(sliding_window=0),
}
WORDS = {"partial_rotary_in_params": "partial_rotary_factor", "short_factor_len": "short_factor",
         "unknown_rope_key": "beta_fast", "rope_type": "'linear'"}


def test_refusals_name_the_option_and_legacy_names_load(saved):
    _, path = saved["longrope_gqa_hd10_partial"]
    with open(os.path.join(path, "config.json")) as f:
        raw = json.load(f)
    for row, changes in REFUSED.items():
        with pytest.raises(ConfigError, match=WORDS.get(row, row)):
            phi3.config_from_hf({**raw, **changes}, "Phi3ForCausalLM")
    # 4.x rope_scaling with Phi-3's old name "su" (HF renames it longrope); the top-level
    # original_max_position_embeddings wins over the one inside, as in Phi3Config
    _, want, _ = phi3.config_from_hf(raw, "Phi3ForCausalLM")
    legacy = {k: v for k, v in raw.items() if k != "rope_parameters"}
    legacy["rope_scaling"] = dict(raw["rope_parameters"], type="su", original_max_position_embeddings=99)
    del legacy["rope_scaling"]["rope_type"]
    _, got, notes = phi3.config_from_hf(legacy, "Phi3ForCausalLM")
    assert got == want and got.rope_scaling.original_max_len == 9 and any("99" in n for n in notes)
