"""gpt-oss (jaxformer/hf/gpt_oss.py) against transformers 5.x GptOssForCausalLM, on odd tiny
random configs (no download): fp32 logits within 1e-5 x max(1, max|logit|) with a left-padded
row, greedy and beam ids equal to generate's, the export loads back in transformers with
identical logits, an MXFP4 checkpoint (blocks + scales, quantization_config mxfp4) imports
as transformers dequantizes it, and unimplemented options are refused by name."""
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
V = 80
RNG = np.random.RandomState(5)
IDS = RNG.randint(3, V, size=(2, 11))
MASK = np.ones_like(IDS)
MASK[1, :3] = 0  # a left-padded row
SMALL = dict(vocab_size=V, hidden_size=32, intermediate_size=24, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, head_dim=8, num_local_experts=5, num_experts_per_tok=2, sliding_window=3,
             max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0)
YARN = dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=16, rope_theta=500.0, beta_fast=8.0,
            beta_slow=1.0, truncate=False)
CASES = {  # windows shorter than the 11-token prompts; limits small enough that the clamps bite
    "default_layers_yarn_limit": dict(SMALL, swiglu_limit=1.5, rope_parameters=YARN),
    "mqa_top3_full_first_no_bias": dict(SMALL, num_key_value_heads=1, num_experts_per_tok=3, num_hidden_layers=2,
                                        layer_types=["full_attention", "sliding_attention"], attention_bias=False,
                                        swiglu_alpha=1.2, swiglu_limit=0.8, tie_word_embeddings=True,
                                        rope_parameters=dict(rope_type="default", rope_theta=300.0)),
    "head_dim_12_e7_top1_all_full": dict(SMALL, head_dim=12, num_local_experts=7, num_experts_per_tok=1,
                                         layer_types=["full_attention"] * 3, intermediate_size=20, eos_token_id=[2, 5],
                                         rope_parameters=dict(YARN, truncate=True, factor=2.0)),
}


@pytest.fixture(autouse=True)
def _precision():
    setup_precision()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpt_oss")
    out = {}
    for tag, kw in CASES.items():
        torch.manual_seed(0)
        model = randomize(T.GptOssForCausalLM(T.GptOssConfig(**kw)))
        model.save_pretrained(root / tag)
        out[tag] = (model, str(root / tag))
    return out


@nnx.jit
def _call(model, ids, mask):
    return model(ids, mask)


@pytest.mark.parametrize("tag", sorted(CASES))
def test_forward_matches_hf(tag, saved):
    hf_model, path = saved[tag]
    model, name, cfg = hf.from_pretrained(path)
    assert name == "lm" and cfg.attn_sinks and cfg.moe.router == "topk_softmax"
    check_hf_logits(tag, hf_lm_logits(hf_model, IDS, MASK), np.asarray(_call(model, jnp.asarray(IDS),
                                                                             jnp.asarray(MASK))), MASK)


def _hf_generate(hf_model, n, **kw):
    hf_model.generation_config.pad_token_id = 0
    with torch.no_grad():
        return hf_model.generate(torch.from_numpy(IDS), attention_mask=torch.from_numpy(MASK), max_new_tokens=n,
                                 do_sample=False, **kw)[:, IDS.shape[1]:].numpy()


@pytest.mark.parametrize("tag", ["default_layers_yarn_limit"])
def test_greedy_and_beam_match_hf(tag, saved):
    """Greedy (with eos) and beam ids (eos never produced, so the stopping rules agree) equal
    HF generate's with a left-padded row, decoding past the window (ring caches)."""
    hf_model, path = saved[tag]
    model, _, _ = hf.from_pretrained(path)
    ref = _hf_generate(hf_model, 12)
    ours = jgen.generate(model, IDS, MASK, gen=GenerationConfig(max_new_tokens=12))
    np.testing.assert_array_equal(ours[:, :ref.shape[1]], ref)
    eos = hf_model.generation_config.eos_token_id
    hf_model.generation_config.eos_token_id = None
    try:
        ref = _hf_generate(hf_model, 8, num_beams=3, length_penalty=1.0)
    finally:
        hf_model.generation_config.eos_token_id = eos
    ours, _ = jgen.generate(model, IDS, MASK, gen=GenerationConfig(max_new_tokens=8, strategy="beam",
                                                                   num_beams=3, eos_id=V + 7))
    np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("tag", sorted(CASES))
def test_export_loads_in_transformers_with_identical_logits(tag, saved, tmp_path):
    hf_model, path = saved[tag]
    model, name, cfg = hf.from_pretrained(path)
    hf.save_pretrained(model, name, cfg, str(tmp_path / "out"))
    back = T.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).eval()
    assert type(back) is T.GptOssForCausalLM
    if "sliding_attention" in hf_model.config.layer_types:
        assert back.config.sliding_window == hf_model.config.sliding_window
    for key in ("layer_types", "swiglu_limit", "swiglu_alpha", "num_local_experts",
                "num_experts_per_tok", "attention_bias", "rope_parameters"):
        assert getattr(back.config, key) == getattr(hf_model.config, key), key
    np.testing.assert_array_equal(hf_lm_logits(realigned(back), IDS, MASK), hf_lm_logits(hf_model, IDS, MASK))
    ref_sd = hf_model.state_dict()  # same keys, shapes and values: fused, interleaved gate_up_proj
    back_sd = back.state_dict()
    assert sorted(back_sd) == sorted(ref_sd)
    assert all(torch.equal(back_sd[k], ref_sd[k]) for k in ref_sd)


def test_interleaved_gate_up_maps_to_gate_and_up(saved):
    hf_model, path = saved["default_layers_yarn_limit"]
    model, _, _ = hf.from_pretrained(path)
    fused = hf_model.model.layers[1].mlp.experts.gate_up_proj.detach().numpy()  # [E, D, 2F]
    experts = model.decoder.layers[1].ffn.experts
    np.testing.assert_array_equal(np.asarray(experts.gate_proj[...]), np.swapaxes(fused[:, :, 0::2], 1, 2))
    np.testing.assert_array_equal(np.asarray(experts.up_proj[...]), np.swapaxes(fused[:, :, 1::2], 1, 2))


def test_mxfp4_checkpoint_imports_as_transformers_dequantizes(saved, tmp_path):
    """Expert weights stored as MXFP4 blocks + scales (what published gpt-oss checkpoints hold):
    the import equals an HF model holding transformers' own dequantization of the same bytes."""
    from safetensors.numpy import load_file, save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    kw = dict(CASES["default_layers_yarn_limit"], intermediate_size=32)  # F and D multiples of 32
    torch.manual_seed(1)
    ref = randomize(T.GptOssForCausalLM(T.GptOssConfig(**kw)))
    ref.save_pretrained(tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    rng = np.random.RandomState(0)
    for key in [k for k in tensors if k.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        e, cols, rows = tensors.pop(key).shape  # [E, G * 32, R]
        blocks = rng.randint(0, 256, (e, rows, cols // 32, 16)).astype(np.uint8)
        scales = rng.randint(120, 126, (e, rows, cols // 32)).astype(np.uint8)
        tensors[f"{key}_blocks"], tensors[f"{key}_scales"] = blocks, scales
        weight = convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales), dtype=torch.float32)
        with torch.no_grad():
            ref.get_parameter(key).copy_(weight)
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    raw = json.loads((tmp_path / "config.json").read_text())
    raw["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    model, _, _, report = hf.from_pretrained(str(tmp_path), return_report=True)
    assert any("MXFP4" in n for n in report["notes"])
    check_hf_logits("mxfp4", hf_lm_logits(ref, IDS, MASK), np.asarray(_call(model, jnp.asarray(IDS),
                                                                            jnp.asarray(MASK))), MASK)


REFUSED = {  # config.json changes -> the option the error names
    "quant": (dict(quantization_config={"quant_method": "fp8"}), "quantization_config"),
    "act": (dict(hidden_act="gelu"), "hidden_act"),
    "experts_per_token": (dict(experts_per_token=3), "experts_per_token"),
    "layer_types": (dict(layer_types=["chunked_attention"] * 3), "layer_types"),
    "unknown": (dict(router_jitter_noise=0.1), "router_jitter_noise"),
}


@pytest.mark.parametrize("row", sorted(REFUSED))
def test_unimplemented_options_are_refused_by_name(row, saved):
    changes, word = REFUSED[row]
    with open(os.path.join(saved["default_layers_yarn_limit"][1], "config.json")) as f:
        raw = {**json.load(f), **changes}
    fam, arch = hf.family_for_architecture(raw)
    with pytest.raises(ConfigError, match=word):
        fam.config_from_hf(raw, arch)
