"""Today's checkpoints (jaxformer/hf/llama.py, qwen.py): Llama with RoPE scaling (llama3,
yarn, linear, dynamic), Qwen2 (q/k/v biases) and Qwen3 (q/k norms) against transformers 5.x:
greedy ids of HF generate with an eos list, beam ids with an eos produced mid-way, tied heads
stored apart, GPT-2's explicit positions, generation_config.json, and refusals that name the
option.

Tiny random HF models built from configs (no download): the rows "llama_qwen/*" of
tests/hf_rows.py, whose forward logits (and on three of them the export back to HF)
tests/test_hf_table.py checks. Tolerance 1e-5 x max(1, max|logit|) in fp32 (docs/numerics.md §19). Worst measured |logit| differences (fp32, max |logit| 1.7-3.1):
llama (llama3, yarn, dynamic) 1.6e-6 (dynamic), qwen2 9.5e-7, qwen3 8.6e-7.
"""
from __future__ import annotations

import copy
import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from helpers import check_hf_logits, hf_lm_logits
from helpers import randomize as _randomize
from hf_helpers import built, hf_generate, lm_logits
from hf_rows import row

from jaxformer import hf
from jaxformer.config import ConfigError
from jaxformer.config.models import GenerationConfig
from jaxformer.generation import generate
from jaxformer.parity import setup_precision

T = pytest.importorskip("transformers")
IDS, MASK = row("llama_qwen/qwen2").inputs()
V = row("llama_qwen/qwen2").config["vocab_size"]


@pytest.fixture(autouse=True)
def _precision():
    setup_precision()


@pytest.mark.parametrize("tag", ["llama_dynamic", "qwen2", "qwen3_bias_head_dim"])
def test_greedy_with_eos_list_matches_hf(tag, tmp_path_factory):
    """Greedy ids of HF generate with eos [2, X] (X produced mid-way by row 0, so one row stops
    early). On a copy of the HF model: HF's dynamic RoPE keeps the longest length it has seen
    (§20), and the table's round trip of these rows compares the shared one's logits."""
    hf_model, _, (model, _, _) = built(row(f"llama_qwen/{tag}"), tmp_path_factory)
    hf_model = copy.deepcopy(hf_model)
    n = 12
    free = hf_generate(hf_model, IDS, MASK, n, eos=None)
    eos = [2, int(free[0, 4])]
    ref = hf_generate(hf_model, IDS, MASK, n, eos=eos)
    ours = generate(model, IDS, MASK, gen=GenerationConfig(max_new_tokens=n, eos_id=tuple(eos)))
    assert ref.shape[1] <= n
    np.testing.assert_array_equal(ours[:, :ref.shape[1]], ref)
    assert (ours[:, ref.shape[1]:] == 0).all()
    assert (ours[0, 5:] == 0).all()  # row 0 stopped at X


@pytest.mark.parametrize("tag", ["gpt2_tanh_gelu", "qwen2_tied_mqa"])  # learned positions; RoPE + GQA, tied
def test_beam_matches_hf(tag, tmp_path_factory):
    """Beam ids equal HF generate's (3 beams, a left-padded row), with an eos that row 0's best
    beam produces mid-way (HF's rules for finishing hypotheses, generation.beam_loop) and with
    no eos at all."""
    hf_model, _, (model, _, _) = built(row(f"llama_qwen/{tag}"), tmp_path_factory)
    n = 8
    free = hf_generate(hf_model, IDS, MASK, n, eos=None, num_beams=3, length_penalty=1.0)
    eos = int(free[0, 3])
    ref = hf_generate(hf_model, IDS, MASK, n, eos=eos, num_beams=3, length_penalty=1.0)
    ours, _ = generate(model, IDS, MASK, gen=GenerationConfig(max_new_tokens=n, strategy="beam", num_beams=3,
                                                             stop_at_eos=False, length_penalty=1.0))
    np.testing.assert_array_equal(ours, free)
    ours, _ = generate(model, IDS, MASK, gen=GenerationConfig(max_new_tokens=n, strategy="beam", num_beams=3,
                                                             eos_id=eos, length_penalty=1.0))
    for row_ids, want in zip(ours, ref, strict=False):  # compared up to and including the eos; HF pads after it
        stop = list(want).index(eos) + 1 if eos in want else len(want)
        np.testing.assert_array_equal(row_ids[:stop], want[:stop])


def test_tied_heads_load_as_transformers_does(tmp_path_factory, tmp_path):
    """tie_word_embeddings with a DIFFERENT stored lm_head.weight: transformers 5.x loads both
    untied (verified in the test); a tied checkpoint storing only lm_head.weight loads too."""
    from safetensors.torch import load_file, save_file
    _, path, _ = built(row("llama_qwen/qwen2_tied_mqa"), tmp_path_factory)
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
        check_hf_logits(f"qwen2_{tag}", hf_lm_logits(ref, IDS, MASK), lm_logits(model, IDS, MASK), MASK)


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


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unimplemented_options_are_refused_by_name(case, tmp_path_factory):
    tag, changes, word = REFUSED[case]
    with open(os.path.join(built(row(f"llama_qwen/{tag}"), tmp_path_factory)[1], "config.json")) as f:
        raw = {**json.load(f), **changes}
    fam, arch = hf.family_for_architecture(raw)
    with pytest.raises(ConfigError, match=word):
        fam.config_from_hf(raw, arch)


def test_legacy_rope_scaling_wins_over_rope_parameters(tmp_path_factory):
    """4.x configs: rope_scaling {type: ...} and a top-level rope_theta; HF lets it win."""
    with open(os.path.join(built(row("llama_qwen/llama_llama3"), tmp_path_factory)[1], "config.json")) as f:
        raw = json.load(f)
    raw.update(rope_theta=321.0, rope_scaling={"type": "linear", "factor": 3.0})
    fam, arch = hf.family_for_architecture(raw)
    _, cfg, _ = fam.config_from_hf(raw, arch)
    theirs = T.LlamaConfig(**{k: v for k, v in raw.items() if k not in ("architectures", "model_type")})
    assert theirs.rope_parameters["rope_type"] == cfg.positions.rope_scaling.rope_type == "linear"
    assert theirs.rope_parameters["factor"] == cfg.positions.rope_scaling.factor == 3.0
    assert theirs.rope_parameters["rope_theta"] == cfg.positions.rope_base == 321.0


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
    check_hf_logits("gpt2_position_ids", ref, np.asarray(ours), MASK)


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
