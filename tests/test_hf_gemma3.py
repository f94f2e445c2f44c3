"""Gemma3, text only (jaxformer/hf/gemma3.py), against transformers 5.x: local (sliding) and
global (full) layers, each with its own RoPE, and (1 + w) q/k norms (docs/numerics.md §33).

Each tiny random HF model is built once (module fixture) and checked for: fp32 logits within
1e-5 x max(1, max|logit|) with a left-padded row; greedy and beam ids equal to HF generate's
past the sliding window (and torch_ref's cached decode equal to jaxformer's); the export loads
in transformers with identical logits. Unimplemented options are refused by name.
Worst measured |logit| differences (fp32, printed by the tests): 5.4e-6 at max |logit| 4.5
(default pattern, 7 layers), 1.6e-6 at 2.6 (pattern 2, capped), 1.7e-6 for its bfloat16
weights; float32 rounding on both sides, measured against float64 (docs/numerics.md §33).
"""
from __future__ import annotations

import copy
import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from helpers import check_hf_logits, hf_lm_logits, randomize, realigned

from jaxformer import convert, hf
from jaxformer import generation as jgen
from jaxformer.config import ConfigError, RopeScaling
from jaxformer.config.models import GenerationConfig, LMConfig
from jaxformer.convert import ConversionError
from jaxformer.models import build_model
from jaxformer.parity import setup_precision
from torch_ref import generation as tgen
from torch_ref.models import build_model as tbuild

T = pytest.importorskip("transformers")
V = 97
IDS = np.random.RandomState(3).randint(3, V, size=(2, 11))
MASK = np.ones_like(IDS)
MASK[1, :3] = 0  # a left-padded row
SMALL = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
             bos_token_id=2, eos_token_id=1, pad_token_id=0, max_position_embeddings=64)
CASES = {
    # HF's default pattern (sliding_window_pattern 6): layers 0-4 and 6 sliding, 5 full; the
    # global RoPE base 1e6 scaled linear 8, the local one 1e4 unscaled (Gemma3's own values)
    "default_pattern_linear_global_tied": dict(
        SMALL, num_hidden_layers=7, head_dim=12, sliding_window=4, query_pre_attn_scalar=20,
        rope_parameters={"full_attention": dict(rope_type="linear", factor=8.0, rope_theta=1e6),
                         "sliding_attention": dict(rope_type="default", rope_theta=1e4)}),
    # a pattern of 2 (sliding, full, sliding), each kind scaled its own way; untied head, GeLU
    # (erf), biases, one kv head, a final logit cap small enough to bend
    "pattern2_local_scaled_untied_gelu_bias_mqa_cap": dict(
        SMALL, num_hidden_layers=3, num_key_value_heads=1, head_dim=8, sliding_window=3, sliding_window_pattern=2,
        query_pre_attn_scalar=8, hidden_activation="gelu", attention_bias=True, tie_word_embeddings=False,
        final_logit_softcapping=3.0,
        rope_parameters={"full_attention": dict(rope_type="default", rope_theta=500.0),
                         "sliding_attention": dict(rope_type="linear", factor=2.0, rope_theta=50.0)}),
}


@pytest.fixture(autouse=True)
def _precision():
    setup_precision()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """tag -> (HF model, its directory, our model, name, cfg), each built and imported once."""
    setup_precision()
    root = tmp_path_factory.mktemp("gemma3")
    out = {}
    for tag, kw in CASES.items():
        model = randomize(T.Gemma3ForCausalLM(T.Gemma3TextConfig(**kw)))
        model.save_pretrained(root / tag)
        out[tag] = (model, str(root / tag), *hf.from_pretrained(str(root / tag)))
    return out


@nnx.jit
def _call(model, ids, mask):
    return model(ids, mask)


def _hf_generate(hf_model, n, **kw):
    hf_model.generation_config.pad_token_id = 0
    with torch.no_grad():
        return hf_model.generate(torch.from_numpy(IDS), attention_mask=torch.from_numpy(MASK), max_new_tokens=n,
                                 do_sample=False, **kw)[:, IDS.shape[1]:].numpy()


def _check_forward_and_export(tag, built, tmp_path):
    hf_model, path, model, name, cfg = built[tag]
    local = cfg.local_layers()
    assert name == "lm" and cfg.qk_norm and cfg.norm == "rmsnorm_offset" and any(local) and not all(local)
    assert cfg.layer_types == tuple(hf_model.config.layer_types)
    check_hf_logits(tag, hf_lm_logits(hf_model, IDS, MASK),
                    np.asarray(_call(model, jnp.asarray(IDS), jnp.asarray(MASK))), MASK)
    hf.save_pretrained(model, name, cfg, str(tmp_path / "out"))
    back = realigned(T.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).eval())
    assert type(back) is T.Gemma3ForCausalLM
    for key in ("layer_types", "sliding_window", "rope_parameters", "query_pre_attn_scalar",
                "final_logit_softcapping", "attn_logit_softcapping", "tie_word_embeddings", "head_dim"):
        assert getattr(back.config, key) == getattr(hf_model.config, key), key
    np.testing.assert_array_equal(hf_lm_logits(back, IDS, MASK), hf_lm_logits(hf_model, IDS, MASK))


def test_default_pattern_logits_generation_export(built, tmp_path):
    """Logits, export, and greedy (the model's eos) and beam ids (eos never produced: every
    hypothesis runs to max_new_tokens, so both stopping rules agree) equal to HF generate's,
    11 + 12 tokens through a window of 4; torch_ref's cached greedy decode gives the same first 6."""
    tag = "default_pattern_linear_global_tied"
    _check_forward_and_export(tag, built, tmp_path)
    hf_model, _, model, name, cfg = built[tag]
    assert cfg.rope_base == 1e6 and cfg.rope_scaling == RopeScaling("linear", 8.0)
    assert cfg.rope_local_base == 1e4 and cfg.rope_local_scaling is None
    ref = _hf_generate(hf_model, 12)
    ours = jgen.generate(model, IDS, MASK, gen=GenerationConfig(max_new_tokens=12))
    np.testing.assert_array_equal(ours[:, :ref.shape[1]], ref)
    t = tbuild(name, cfg).eval()
    t.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in convert.flax_to_torch_arrays(model).items()})
    torch_ids = tgen.lm_generate(t, IDS, MASK, GenerationConfig(max_new_tokens=6))  # its ring wraps too
    np.testing.assert_array_equal(torch_ids, ours[:, :6])
    hf_model.generation_config.eos_token_id = None
    try:
        ref = _hf_generate(hf_model, 8, num_beams=3, length_penalty=1.0)
    finally:
        hf_model.generation_config.eos_token_id = 1
    ours, _ = jgen.generate(model, IDS, MASK, gen=GenerationConfig(max_new_tokens=8, strategy="beam", num_beams=3,
                                                                   eos_id=V + 7))
    np.testing.assert_array_equal(ours, ref)


def test_pattern2_logits_export_and_bf16(built, tmp_path):
    """Logits and export; the same weights saved in bfloat16 and
    kept bfloat16 give HF's float32 logits on them (the sqrt(D) factor stays float32, as for
    Gemma2, docs/numerics.md §21)."""
    tag = "pattern2_local_scaled_untied_gelu_bias_mqa_cap"
    _check_forward_and_export(tag, built, tmp_path)
    hf_model, _, model, _, cfg = built[tag]
    assert (cfg.rope_base, cfg.rope_scaling, cfg.rope_local_base) == (500.0, None, 50.0)
    assert cfg.rope_local_scaling == RopeScaling("linear", 2.0) and cfg.final_logit_softcap == 3.0
    copy.deepcopy(hf_model).to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    hf32 = T.AutoModelForCausalLM.from_pretrained(str(tmp_path / "bf16"), dtype=torch.float32).eval()
    model16, _, _ = hf.from_pretrained(str(tmp_path / "bf16"), param_dtype="auto")
    assert {np.dtype(x.dtype).name for x in jax.tree.leaves(nnx.to_pure_dict(nnx.state(model16, nnx.Param)))} \
        == {"bfloat16"}
    check_hf_logits(f"{tag} bf16", hf_lm_logits(hf32, IDS, MASK),
                    np.asarray(_call(model16, jnp.asarray(IDS), jnp.asarray(MASK))), MASK)


def test_legacy_rope_keys_read_as_transformers_does(built):
    """Files saved before transformers 5 carry rope_theta / rope_scaling (full layers) and
    rope_local_base_freq (sliding layers), and sliding_window_pattern instead of layer_types:
    both HF and jaxformer read them as the nested rope_parameters."""
    path = built["default_pattern_linear_global_tied"][1]
    with open(os.path.join(path, "config.json")) as f:
        raw = json.load(f)
    nested = hf.gemma3.config_from_hf(raw, "Gemma3ForCausalLM")[1]
    legacy = {k: v for k, v in raw.items() if k not in ("rope_parameters", "layer_types")}
    legacy.update(rope_theta=1e6, rope_scaling={"rope_type": "linear", "factor": 8.0}, rope_local_base_freq=1e4,
                  sliding_window_pattern=6)
    assert hf.gemma3.config_from_hf(legacy, "Gemma3ForCausalLM")[1] == nested
    theirs = T.Gemma3TextConfig(**{k: v for k, v in legacy.items() if k not in ("architectures", "model_type")})
    assert theirs.rope_parameters == raw["rope_parameters"] and theirs.layer_types == raw["layer_types"]


REFUSED = {  # config.json changes -> the option the error names
    "attn_cap": (dict(attn_logit_softcapping=50.0), "attn_logit_softcapping"),
    "bidirectional": (dict(use_bidirectional_attention=True), "use_bidirectional_attention"),
    "flat_rope": (dict(rope_parameters={"rope_type": "linear", "factor": 8.0}), "rope_parameters"),
    "local_key_typo": (dict(rope_parameters={"sliding_attention": {"rope_type": "linear", "factr": 2.0}}),
                        "rope_parameters\\['sliding_attention'\\]"),
    "pattern": (dict(layer_types=None, sliding_window_pattern=0), "sliding_window_pattern"),
    "act": (dict(hidden_activation="relu"), "hidden_activation"),
    "legacy_act": (dict(hidden_act="gelu"), "hidden_act"),
    "no_window": (dict(sliding_window=None), "sliding_window"),
    "unknown": (dict(altup_num_inputs=4), "altup_num_inputs"),
}


def test_unimplemented_options_are_refused_by_name(built):
    with open(os.path.join(built["default_pattern_linear_global_tied"][1], "config.json")) as f:
        raw = json.load(f)
    for row, (changes, word) in REFUSED.items():
        with pytest.raises(ConfigError, match=word):
            hf.gemma3.config_from_hf({**raw, **changes}, "Gemma3ForCausalLM")
    cfg = built["default_pattern_linear_global_tied"][4]
    for changes, word in ((dict(attn_logit_softcap=5.0), "attn_logit_softcap"),
                          (dict(qk_norm=False, rope_local_base=None, rope_local_scaling=None), None)):
        bad = dataclasses.replace(cfg, **changes)
        if word is None:  # without q/k norms or a local RoPE it is Gemma2's
            assert hf.exporter("lm", bad) is hf.gemma2.FAMILY
            continue
        with pytest.raises(ConversionError, match=word):
            hf.exporter("lm", bad)
    with pytest.raises(ConversionError, match="rope_local_base"):  # no other family has two RoPEs
        hf.exporter("lm", LMConfig.tiny("llama", rope_local_base=50.0))
    with pytest.raises(ConfigError, match="rope_local_scaling"):
        LMConfig.tiny("llama", rope_local_scaling=RopeScaling("linear", 2.0))
    with pytest.raises(ConfigError, match="rope_local_base"):
        LMConfig.tiny("gpt2", rope_local_base=50.0)
    with pytest.raises(ConfigError, match="scan_layers"):  # two RoPE tables cannot be stacked
        build_model("lm", dataclasses.replace(cfg, scan_layers=True))
