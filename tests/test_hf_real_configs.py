"""The config.json files of published checkpoints (tests/data/hf_configs/, sources in
SOURCES.md), imported as shipped: each file's size keys are shrunk to tiny values (width,
ffn width, one layer (two where one would drop a kind of layer), heads, head_dim, experts,
MLA ranks, vocab; token ids beyond the tiny vocab stay as shipped, as metadata);
every other key stays as published (rope_scaling, sliding windows, soft-caps, cache and
activation keys, task_specific_params...). transformers builds the model from that config,
random weights are saved beside the unchanged config.json, and jaxformer imports the
directory: outputs within 1e-5 x max(1, max|logit|) of HF's in fp32 (docs/numerics.md §19).
The export must load back in transformers with the same outputs.

Worst measured |logit| differences are printed (-s) and listed in SOURCES.md.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from helpers import check_hf_logits, hf_lm_logits, randomize

from jaxformer import hf
from jaxformer.config import ConfigError
from jaxformer.parity import setup_precision

T = pytest.importorskip("transformers")
DATA = Path(__file__).parent / "data" / "hf_configs"
# size key -> tiny value, for whichever of them a config has
TINY = {"hidden_size": 32, "n_embd": 32, "d_model": 32, "intermediate_size": 48, "d_ff": 48,
        "num_hidden_layers": 1, "n_layer": 1, "num_layers": 1, "num_decoder_layers": 1,
        "num_attention_heads": 4, "n_head": 4, "num_heads": 4, "num_key_value_heads": 2,
        "head_dim": 8, "d_kv": 8, "moe_intermediate_size": 16, "shared_expert_intermediate_size": 24,
        "num_experts": 8, "num_local_experts": 8, "n_routed_experts": 16, "first_k_dense_replace": 1, "kv_lora_rank": 16,
        "q_lora_rank": 24, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8}
# model_type -> layers, where one layer would drop a kind: Gemma-2's and gpt-oss's sliding +
# full pair, DeepSeek-V3's dense first layer + MoE layer
LAYERS = {"gemma2": 2, "deepseek_v3": 2, "gpt_oss": 2}
# model_type -> ffn width where the shipped weights need one: MXFP4 blocks hold 32 values
MXFP4_FFN = {"gpt_oss": 32}
TINY_VOCAB = 96
# file -> what a ConfigError must name: fp8 block weights are not dequantized
REFUSED = {"deepseek-ai__DeepSeek-R1.json": "quantization_config"}
# (file, keys dropped): the published files as shipped, and DeepSeek-R1 as its bf16 conversions
# ship it (fp8 quantization_config removed), so its MLA / MoE / YaRN keys are checked too
CHECKED = [(name, ()) for name in sorted(p.name for p in DATA.glob("*.json") if p.name not in REFUSED)]
CHECKED.append(("deepseek-ai__DeepSeek-R1.json", ("quantization_config",)))
RNG = np.random.RandomState(5)
IDS = RNG.randint(3, 60, size=(2, 11))
MASK = np.ones_like(IDS)
MASK[1, :3] = 0  # a left-padded row
TGT = RNG.randint(3, 60, size=(2, 7))
TGT[:, 0] = 0  # T5's decoder start
TYPES = np.zeros_like(IDS)
IMAGES = RNG.randn(2, 224, 224, 3).astype(np.float32)  # [B, H, W, C]: the ViT files' image_size 224


@pytest.fixture(autouse=True)
def _precision():
    setup_precision()


def shrunk(raw: dict) -> dict:
    """The published config with its size keys made tiny, the vocab too: token ids beyond it
    stay as shipped (metadata to both sides: transformers warns, jaxformer notes), except a
    pad_token_id, which must index the embedding (HF's padding_idx)."""
    out = {k: (TINY[k] if k in TINY and isinstance(v, int) else v) for k, v in raw.items()}
    if "num_key_value_heads" in raw and raw["num_key_value_heads"] == raw.get("num_attention_heads"):  # MHA
        out["num_key_value_heads"] = out.get("num_attention_heads")
    if raw.get("model_type") in LAYERS:
        out["num_hidden_layers"] = LAYERS[raw["model_type"]]
    if isinstance(raw.get("layer_types"), list):  # the shipped per-layer pattern, cut to the layers kept
        out["layer_types"] = raw["layer_types"][:out["num_hidden_layers"]]
    if _mxfp4(raw):
        out["intermediate_size"] = MXFP4_FFN[raw["model_type"]]
    if "vocab_size" in raw and (not isinstance(raw.get("pad_token_id"), int) or raw["pad_token_id"] < TINY_VOCAB):
        out["vocab_size"] = TINY_VOCAB
    return out


def _mxfp4(raw: dict) -> bool:
    return (raw.get("quantization_config") or {}).get("quant_method") == "mxfp4"


def _quantize_experts(model, path: Path) -> None:
    """The expert weights stored as the published gpt-oss checkpoints store them: MXFP4
    blocks + scales (random bytes), and the HF model given transformers' own dequantization
    of the same bytes, so both sides compute with the shipped format's values."""
    from safetensors.numpy import load_file, save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    tensors = load_file(str(path / "model.safetensors"))
    rng = np.random.RandomState(3)
    for key in [k for k in tensors if k.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        e, cols, rows = tensors.pop(key).shape  # [E, G * 32, R]
        blocks = rng.randint(0, 256, (e, rows, cols // 32, 16)).astype(np.uint8)
        scales = rng.randint(120, 126, (e, rows, cols // 32)).astype(np.uint8)
        tensors[f"{key}_blocks"], tensors[f"{key}_scales"] = blocks, scales
        with torch.no_grad():
            model.get_parameter(key).copy_(convert_moe_packed_tensors(
                torch.from_numpy(blocks), torch.from_numpy(scales), dtype=torch.float32))
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})


def _kind(raw: dict) -> str:
    arch = raw["architectures"][0]
    if arch.startswith("ViT"):
        assert (raw["image_size"], raw["num_channels"]) == IMAGES.shape[2:], "IMAGES fit the ViT files"
        return "vit"
    return "seq2seq" if arch.startswith("T5") else "bert" if arch.startswith("Bert") else "lm"


def _hf_out(model, kind: str) -> np.ndarray:
    with torch.no_grad():
        if kind == "lm":
            return hf_lm_logits(model, IDS, MASK)
        if kind == "seq2seq":
            return model(input_ids=torch.from_numpy(IDS), attention_mask=torch.from_numpy(MASK),
                         decoder_input_ids=torch.from_numpy(TGT)).logits.numpy()
        if kind == "vit":  # ViTModel: its last hidden state and pooler output, side by side
            out = model(pixel_values=torch.from_numpy(IMAGES).permute(0, 3, 1, 2))
            return np.concatenate([out.last_hidden_state.numpy().reshape(2, -1), out.pooler_output.numpy()], axis=1)
        body = getattr(model, "bert", model)  # a BertForMaskedLM checkpoint imports as its BertModel
        return body(torch.from_numpy(IDS), attention_mask=torch.from_numpy(MASK),
                    token_type_ids=torch.from_numpy(TYPES)).last_hidden_state.numpy()


@nnx.jit
def _call(model, *args, **kw):
    return model(*args, **kw)


@nnx.jit
def _call_inter(model, images):
    return model(images, return_intermediates=True)


def _our_out(model, kind: str) -> np.ndarray:
    if kind == "lm":
        return np.asarray(_call(model, jnp.asarray(IDS), jnp.asarray(MASK)))
    if kind == "seq2seq":
        return np.asarray(_call(model, jnp.asarray(IDS), jnp.asarray(TGT), jnp.asarray(MASK)))
    if kind == "vit":  # head "pooler": the output is the pooler's, the last hidden state an intermediate
        pooled, inter = _call_inter(model, jnp.asarray(IMAGES))
        return np.concatenate([np.asarray(inter["encoder.final_norm"]).reshape(2, -1), np.asarray(pooled)], axis=1)
    out = _call(model, jnp.asarray(IDS), jnp.asarray(MASK), token_type_ids=jnp.asarray(TYPES))
    return np.asarray(out[0] if isinstance(out, tuple) else out)


def _check(tag: str, kind: str, ref: np.ndarray, ours: np.ndarray) -> float:
    if kind == "lm":  # pad positions see no real token in HF's causal mask
        return check_hf_logits(tag, ref, ours, MASK)
    d, top = float(np.abs(ref - ours).max()), max(1.0, float(np.abs(ref).max()))
    print(f"[hf logits] {tag}: max |diff| {d:.2e}, max |out| {top:.2f}")
    assert d <= 1e-5 * top, f"{tag}: max |diff| vs HF {d:.2e}"
    return d


def _checkpoint(file: str, root: Path, drop: tuple[str, ...] = ()):
    """(HF model, directory): random weights saved by transformers beside the shrunk
    published config.json, written as is (save_pretrained's own config.json is replaced)."""
    raw = shrunk({k: v for k, v in json.loads((DATA / file).read_text()).items() if k not in drop})
    path = root / file.removesuffix(".json")
    os.makedirs(path)
    (path / "config.json").write_text(json.dumps(raw, indent=2))
    config = T.AutoConfig.from_pretrained(str(path))  # as transformers reads the file
    model = getattr(T, raw["architectures"][0])(config).float()
    randomize(model, seed=len(file))
    model.save_pretrained(str(path))
    if _mxfp4(raw):
        _quantize_experts(model, path)
    (path / "config.json").write_text(json.dumps(raw, indent=2))
    return model, str(path), _kind(raw)


@pytest.mark.parametrize("file, drop", CHECKED, ids=[f + "".join(f"-no-{k}" for k in d) for f, d in CHECKED])
def test_published_config_imports_matches_hf_and_exports(file, drop, tmp_path):
    hf_model, path, kind = _checkpoint(file, tmp_path, drop)
    model, name, cfg, report = hf.from_pretrained(path, return_report=True)
    if kind == "bert":  # BertForMaskedLM: its encoder, the masked-LM head skipped and said so
        assert name == "encoder" and any("cls.predictions" in n for n in report["notes"])
        assert report["skipped"] and all(k.startswith("cls.") for k in report["skipped"])
    ref = _hf_out(hf_model, kind)
    _check(file, kind, ref, _our_out(model, kind))

    hf.save_pretrained(model, name, cfg, str(tmp_path / "out"))
    T.AutoConfig.from_pretrained(str(tmp_path / "out"))
    cls = {"lm": T.AutoModelForCausalLM, "seq2seq": T.AutoModelForSeq2SeqLM, "bert": T.AutoModel,
           "vit": T.AutoModel}[kind]
    back = cls.from_pretrained(str(tmp_path / "out")).eval()
    _check(f"{file} exported", kind, ref, _hf_out(back, kind))


@pytest.mark.parametrize("file", sorted(REFUSED))
def test_published_config_refused_by_name(file):
    raw = shrunk(json.loads((DATA / file).read_text()))
    with pytest.raises(ConfigError, match=REFUSED[file]):
        fam, arch = hf.family_for_architecture(raw)
        fam.config_from_hf(raw, arch)


# a published file with one key changed -> the option the error names: the values accepted
# above are accepted because they are HF's own behaviour, not because the key is skipped
CHANGED = {"use_mrope": ("Qwen__Qwen2.5-0.5B.json", {"use_mrope": True}),
           "rope_interleaved": ("HuggingFaceTB__SmolLM2-135M.json", {"rope_interleaved": True}),
           "pooler_act": ("google__vit-base-patch16-224-in21k.json", {"pooler_act": "relu"}),
           "pooler_output_size": ("google__vit-base-patch16-224-in21k.json", {"pooler_output_size": 64})}


@pytest.mark.parametrize("word", sorted(CHANGED))
def test_changed_published_config_is_refused_by_name(word):
    file, change = CHANGED[word]
    raw = {**shrunk(json.loads((DATA / file).read_text())), **change}
    fam, arch = hf.family_for_architecture(raw)
    with pytest.raises(ConfigError, match=word):
        fam.config_from_hf(raw, arch)


def test_sources_list_every_file():
    sources = (DATA / "SOURCES.md").read_text()
    assert all(f"`{p.name}`" in sources for p in DATA.glob("*.json"))
