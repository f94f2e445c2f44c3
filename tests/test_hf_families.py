"""Today's checkpoints (jaxformer/hf/llama.py, qwen.py): Llama with RoPE scaling (llama3,
yarn, linear, dynamic), Qwen2 (q/k/v biases) and Qwen3 (q/k norms) against transformers 5.x:
forward logits with a left-padded row, greedy ids of HF generate with an eos list, export
back to HF, tied heads stored apart, and refusals that name the option.

Tiny random HF models built from configs (no download). Tolerance 1e-5 x max(1, max|logit|)
in fp32 (docs/numerics.md §19). Worst measured |logit| differences (fp32, max |logit| 1.7-3.1):
llama (llama3, yarn, dynamic) 1.6e-6 (dynamic), qwen2 9.5e-7, qwen3 8.6e-7.
"""
from __future__ import annotations

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from helpers import check_hf_logits, hf_lm_logits
from helpers import randomize as _randomize

from jaxformer import hf
from jaxformer.config import ConfigError
from jaxformer.parity import setup_precision

T = pytest.importorskip("transformers")
V = 64
RNG = np.random.RandomState(1)
IDS = RNG.randint(3, V, size=(2, 11))
MASK = np.ones_like(IDS)
MASK[1, :3] = 0  # a left-padded row
SMALL = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, bos_token_id=1, eos_token_id=2, pad_token_id=0)
# name -> (HF class, config kwargs, from_pretrained max_len)
CASES = {
    "llama_llama3": (T.LlamaForCausalLM, dict(SMALL, max_position_embeddings=32, rope_parameters=dict(
        rope_type="llama3", rope_theta=500.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=8)), None),
    "llama_yarn_head_dim": (T.LlamaForCausalLM, dict(SMALL, head_dim=12, max_position_embeddings=32,
        rope_parameters=dict(rope_type="yarn", rope_theta=1000.0, factor=4.0, beta_fast=8.0,
                             original_max_position_embeddings=8)), None),
    # dynamic NTK grows the base past max_position_embeddings (8): the prompt is 11 long
    "llama_dynamic": (T.LlamaForCausalLM, dict(SMALL, max_position_embeddings=8, rope_parameters=dict(
        rope_type="dynamic", rope_theta=100.0, factor=2.0)), 64),
    "qwen2": (T.Qwen2ForCausalLM, dict(SMALL, max_position_embeddings=32, rope_theta=500.0), None),
    "qwen2_tied_mqa": (T.Qwen2ForCausalLM, dict(SMALL, num_key_value_heads=1, max_position_embeddings=32,
                                                tie_word_embeddings=True, sliding_window=4), None),
    "qwen3_bias_head_dim": (T.Qwen3ForCausalLM, dict(SMALL, head_dim=12, attention_bias=True,
                                                     max_position_embeddings=32), None),
    "gpt2_tanh_gelu": (T.GPT2LMHeadModel, dict(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_inner=56,
                                                n_positions=32, bos_token_id=1, eos_token_id=2, pad_token_id=0), None),
    "qwen3_linear_rope": (T.Qwen3ForCausalLM, dict(SMALL, head_dim=8, max_position_embeddings=32,
        rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=2.0)), None),
}


@pytest.fixture(autouse=True)
def _precision():
    setup_precision()


def _hf_logits(model, ids=IDS, mask=MASK) -> np.ndarray:
    return hf_lm_logits(model, ids, mask)


@nnx.jit
def _call(model, ids, mask):
    return model(ids, mask)


def _check(tag: str, ref: np.ndarray, ours: np.ndarray) -> float:
    return check_hf_logits(tag, ref, ours, MASK)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("fam")
    out = {}
    for tag, (cls, kw, max_len) in CASES.items():
        model = _randomize(cls(cls.config_class(**kw)))
        model.save_pretrained(root / tag)
        out[tag] = (model, str(root / tag), max_len)
    return out


@pytest.mark.parametrize("tag", sorted(CASES))
def test_forward_matches_hf(tag, saved):
    hf_model, path, max_len = saved[tag]
    model, name, cfg = hf.from_pretrained(path, max_len=max_len)
    assert name == "lm" and (cfg.qk_norm == tag.startswith("qwen3"))
    _check(tag, _hf_logits(hf_model), np.asarray(_call(model, jnp.asarray(IDS), jnp.asarray(MASK))))


@pytest.mark.parametrize("tag", ["llama_dynamic", "qwen2", "qwen3_bias_head_dim"])
def test_greedy_with_eos_list_and_export_match_hf(tag, saved, tmp_path):
    """Greedy ids of HF generate with eos [2, X] (X produced mid-way by row 0, so one row stops
    early); then the model exported back loads in transformers with HF's own logits."""
    from jaxformer.config.models import GenerationConfig
    from jaxformer.generation import generate
    hf_model, path, max_len = saved[tag]
    model, name, cfg = hf.from_pretrained(path, max_len=max_len)
    before = _hf_logits(hf_model)  # HF's dynamic RoPE keeps the longest length seen (§20)
    n = 12
    hf_model.generation_config.pad_token_id = 0
    with torch.no_grad():
        def hf_generate(eos):
            hf_model.generation_config.eos_token_id = eos
            return hf_model.generate(torch.from_numpy(IDS), attention_mask=torch.from_numpy(MASK),
                                     max_new_tokens=n, do_sample=False)[:, IDS.shape[1]:].numpy()
        free = hf_generate(None)
        eos = [2, int(free[0, 4])]
        ref = hf_generate(eos)
    ours = generate(model, IDS, MASK, gen=GenerationConfig(max_new_tokens=n, eos_id=tuple(eos)))
    assert ref.shape[1] <= n
    np.testing.assert_array_equal(ours[:, :ref.shape[1]], ref)
    assert (ours[:, ref.shape[1]:] == 0).all()
    assert (ours[0, 5:] == 0).all()  # row 0 stopped at X

    hf.save_pretrained(model, name, cfg, str(tmp_path / "out"))
    back = T.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).eval()
    assert type(back) is type(hf_model)
    np.testing.assert_array_equal(_hf_logits(back), before)


@pytest.mark.parametrize("tag", ["gpt2_tanh_gelu", "qwen2_tied_mqa"])  # learned positions; RoPE + GQA, tied
def test_beam_matches_hf(tag, saved):
    """Beam ids equal HF generate's (3 beams, a left-padded row), with an eos that row 0's best
    beam produces mid-way (HF's rules for finishing hypotheses, generation.beam_loop) and with
    no eos at all."""
    from jaxformer.config.models import GenerationConfig
    from jaxformer.generation import generate
    hf_model, path, max_len = saved[tag]
    model, _, _ = hf.from_pretrained(path, max_len=max_len)
    n = 8
    hf_model.generation_config.pad_token_id = 0
    with torch.no_grad():
        def hf_beam(eos):
            hf_model.generation_config.eos_token_id = eos
            return hf_model.generate(torch.from_numpy(IDS), attention_mask=torch.from_numpy(MASK),
                                     max_new_tokens=n, do_sample=False, num_beams=3,
                                     length_penalty=1.0)[:, IDS.shape[1]:].numpy()
        free = hf_beam(None)
        eos = int(free[0, 3])
        ref = hf_beam(eos)
    ours, _ = generate(model, IDS, MASK, gen=GenerationConfig(max_new_tokens=n, strategy="beam", num_beams=3,
                                                             eos_id=V + 7, length_penalty=1.0))
    np.testing.assert_array_equal(ours, free)
    ours, _ = generate(model, IDS, MASK, gen=GenerationConfig(max_new_tokens=n, strategy="beam", num_beams=3,
                                                             eos_id=eos, length_penalty=1.0))
    for row, want in zip(ours, ref):  # compared up to and including the eos; HF pads after it
        stop = list(want).index(eos) + 1 if eos in want else len(want)
        np.testing.assert_array_equal(row[:stop], want[:stop])


def test_tied_heads_load_as_transformers_does(saved, tmp_path):
    """tie_word_embeddings with a DIFFERENT stored lm_head.weight: transformers 5.x loads both
    untied (verified in the test); a tied checkpoint storing only lm_head.weight loads too."""
    from safetensors.torch import load_file, save_file
    _, path, _ = saved["qwen2_tied_mqa"]
    sd = load_file(os.path.join(path, "model.safetensors"))
    assert "lm_head.weight" not in sd
    for tag, tensors in (("distinct", {**sd, "lm_head.weight": torch.randn(V, 32) * 0.2}),
                         ("head_only", {("lm_head.weight" if k == "model.embed_tokens.weight" else k): v
                                        for k, v in sd.items()})):
        d = tmp_path / tag
        os.makedirs(d)
        save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(path, "config.json")) as f:
            (d / "config.json").write_text(f.read())
        ref = T.AutoModelForCausalLM.from_pretrained(str(d)).eval()
        tied = ref.lm_head.weight.data_ptr() == ref.model.embed_tokens.weight.data_ptr()
        assert tied == (tag == "head_only")
        model, _, cfg, report = hf.from_pretrained(str(d), return_report=True)
        assert cfg.tie_embeddings == tied and report["skipped"] == []
        _check(f"qwen2_{tag}", _hf_logits(ref), np.asarray(_call(model, jnp.asarray(IDS), jnp.asarray(MASK))))


REFUSED = {  # config.json changes -> the option the error names
    "sliding": ("qwen2", dict(use_sliding_window=True), "use_sliding_window"),
    "layer_types": ("qwen2", dict(layer_types=["sliding_attention", "full_attention"]), "layer_types"),
    "longrope": ("llama_llama3", dict(rope_parameters=dict(rope_type="longrope", rope_theta=1.0, short_factor=[1],
                                                            long_factor=[1])), "longrope"),
    "unknown_rope_key": ("llama_llama3", dict(rope_scaling=dict(type="linear", factor=2.0, warp=1.0)), "warp"),
    "partial_rotary": ("qwen3_linear_rope", dict(partial_rotary_factor=0.5), "partial_rotary_factor"),
    "yarn_bad_type": ("llama_yarn_head_dim", dict(rope_parameters=dict(rope_type="yarn", factor="4",
                                                                       rope_theta=10.0)), "factor"),
}


@pytest.mark.parametrize("row", sorted(REFUSED))
def test_unimplemented_options_are_refused_by_name(row, saved):
    tag, changes, word = REFUSED[row]
    with open(os.path.join(saved[tag][1], "config.json")) as f:
        raw = {**json.load(f), **changes}
    fam, arch = hf.family_for_architecture(raw)
    with pytest.raises(ConfigError, match=word):
        fam.config_from_hf(raw, arch)


def test_legacy_rope_scaling_wins_over_rope_parameters(saved):
    """4.x configs: rope_scaling {type: ...} and a top-level rope_theta; HF lets it win."""
    with open(os.path.join(saved["llama_llama3"][1], "config.json")) as f:
        raw = json.load(f)
    raw.update(rope_theta=321.0, rope_scaling={"type": "linear", "factor": 3.0})
    fam, arch = hf.family_for_architecture(raw)
    _, cfg, _ = fam.config_from_hf(raw, arch)
    theirs = T.LlamaConfig(**{k: v for k, v in raw.items() if k not in ("architectures", "model_type")})
    assert theirs.rope_parameters["rope_type"] == cfg.rope_scaling.rope_type == "linear"
    assert theirs.rope_parameters["factor"] == cfg.rope_scaling.factor == 3.0
    assert theirs.rope_parameters["rope_theta"] == cfg.rope_base == 321.0


def test_gpt2_position_ids_match_hf(tmp_path):
    """GPT-2 with a left-padded row and explicit position_ids (shifted by 3) matches HF."""
    hf_model = _randomize(T.GPT2LMHeadModel(T.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=V,
                                                           n_positions=32, bos_token_id=1, eos_token_id=2)))
    hf_model.save_pretrained(tmp_path)
    model, _, _ = hf.from_pretrained(str(tmp_path))
    mask_t = torch.from_numpy(MASK)
    pos = (mask_t.cumsum(-1) - 1).clamp(min=0) + 3
    with torch.no_grad():
        ref = hf_model(torch.from_numpy(IDS), attention_mask=mask_t, position_ids=pos).logits.numpy()
    ours = nnx.jit(lambda m, i, k, p: m(i, k, position_ids=p))(model, jnp.asarray(IDS), jnp.asarray(MASK),
                                                               jnp.asarray(pos.numpy()))
    _check("gpt2_position_ids", ref, np.asarray(ours))


def test_generation_config_json_supplies_defaults(tmp_path):
    """generation_config.json -> GenerationConfig fields (validated); flags win; keys jaxformer
    does not implement are reported, never silently applied or dropped."""
    import argparse

    from jaxformer.cli.generate import add_arguments, generation_config
    (tmp_path / "generation_config.json").write_text(json.dumps(dict(
        eos_token_id=[2, 7], max_new_tokens=5, do_sample=True, temperature=0.6, top_p=0.9, top_k=20,
        repetition_penalty=1.05, bos_token_id=1, transformers_version="5.0")))
    fields, notes = hf.generation_defaults(str(tmp_path))
    assert fields == dict(eos_id=(2, 7), max_new_tokens=5, strategy="sample", temperature=0.6, top_p=0.9,
                          top_k=20)
    assert len(notes) == 1 and "repetition_penalty" in notes[0]
    p = argparse.ArgumentParser()
    add_arguments(p)
    gen = generation_config(p.parse_args(["--weights", str(tmp_path), "--prompt", "3", "--top-k", "4",
                                          "--eos-id", "9"]), str(tmp_path))
    assert (gen.eos_id, gen.top_k, gen.max_new_tokens, gen.strategy) == ((9,), 4, 5, "sample")
    (tmp_path / "generation_config.json").write_text(json.dumps(dict(max_new_tokens="5")))
    with pytest.raises(ConfigError, match="max_new_tokens"):
        hf.generation_defaults(str(tmp_path))
