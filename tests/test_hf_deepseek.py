"""Hugging Face DeepSeek-V3 (`DeepseekV3ForCausalLM`): config mapping and refusals, fp32 logits
and greedy / beam ids against transformers, export that transformers loads, both expert layouts,
the multi-token-prediction layers of published checkpoints; tiny random configs, no downloads.

HF initialises e_score_correction_bias to zeros (a buffer, which helpers.randomize does not
touch): it is redrawn here, so the choosing-only bias decides some experts."""
from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from jaxformer.config import ConfigError
from jaxformer.hf import deepseek

ARCH = "DeepseekV3ForCausalLM"
V = 80
IDS = np.random.RandomState(5).randint(3, V, size=(2, 11))
MASK = np.ones_like(IDS)
MASK[1, :3] = 0  # a left-padded row
BASE = dict(vocab_size=V, hidden_size=32, intermediate_size=40, num_hidden_layers=2, bos_token_id=1, eos_token_id=2,
            pad_token_id=0, max_position_embeddings=64)
# tag -> DeepseekV3Config kwargs: q_lora and plain q; grouped choice with topk_group < n_group;
# a dense first layer and an all-sparse stack; YaRN with mscale != mscale_all_dim; both rope layouts.
# Expert widths are multiples of 4: HF's grouped_mm experts need 16-byte strides.
CASES = {
    "qlora_yarn_e8_g4_dense0": dict(
        BASE, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=10, kv_lora_rank=12, qk_nope_head_dim=6,
        qk_rope_head_dim=4, v_head_dim=10, n_routed_experts=8, num_experts_per_tok=3, n_group=4, topk_group=2,
        moe_intermediate_size=12, n_shared_experts=1, first_k_dense_replace=1, routed_scaling_factor=2.5,
        attention_bias=True, rope_parameters=dict(rope_type="yarn", rope_theta=500.0, factor=4.0,
                                                  original_max_position_embeddings=16, mscale=0.9,
                                                  mscale_all_dim=1.3, beta_fast=8.0, beta_slow=1.0)),
    "plainq_e6_g3_shared2_tied": dict(
        BASE, num_attention_heads=3, num_key_value_heads=3, q_lora_rank=None, kv_lora_rank=9, qk_nope_head_dim=5,
        qk_rope_head_dim=6, v_head_dim=7, n_routed_experts=6, num_experts_per_tok=2, n_group=3, topk_group=1,
        moe_intermediate_size=8, n_shared_experts=2, first_k_dense_replace=0, norm_topk_prob=False,
        routed_scaling_factor=1.5, rope_interleave=False, tie_word_embeddings=True),
}


def hf_config(**kw) -> dict:
    """config.json of a tiny model as transformers' own config class writes it."""
    import transformers
    out = json.loads(transformers.DeepseekV3Config(**dict(CASES["qlora_yarn_e8_g4_dense0"], **kw)).to_json_string())
    out["architectures"] = [ARCH]
    return out


# ----------------------------------------------------------------------------- config
def test_config_maps_and_round_trips():
    _, cfg, _ = deepseek.config_from_hf(hf_config(), ARCH)
    moe, mla = cfg.moe, cfg.mla
    assert (moe.router, moe.num_experts, moe.top_k, moe.n_group, moe.topk_group) == ("sigmoid_grouped", 8, 3, 4, 2)
    assert (moe.score_bias, moe.routed_scaling_factor, moe.norm_topk_prob, moe.d_expert) == (True, 2.5, True, 12)
    assert (moe.num_shared_experts, moe.resolved_d_shared, moe.dense_layers, cfg.d_ff) == (1, 12, (0,), 40)
    assert (mla.q_lora_rank, mla.kv_lora_rank, mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim) == (
        10, 12, 6, 4, 10)
    assert mla.rope_interleave and cfg.resolved_qkv_bias and cfg.resolved_out_bias and cfg.num_kv_heads is None
    s = cfg.rope_scaling
    assert (s.rope_type, s.factor, s.mscale, s.mscale_all_dim, s.original_max_len) == ("yarn", 4.0, 0.9, 1.3, 16)
    assert deepseek.export_problems("lm", cfg) == []
    assert deepseek.config_from_hf(deepseek.config_to_hf("lm", cfg), ARCH)[1] == cfg
    _, plain, _ = deepseek.config_from_hf(hf_config(q_lora_rank=None, first_k_dense_replace=5), ARCH)
    assert plain.mla.q_lora_rank is None and plain.moe.dense_layers == (0, 1)  # more than num_layers: all dense


def test_published_v3_config_json_maps():
    """The keys DeepSeek-V3's own config.json carries (its original remote code's) map, with
    the legacy yarn rope_scaling; only the fp8 quantization_config is refused."""
    raw = dict(architectures=[ARCH], model_type="deepseek_v3", attention_bias=False, attention_dropout=0.0,
               auto_map={"AutoConfig": "configuration_deepseek.DeepseekV3Config"}, aux_loss_alpha=0.001,
               bos_token_id=0, eos_token_id=1, ep_size=1, first_k_dense_replace=3, hidden_act="silu",
               hidden_size=7168, initializer_range=0.02, intermediate_size=18432, kv_lora_rank=512,
               max_position_embeddings=163840, moe_intermediate_size=2048, moe_layer_freq=1, n_group=8,
               n_routed_experts=256, n_shared_experts=1, norm_topk_prob=True, num_attention_heads=128,
               num_experts_per_tok=8, num_hidden_layers=61, num_key_value_heads=128, num_nextn_predict_layers=1,
               q_lora_rank=1536, qk_nope_head_dim=128, qk_rope_head_dim=64, rms_norm_eps=1e-6,
               rope_scaling=dict(beta_fast=32, beta_slow=1, factor=40, mscale=1.0, mscale_all_dim=1.0,
                                 original_max_position_embeddings=4096, type="yarn"),
               rope_theta=10000, routed_scaling_factor=2.5, scoring_func="sigmoid", seq_aux=True,
               tie_word_embeddings=False, topk_group=4, topk_method="noaux_tc", torch_dtype="bfloat16",
               transformers_version="4.33.1", use_cache=True, v_head_dim=128, vocab_size=129280)
    keys = ["model.layers.60.mlp.gate.weight", "model.layers.61.eh_proj.weight"]
    _, cfg, notes = deepseek.config_from_hf(raw, ARCH, keys)
    assert cfg.moe.dense_layers == (0, 1, 2) and cfg.moe.num_experts == 256 and cfg.rope_scaling.factor == 40
    assert any("model.layers.[61] skipped" in n for n in notes)
    with pytest.raises(ConfigError, match="quantization_config"):
        deepseek.config_from_hf(dict(raw, quantization_config={"quant_method": "fp8"}), ARCH, keys)
    with pytest.raises(ConfigError, match="model.layers.62, beyond"):
        deepseek.config_from_hf(raw, ARCH, keys + ["model.layers.62.enorm.weight"])


@pytest.mark.parametrize("kw, named", [
    (dict(topk_method="group_limited_greedy"), "topk_method"),
    (dict(scoring_func="softmax"), "scoring_func"),
    (dict(moe_layer_freq=2), "moe_layer_freq"),
    (dict(ep_size=8), "ep_size"),
    (dict(num_key_value_heads=2), "num_key_value_heads"),
    (dict(n_shared_experts=0), "n_shared_experts"),
    (dict(n_group=None), "n_group"),
    (dict(head_dim=8), "head_dim"),
    (dict(topk_group=5), "topk_group"),
    (dict(hidden_act="gelu"), "hidden_act"),
    (dict(rope_parameters={"rope_type": "longrope", "rope_theta": 1e4}), "rope_parameters"),
])
def test_refused_options_are_named(kw, named):
    raw = dict(hf_config(), **kw)  # past the config class, which refuses some of these itself
    with pytest.raises(ConfigError, match=named):
        deepseek.config_from_hf(raw, ARCH)


def test_export_refuses_what_hf_cannot_express():
    _, cfg, _ = deepseek.config_from_hf(hf_config(), ARCH)
    for change, named in ((dict(dense_layers=(1,)), "dense_layers"), (dict(capacity_factor=1.0), "capacity_factor"),
                          (dict(score_bias=False), "score_bias"), (dict(d_shared=7), "shared experts")):
        bad = dataclasses.replace(cfg, moe=dataclasses.replace(cfg.moe, **change))
        assert any(named in p for p in deepseek.export_problems("lm", bad)), change
    bad = dataclasses.replace(cfg, mla=dataclasses.replace(cfg.mla, latent_norm_eps=1e-5))
    assert any("latent_norm_eps" in p for p in deepseek.export_problems("lm", bad))


# ----------------------------------------------------------------------------- parity with transformers
@pytest.fixture(autouse=True)
def _precision():
    from jaxformer.parity import setup_precision
    setup_precision()


def randomize_router_bias(model, seed: int = 3):
    """Every e_score_correction_bias redrawn (HF: zeros), at the scale of the sigmoid scores'
    spread, so the bias moves some choices but not all."""
    import torch
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buf.copy_(torch.randn(buf.shape, generator=g) * 0.1)
    return model


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """tag -> (HF model, its save_pretrained dir, our imported model): built once."""
    import transformers
    from helpers import randomize

    from jaxformer import hf
    root = tmp_path_factory.mktemp("hf_deepseek")
    out = {}
    for tag, kw in CASES.items():
        model = randomize_router_bias(randomize(transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(**kw))))
        model.save_pretrained(root / tag)
        out[tag] = (model, str(root / tag), hf.from_pretrained(str(root / tag)))
    return out


def _ours(model) -> np.ndarray:
    import jax.numpy as jnp
    from flax import nnx
    global _jitted
    if "_jitted" not in globals():
        _jitted = nnx.jit(lambda m, i, k: m(i, k))
    return np.asarray(_jitted(model, jnp.asarray(IDS), jnp.asarray(MASK)))


@pytest.mark.parametrize("tag", sorted(CASES))
def test_forward_matches_hf(tag, saved):
    """Logits within tolerance, left-padded row included; zeroing our score_bias moves them
    well past it (the biased choice is exercised)."""
    import jax.numpy as jnp
    from helpers import check_hf_logits, hf_lm_logits
    hf_model, _, (model, _, cfg) = saved[tag]
    assert cfg.sparse_layers() == ((False, True) if "dense0" in tag else (True, True))
    ref = hf_lm_logits(hf_model, IDS, MASK)
    check_hf_logits(tag, ref, _ours(model), MASK)
    routers = [layer.ffn.router for layer, sparse in zip(model.decoder.layers, cfg.sparse_layers()) if sparse]
    kept = [r.score_bias.get_value() for r in routers]
    try:
        for r in routers:
            r.score_bias.set_value(jnp.zeros_like(r.score_bias.get_value()))
        unbiased = _ours(model)
    finally:
        for r, b in zip(routers, kept):
            r.score_bias.set_value(b)
    assert np.abs(unbiased - ref)[MASK.astype(bool)].max() > 1e-2


def _hf_generate(hf_model, n, **kw):
    import torch
    hf_model.generation_config.pad_token_id = 0
    with torch.no_grad():
        return hf_model.generate(torch.from_numpy(IDS), attention_mask=torch.from_numpy(MASK), max_new_tokens=n,
                                 do_sample=False, **kw)[:, IDS.shape[1]:].numpy()


def test_greedy_and_beam_match_hf(saved):
    """Greedy ids equal HF generate's (the latent cache with its absorbed one-token steps, a
    left-padded row, a dense and a sparse layer); beam ids too (eos never produced, so both
    stopping rules agree). One case: each search compiles for over 10 s, and the plain-q
    decode step is checked against full recompute in tests/test_mla.py."""
    from jaxformer import generation as jgen
    from jaxformer.config.models import GenerationConfig
    hf_model, _, (model, _, _) = saved["qlora_yarn_e8_g4_dense0"]
    ref = _hf_generate(hf_model, 8)
    ours = jgen.generate(model, IDS, MASK, gen=GenerationConfig(max_new_tokens=8))
    np.testing.assert_array_equal(ours[:, :ref.shape[1]], ref)
    eos = hf_model.generation_config.eos_token_id
    hf_model.generation_config.eos_token_id = None
    try:
        ref = _hf_generate(hf_model, 5, num_beams=3, length_penalty=1.0)
    finally:
        hf_model.generation_config.eos_token_id = eos
    ours, _ = jgen.generate(model, IDS, MASK, gen=GenerationConfig(max_new_tokens=5, strategy="beam", num_beams=3,
                                                                   eos_id=V + 7))
    np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("tag", sorted(CASES))
def test_export_loads_in_transformers_with_identical_logits(tag, saved, tmp_path):
    """The export holds save_pretrained's keys, its config.json save_pretrained's keys with
    the same values and JSON types (ints as ints), and loads with identical logits."""
    import transformers
    from helpers import hf_lm_logits, realigned

    from jaxformer import hf
    hf_model, path, (model, name, cfg) = saved[tag]
    out = str(tmp_path / "out")
    hf.save_pretrained(model, name, cfg, out)
    assert set(load_file(os.path.join(out, "model.safetensors"))) == set(load_file(os.path.join(path, "model.safetensors")))
    with open(os.path.join(path, "config.json")) as f, open(os.path.join(out, "config.json")) as g:
        theirs, ours = json.load(f), json.load(g)
    theirs.pop("transformers_version")
    assert theirs.pop("num_nextn_predict_layers") == 1 and ours.pop("num_nextn_predict_layers") == 0  # no MTP exported
    ours.pop("rope_theta", None)  # rope_to_hf also writes the 4.x top-level key, which 5.x folds in
    assert ours["rope_parameters"].pop("truncate", True) is True  # yarn's default, written explicitly
    assert set(ours) == set(theirs), set(ours) ^ set(theirs)
    for k, v in theirs.items():
        assert ours[k] == v and type(ours[k]) is type(v), (k, ours[k], v)
    back, info = transformers.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert type(back) is type(hf_model)
    np.testing.assert_array_equal(hf_lm_logits(realigned(back).eval(), IDS, MASK), hf_lm_logits(hf_model, IDS, MASK))


def _copy_config(src: str, dst) -> None:
    os.makedirs(dst)
    with open(os.path.join(src, "config.json")) as f, open(os.path.join(dst, "config.json"), "w") as g:
        g.write(f.read())


def _same_params(a, b) -> None:
    from jaxformer.convert import param_leaves
    la, lb = param_leaves(a), param_leaves(b)
    assert set(la) == set(lb)
    for p in la:
        np.testing.assert_array_equal(np.asarray(la[p].get_value()), np.asarray(lb[p].get_value()), err_msg=str(p))


def test_fused_in_memory_layout_imports_the_same_params(saved, tmp_path):
    """transformers' own state_dict (fused gate_up_proj / down_proj experts) as a checkpoint
    gives exactly the params of the per-expert save_pretrained files."""
    from jaxformer import hf
    hf_model, path, (model, _, _) = saved["qlora_yarn_e8_g4_dense0"]
    sd = {k: v.numpy() for k, v in hf_model.state_dict().items()}
    assert "model.layers.1.mlp.experts.gate_up_proj" in sd and "model.layers.1.mlp.gate.e_score_correction_bias" in sd
    _copy_config(path, tmp_path / "fused")
    save_file(sd, str(tmp_path / "fused" / "model.safetensors"))
    _same_params(hf.from_pretrained(str(tmp_path / "fused"))[0], model)


def test_mtp_layers_are_skipped_as_transformers_does(saved, tmp_path):
    """A published checkpoint's MTP module (model.layers.{num_hidden_layers}.*) is reported
    as unexpected by transformers' DeepseekV3ForCausalLM, which computes the same logits
    without it; the import skips it with a note and gives the same params."""
    import transformers
    from helpers import hf_lm_logits, realigned

    from jaxformer import hf
    hf_model, path, (model, _, _) = saved["plainq_e6_g3_shared2_tied"]
    sd = load_file(os.path.join(path, "model.safetensors"))
    rng = np.random.default_rng(0)
    mtp = {"model.layers.2.eh_proj.weight": (32, 64), "model.layers.2.enorm.weight": (32,),
           "model.layers.2.shared_head.norm.weight": (32,), "model.layers.2.mlp.gate.weight": (6, 32),
           "model.layers.2.self_attn.kv_a_layernorm.weight": (9,)}
    sd.update({k: rng.standard_normal(s).astype(np.float32) for k, s in mtp.items()})
    _copy_config(path, tmp_path / "mtp")
    save_file(sd, str(tmp_path / "mtp" / "model.safetensors"))
    back, info = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "mtp"), output_loading_info=True)
    assert set(info["unexpected_keys"]) == set(mtp) and not info["missing_keys"]
    np.testing.assert_array_equal(hf_lm_logits(realigned(back).eval(), IDS, MASK), hf_lm_logits(hf_model, IDS, MASK))
    ours, _, _, report = hf.from_pretrained(str(tmp_path / "mtp"), return_report=True)
    assert any("model.layers.[2] skipped" in n for n in report["notes"])
    _same_params(ours, model)
