"""OLMo 2 (`Olmo2ForCausalLM`, jaxformer/hf/olmo2.py) against transformers 5.x: norms on the
sublayer outputs and none on their inputs (norm_position="post_sublayer"), q/k RMSNorm over the
full projected width before the head split and RoPE (qk_norm_full), with GQA / MQA, a head_dim
that is not hidden_size / heads, RoPE scaling, tied and untied heads (docs/numerics.md §35).

Each tiny random HF model is built once (module fixture); one test per config checks fp32
logits with a left-padded row (within 1e-5 x max(1, max|logit|)), the export loading back in
transformers with identical logits, and on one config greedy and beam ids equal to HF
generate's. Worst measured |logit| difference (printed by check_hf_logits, -s): 1.3e-6 at
max |logit| 2.6 (mqa_bias_tied_yarn; docs/numerics.md §35).
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

from jaxformer import generation as jgen
from jaxformer import hf
from jaxformer.config import ConfigError
from jaxformer.config.models import GenerationConfig
from jaxformer.parity import setup_precision

T = pytest.importorskip("transformers")
V = 83
RNG = np.random.RandomState(6)
IDS = RNG.randint(3, V, size=(2, 9))
MASK = np.ones_like(IDS)
MASK[1, :2] = 0  # a left-padded row
SMALL = dict(vocab_size=V, hidden_size=40, intermediate_size=56, num_hidden_layers=2, bos_token_id=1,
             eos_token_id=2, pad_token_id=0, max_position_embeddings=64)
# name -> config kwargs; generate runs on GENERATE only (its loops compile for seconds per model)
CASES = {
    # GQA (4 heads, 2 kv), head_dim 6 (not 40 / 4), linear RoPE scaling, untied
    "gqa_head_dim6_linear": dict(SMALL, num_attention_heads=4, num_key_value_heads=2, head_dim=6,
                                 rope_parameters=dict(rope_type="linear", factor=2.0, rope_theta=700.0)),
    # MQA, head_dim 10 with 5 heads (50 != 40), attention biases, tied, yarn, 3 layers
    "mqa_bias_tied_yarn": dict(SMALL, num_hidden_layers=3, num_attention_heads=5, num_key_value_heads=1,
                               head_dim=10, attention_bias=True, tie_word_embeddings=True, rms_norm_eps=1e-6,
                               rope_parameters=dict(rope_type="yarn", factor=2.0, rope_theta=1000.0,
                                                    original_max_position_embeddings=32)),
}
GENERATE = "gqa_head_dim6_linear"


@pytest.fixture(autouse=True)
def _precision():
    setup_precision()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("olmo2")
    out = {}
    for tag, kw in CASES.items():
        model = randomize(T.Olmo2ForCausalLM(T.Olmo2Config(**kw)))
        model.save_pretrained(root / tag)
        out[tag] = (model, str(root / tag))
    return out


@nnx.jit
def _call(model, ids, mask):
    return model(ids, mask)


def _hf_generate(hf_model, n, **kw):
    hf_model.generation_config.pad_token_id = 0
    with torch.no_grad():
        return hf_model.generate(torch.from_numpy(IDS), attention_mask=torch.from_numpy(MASK), max_new_tokens=n,
                                 do_sample=False, **kw)[:, IDS.shape[1]:].numpy()


@pytest.mark.parametrize("tag", sorted(CASES))
def test_olmo2_matches_transformers(tag, saved, tmp_path):
    hf_model, path = saved[tag]
    model, name, cfg = hf.from_pretrained(path)
    assert (name, cfg.norm_position, cfg.qk_norm_full, cfg.qk_norm) == ("lm", "post_sublayer", True, False)
    assert cfg.resolved_head_dim == CASES[tag]["head_dim"]
    ref = hf_lm_logits(hf_model, IDS, MASK)
    check_hf_logits(tag, ref, np.asarray(_call(model, jnp.asarray(IDS), jnp.asarray(MASK))), MASK)
    if tag == GENERATE:
        _check_generate(hf_model, model)
    # the export loads back as the same class, with the same options and logits
    hf.save_pretrained(model, name, cfg, str(tmp_path / "out"))
    back = realigned(T.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).eval())
    assert type(back) is T.Olmo2ForCausalLM
    for key in ("num_key_value_heads", "head_dim", "tie_word_embeddings", "attention_bias"):
        assert getattr(back.config, key) == getattr(hf_model.config, key), key
    rope = hf_model.config.rope_parameters  # export also spells out yarn's defaults
    assert {k: back.config.rope_parameters[k] for k in rope} == rope
    np.testing.assert_array_equal(hf_lm_logits(back, IDS, MASK), hf_lm_logits(realigned(hf_model), IDS, MASK))


def _check_generate(hf_model, model):
    # greedy (the model's eos) and beam (eos never produced, so both stopping rules agree)
    greedy = _hf_generate(hf_model, 8)
    ours = jgen.generate(model, IDS, MASK, gen=GenerationConfig(max_new_tokens=8))
    np.testing.assert_array_equal(ours[:, :greedy.shape[1]], greedy)
    eos = hf_model.generation_config.eos_token_id
    hf_model.generation_config.eos_token_id = None
    try:
        beam = _hf_generate(hf_model, 6, num_beams=3, length_penalty=1.0)
    finally:
        hf_model.generation_config.eos_token_id = eos
    ours, _ = jgen.generate(model, IDS, MASK, gen=GenerationConfig(max_new_tokens=6, strategy="beam",
                                                                   num_beams=3, eos_id=V + 7))
    np.testing.assert_array_equal(ours, beam)


def test_refusals_name_the_option(saved):
    with open(os.path.join(saved[GENERATE][1], "config.json")) as f:
        raw = json.load(f)
    fam, arch = hf.family_for_architecture(raw)
    refused = {"hidden_act": {**raw, "hidden_act": "gelu"},
               "partial_rotary_factor": {**raw, "rope_parameters": dict(raw["rope_parameters"],
                                                                        partial_rotary_factor=0.5)},
               "use_sliding_window": {**raw, "use_sliding_window": True}}
    for word, changed in refused.items():
        with pytest.raises(ConfigError, match=word):
            fam.config_from_hf(changed, arch)
