"""Hugging Face Mixtral, Qwen2-MoE and Qwen3-MoE: config mapping, both expert weight layouts
(per-expert on disk, transformers' fused in memory) through the streaming engine, and the
refusals; tiny random configs, no downloads."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from safetensors.numpy import save_file

from jaxformer.config import ConfigError
from jaxformer.convert import ConversionError
from jaxformer.hf import mixtral, qwen_moe

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
    moe = cfg.moe
    assert (moe.num_experts, moe.top_k, moe.router, moe.d_expert, moe.norm_topk_prob) == (5, 3, "softmax_topk", 24, True)
    assert (moe.dense_layers, moe.num_shared_experts, moe.aux_loss_coef) == ((), 0, 0.02)
    assert cfg.sliding_window == 7 and cfg.rope_base == 1e6 and cfg.num_kv_heads == 2
    assert any("output_router_logits" in n for n in notes)


@pytest.mark.parametrize("arch", ["Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM"])
def test_qwen_moe_config(arch):
    raw = hf_config(arch, num_experts=7, moe_intermediate_size=10, decoder_sparse_step=2, mlp_only_layers=[3],
                    num_hidden_layers=5, norm_topk_prob=True, **({"shared_expert_intermediate_size": 14}
                                                                   if arch.startswith("Qwen2") else {}))
    _, cfg, _ = qwen_moe.config_from_hf(raw, arch)
    moe = cfg.moe
    # sparse: (i + 1) % 2 == 0 and i not in [3] -> layer 1 only
    assert moe.dense_layers == (0, 2, 3, 4) and cfg.sparse_layers() == (False, True, False, False, False)
    assert (moe.num_experts, moe.top_k, moe.d_expert, moe.norm_topk_prob, cfg.d_ff) == (7, 3, 10, True, 24)
    if arch.startswith("Qwen2"):
        assert (moe.num_shared_experts, moe.resolved_d_shared, moe.shared_expert_gate) == (1, 14, True)
        assert cfg.resolved_qkv_bias and not cfg.resolved_out_bias and not cfg.qk_norm
    else:
        assert moe.num_shared_experts == 0 and cfg.qk_norm
    # export writes a config transformers reads back to the same model
    out = qwen_moe.config_to_hf("lm", cfg)
    assert qwen_moe.export_problems("lm", cfg) == []
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
    if named in ("router_dropout", "rope_parameters"):  # the config class refuses these itself
        raw = dict(hf_config(arch), **kw)
    else:
        raw = hf_config(arch, **kw)
    with pytest.raises(ConfigError, match=named):
        family(arch).config_from_hf(raw, arch)


def test_expert_count_alias_must_agree():
    raw = dict(hf_config("Qwen3MoeForCausalLM", num_experts=5), num_experts=6)  # num_local_experts 5
    with pytest.raises(ConfigError, match="num_experts"):
        qwen_moe.config_from_hf(raw, "Qwen3MoeForCausalLM")
    raw = hf_config("Qwen3MoeForCausalLM", num_experts=5)
    raw["num_experts"] = raw.pop("num_local_experts")  # published checkpoints' spelling
    assert qwen_moe.config_from_hf(raw, "Qwen3MoeForCausalLM")[1].moe.num_experts == 5


def test_export_refuses_what_hf_cannot_express():
    _, cfg, _ = mixtral.config_from_hf(hf_config("MixtralForCausalLM", num_local_experts=5), "MixtralForCausalLM")
    import dataclasses
    for change, named in ((dict(norm_topk_prob=False), "norm_topk_prob"), (dict(capacity_factor=1.0), "capacity_factor"),
                          (dict(dense_layers=(0,)), "dense_layers"), (dict(router="topk_softmax"), "router")):
        bad = dataclasses.replace(cfg, moe=dataclasses.replace(cfg.moe, **change))
        assert any(named in p for p in mixtral.export_problems("lm", bad)), change


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
V = 96
IDS = np.random.RandomState(5).randint(3, V, size=(2, 11))
MASK = np.ones_like(IDS)
MASK[1, :3] = 0  # a left-padded row
SMALL = dict(vocab_size=V, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, bos_token_id=1, eos_token_id=2, pad_token_id=0, max_position_embeddings=64)
# tag -> (architecture, config kwargs): odd expert counts, top_k, head counts; dense layers,
# the shared expert, norm_topk_prob and biases on and off
CASES = {
    "mixtral_e5_k2_window4": ("MixtralForCausalLM", dict(SMALL, num_local_experts=5, num_experts_per_tok=2,
                                                         sliding_window=4)),
    "mixtral_e3_k3_mqa_head12_tied": ("MixtralForCausalLM", dict(
        SMALL, num_hidden_layers=3, num_attention_heads=3, num_key_value_heads=1, head_dim=12, num_local_experts=3,
        num_experts_per_tok=3, tie_word_embeddings=True, intermediate_size=20)),
    "qwen2_moe_e5_k3_dense1": ("Qwen2MoeForCausalLM", dict(
        SMALL, num_hidden_layers=3, num_experts=5, num_experts_per_tok=3, moe_intermediate_size=16,
        shared_expert_intermediate_size=20, mlp_only_layers=[1])),
    "qwen2_moe_e7_k2_norm_nobias_step2": ("Qwen2MoeForCausalLM", dict(
        SMALL, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=3, head_dim=6, num_experts=7,
        num_experts_per_tok=2, moe_intermediate_size=12, shared_expert_intermediate_size=8, norm_topk_prob=True,
        qkv_bias=False, decoder_sparse_step=2)),
    "qwen3_moe_e5_k3_head12": ("Qwen3MoeForCausalLM", dict(
        SMALL, num_experts=5, num_experts_per_tok=3, moe_intermediate_size=16, head_dim=12)),
    "qwen3_moe_e4_k1_norm_bias_dense0": ("Qwen3MoeForCausalLM", dict(
        SMALL, num_hidden_layers=3, num_attention_heads=5, num_key_value_heads=5, head_dim=8, num_experts=4,
        num_experts_per_tok=1, moe_intermediate_size=8, norm_topk_prob=True, attention_bias=True,
        mlp_only_layers=[0])),
}


@pytest.fixture(autouse=True)
def _precision():
    from jaxformer.parity import setup_precision
    setup_precision()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """tag -> (HF model, its save_pretrained dir, our imported model): built once."""
    import transformers
    from helpers import randomize

    from jaxformer import hf
    root = tmp_path_factory.mktemp("hf_moe")
    out = {}
    for tag, (arch, kw) in CASES.items():
        cls = getattr(transformers, arch)
        model = randomize(cls(cls.config_class(**kw)))
        model.save_pretrained(root / tag)
        out[tag] = (model, str(root / tag), hf.from_pretrained(str(root / tag)))
    return out


def _ours(model, ids=IDS, mask=MASK) -> np.ndarray:
    import jax.numpy as jnp
    return np.asarray(_call(model, jnp.asarray(ids), jnp.asarray(mask)))


def _call(model, ids, mask):
    from flax import nnx
    global _jitted
    if "_jitted" not in globals():
        _jitted = nnx.jit(lambda m, i, k: m(i, k))
    return _jitted(model, ids, mask)


@pytest.mark.parametrize("tag", sorted(CASES))
def test_forward_matches_hf(tag, saved):
    from helpers import check_hf_logits, hf_lm_logits
    hf_model, _, (model, name, cfg) = saved[tag]
    assert cfg.moe is not None and (any(not s for s in cfg.sparse_layers()) == ("dense" in tag or "step" in tag))
    check_hf_logits(tag, hf_lm_logits(hf_model, IDS, MASK), _ours(model), MASK)


@pytest.mark.parametrize("tag", ["mixtral_e5_k2_window4", "qwen2_moe_e5_k3_dense1", "qwen3_moe_e5_k3_head12"])
def test_fused_in_memory_layout_imports_the_same_params(tag, saved, tmp_path):
    """transformers' own state_dict (fused gate_up_proj / down_proj experts) as a checkpoint
    gives exactly the params of the per-expert save_pretrained files."""
    from jaxformer import hf
    from jaxformer.convert import param_leaves
    hf_model, path, (model, _, _) = saved[tag]
    sd = {k: v.numpy() for k, v in hf_model.state_dict().items()}
    assert any(k.endswith("experts.gate_up_proj") for k in sd)
    os.makedirs(tmp_path / "fused")
    with open(os.path.join(path, "config.json")) as f, open(tmp_path / "fused" / "config.json", "w") as g:
        g.write(f.read())
    save_file(sd, str(tmp_path / "fused" / "model.safetensors"))
    fused, _, _ = hf.from_pretrained(str(tmp_path / "fused"))
    a, b = param_leaves(fused), param_leaves(model)  # the same params: the same logits, no compile
    assert set(a) == set(b)
    for p in a:
        np.testing.assert_array_equal(np.asarray(a[p].get_value()), np.asarray(b[p].get_value()), err_msg=str(p))


def _hf_generate(hf_model, n, **kw):
    import torch
    hf_model.generation_config.pad_token_id = 0
    with torch.no_grad():
        return hf_model.generate(torch.from_numpy(IDS), attention_mask=torch.from_numpy(MASK), max_new_tokens=n,
                                 do_sample=False, **kw)[:, IDS.shape[1]:].numpy()


@pytest.mark.parametrize("tag", ["mixtral_e5_k2_window4", "qwen2_moe_e7_k2_norm_nobias_step2", "qwen3_moe_e5_k3_head12"])
def test_greedy_and_beam_match_hf(tag, saved):
    """Greedy and beam ids equal HF generate's with a left-padded row, for each family
    (Mixtral's window is shorter than the prompt: the ring cache; beam with an eos never
    produced, so both stopping rules agree)."""
    from jaxformer import generation as jgen
    from jaxformer.config.models import GenerationConfig
    hf_model, _, (model, _, _) = saved[tag]
    ref = _hf_generate(hf_model, 10)
    ours = jgen.generate(model, IDS, MASK, gen=GenerationConfig(max_new_tokens=10))
    np.testing.assert_array_equal(ours[:, :ref.shape[1]], ref)
    eos = hf_model.generation_config.eos_token_id
    hf_model.generation_config.eos_token_id = None
    try:
        ref = _hf_generate(hf_model, 6, num_beams=3, length_penalty=1.0)
    finally:
        hf_model.generation_config.eos_token_id = eos
    ours, _ = jgen.generate(model, IDS, MASK, gen=GenerationConfig(max_new_tokens=6, strategy="beam", num_beams=3,
                                                                   eos_id=V + 7))
    np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("tag", sorted(CASES))
def test_export_loads_in_transformers_with_identical_logits(tag, saved, tmp_path):
    import transformers
    from helpers import hf_lm_logits, realigned
    from safetensors.numpy import load_file

    from jaxformer import hf
    hf_model, path, (model, name, cfg) = saved[tag]
    hf.save_pretrained(model, name, cfg, str(tmp_path / "out"))
    assert set(load_file(str(tmp_path / "out" / "model.safetensors"))) == set(
        load_file(os.path.join(path, "model.safetensors")))  # the per-expert layout save_pretrained writes
    back, info = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"), output_loading_info=True)
    assert not any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert type(back) is type(hf_model)
    for key in ("num_experts", "num_local_experts", "num_experts_per_tok", "norm_topk_prob", "sliding_window",
                "qkv_bias", "attention_bias", "shared_expert_intermediate_size", "moe_intermediate_size"):
        assert getattr(back.config, key, None) == getattr(hf_model.config, key, None), key
    np.testing.assert_array_equal(hf_lm_logits(realigned(back).eval(), IDS, MASK), hf_lm_logits(hf_model, IDS, MASK))


def test_streaming_to_a_checkpoint_in_small_batches(saved, tmp_path):
    """convert_hf_to_flax (orbax partial saves of about one expert param each) restores the
    params from_pretrained gives."""
    import jax
    from flax import nnx

    from jaxformer import hf
    from jaxformer.checkpoint_io import load_model_config, restore_params
    _, path, (model, _, cfg) = saved["qwen2_moe_e5_k3_dense1"]
    report = hf.convert_hf_to_flax(path, str(tmp_path / "ckpt"), flush_bytes=5 * 16 * 32 * 4)
    assert report["batches"] > 3
    assert load_model_config(str(tmp_path / "ckpt")) == ("lm", cfg)
    want = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    got = restore_params(str(tmp_path / "ckpt"), jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), want))
    jax.tree.map(np.testing.assert_array_equal, got, want)
