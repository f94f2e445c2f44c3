"""Hugging Face Mixtral, Qwen2-MoE and Qwen3-MoE: config mapping, both expert weight layouts
(per-expert on disk, transformers' fused in memory) through the streaming engine, and the
refusals; tiny random configs, no downloads (logits, generation and the export round trip:
tests/test_hf_table.py)."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hf_helpers import built, check_in_memory_layout
from hf_rows import row
from safetensors.numpy import save_file

from jaxformer.config import ConfigError
from jaxformer.convert import ConversionError
from jaxformer.hf import mixtral, qwen_moe
from jaxformer.hf.families import export_problems

E, F, D = 5, 6, 8  # odd expert count, expert width, model width of the engine tests


def hf_config(arch: str, **kw) -> dict:
    """config.json of a tiny model as transformers' own config class writes it."""
    import transformers
    cls = {"MixtralForCausalLM": transformers.MixtralConfig, "Qwen2MoeForCausalLM": transformers.Qwen2MoeConfig,
           "Qwen3MoeForCausalLM": transformers.Qwen3MoeConfig}[arch]
    base = dict(vocab_size=64, hidden_size=32, intermediate_size=24, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, num_experts_per_tok=3)
    out = json.loads(cls(**dict(base, **kw)).to_json_string())
    out["architectures"] = [arch]
    return out


def family(arch: str):
    return mixtral if arch == "MixtralForCausalLM" else qwen_moe


# ----------------------------------------------------------------------------- config
def test_mixtral_config():
    _, cfg, notes = mixtral.config_from_hf(hf_config("MixtralForCausalLM", num_local_experts=5, sliding_window=7,
                                                     router_aux_loss_coef=0.02), "MixtralForCausalLM")
    moe = cfg.feedforward.moe
    assert (moe.num_experts, moe.top_k, moe.router, moe.d_expert, moe.norm_topk_prob) == (5, 3, "softmax_topk", 24, True)
    assert (moe.dense_layers, moe.num_shared_experts, moe.aux_loss_coef) == ((), 0, 0.02)
    assert cfg.attention.sliding_window == 7 and cfg.positions.rope_base == 1e6 and cfg.attention.num_kv_heads == 2
    assert any("output_router_logits" in n for n in notes)


@pytest.mark.parametrize("arch", ["Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM"])
def test_qwen_moe_config(arch):
    raw = hf_config(arch, num_experts=7, moe_intermediate_size=10, decoder_sparse_step=2, mlp_only_layers=[3],
                    num_hidden_layers=5, norm_topk_prob=True, **({"shared_expert_intermediate_size": 14}
                                                                   if arch.startswith("Qwen2") else {}))
    _, cfg, _ = qwen_moe.config_from_hf(raw, arch)
    moe = cfg.feedforward.moe
    # sparse: (i + 1) % 2 == 0 and i not in [3] -> layer 1 only
    assert moe.dense_layers == (0, 2, 3, 4) and cfg.sparse_layers() == (False, True, False, False, False)
    assert (moe.num_experts, moe.top_k, moe.d_expert, moe.norm_topk_prob, cfg.feedforward.d_ff) == (7, 3, 10, True, 24)
    if arch.startswith("Qwen2"):
        assert (moe.num_shared_experts, moe.resolved_d_shared, moe.shared_expert_gate) == (1, 14, True)
        assert cfg.resolved_qkv_bias and not cfg.resolved_out_bias and not cfg.attention.qk_norm
    else:
        assert moe.num_shared_experts == 0 and cfg.attention.qk_norm
    # export writes a config transformers reads back to the same model
    out = qwen_moe.config_to_hf("lm", cfg)
    assert export_problems(qwen_moe.FAMILY, "lm", cfg) == []
    assert qwen_moe.config_from_hf(out, arch)[1] == cfg


@pytest.mark.parametrize("arch, kw, named", [
    ("MixtralForCausalLM", dict(router_jitter_noise=0.1), "router_jitter_noise"),
    ("MixtralForCausalLM", dict(rope_parameters={"rope_type": "longrope", "rope_theta": 1e4}), "rope_parameters"),
    ("Qwen2MoeForCausalLM", dict(use_sliding_window=True), "use_sliding_window"),
    ("Qwen2MoeForCausalLM", dict(num_experts=0), "num_experts"),
    ("Qwen2MoeForCausalLM", dict(shared_expert_intermediate_size=0), "shared_expert_intermediate_size"),
    ("Qwen3MoeForCausalLM", dict(decoder_sparse_step=0), "decoder_sparse_step"),
    ("Qwen3MoeForCausalLM", dict(num_experts_per_tok=9, num_experts=4), "top_k"),
    ("Qwen3MoeForCausalLM", dict(router_dropout=0.1), "router_dropout"),
])
def test_refused_options_are_named(arch, kw, named):
    # the config class refuses router_dropout and rope_parameters itself
    raw = dict(hf_config(arch), **kw) if named in ("router_dropout", "rope_parameters") else hf_config(arch, **kw)
    with pytest.raises(ConfigError, match=named):
        family(arch).config_from_hf(raw, arch)


def test_expert_count_alias_must_agree():
    raw = dict(hf_config("Qwen3MoeForCausalLM", num_experts=5), num_experts=6)  # num_local_experts 5
    with pytest.raises(ConfigError, match="num_experts"):
        qwen_moe.config_from_hf(raw, "Qwen3MoeForCausalLM")
    raw = hf_config("Qwen3MoeForCausalLM", num_experts=5)
    raw["num_experts"] = raw.pop("num_local_experts")  # published checkpoints' spelling
    assert qwen_moe.config_from_hf(raw, "Qwen3MoeForCausalLM")[1].feedforward.moe.num_experts == 5


def test_export_refuses_what_hf_cannot_express():
    _, cfg, _ = mixtral.config_from_hf(hf_config("MixtralForCausalLM", num_local_experts=5), "MixtralForCausalLM")
    import dataclasses
    for change, named in ((dict(norm_topk_prob=False), "norm_topk_prob"), (dict(capacity_factor=1.0), "capacity_factor"),
                          (dict(dense_layers=(0,)), "dense_layers"), (dict(router="topk_softmax"), "router")):
        bad = cfg.replace(moe=dataclasses.replace(cfg.feedforward.moe, **change))
        assert any(named in p for p in export_problems(mixtral.FAMILY, "lm", bad)), change


# ----------------------------------------------------------------------------- weights, no layer
def _fake_moe_model(layers: int = 2):
    """An nnx model holding only the agreed MoE params, at their LM paths
    (decoder.layers.{i}.ffn.router / experts.*): the engine needs no MoE layer."""
    import jax.numpy as jnp
    from flax import nnx

    class Experts(nnx.Module):
        def __init__(self):
            self.gate_proj = nnx.Param(jnp.zeros((E, F, D)))
            self.up_proj = nnx.Param(jnp.zeros((E, F, D)))
            self.down_proj = nnx.Param(jnp.zeros((E, D, F)))

    class FFN(nnx.Module):
        def __init__(self, rngs):
            self.router = nnx.Linear(D, E, use_bias=False, rngs=rngs)
            self.experts = Experts()

    class Layer(nnx.Module):
        def __init__(self, rngs):
            self.ffn = FFN(rngs)

    class Decoder(nnx.Module):
        def __init__(self, rngs):
            self.layers = nnx.List([Layer(rngs) for _ in range(layers)])

    class Model(nnx.Module):
        def __init__(self):
            self.decoder = Decoder(nnx.Rngs(0))
    return Model()


def _weights(layers: int = 2, seed: int = 0) -> dict[str, np.ndarray]:
    """{torch key: stacked array} of _fake_moe_model."""
    rng = np.random.default_rng(seed)
    out = {}
    for i in range(layers):
        p = f"decoder.layers.{i}.ffn"
        out[f"{p}.router.weight"] = rng.standard_normal((E, D), np.float32)
        for w, shape in (("gate_proj", (E, F, D)), ("up_proj", (E, F, D)), ("down_proj", (E, D, F))):
            out[f"{p}.experts.{w}"] = rng.standard_normal(shape, np.float32)
    return out


def _per_expert(sd, block="block_sparse_moe") -> dict[str, np.ndarray]:
    """Mixtral's on-disk layout of _weights."""
    out = {}
    for k, v in sd.items():
        i = k.split(".")[2]
        if k.endswith("router.weight"):
            out[f"model.layers.{i}.{block}.gate.weight"] = v
            continue
        hf = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}[k.rsplit(".", 1)[1]]
        out.update({f"model.layers.{i}.{block}.experts.{e}.{hf}.weight": v[e] for e in range(E)})
    return out


def _fused(sd) -> dict[str, np.ndarray]:
    """transformers 5.x's in-memory layout of _weights (model.state_dict())."""
    out = {}
    for i in range(2):
        p = f"decoder.layers.{i}.ffn"
        out[f"model.layers.{i}.mlp.gate.weight"] = sd[f"{p}.router.weight"]
        out[f"model.layers.{i}.mlp.experts.gate_up_proj"] = np.concatenate(
            [sd[f"{p}.experts.gate_proj"], sd[f"{p}.experts.up_proj"]], axis=1)
        out[f"model.layers.{i}.mlp.experts.down_proj"] = sd[f"{p}.experts.down_proj"]
    return out


def _write(path, tensors: dict, shards: int = 1):
    """An HF directory; with shards > 1 the keys are dealt round-robin (experts of one param
    land in different shards, in a shuffled order)."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(hf_config("MixtralForCausalLM", num_local_experts=E), f)
    keys = list(tensors)
    np.random.default_rng(1).shuffle(keys)
    if shards == 1:
        save_file(tensors, os.path.join(path, "model.safetensors"))
        return
    weight_map = {}
    for s in range(shards):
        name = f"model-{s:05d}.safetensors"
        part = {k: tensors[k] for k in keys[s::shards]}
        save_file(part, os.path.join(path, name))
        weight_map.update(dict.fromkeys(part, name))
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"weight_map": weight_map}, f)


def _stream(path, flush_bytes: int = 256 << 20):
    from jaxformer.convert import param_leaves, torch_key
    from jaxformer.hf.files import HFCheckpoint
    from jaxformer.hf.streaming import ModelSink, convert_stream
    _, cfg, _ = mixtral.config_from_hf(hf_config("MixtralForCausalLM", num_local_experts=E), "MixtralForCausalLM")
    model = _fake_moe_model()
    report = convert_stream(HFCheckpoint(str(path)), mixtral.tensor_fn("lm", cfg, "MixtralForCausalLM"), model,
                            ModelSink(model), flush_bytes=flush_bytes)
    leaves = param_leaves(model)
    got = {torch_key(p): np.asarray(v.get_value()) for p, v in leaves.items()}
    return report, {k: (v.T if k.endswith("router.weight") else v) for k, v in got.items()}


@pytest.mark.parametrize("layout", ["per_expert", "per_expert_mlp", "fused"])
def test_both_expert_layouts_stream_into_the_stacked_params(layout, tmp_path):
    sd = _weights()
    hf_sd = {"per_expert": lambda: _per_expert(sd), "per_expert_mlp": lambda: _per_expert(sd, "mlp"),
             "fused": lambda: _fused(sd)}[layout]()
    _write(tmp_path, hf_sd, shards=3)
    report, got = _stream(tmp_path, flush_bytes=E * F * D * 4)  # a batch of about one param
    assert report["params"] == len(sd) and set(got) == set(sd)
    for k in sd:
        np.testing.assert_array_equal(got[k], sd[k], err_msg=k)


def test_missing_duplicate_and_misshaped_experts_are_named_in_one_error(tmp_path):
    sd = _weights()
    hf_sd = _per_expert(sd)
    del hf_sd["model.layers.0.block_sparse_moe.experts.2.w3.weight"]
    hf_sd["model.layers.0.block_sparse_moe.experts.4.w2.weight"] = np.zeros((D, F + 1), np.float32)
    hf_sd["model.layers.0.block_sparse_moe.experts.5.w1.weight"] = np.zeros((F, D), np.float32)  # E = 5
    # layer 1's down_proj both fused and per expert
    hf_sd["model.layers.1.mlp.experts.down_proj"] = sd["decoder.layers.1.ffn.experts.down_proj"]
    _write(tmp_path, hf_sd)
    with pytest.raises(ConversionError) as err:
        _stream(tmp_path)
    text = str(err.value)
    assert "missing: decoder.layers.0.ffn.experts.up_proj[2] (slice 2 of 5" in text
    assert "expected from HF model.layers.0.block_sparse_moe.experts.2.w3.weight" in text
    assert "shape: decoder.layers.0.ffn.experts.down_proj[4]" in text
    assert "unexpected: decoder.layers.0.ffn.experts.gate_proj[5]" in text
    assert "duplicate: decoder.layers.1.ffn.experts.down_proj comes whole from HF model.layers.1.mlp" in text
    assert len(err.value.problems) == 4


def test_a_repeated_expert_is_a_duplicate():
    from jaxformer.hf.streaming import _read_order
    fn = mixtral.tensor_fn("lm", mixtral.config_from_hf(hf_config("MixtralForCausalLM"), "MixtralForCausalLM")[1],
                           "MixtralForCausalLM")
    a = fn("model.layers.0.block_sparse_moe.experts.3.w1.weight", np.zeros((F, D)))
    b = fn("model.layers.0.mlp.experts.3.w1.weight", np.zeros((F, D)))
    assert list(a) == list(b) == ["decoder.layers.0.ffn.experts.gate_proj[3]"]  # one slice from two names
    # the slices of one param are read one after another, at its first slice's place
    keys = ["x", "e0.w1", "e0.w2", "e1.w1", "e1.w2", "y"]
    base = {"e0.w1": "g", "e1.w1": "g", "e0.w2": "d", "e1.w2": "d"}
    assert _read_order(keys, base) == ["x", "e0.w1", "e1.w1", "e0.w2", "e1.w2", "y"]


@pytest.mark.parametrize("arch", ["Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "MixtralForCausalLM"])
def test_save_pretrained_keys_map_both_ways(arch, tmp_path):
    """Every key transformers' save_pretrained writes maps to one of ours (an expert slice
    where it is per expert), and export writes exactly those keys back with the same values."""
    import torch
    import transformers
    from safetensors.numpy import load_file
    kw = dict(num_local_experts=E) if arch.startswith("Mixtral") else dict(num_experts=E, mlp_only_layers=[1])
    raw = hf_config(arch, **kw)
    torch.manual_seed(0)
    model = getattr(transformers, arch)(getattr(transformers, type_name(arch))(**{
        k: v for k, v in raw.items() if k not in ("architectures", "model_type", "transformers_version")}))
    model.save_pretrained(str(tmp_path))
    disk = load_file(str(tmp_path / "model.safetensors"))
    fam = family(arch)
    _, cfg, _ = fam.config_from_hf(raw, arch)
    fn = fam.tensor_fn("lm", cfg, arch)
    sd, slices = {}, {}
    for k, x in disk.items():
        for tk, y in fn(k, x).items():
            base, _, e = tk.partition("[")
            if e:
                slices.setdefault(base, {})[int(e[:-1])] = y
            else:
                sd[tk] = y
    sd.update({b: np.stack([p[e] for e in range(len(p))]) for b, p in slices.items()})
    assert sd["decoder.layers.0.ffn.experts.gate_proj"].shape[0] == E
    back = fam.state_dict_to_hf(sd, "lm", cfg)
    assert set(back) == set(disk)
    for k in disk:
        np.testing.assert_array_equal(back[k], disk[k], err_msg=k)


def type_name(arch: str) -> str:
    return arch.replace("ForCausalLM", "Config")


# ----------------------------------------------------------------------------- parity with transformers
# The tiny random HF models are the rows "moe/*" of tests/hf_rows.py: tests/test_hf_table.py
# checks their fp32 logits, greedy and beam ids, and the export (save_pretrained's per-expert
# keys) loading back in transformers with identical logits.
@pytest.fixture(autouse=True)
def _precision():
    from jaxformer.parity import setup_precision
    setup_precision()


@pytest.mark.parametrize("tag", ["mixtral_e5_k2_window4", "qwen2_moe_e5_k3_dense1", "qwen3_moe_e5_k3_head12"])
def test_fused_in_memory_layout_imports_the_same_params(tag, tmp_path_factory, tmp_path):
    """transformers' own state_dict (fused gate_up_proj / down_proj experts) as a checkpoint
    gives exactly the params of the per-expert save_pretrained files."""
    hf_model, path, (model, _, _) = built(row(f"moe/{tag}"), tmp_path_factory)
    sd = check_in_memory_layout(hf_model, path, model, tmp_path / "fused")
    assert any(k.endswith("experts.gate_up_proj") for k in sd)


def test_streaming_to_a_checkpoint_in_small_batches(tmp_path_factory, tmp_path):
    """convert_hf_to_flax (orbax partial saves of about one expert param each) restores the
    params from_pretrained gives."""
    import jax
    from flax import nnx

    from jaxformer import hf
    from jaxformer.checkpoint_io import load_model_config, restore_params
    _, path, (model, _, cfg) = built(row("moe/qwen2_moe_e5_k3_dense1"), tmp_path_factory)
    report = hf.convert_hf_to_flax(path, str(tmp_path / "ckpt"), flush_bytes=5 * 16 * 32 * 4)
    assert report["batches"] > 3
    assert load_model_config(str(tmp_path / "ckpt")) == ("lm", cfg)
    want = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    got = restore_params(str(tmp_path / "ckpt"), jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), want))
    jax.tree.map(np.testing.assert_array_equal, got, want)
