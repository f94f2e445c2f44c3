"""Hugging Face DeepSeek-V3 (`DeepseekV3ForCausalLM`): config mapping and refusals, the
choosing-only score bias, the export's config.json, both expert layouts, the multi-token-prediction
layers of published checkpoints; tiny random configs (rows "deepseek/*" of tests/hf_rows.py, whose
fp32 logits, greedy / beam ids and export round trip tests/test_hf_table.py checks), no downloads.

HF initialises e_score_correction_bias to zeros (a buffer, which helpers.randomize does not
touch): the rows redraw it (hf_rows.randomize_router_bias), so the bias decides some experts."""
from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest
from hf_helpers import built, check_in_memory_layout, copy_config, lm_logits, same_params
from hf_rows import row
from safetensors.numpy import load_file, save_file

from jaxformer.config import ConfigError
from jaxformer.hf import deepseek
from jaxformer.hf.families import export_problems

ARCH = "DeepseekV3ForCausalLM"
QLORA, PLAIN = row("deepseek/qlora_yarn_e8_g4_dense0"), row("deepseek/plainq_e6_g3_shared2_tied")
IDS, MASK = QLORA.inputs()


def hf_config(**kw) -> dict:
    """config.json of a tiny model as transformers' own config class writes it."""
    import transformers
    out = json.loads(transformers.DeepseekV3Config(**dict(QLORA.config, **kw)).to_json_string())
    out["architectures"] = [ARCH]
    return out


# ----------------------------------------------------------------------------- config
def test_config_maps_and_round_trips():
    _, cfg, _ = deepseek.config_from_hf(hf_config(), ARCH)
    moe, mla = cfg.feedforward.moe, cfg.attention.mla
    assert (moe.router, moe.num_experts, moe.top_k, moe.n_group, moe.topk_group) == ("sigmoid_grouped", 8, 3, 4, 2)
    assert (moe.score_bias, moe.routed_scaling_factor, moe.norm_topk_prob, moe.d_expert) == (True, 2.5, True, 12)
    assert (moe.num_shared_experts, moe.resolved_d_shared, moe.dense_layers, cfg.feedforward.d_ff) == (1, 12, (0,), 40)
    assert (mla.q_lora_rank, mla.kv_lora_rank, mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim) == (
        10, 12, 6, 4, 10)
    assert (mla.rope_interleave and cfg.resolved_qkv_bias and cfg.resolved_out_bias
            and cfg.attention.num_kv_heads is None)
    s = cfg.positions.rope_scaling
    assert (s.rope_type, s.factor, s.mscale, s.mscale_all_dim, s.original_max_len) == ("yarn", 4.0, 0.9, 1.3, 16)
    assert export_problems(deepseek.FAMILY, "lm", cfg) == []
    assert deepseek.config_from_hf(deepseek.config_to_hf("lm", cfg), ARCH)[1] == cfg
    _, plain, _ = deepseek.config_from_hf(hf_config(q_lora_rank=None, first_k_dense_replace=5), ARCH)
    assert (plain.attention.mla.q_lora_rank is None
            and plain.feedforward.moe.dense_layers == (0, 1))  # more than num_layers: all dense


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
    assert (cfg.feedforward.moe.dense_layers == (0, 1, 2) and cfg.feedforward.moe.num_experts == 256
            and cfg.positions.rope_scaling.factor == 40)
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
        bad = cfg.replace(moe=dataclasses.replace(cfg.feedforward.moe, **change))
        assert any(named in p for p in export_problems(deepseek.FAMILY, "lm", bad)), change
    bad = cfg.replace(mla=dataclasses.replace(cfg.attention.mla, latent_norm_eps=1e-5))
    assert any("latent_norm_eps" in p for p in export_problems(deepseek.FAMILY, "lm", bad))


# ----------------------------------------------------------------------------- parity with transformers
@pytest.fixture(autouse=True)
def _precision():
    from jaxformer.parity import setup_precision
    setup_precision()


@pytest.mark.parametrize("r", [QLORA, PLAIN], ids=lambda r: r.case)
def test_zeroing_the_score_bias_moves_the_logits(r, tmp_path_factory):
    """The choosing-only score_bias is exercised (the logits within tolerance of HF's:
    tests/test_hf_table.py): zeroing ours moves the logits well past the tolerance."""
    import jax.numpy as jnp
    from helpers import hf_lm_logits
    hf_model, _, (model, _, cfg) = built(r, tmp_path_factory)
    ref = hf_lm_logits(hf_model, IDS, MASK)
    routers = [layer.ffn.router for layer, sparse in zip(model.decoder.layers, cfg.sparse_layers(), strict=False) if sparse]
    kept = [router.score_bias.get_value() for router in routers]
    try:
        for router in routers:
            router.score_bias.set_value(jnp.zeros_like(router.score_bias.get_value()))
        unbiased = lm_logits(model, IDS, MASK)
    finally:
        for router, b in zip(routers, kept, strict=True):
            router.score_bias.set_value(b)
    assert np.abs(unbiased - ref)[MASK.astype(bool)].max() > 1e-2


@pytest.mark.parametrize("r", [QLORA, PLAIN], ids=lambda r: r.case)
def test_export_files_are_save_pretrained_s(r, tmp_path_factory, tmp_path):
    """The export's config.json holds save_pretrained's keys with the same values and JSON types
    (ints as ints); its loading back with identical logits is tests/test_hf_table.py's."""
    from jaxformer import hf
    _, path, (model, name, cfg) = built(r, tmp_path_factory)
    out = str(tmp_path / "out")
    hf.save_pretrained(model, name, cfg, out)
    with open(os.path.join(path, "config.json")) as f, open(os.path.join(out, "config.json")) as g:
        theirs, ours = json.load(f), json.load(g)
    theirs.pop("transformers_version")
    assert theirs.pop("num_nextn_predict_layers") == 1 and ours.pop("num_nextn_predict_layers") == 0  # no MTP exported
    ours.pop("rope_theta", None)  # rope_to_hf also writes the 4.x top-level key, which 5.x folds in
    assert ours["rope_parameters"].pop("truncate", True) is True  # yarn's default, written explicitly
    assert set(ours) == set(theirs), set(ours) ^ set(theirs)
    for k, v in theirs.items():
        assert ours[k] == v and type(ours[k]) is type(v), (k, ours[k], v)


def test_fused_in_memory_layout_imports_the_same_params(tmp_path_factory, tmp_path):
    """transformers' own state_dict (fused gate_up_proj / down_proj experts) as a checkpoint
    gives exactly the params of the per-expert save_pretrained files."""
    hf_model, path, (model, _, _) = built(QLORA, tmp_path_factory)
    sd = check_in_memory_layout(hf_model, path, model, tmp_path / "fused")
    assert "model.layers.1.mlp.experts.gate_up_proj" in sd and "model.layers.1.mlp.gate.e_score_correction_bias" in sd


def test_mtp_layers_are_skipped_as_transformers_does(tmp_path_factory, tmp_path):
    """A published checkpoint's MTP module (model.layers.{num_hidden_layers}.*) is reported
    as unexpected by transformers' DeepseekV3ForCausalLM, which computes the same logits
    without it; the import skips it with a note and gives the same params."""
    import transformers
    from helpers import hf_lm_logits, realigned

    from jaxformer import hf
    hf_model, path, (model, _, _) = built(PLAIN, tmp_path_factory)
    sd = load_file(os.path.join(path, "model.safetensors"))
    rng = np.random.default_rng(0)
    mtp = {"model.layers.2.eh_proj.weight": (32, 64), "model.layers.2.enorm.weight": (32,),
           "model.layers.2.shared_head.norm.weight": (32,), "model.layers.2.mlp.gate.weight": (6, 32),
           "model.layers.2.self_attn.kv_a_layernorm.weight": (9,)}
    sd.update({k: rng.standard_normal(s).astype(np.float32) for k, s in mtp.items()})
    copy_config(path, tmp_path / "mtp")
    save_file(sd, str(tmp_path / "mtp" / "model.safetensors"))
    back, info = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "mtp"), output_loading_info=True)
    assert set(info["unexpected_keys"]) == set(mtp) and not info["missing_keys"]
    np.testing.assert_array_equal(hf_lm_logits(realigned(back).eval(), IDS, MASK), hf_lm_logits(hf_model, IDS, MASK))
    ours, _, _, report = hf.from_pretrained(str(tmp_path / "mtp"), return_report=True)
    assert any("model.layers.[2] skipped" in n for n in report["notes"])
    same_params(ours, model)
