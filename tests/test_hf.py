"""Hugging Face import and export (jaxformer/hf/): logits parity with transformers for every
family, greedy decoding, export -> from_pretrained round trips, the streaming CLI path and its
train.yaml, safe loading of .bin files, and clear errors with nothing left behind.

Every HF model is built from a tiny config with random weights (no download). Tolerance:
1e-5 max abs in fp32 (setup_precision). Measured on this machine (2 CPU cores, fp32): import
logits vs HF between 9e-8 and 8e-7 for every family; export round trips bit-exact.
"""
from __future__ import annotations

import json
import os
import pickle
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from helpers import randomize as _randomize

from jaxformer import hf
from jaxformer.checkpoint_io import load_model
from jaxformer.cli import main as cli
from jaxformer.config import ConfigError
from jaxformer.convert import ConversionError, param_leaves, torch_to_flax_arrays
from jaxformer.parity import setup_precision

transformers = pytest.importorskip("transformers")
T = transformers
TOL = 1e-5
V = 300  # >= 259: the byte-level datasets fit, so train.yaml gets a real data section


@pytest.fixture(autouse=True)
def _precision():
    setup_precision()


# family -> (HF class, HF config, Auto class for the round trip)
FAMILIES = {
    "gpt2": lambda: (T.GPT2LMHeadModel, T.GPT2Config(
        n_embd=32, n_layer=2, n_head=4, vocab_size=V, n_positions=64, bos_token_id=1, eos_token_id=2),
        T.AutoModelForCausalLM),
    "llama_gqa": lambda: (T.LlamaForCausalLM, T.LlamaConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=48, vocab_size=V, max_position_embeddings=64, rope_theta=500.0),
        T.AutoModelForCausalLM),
    "bert": lambda: (T.BertModel, T.BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48, vocab_size=96,
        max_position_embeddings=64), T.AutoModel),
    "bert_cls": lambda: (T.BertForSequenceClassification, T.BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48, vocab_size=96,
        max_position_embeddings=64, num_labels=3, hidden_act="gelu_new"),
        T.AutoModelForSequenceClassification),
    "vit": lambda: (T.ViTForImageClassification, T.ViTConfig(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=48, num_labels=5), T.AutoModelForImageClassification),
    "swin": lambda: (T.SwinForImageClassification, T.SwinConfig(
        image_size=32, patch_size=4, embed_dim=8, depths=[2, 2], num_heads=[2, 4], window_size=4,
        mlp_ratio=2.0, num_labels=5), T.AutoModelForImageClassification),
}
LMS = ("gpt2", "llama_gqa")

RNG = np.random.RandomState(0)
IDS = RNG.randint(3, 96, size=(2, 11))
MASK = np.ones_like(IDS)
MASK[1, :4] = 0  # a left-padded row
TYPES = (np.arange(11)[None, :] >= 6).astype(np.int64).repeat(2, 0)
IMAGES = RNG.standard_normal((2, 3, 32, 32)).astype(np.float32)  # NCHW (HF)


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """family -> (HF model, its save_pretrained directory)."""
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for fam, make in FAMILIES.items():
        cls, cfg, _ = make()
        model = _randomize(cls(cfg))
        model.save_pretrained(root / fam)
        out[fam] = (model, str(root / fam))
    return out


def hf_outputs(model, fam) -> list[np.ndarray]:
    with torch.no_grad():
        if fam in ("vit", "swin"):
            return [model(torch.from_numpy(IMAGES)).logits.numpy()]
        mask = torch.from_numpy(MASK)
        if fam in LMS:  # positions count real tokens, as HF generate (and jaxformer) do
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            return [model(torch.from_numpy(IDS), attention_mask=mask, position_ids=pos).logits.numpy()]
        out = model(torch.from_numpy(IDS), attention_mask=mask, token_type_ids=torch.from_numpy(TYPES))
        if fam == "bert":
            return [out.last_hidden_state.numpy(), out.pooler_output.numpy()]
        return [out.logits.numpy()]


@nnx.jit
def _call(model, *args, **kw):
    return model(*args, **kw)  # one XLA compilation instead of one per eager op (CPU time)


def our_outputs(model, fam) -> list[np.ndarray]:
    if fam in ("vit", "swin"):
        return [np.asarray(_call(model, jnp.asarray(IMAGES.transpose(0, 2, 3, 1))))]  # NHWC
    kw = {} if fam in LMS else {"token_type_ids": jnp.asarray(TYPES)}
    out = _call(model, jnp.asarray(IDS), jnp.asarray(MASK), **kw)
    return [np.asarray(x) for x in (out if isinstance(out, tuple) else (out,))]


def max_diff(fam, a: list, b: list) -> float:
    assert len(a) == len(b)
    # LM rows at pad positions see no real token in HF's causal mask: compare real tokens only
    sel = (lambda x: x[MASK.astype(bool)]) if fam in LMS else (lambda x: x)
    return max(float(np.abs(sel(x) - sel(y)).max()) for x, y in zip(a, b, strict=True))


# ----------------------------------------------------------------------------- import parity
@pytest.mark.parametrize("fam", sorted(FAMILIES))
def test_import_matches_hf(fam, hf_dirs):
    hf_model, path = hf_dirs[fam]
    model, name, cfg = hf.from_pretrained(path)
    d = max_diff(fam, hf_outputs(hf_model, fam), our_outputs(model, fam))
    assert d <= TOL, f"{fam}: max |logits diff| vs HF {d:.2e}"


def test_a_wrong_mapping_is_caught(hf_dirs, tmp_path):
    """The comparison can fail: a GPT-2 whose config claims exact GELU (the weights are the
    same) gives different logits (docs/numerics.md §2)."""
    hf_model, path = hf_dirs["gpt2"]
    bad = _copy_with_config(path, tmp_path / "g", activation_function="gelu")
    model, _, cfg = hf.from_pretrained(bad)
    assert cfg.feedforward.kind == "gelu"
    assert max_diff("gpt2", hf_outputs(hf_model, "gpt2"), our_outputs(model, "gpt2")) > 10 * TOL  # 2.4e-4


@pytest.mark.parametrize("fam", LMS)
def test_greedy_decoding_matches_hf(fam, hf_dirs):
    """32 greedy tokens after two left-padded prompts: the same ids as HF generate."""
    from jaxformer.config.models import GenerationConfig
    from jaxformer.generation import generate
    hf_model, path = hf_dirs[fam]
    model, _, _ = hf.from_pretrained(path)
    hf_model.generation_config.eos_token_id = None  # generate exactly 32 tokens on both sides
    hf_model.generation_config.pad_token_id = 0
    with torch.no_grad():
        ref = hf_model.generate(torch.from_numpy(IDS), attention_mask=torch.from_numpy(MASK),
                                max_new_tokens=32, do_sample=False)[:, IDS.shape[1]:].numpy()
    ours = generate(model, IDS, MASK, gen=GenerationConfig(max_new_tokens=32, stop_at_eos=False))
    assert ref.shape == ours.shape == (2, 32)
    np.testing.assert_array_equal(ours, ref)


def test_streaming_engine_equals_the_converter(hf_dirs):
    """convert_stream (shard by shard, planned from headers) gives exactly what
    jaxformer.convert.torch_to_flax_arrays gives on the whole torch_ref state_dict."""
    from jaxformer.hf.files import HFCheckpoint
    from jaxformer.models import abstract_model
    for fam in ("gpt2", "bert_cls"):
        ckpt = HFCheckpoint(hf_dirs[fam][1])
        family, arch, name, cfg, _ = hf.read_config(ckpt)
        fn = family.tensor_fn(name, cfg, arch)
        sd = {}
        for k in ckpt.tensors:
            sd.update(fn(k, ckpt.read(k)) or {})
        ref = torch_to_flax_arrays(sd, abstract_model(name, cfg))
        model, _, _ = hf.from_pretrained(hf_dirs[fam][1])
        leaves = param_leaves(model)
        assert set(ref) == set(leaves)
        for p, x in ref.items():
            np.testing.assert_array_equal(np.asarray(leaves[p].get_value()), x)


# ----------------------------------------------------------------------------- export
@pytest.mark.parametrize("fam", sorted(FAMILIES))
def test_export_round_trip(fam, hf_dirs, tmp_path):
    hf_model, path = hf_dirs[fam]
    model, name, cfg = hf.from_pretrained(path)
    hf.save_pretrained(model, name, cfg, str(tmp_path / "out"))
    auto = FAMILIES[fam]()[2]
    back, info = auto.from_pretrained(str(tmp_path / "out"), output_loading_info=True)
    assert not any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    back.eval()
    sd, sd2 = hf_model.state_dict(), back.state_dict()
    assert set(sd) == set(sd2) and all(torch.equal(sd[k], sd2[k]) for k in sd)  # bit-exact weights
    for a, b in zip(hf_outputs(hf_model, fam), hf_outputs(back, fam), strict=True):
        np.testing.assert_array_equal(a, b)


def test_export_without_hf_equivalent_is_an_error(tmp_path):
    from jaxformer.config.models import ClassifierConfig, LMConfig
    from jaxformer.models import abstract_model
    cases = [("lm", LMConfig(vocab_size=64, d_model=32, num_heads=4, d_ff=64, num_layers=1, position="alibi"),
              "positions.kind='alibi'"),
             ("classifier", ClassifierConfig(vocab_size=64, d_model=32, num_heads=4, d_ff=64, num_layers=1),
              "type_vocab_size=0")]
    for name, cfg, msg in cases:
        with pytest.raises(ConversionError, match=msg):
            hf.save_pretrained(abstract_model(name, cfg), name, cfg, str(tmp_path / name))
        assert not os.path.exists(tmp_path / name)


# ----------------------------------------------------------------------------- CLI, streaming
def test_cli_sharded_import_train_yaml_and_export(hf_dirs, tmp_path, capsys):
    """A sharded LLaMA through `convert --from hf` (several orbax partial saves), loaded back,
    fine-tune config, then `convert --from flax --to hf`."""
    from jaxformer.train.config import load_config
    from jaxformer.train.finetune import finetune_yaml
    from jaxformer.train.jax_trainer import build_jax_model
    hf_model, _ = hf_dirs["llama_gqa"]
    src = tmp_path / "sharded"
    hf_model.save_pretrained(src, max_shard_size="20KB")
    assert os.path.exists(src / "model.safetensors.index.json")
    assert len(set(json.loads((src / "model.safetensors.index.json").read_text())["weight_map"].values())) > 2
    out = tmp_path / "ckpt"

    def train_yaml(name, cfg):  # what the CLI adds: jaxformer.train's fine-tune config
        text, why = finetune_yaml(name, cfg, str(out), str(out / "train.yaml"))
        assert why == ""  # a real data section
        return {"train.yaml": text}

    report = hf.convert_hf_to_flax(str(src), str(out), flush_bytes=8192, extra_files=train_yaml)
    assert report["batches"] > 2 and report["files"] == ["train.yaml"]
    name, cfg, model = load_model(str(out))
    assert max_diff("llama_gqa", hf_outputs(hf_model, "llama_gqa"), our_outputs(model, "llama_gqa")) <= TOL
    run = load_config(str(out / "train.yaml"))
    assert run.train.init_from == str(out) and run.model == cfg and run.data_name == "stdlib_docs"
    tuned = build_jax_model(run)  # loads train.init_from
    a, b = param_leaves(model), param_leaves(tuned)
    assert all(np.array_equal(np.asarray(a[p].get_value()), np.asarray(b[p].get_value())) for p in a)
    # the same through the command line, then back to HF
    assert cli(["convert", "--from", "hf", str(src), "--to", "flax", str(tmp_path / "cli")]) == 0
    printed = capsys.readouterr().out
    assert "train.yaml: written\n" in printed and "fine-tune: jaxformer train --config" in printed
    assert load_config(str(tmp_path / "cli" / "train.yaml")).train.init_from == str(tmp_path / "cli")
    assert cli(["convert", "--from", "flax", str(tmp_path / "cli"), "--to", "hf", str(tmp_path / "hf")]) == 0
    back = T.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()
    np.testing.assert_array_equal(hf_outputs(back, "llama_gqa")[0], hf_outputs(hf_model, "llama_gqa")[0])
    assert cli(["convert", "--from", "hf", str(src), "--to", "torch", str(tmp_path / "x")]) == 2


def test_extra_files_are_part_of_the_atomic_output(hf_dirs, tmp_path):
    """convert_hf_to_flax writes model.yaml and params, plus the caller's extra_files inside
    the same atomic write: if making them fails, nothing is left at OUT."""
    def fail(name, cfg):
        raise RuntimeError("no extra files")

    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="no extra files"):
        hf.convert_hf_to_flax(hf_dirs["gpt2"][1], str(out), extra_files=fail)
    assert not os.path.exists(out) and not [p for p in os.listdir(tmp_path) if p.startswith(".tmp-")]
    hf.convert_hf_to_flax(hf_dirs["gpt2"][1], str(out), extra_files=lambda name, cfg: {"name.txt": name})
    assert sorted(os.listdir(out)) == ["model.yaml", "name.txt", "params"]
    assert (out / "name.txt").read_text() == "lm"


# ----------------------------------------------------------------------------- safe loading
class _Payload:
    """Unpickling this runs code: it creates the marker file."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('pwned')",))


@pytest.mark.parametrize("kind", ["legacy_pickle", "torch_zip"])
def test_malicious_bin_is_refused_and_never_runs(kind, hf_dirs, tmp_path):
    src = tmp_path / "evil"
    shutil.copytree(hf_dirs["gpt2"][1], src)
    os.remove(src / "model.safetensors")
    marker = str(tmp_path / "marker")
    payload = {"transformer.wte.weight": torch.zeros(3), "x": _Payload(marker)}
    if kind == "legacy_pickle":
        with open(src / "pytorch_model.bin", "wb") as f:
            pickle.dump(payload, f, protocol=2)
        with open(src / "pytorch_model.bin", "rb") as f:  # control: a plain unpickle runs it
            pickle.load(f)
    else:
        torch.save(payload, src / "pytorch_model.bin")
        torch.load(src / "pytorch_model.bin", weights_only=False)  # control: torch.load runs it
    assert os.path.exists(marker)
    os.remove(marker)
    out = tmp_path / "out"
    with pytest.raises(ConversionError, match=r"pytorch_model\.bin: refused: not a plain tensor file "
                       r"\(torch\.load weights_only=True\): .*Unsupported global: GLOBAL \S+"):
        hf.convert_hf_to_flax(str(src), str(out))
    with pytest.raises(ConversionError, match="refused"):
        hf.from_pretrained(str(src))
    assert not os.path.exists(marker) and not os.path.exists(out)


def test_plain_bin_checkpoints_load(hf_dirs, tmp_path):
    """A pytorch_model.bin (tied GPT-2: the stored lm_head copy is skipped, as HF does), then
    the same weights as a sharded .bin with an index."""
    hf_model, path = hf_dirs["gpt2"]
    src = tmp_path / "bin"
    src.mkdir()
    shutil.copy(os.path.join(path, "config.json"), src)
    torch.save(hf_model.state_dict(), src / "pytorch_model.bin")
    model, _, _, report = hf.from_pretrained(str(src), return_report=True)
    assert report["skipped"] == ["lm_head.weight"]
    assert max_diff("gpt2", hf_outputs(hf_model, "gpt2"), our_outputs(model, "gpt2")) <= TOL
    # sharded: pytorch_model.bin.index.json and two .bin shards
    os.remove(src / "pytorch_model.bin")
    sd = {k: v for k, v in hf_model.state_dict().items() if k != "lm_head.weight"}
    keys = sorted(sd)
    weight_map = {}
    for i, part in enumerate((keys[: len(keys) // 2], keys[len(keys) // 2:])):
        name = f"pytorch_model-{i + 1:05d}-of-00002.bin"
        torch.save({k: sd[k] for k in part}, src / name)
        weight_map.update({k: name for k in part})
    (src / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": weight_map}))
    model2, _, _ = hf.from_pretrained(str(src))
    a, b = param_leaves(model), param_leaves(model2)
    assert all(np.array_equal(np.asarray(a[p].get_value()), np.asarray(b[p].get_value())) for p in a)


# ----------------------------------------------------------------------------- bad input
def _copy_with_config(path, dst, **changes):
    shutil.copytree(path, dst)
    with open(os.path.join(dst, "config.json")) as f:
        raw = json.load(f)
    raw.update(changes)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(raw, f)
    return str(dst)


def _fails_cleanly(src, tmp_path, exc, match):
    """The API raises a clear error, the CLI exits 2 with it, and no output is left."""
    out = tmp_path / "out"
    with pytest.raises(exc, match=match):
        hf.convert_hf_to_flax(str(src), str(out))
    assert cli(["convert", "--from", "hf", str(src), "--to", "flax", str(out)]) == 2
    assert not os.path.exists(out)
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp-")]  # no temp dirs either


UNSUPPORTED = {
    "gpt2_inverse_layer_idx": ("gpt2", dict(scale_attn_by_inverse_layer_idx=True),
                               "scale_attn_by_inverse_layer_idx"),
    "gpt2_activation": ("gpt2", dict(activation_function="quick_gelu"), "activation_function"),
    "gpt2_cross_attention": ("gpt2", dict(add_cross_attention=True), "add_cross_attention"),
    "llama_rope_longrope": ("llama_gqa", dict(rope_parameters={"rope_type": "longrope", "factor": 2.0,
                                                               "rope_theta": 500.0}), "rope_parameters"),
    "llama_legacy_rope_scaling_unknown_key": ("llama_gqa", dict(rope_scaling={
        "type": "dynamic", "factor": 2.0, "finetuned": True}), "rope_scaling"),
    "llama_hidden_act": ("llama_gqa", dict(hidden_act="gelu"), "hidden_act"),
    "bert_relative_positions": ("bert", dict(position_embedding_type="relative_key"),
                                "position_embedding_type"),
    "bert_classifier_dropout_out_of_range": ("bert_cls", dict(classifier_dropout=1.5), "classifier_dropout"),
    "bert_problem_type_unknown": ("bert_cls", dict(problem_type="ranking"), "problem_type"),
    "unknown_option": ("gpt2", dict(use_fancy_attention=True), "use_fancy_attention"),
    "number_as_string": ("gpt2", dict(n_embd="32"), "n_embd"),
    "bool_as_number": ("llama_gqa", dict(num_hidden_layers=True), "num_hidden_layers"),
    "non_finite_eps": ("bert", dict(layer_norm_eps=float("nan")), "layer_norm_eps"),
}


@pytest.mark.parametrize("case", sorted(UNSUPPORTED))
def test_unsupported_config_option_is_named(case, hf_dirs, tmp_path):
    fam, changes, option = UNSUPPORTED[case]
    src = _copy_with_config(hf_dirs[fam][1], tmp_path / "src", **changes)
    _fails_cleanly(src, tmp_path, ConfigError, rf"{option}=.*not")


def test_every_unsupported_option_in_one_error(hf_dirs, tmp_path):
    src = _copy_with_config(hf_dirs["gpt2"][1], tmp_path / "src", scale_attn_by_inverse_layer_idx=True,
                            activation_function="swish", n_ctx=17)
    with pytest.raises(ConfigError) as e:
        hf.from_pretrained(src)
    assert "3 unsupported option(s)" in str(e.value)
    for option in ("scale_attn_by_inverse_layer_idx", "activation_function", "n_ctx"):
        assert option in str(e.value)


def test_wrong_architecture(hf_dirs, tmp_path):
    src = _copy_with_config(hf_dirs["llama_gqa"][1], tmp_path / "src", architectures=["MambaForCausalLM"])
    _fails_cleanly(src, tmp_path, ConfigError, "architecture 'MambaForCausalLM' is not supported")


def test_weights_of_another_architecture(hf_dirs, tmp_path):
    """LLaMA weights under a GPT-2 config: every unmapped key listed, nothing written."""
    src = tmp_path / "src"
    shutil.copytree(hf_dirs["llama_gqa"][1], src)
    shutil.copy(os.path.join(hf_dirs["gpt2"][1], "config.json"), src / "config.json")
    _fails_cleanly(src, tmp_path, ConversionError, r"unmapped: model\.layers\.0\.mlp\.gate_proj\.weight")


def test_model_type_must_match_the_architecture(hf_dirs, tmp_path):
    src = _copy_with_config(hf_dirs["llama_gqa"][1], tmp_path / "src", model_type="gpt2")
    _fails_cleanly(src, tmp_path, ConfigError, r"config\.json: model_type='gpt2' does not match "
                                               r"architectures=\['LlamaForCausalLM'\]")


@pytest.fixture()
def sharded(hf_dirs, tmp_path):
    src = tmp_path / "src"
    hf_dirs["gpt2"][0].save_pretrained(src, max_shard_size="20KB")
    shards = sorted(set(json.loads((src / "model.safetensors.index.json").read_text())["weight_map"].values()))
    return src, shards


def test_missing_shard(sharded, tmp_path):
    src, shards = sharded
    os.remove(src / shards[1])
    _fails_cleanly(src, tmp_path, ConversionError, f"missing shard: {shards[1]}")


def test_truncated_safetensors(sharded, tmp_path):
    src, shards = sharded
    with open(src / shards[-1], "r+b") as f:
        f.truncate(os.path.getsize(src / shards[-1]) - 100)
    _fails_cleanly(src, tmp_path, ConversionError, f"truncated or malformed safetensors file .*{shards[-1]}")


def test_nan_in_last_shard_removes_the_partial_output(sharded, tmp_path):
    """Non-finite values are found while streaming, after earlier batches were written: the
    temporary output is removed."""
    from safetensors.numpy import load_file, save_file
    src, shards = sharded
    tensors = load_file(src / shards[-1])
    key = sorted(tensors)[-1]
    tensors[key] = tensors[key].copy()
    tensors[key].reshape(-1)[0] = np.nan
    save_file(tensors, src / shards[-1], metadata={"format": "pt"})
    _fails_cleanly(src, tmp_path, ConversionError, "non-finite")


def test_weights_that_do_not_fit_the_config(hf_dirs, tmp_path):
    src = _copy_with_config(hf_dirs["gpt2"][1], tmp_path / "src", n_inner=96)
    with pytest.raises(ConversionError) as e:
        hf.from_pretrained(src)
    assert "shape: decoder.layers.0.ffn.up_proj.weight" in str(e.value)
    assert "shape: decoder.layers.1.ffn.down_proj.weight" in str(e.value)  # every problem listed


@pytest.mark.parametrize("bad", ["../x.safetensors", "/etc/passwd", "sub/../../x.safetensors"])
def test_index_names_are_all_checked_before_any_shard_is_opened(bad, sharded, monkeypatch):
    """One entry that leaves the directory (the last one) refuses the whole index before any
    file it names is read (no shard header is parsed)."""
    from jaxformer.hf import files
    src, _ = sharded
    index = json.loads((src / "model.safetensors.index.json").read_text())
    index["weight_map"][sorted(index["weight_map"])[-1]] = bad
    (src / "model.safetensors.index.json").write_text(json.dumps(index))

    def never(path):
        raise AssertionError(f"opened {path}")
    monkeypatch.setattr(files, "read_safetensors_header", never)
    with pytest.raises(ConversionError, match="unsafe checkpoint index: .*" + ("absolute" if bad[0] == "/"
                                                                               else r"leaves .*'\.\.'")):
        hf.from_pretrained(str(src))


def test_hub_cache_snapshot_links_are_followed(hf_dirs, tmp_path):
    """A hub cache snapshot (models--org--name/snapshots/REV/* linking into ../../blobs) loads;
    a link from the same snapshot to anywhere else is refused."""
    _, path = hf_dirs["gpt2"]
    repo = tmp_path / "models--org--tiny"
    (repo / "blobs").mkdir(parents=True)
    snap = repo / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copy(os.path.join(path, name), repo / "blobs" / f"blob-{name}")
        os.symlink(os.path.join("..", "..", "blobs", f"blob-{name}"), snap / name)
    model, name, _ = hf.from_pretrained(str(snap))
    ref, _, _ = hf.from_pretrained(path)
    a, b = param_leaves(model), param_leaves(ref)
    assert all(np.array_equal(np.asarray(a[p].get_value()), np.asarray(b[p].get_value())) for p in a)
    shutil.copy(os.path.join(path, "config.json"), tmp_path / "elsewhere.json")
    os.remove(snap / "config.json")
    os.symlink(tmp_path / "elsewhere.json", snap / "config.json")
    with pytest.raises(ConversionError, match="outside the checkpoint directory"):
        hf.from_pretrained(str(snap))


def _safetensors_file(path, header, data: int) -> str:
    head = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(len(head).to_bytes(8, "little") + head + bytes(data))
    return str(path)


F32_4 = {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}
BAD_HEADERS = {
    "bool_in_shape": ({"w": {**F32_4, "shape": [True, 4]}}, 16, "shape .* non-negative integers"),
    "float_in_shape": ({"w": {**F32_4, "shape": [4.0]}}, 16, "shape .* non-negative integers"),
    "negative_dim": ({"w": {**F32_4, "shape": [-4, -1]}}, 16, "shape .* non-negative integers"),
    "offsets_past_the_end": ({"w": {**F32_4, "data_offsets": [0, 32]}}, 16, "within the 16-byte"),
    "offsets_reversed": ({"w": {**F32_4, "data_offsets": [16, 0]}}, 16, "data_offsets"),
    "size_mismatch": ({"w": {**F32_4, "shape": [3]}}, 16, "16 bytes for shape"),
    "unknown_dtype": ({"w": {**F32_4, "dtype": "F31"}}, 16, "unknown dtype 'F31'"),
    "entry_not_object": ({"w": [1, 2]}, 16, "is not {dtype, shape, data_offsets}"),
    "metadata_not_object": ({"__metadata__": [1], "w": F32_4}, 16, "__metadata__"),
    "gap_in_data": ({"w": {**F32_4, "data_offsets": [8, 24]}}, 24, "not contiguous"),
}


@pytest.mark.parametrize("case", sorted(BAD_HEADERS))
def test_malformed_safetensors_headers(case, tmp_path):
    from jaxformer.hf.files import read_safetensors_header
    header, data, match = BAD_HEADERS[case]
    path = _safetensors_file(tmp_path / "m.safetensors", header, data)
    with pytest.raises(ConversionError, match=f"malformed safetensors file {path}: .*{match}"):
        read_safetensors_header(path)
    good = _safetensors_file(tmp_path / "ok.safetensors", {"w": F32_4}, 16)  # control
    assert read_safetensors_header(good)[0]["w"].shape == (4,)
