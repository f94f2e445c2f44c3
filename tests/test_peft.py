"""PEFT interchange (jaxformer/hf/adapters.py, `export --to peft|--merge`, `convert --adapter`)
against the `peft` package itself, on tiny random HF models (no download).

  * export: a jaxformer LoRA checkpoint (apply_lora + save_model, B randomised so the adapter
    changes the logits) -> `jaxformer export --to peft` -> peft.PeftModel.from_pretrained on the
    HF base gives jaxformer's logits within 1e-5 x max(1, max|logit|) (docs/numerics.md §19).
  * --merge: `export --to hf --merge` loads in transformers with the adapted model's logits.
  * import: an adapter made by peft.get_peft_model (B randomised) loads with
    hf.from_pretrained(base, adapter=) and `convert --from hf --adapter` and gives PEFT's logits.
  * refusals: PEFT options jaxformer does not implement, modules with no counterpart.
Families: Llama, Qwen2 (q/k/v biases, tied head; a PEFT "all-linear" adapter), and for export
Gemma2 (its own Renamer: four norms per layer; an adapter on layer 1 only by regex).
Measured worst |logit| differences are printed by check_hf_logits (run with -s).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from helpers import check_hf_logits, hf_lm_logits, randomize

from jaxformer import checkpoint_io, cli, hf
from jaxformer.config import ConfigError
from jaxformer.config.lora import LoRAConfig
from jaxformer.convert import ConversionError
from jaxformer.parity import setup_precision

T = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
V = 64
WEIGHTS = "adapter_model.safetensors"
IDS = np.random.RandomState(5).randint(3, V, size=(2, 9))
MASK = np.ones_like(IDS)
MASK[1, :2] = 0  # a left-padded row
SMALL = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0)
FAMILIES = {
    "llama": (T.LlamaForCausalLM, dict(SMALL)),
    "qwen2": (T.Qwen2ForCausalLM, dict(SMALL, tie_word_embeddings=True)),
    "gemma2": (T.Gemma2ForCausalLM, dict(SMALL, head_dim=8, sliding_window=4, query_pre_attn_scalar=8,
                                          final_logit_softcapping=None, attn_logit_softcapping=None)),
}
# (jaxformer LoRAConfig of the export test, PEFT LoraConfig kwargs of the import test) per family
LORAS = {
    "llama": (LoRAConfig(r=4, alpha=16), dict(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"],
                                               init_lora_weights="gaussian", rank_pattern={"down_proj": 2},
                                               alpha_pattern={r"layers\.1\.self_attn\.v_proj": 3})),
    "qwen2": (LoRAConfig(r=2, alpha=3, use_rslora=True, target_modules=["q_proj", "o_proj", "up_proj"]),
              dict(r=3, lora_alpha=5, use_rslora=True, target_modules="all-linear")),
    "gemma2": (LoRAConfig(r=4, alpha=8, target_modules=r".*layers\.1\..*_proj"), None),
}


@pytest.fixture(autouse=True)
def _precision():
    setup_precision()


def _cli(argv) -> None:
    assert cli.main(argv) == 0


@nnx.jit
def _call(model, ids, mask):
    return model(ids, mask)


def _ours(model) -> np.ndarray:
    return np.asarray(_call(model, jnp.asarray(IDS), jnp.asarray(MASK)))


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    """{family: HF base dir} of tiny random models, built once."""
    root = tmp_path_factory.mktemp("peft_bases")
    out = {}
    for fam, (cls, kw) in FAMILIES.items():
        torch.manual_seed(0)
        path = str(root / fam)
        randomize(cls(cls.config_class(**kw))).save_pretrained(path)
        out[fam] = path
    return out


def _hf(fam: str, path: str):
    return FAMILIES[fam][0].from_pretrained(path).eval()


@pytest.fixture(scope="module")
def lora_ckpts(bases, tmp_path_factory):
    """{family: jaxformer model checkpoint of the HF base with a LoRA adapter (random B)}."""
    from jaxformer.layers.lora import apply_lora, lora_modules
    root = tmp_path_factory.mktemp("peft_ckpts")
    out = {}
    for i, fam in enumerate(FAMILIES):
        model, name, cfg = hf.from_pretrained(bases[fam])
        apply_lora(model, LORAS[fam][0], nnx.Rngs(1))
        for j, m in enumerate(lora_modules(model).values()):  # B = 0 would make the adapter a no-op
            m.lora_B.kernel.set_value(0.3 * jax.random.normal(jax.random.key(10 * i + j), m.lora_B.kernel.shape))
        checkpoint_io.save_model(model, name, cfg, str(root / fam), lora=LORAS[fam][0])
        out[fam] = str(root / fam)
    return out


# ----------------------------------------------------------------------------- export
@pytest.mark.parametrize("fam", FAMILIES)
def test_export_peft_and_merged_hf(fam, bases, lora_ckpts, tmp_path):
    """export --to peft loads in PEFT on the HF base, export --to hf --merge in transformers,
    both with the adapted jaxformer model's logits."""
    from jaxformer.layers.lora import lora_modules
    model, _ = checkpoint_io.load(lora_ckpts[fam])  # model.yaml's lora: section rebuilds the adapters
    ours = _ours(model)
    out = str(tmp_path / "adapter")
    _cli(["export", lora_ckpts[fam], "--to", "peft", out, "--base-model", bases[fam]])
    config = json.loads(Path(os.path.join(out, "adapter_config.json")).read_text())
    lora = LORAS[fam][0]
    assert (config["peft_type"], config["r"], config["lora_alpha"], config["use_rslora"], config["task_type"],
            config["bias"], config["base_model_name_or_path"]) == \
        ("LORA", lora.r, lora.alpha, lora.use_rslora, "CAUSAL_LM", "none", bases[fam])
    base = _hf(fam, bases[fam])
    plain = hf_lm_logits(base, IDS, MASK)
    adapted = peft.PeftModel.from_pretrained(base, out).eval()
    ref = hf_lm_logits(adapted, IDS, MASK)
    check_hf_logits(f"export --to peft {fam}", ref, ours, MASK)
    real = MASK.astype(bool)
    assert np.abs(ref[real] - plain[real]).max() > 0.1  # the adapter matters
    n_adapted = sum(1 for n, _ in adapted.named_modules() if n.endswith(".lora_A.default"))
    assert n_adapted == len(lora_modules(model))  # target_modules selects exactly our adapted modules
    _cli(["export", lora_ckpts[fam], "--to", "hf", str(tmp_path / "merged"), "--merge"])
    check_hf_logits(f"export --to hf --merge {fam}", hf_lm_logits(_hf(fam, str(tmp_path / "merged")), IDS, MASK),
                    ours, MASK)


def test_export_keys_and_layout(lora_ckpts, tmp_path):
    from safetensors.numpy import load_file
    out = str(tmp_path / "adapter")
    _cli(["export", lora_ckpts["llama"], "--to", "peft", out])
    tensors = load_file(os.path.join(out, "adapter_model.safetensors"))
    a = tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"]
    b = tensors["base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"]
    assert a.shape == (4, 32) and b.shape == (32, 4) and len(tensors) == 2 * 7 * 2
    assert json.loads(Path(os.path.join(out, "adapter_config.json")).read_text())["base_model_name_or_path"] is None


def test_export_merged_flax_and_kept_flax(lora_ckpts, tmp_path):
    model, _ = checkpoint_io.load(lora_ckpts["llama"])
    ours = _ours(model)
    _cli(["export", lora_ckpts["llama"], "--to", "flax", str(tmp_path / "merged"), "--merge"])
    _cli(["export", lora_ckpts["llama"], "--to", "flax", str(tmp_path / "kept")])
    assert checkpoint_io.lora_section(str(tmp_path / "merged")) is None
    assert checkpoint_io.lora_section(str(tmp_path / "kept")) == LORAS["llama"][0]
    for sub in ("merged", "kept"):
        m, _ = checkpoint_io.load(str(tmp_path / sub))
        np.testing.assert_allclose(_ours(m), ours, atol=1e-5 * max(1.0, np.abs(ours).max()), rtol=0)


def test_export_fused_module_refused(tmp_path):
    """GPT-2 fuses q/k/v into c_attn (a Conv1D): an adapter on q_proj has no HF module."""
    from flax import nnx

    from jaxformer.config.models import LMConfig
    from jaxformer.hf.adapters import save_adapter
    from jaxformer.layers.lora import apply_lora
    from jaxformer.models import build_model
    cfg = LMConfig.tiny("gpt2", num_layers=1)
    model = build_model("lm", cfg)
    lora = LoRAConfig(r=2, target_modules=["q_proj"])
    apply_lora(model, lora, nnx.Rngs(0))
    with pytest.raises(ConversionError, match=r"decoder.layers.0.self_attn.q_proj: adapted, but the gpt2 HF"):
        save_adapter(model, "lm", cfg, lora, str(tmp_path / "out"))
    assert not os.path.exists(tmp_path / "out")


# ----------------------------------------------------------------------------- import
def _peft_adapter(fam: str, base: str, out: str, seed: int = 0, randomize_b: bool = True, **options):
    """A PEFT adapter of the HF base saved by peft itself (B randomised); -> the PEFT model."""
    kw = dict(LORAS[fam][1], **options)
    torch.manual_seed(seed)
    pm = peft.get_peft_model(_hf(fam, base), peft.LoraConfig(task_type="CAUSAL_LM", **kw))
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n and randomize_b:
                p.copy_(torch.randn(p.shape) * 0.3)
    pm.save_pretrained(out)
    return pm.eval()


@pytest.mark.parametrize("fam", ["llama", "qwen2"])
def test_peft_adapter_loads(fam, bases, tmp_path):
    out = str(tmp_path / "adapter")
    ref = hf_lm_logits(_peft_adapter(fam, bases[fam], out), IDS, MASK)
    real = MASK.astype(bool)
    assert np.abs(ref[real] - hf_lm_logits(_hf(fam, bases[fam]), IDS, MASK)[real]).max() > 0.1  # it matters
    model, name, cfg, report = hf.from_pretrained(bases[fam], adapter=out, return_report=True)
    check_hf_logits(f"hf.from_pretrained(adapter=) {fam}", ref, _ours(model), MASK)
    kw = LORAS[fam][1]
    lora = report["lora"]
    assert (lora.r, lora.alpha, lora.use_rslora) == (kw["r"], kw["lora_alpha"], kw.get("use_rslora", False))
    if fam == "llama":  # the CLI: a model checkpoint with the adapter, and one with it merged
        _cli(["convert", "--from", "hf", bases[fam], "--adapter", out, "--to", "flax", str(tmp_path / "kept")])
        _cli(["convert", "--from", "hf", bases[fam], "--adapter", out, "--to", "flax", str(tmp_path / "merged"),
              "--merge"])
        assert checkpoint_io.lora_section(str(tmp_path / "kept")).target_modules == ("down_proj", "q_proj", "v_proj")
        for sub in ("kept", "merged"):
            check_hf_logits(f"convert --adapter ({sub})", ref, _ours(checkpoint_io.load(str(tmp_path / sub))[0]), MASK)


def test_peft_adapter_bin_and_round_trip(bases, tmp_path):
    """adapter_model.bin (torch.load weights_only) loads too; export --to peft gives PEFT's keys back."""
    from safetensors.numpy import load_file
    src = str(tmp_path / "adapter")
    ref = hf_lm_logits(_peft_adapter("llama", bases["llama"], src, seed=3), IDS, MASK)
    tensors = load_file(os.path.join(src, "adapter_model.safetensors"))
    torch.save({k: torch.from_numpy(v) for k, v in tensors.items()}, os.path.join(src, "adapter_model.bin"))
    os.remove(os.path.join(src, "adapter_model.safetensors"))
    model, name, cfg, report = hf.from_pretrained(bases["llama"], adapter=src, return_report=True)
    check_hf_logits("adapter_model.bin", ref, _ours(model), MASK)
    checkpoint_io.save_model(model, name, cfg, str(tmp_path / "ckpt"), lora=report["lora"])
    _cli(["export", str(tmp_path / "ckpt"), "--to", "peft", str(tmp_path / "back")])
    back = load_file(str(tmp_path / "back" / "adapter_model.safetensors"))
    assert set(back) == set(tensors)
    assert all(np.array_equal(back[k], tensors[k]) for k in tensors)


@pytest.mark.parametrize("fam", ["llama", "qwen2"])
def test_peft_head_adapter_both_ways(fam, bases, tmp_path):
    """PEFT's default save of a LoRA on lm_head also stores lm_head.base_layer.weight: checked
    equal to the base's (Qwen2's tied head: the embedding; the model loads untied) and not
    loaded. The export leaves it out (the base has it) and PeftModel loads it with our logits."""
    from safetensors.numpy import load_file, save_file
    src = str(tmp_path / "adapter")
    ref = hf_lm_logits(_peft_adapter(fam, bases[fam], src, seed=4, r=2, target_modules=["lm_head", "q_proj"]),
                       IDS, MASK)
    tensors = load_file(os.path.join(src, "adapter_model.safetensors"))
    assert "base_model.model.lm_head.base_layer.weight" in tensors
    model, name, cfg, report = hf.from_pretrained(bases[fam], adapter=src, return_report=True)
    ours = _ours(model)
    check_hf_logits(f"PEFT lm_head adapter {fam}", ref, ours, MASK)
    assert report["lora"].target_modules == ("lm_head", "q_proj") and cfg.tie_embeddings is False
    assert any("loaded untied" in n for n in report["notes"]) == (fam == "qwen2")
    back_dir = str(tmp_path / "back")
    checkpoint_io.save_model(model, name, cfg, str(tmp_path / "ckpt"), lora=report["lora"])
    _cli(["export", str(tmp_path / "ckpt"), "--to", "peft", back_dir])
    assert "base_model.model.lm_head.lora_B.weight" in load_file(os.path.join(back_dir, WEIGHTS)) and \
        not any("base_layer" in k for k in load_file(os.path.join(back_dir, WEIGHTS)))
    back = peft.PeftModel.from_pretrained(_hf(fam, bases[fam]), back_dir).eval()
    check_hf_logits(f"export --to peft, lm_head adapter {fam}", hf_lm_logits(back, IDS, MASK), ours, MASK)
    # a bfloat16 base holds the head rounded: compared in bfloat16, the stored fp32 head is the same
    assert hf.from_pretrained(bases[fam], adapter=src, param_dtype="bfloat16")[2].tie_embeddings is False
    tensors["base_model.model.lm_head.base_layer.weight"][3, 5] += 1e-3  # another base model's head
    save_file(tensors, os.path.join(src, "adapter_model.safetensors"))
    with pytest.raises(ConversionError, match=r"base weight: base_model.model.lm_head.base_layer.weight differs "
                                              r"from the model's \(max \|diff\| 0.001\): the adapter was saved on "
                                              "another base model"):
        hf.from_pretrained(bases[fam], adapter=src)


def test_peft_options_the_tensors_decide(bases, tmp_path):
    """init_lora_weights=False (B random too, not 0), exclude_modules, layers_to_transform and
    layers_pattern only say which modules get an adapter and how it starts: the saved tensors
    decide, and the adapter loads with PEFT's logits."""
    out = str(tmp_path / "adapter")
    pm = _peft_adapter("llama", bases["llama"], out, seed=6, randomize_b=False, init_lora_weights=False,
                       target_modules=["q_proj", "v_proj", "down_proj"], exclude_modules=["v_proj"],
                       layers_to_transform=[1], layers_pattern="layers")
    config = json.loads(Path(os.path.join(out, "adapter_config.json")).read_text())
    assert (config["init_lora_weights"], config["exclude_modules"], config["layers_to_transform"],
            config["layers_pattern"]) == (False, ["v_proj"], [1], "layers")
    ref = hf_lm_logits(pm, IDS, MASK)
    real = MASK.astype(bool)
    assert np.abs(ref[real] - hf_lm_logits(_hf("llama", bases["llama"]), IDS, MASK)[real]).max() > 1e-3  # it matters
    model, name, cfg, report = hf.from_pretrained(bases["llama"], adapter=out, return_report=True)
    check_hf_logits("PEFT adapter with init False, exclude_modules, layers_to_transform", ref, _ours(model), MASK)
    assert report["lora"].target_modules == ("decoder.layers.1.ffn.down_proj", "decoder.layers.1.self_attn.q_proj")


@pytest.mark.parametrize("option, value, phrase", [
    ("use_dora", True, "use_dora=True is not supported"),
    ("modules_to_save", ["lm_head"], "modules_to_save=['lm_head'] is not supported"),
    ("layer_replication", [[0, 1]], "layer_replication=[[0, 1]] is not supported"),
    ("bias", "lora_only", "bias='lora_only' is not supported"),
    ("peft_type", "IA3", "peft_type='IA3' is not supported"),
    ("init_lora_weights", "pissa", "init_lora_weights='pissa' is not supported"),
])
def test_unsupported_peft_options_refused(option, value, phrase, tmp_path):
    from jaxformer.hf.adapters import read_adapter
    os.makedirs(tmp_path / "a")
    config = {"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["q_proj"], option: value}
    (tmp_path / "a" / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=phrase.replace("[", r"\[").replace("]", r"\]")):
        read_adapter(str(tmp_path / "a"))


def test_unmapped_and_missing_keys_refused(bases, tmp_path):
    from safetensors.numpy import save_file
    os.makedirs(tmp_path / "a")
    (tmp_path / "a" / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 2, "lora_alpha": 4}))
    pre = "base_model.model.model.layers.0."
    save_file({f"{pre}self_attn.qkv_proj.lora_A.weight": np.zeros((2, 32), np.float32),
               f"{pre}self_attn.q_proj.lora_A.weight": np.zeros((2, 32), np.float32),
               f"{pre}mlp.up_proj.lora_A.weight": np.zeros((3, 32), np.float32),
               f"{pre}mlp.up_proj.lora_B.weight": np.zeros((48, 3), np.float32),
               "base_model.model.model.embed_tokens.lora_embedding_A": np.zeros((2, V), np.float32)},
              str(tmp_path / "a" / "adapter_model.safetensors"))
    with pytest.raises(ConversionError) as e:
        hf.from_pretrained(bases["llama"], adapter=str(tmp_path / "a"))
    text = "\n".join(e.value.problems)
    assert "HF module model.layers.0.self_attn.qkv_proj has no jaxformer Linear equivalent" in text
    assert f"missing: {pre}self_attn.q_proj.lora_B.weight" in text
    assert f"shape: {pre}mlp.up_proj.lora_A.weight is (3, 32), expected (2, 32)" in text
    assert "embed_tokens.lora_embedding_A is not a LoRA A/B weight" in text
