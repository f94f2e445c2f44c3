"""GPT-NeoX / Pythia (`GPTNeoXForCausalLM`, jaxformer/hf/gpt_neox.py) against transformers 5.x:
partial rotary (rotary_pct 0.25 and 0.5: 6 of 24 and 6 of 12 dims rotated, 3 frequencies),
the parallel residual on and off, the per-head fused query_key_value, tied and untied heads,
RoPE scaling with partial rotary (docs/numerics.md §35).

Each tiny random HF model is built once (module fixture); one test per config checks fp32
logits with a left-padded row (within 1e-5 x max(1, max|logit|)), greedy and beam ids equal to
HF generate's, and the export loading back in transformers with identical logits. Worst
measured |logit| difference (printed by check_hf_logits, -s): 9.5e-7 at max |logit| 3.9
(pct50_sequential_tied_linear; docs/numerics.md §35).
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
V = 89
RNG = np.random.RandomState(5)
IDS = RNG.randint(3, V, size=(2, 10))
MASK = np.ones_like(IDS)
MASK[1, :3] = 0  # a left-padded row
SMALL = dict(vocab_size=V, hidden_size=48, intermediate_size=72, num_hidden_layers=2, bos_token_id=1,
             eos_token_id=2, pad_token_id=0, max_position_embeddings=64)
# name -> (config kwargs, expected rotary_dim, parallel_residual); generate runs on the first
# only (its greedy and beam loops compile for seconds per model; CI time, tests/README)
CASES = {
    # Pythia's layout: rotary_pct 0.25 of head_dim 24 -> 6, parallel, untied, exact GELU
    "pct25_parallel_untied": (dict(SMALL, num_attention_heads=2, rotary_pct=0.25, rotary_emb_base=500.0,
                                   use_parallel_residual=True, tie_word_embeddings=False), 6, True),
    # 0.5 of head_dim 12 -> 6, sequential, tied, tanh GELU, no attention biases, linear RoPE scaling
    "pct50_sequential_tied_linear": (dict(
        SMALL, num_attention_heads=4, hidden_act="gelu_new", use_parallel_residual=False,
        tie_word_embeddings=True, attention_bias=False, num_hidden_layers=3,
        rope_parameters=dict(rope_type="linear", factor=2.0, rope_theta=300.0, partial_rotary_factor=0.5)), 6, False),
}

GENERATE = "pct25_parallel_untied"


@pytest.fixture(autouse=True)
def _precision():
    setup_precision()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpt_neox")
    out = {}
    for tag, (kw, _, _) in CASES.items():
        model = randomize(T.GPTNeoXForCausalLM(T.GPTNeoXConfig(**kw)))
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
def test_gpt_neox_matches_transformers(tag, saved, tmp_path):
    hf_model, path = saved[tag]
    model, name, cfg = hf.from_pretrained(path)
    _, rotary_dim, parallel = CASES[tag]
    assert (name, cfg.rotary_dim, cfg.parallel_residual) == ("lm", rotary_dim, parallel)
    ref = hf_lm_logits(hf_model, IDS, MASK)
    check_hf_logits(tag, ref, np.asarray(_call(model, jnp.asarray(IDS), jnp.asarray(MASK))), MASK)
    if tag == GENERATE:
        _check_generate(hf_model, model)
    # the export loads back as the same class, with the same options and logits
    hf.save_pretrained(model, name, cfg, str(tmp_path / "out"))
    back = realigned(T.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).eval())
    assert type(back) is T.GPTNeoXForCausalLM
    for key in ("use_parallel_residual", "tie_word_embeddings", "attention_bias", "hidden_act"):
        assert getattr(back.config, key) == getattr(hf_model.config, key), key
    assert back.gpt_neox.layers[0].attention.rotary_ndims == rotary_dim
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


def test_legacy_rotary_keys_and_refusals(saved):
    """4.x files spell the factor rotary_pct and the base rotary_emb_base, the head embed_out,
    and carry mask / inv_freq buffers (skipped); options jaxformer does not implement are
    refused by name."""
    with open(os.path.join(saved["pct25_parallel_untied"][1], "config.json")) as f:
        raw = json.load(f)
    legacy = {k: v for k, v in raw.items() if k != "rope_parameters"}
    fam, arch = hf.family_for_architecture(raw)
    _, cfg, _ = fam.config_from_hf({**legacy, "rotary_pct": 0.5, "rotary_emb_base": 700}, arch)
    assert (cfg.rotary_dim, cfg.rope_base) == (12, 700.0)
    _, cfg, _ = fam.config_from_hf({**legacy, "rotary_pct": 1.0}, arch)
    assert cfg.rotary_dim is None  # the whole head
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
