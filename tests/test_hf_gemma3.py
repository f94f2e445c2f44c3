"""Gemma3, text only (jaxformer/hf/gemma3.py), against transformers 5.x: local (sliding) and
global (full) layers, each with its own RoPE, and (1 + w) q/k norms (docs/numerics.md §33).

The tiny random HF models are the rows "gemma3/*" of tests/hf_rows.py; tests/test_hf_table.py
checks their fp32 logits within 1e-5 x max(1, max|logit|) with a left-padded row, greedy and
beam ids equal to HF generate's past the sliding window, and the export loading in transformers
with identical logits. Here: both RoPEs, torch_ref's cached decode equal to HF's, the bfloat16
weights, the legacy keys; unimplemented options are refused by name.
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
import numpy as np
import pytest
import torch
from flax import nnx
from helpers import check_hf_logits, hf_lm_logits
from hf_helpers import built, hf_generate, lm_logits
from hf_rows import row

from jaxformer import convert, hf
from jaxformer.config import ConfigError, RopeScaling
from jaxformer.config.models import GenerationConfig, LMConfig
from jaxformer.convert import ConversionError
from jaxformer.models import build_model
from jaxformer.parity import setup_precision
from torch_ref import generation as tgen
from torch_ref.models import build_model as tbuild

T = pytest.importorskip("transformers")
DEFAULT = row("gemma3/default_pattern_linear_global_tied")
PATTERN2 = row("gemma3/pattern2_local_scaled_untied_gelu_bias_mqa_cap")
IDS, MASK = DEFAULT.inputs()


@pytest.fixture(autouse=True)
def _precision():
    setup_precision()


def test_default_pattern_ropes_and_torch_ref_decode(tmp_path_factory):
    """Both RoPEs read; torch_ref's cached greedy decode (its ring wraps too: 11 + 6 tokens
    through a window of 4) gives HF generate's first 6 ids (jaxformer's equal HF's:
    tests/test_hf_table.py)."""
    hf_model, _, (model, name, cfg) = built(DEFAULT, tmp_path_factory)
    assert cfg.positions.rope_base == 1e6 and cfg.positions.rope_scaling == RopeScaling("linear", 8.0)
    assert cfg.positions.rope_local_base == 1e4 and cfg.positions.rope_local_scaling is None
    ref = hf_generate(hf_model, IDS, MASK, 6)
    t = tbuild(name, cfg).eval()
    t.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in convert.flax_to_torch_arrays(model).items()})
    torch_ids = tgen.lm_generate(t, IDS, MASK, GenerationConfig(max_new_tokens=6))
    np.testing.assert_array_equal(torch_ids[:, :ref.shape[1]], ref)


def test_pattern2_ropes_and_bf16(tmp_path_factory, tmp_path):
    """Each kind's RoPE and the final cap read; the same weights saved in bfloat16 and kept
    bfloat16 give HF's float32 logits on them (the sqrt(D) factor stays float32, as for
    Gemma2, docs/numerics.md §21)."""
    hf_model, _, (_, _, cfg) = built(PATTERN2, tmp_path_factory)
    assert (cfg.positions.rope_base, cfg.positions.rope_scaling, cfg.positions.rope_local_base) == (500.0, None, 50.0)
    assert cfg.positions.rope_local_scaling == RopeScaling("linear", 2.0) and cfg.final_logit_softcap == 3.0
    copy.deepcopy(hf_model).to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    hf32 = T.AutoModelForCausalLM.from_pretrained(str(tmp_path / "bf16"), dtype=torch.float32).eval()
    model16, _, _ = hf.from_pretrained(str(tmp_path / "bf16"), param_dtype="auto")
    assert {np.dtype(x.dtype).name for x in jax.tree.leaves(nnx.to_pure_dict(nnx.state(model16, nnx.Param)))} \
        == {"bfloat16"}
    check_hf_logits(f"{PATTERN2.case} bf16", hf_lm_logits(hf32, IDS, MASK), lm_logits(model16, IDS, MASK), MASK)


def test_legacy_rope_keys_read_as_transformers_does(tmp_path_factory):
    """Files saved before transformers 5 carry rope_theta / rope_scaling (full layers) and
    rope_local_base_freq (sliding layers), and sliding_window_pattern instead of layer_types:
    both HF and jaxformer read them as the nested rope_parameters."""
    path = built(DEFAULT, tmp_path_factory)[1]
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


def test_unimplemented_options_are_refused_by_name(tmp_path_factory):
    _, path, (_, _, cfg) = built(DEFAULT, tmp_path_factory)
    with open(os.path.join(path, "config.json")) as f:
        raw = json.load(f)
    for changes, word in REFUSED.values():
        with pytest.raises(ConfigError, match=word):
            hf.gemma3.config_from_hf({**raw, **changes}, "Gemma3ForCausalLM")
    for changes, word in ((dict(attn_logit_softcap=5.0), "attn_logit_softcap"),
                          (dict(qk_norm=False, rope_local_base=None, rope_local_scaling=None), None)):
        bad = cfg.replace(**changes)
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
