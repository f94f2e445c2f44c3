"""ViT (`ViTForImageClassification`) <-> `vit` and Swin (`SwinForImageClassification`) <->
`swin`, on top of the colleague's mapping in jaxformer/hf_vision.py (its docstring lists the
layout details: NCHW vs NHWC images, position embedding shape, eps, Swin's clamped windows).

This module adds what a checkpoint directory needs: strict config.json options (dropouts
carried over, every other option checked or an error), per-tensor renaming for streaming,
and export in the names HF's own save_pretrained writes (transformers 4.x names, which 5.x
renames on load; hf_vision's `*_to_hf` gives the 5.x in-memory names).

Deliberate details:
  * ViT: hidden_dropout_prob -> dropout and embed_dropout (HF uses it for both),
    attention_probs_dropout_prob -> attn_dropout. encoder_stride (masked-image-modelling
    decoder) and pooler_* (ViTModel's pooler; the classifier has none) do not apply.
  * Swin: attention_probs_dropout_prob -> attn_dropout, drop_path_rate -> drop_path_rate.
    hidden_dropout_prob must be 0 (HF's default): HF also applies it after the patch
    embedding, where jaxformer's Swin has no dropout. hidden_size and num_layers are derived
    (checked), out_features/out_indices/stage_names are the backbone API.
  * Class names (id2label) are not kept: jaxformer keeps num_classes only; export writes
    LABEL_i names.
"""
from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np

from jaxformer import hf_vision
from jaxformer.config import ConfigError
from jaxformer.config.vision import SwinConfig, ViTConfig
from jaxformer.hf.common import Options
from jaxformer.hf.loading import MappingError

ARCHITECTURES = {"ViTForImageClassification": "vit", "SwinForImageClassification": "swin"}
VIT_DEFAULTS = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                    hidden_act="gelu", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                    layer_norm_eps=1e-12, image_size=224, patch_size=16, num_channels=3, qkv_bias=True)
VIT_IGNORED = {"encoder_stride": "the masked-image-modelling decoder only",
               "pooler_output_size": "ViTModel's pooler; ViTForImageClassification has none",
               "pooler_act": "ViTModel's pooler; ViTForImageClassification has none"}
SWIN_DEFAULTS = dict(image_size=224, patch_size=4, num_channels=3, embed_dim=96, depths=[2, 2, 6, 2],
                     num_heads=[3, 6, 12, 24], window_size=7, mlp_ratio=4.0, qkv_bias=True,
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, drop_path_rate=0.1,
                     hidden_act="gelu", use_absolute_embeddings=False, layer_norm_eps=1e-5)
SWIN_IGNORED = {"encoder_stride": "the masked-image-modelling decoder only",
                "out_features": "the backbone API", "out_indices": "the backbone API",
                "stage_names": "the backbone API"}
ACTS_TO_HF = {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "relu": "relu"}

# 5.x in-memory names (hf_vision) -> the names save_pretrained writes (4.x), in order
VIT_SAVED = [(r"^vit\.layers\.", "vit.encoder.layer."),
             (r"attention\.q_proj", "attention.attention.query"),
             (r"attention\.k_proj", "attention.attention.key"),
             (r"attention\.v_proj", "attention.attention.value"),
             (r"attention\.o_proj", "attention.output.dense"),
             (r"mlp\.fc1", "intermediate.dense"), (r"mlp\.fc2", "output.dense")]
SWIN_SAVED = [(r"attention\.q_proj", "attention.self.query"), (r"attention\.k_proj", "attention.self.key"),
              (r"attention\.v_proj", "attention.self.value"),
              (r"attention\.relative_position_bias\.relative_position_bias_table",
               "attention.self.relative_position_bias_table"),
              (r"attention\.o_proj", "attention.output.dense"),
              (r"mlp\.fc1", "intermediate.dense"), (r"mlp\.fc2", "output.dense")]


def _wrap(fn, o: Options):
    o.finish()
    try:
        return fn()
    except (ValueError, ConfigError) as e:
        raise ConfigError(f"config.json ({o.family}): {e}") from None


def config_from_hf(raw: dict, arch: str, keys=()):
    if arch == "ViTForImageClassification":
        o = Options(raw, VIT_DEFAULTS, family="vit ViTForImageClassification", ignored=VIT_IGNORED)
        ns = SimpleNamespace(**{k: o[k] for k in VIT_DEFAULTS}, num_labels=o.num_labels())
        drop = float(ns.hidden_dropout_prob)
        cfg = _wrap(lambda: hf_vision.vit_config_from_hf(
            ns, dropout=drop, embed_dropout=drop, attn_dropout=float(ns.attention_probs_dropout_prob)), o)
        return "vit", cfg, o.notes
    o = Options(raw, SWIN_DEFAULTS, family="swin SwinForImageClassification", ignored=SWIN_IGNORED)
    ns = SimpleNamespace(**{k: o[k] for k in SWIN_DEFAULTS}, num_labels=o.num_labels())
    o.require("hidden_dropout_prob", (0, 0.0), "HF applies it after the patch embedding too, where "
              "jaxformer's Swin has no dropout")
    n = len(ns.depths)
    if "hidden_size" in raw:
        o.require("hidden_size", lambda v: v == ns.embed_dim * 2 ** (n - 1),
                  f"must be embed_dim * 2**(len(depths)-1) = {ns.embed_dim * 2 ** (n - 1)}")
    if "num_layers" in raw:
        o.require("num_layers", lambda v: v == n, f"must equal len(depths) = {n}")
    cfg = _wrap(lambda: hf_vision.swin_config_from_hf(
        ns, attn_dropout=float(ns.attention_probs_dropout_prob), drop_path_rate=float(ns.drop_path_rate)), o)
    return "swin", cfg, o.notes


def tensor_fn(name: str, cfg, arch: str):
    rules = hf_vision.VIT_RULES if name == "vit" else hf_vision.SWIN_RULES

    def fn(key: str, x: np.ndarray):
        try:
            out = hf_vision._rename({key: x}, rules, reverse=False, legacy=True)
        except ValueError:
            raise MappingError(f"unmapped: {key} has no jaxformer {name} equivalent") from None
        if not out:
            return None  # a recomputed buffer (relative_position_index)
        pos = out.get("embed_positions.weight")
        if pos is not None and pos.ndim == 3 and pos.shape[0] == 1:  # [1, N, D] -> [N, D]
            out["embed_positions.weight"] = pos.reshape(pos.shape[1:])
        return out
    return fn


# ----------------------------------------------------------------------------- export
def export_problems(name: str, cfg) -> list[str]:
    out = []
    if cfg.ffn not in ACTS_TO_HF:
        out.append(f"ffn={cfg.ffn!r} (HF {name} activations: {sorted(ACTS_TO_HF)})")
    if name == "vit":
        want = dict(class_token=True, pool="cls", bias=True)
        out += [f"{k}={getattr(cfg, k)!r} (HF ViT needs {v!r})" for k, v in want.items()
                if getattr(cfg, k) != v]
        if cfg.embed_dropout != cfg.dropout:
            out.append(f"embed_dropout={cfg.embed_dropout} != dropout={cfg.dropout} (HF ViT has one "
                       "hidden_dropout_prob)")
    else:
        if cfg.norm_eps != 1e-5:
            out.append(f"norm_eps={cfg.norm_eps} (HF Swin keeps 1e-5 in its patch and merge norms)")
        if cfg.dropout != 0.0:
            out.append(f"dropout={cfg.dropout} (HF Swin's hidden_dropout_prob also drops the patch "
                       "embedding)")
    return out


def _labels(n: int) -> dict:
    return {"id2label": {str(i): f"LABEL_{i}" for i in range(n)},
            "label2id": {f"LABEL_{i}": i for i in range(n)}}


def config_to_hf(name: str, cfg) -> dict:
    if name == "vit":
        c: ViTConfig = cfg
        return {"architectures": ["ViTForImageClassification"], "model_type": "vit",
                "hidden_size": c.d_model, "num_hidden_layers": c.num_layers,
                "num_attention_heads": c.num_heads, "intermediate_size": c.d_ff,
                "hidden_act": ACTS_TO_HF[c.ffn], "hidden_dropout_prob": c.dropout,
                "attention_probs_dropout_prob": c.attn_dropout, "layer_norm_eps": c.norm_eps,
                "image_size": c.image_size, "patch_size": c.patch_size, "num_channels": c.num_channels,
                "qkv_bias": True, "initializer_range": 0.02, "dtype": "float32", **_labels(c.num_classes)}
    s: SwinConfig = cfg
    return {"architectures": ["SwinForImageClassification"], "model_type": "swin",
            "image_size": s.image_size, "patch_size": s.patch_size, "num_channels": s.num_channels,
            "embed_dim": s.embed_dim, "depths": list(s.depths), "num_heads": list(s.num_heads),
            "window_size": s.window_size, "mlp_ratio": s.mlp_ratio, "qkv_bias": s.qkv_bias,
            "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": s.attn_dropout,
            "drop_path_rate": s.drop_path_rate, "hidden_act": ACTS_TO_HF[s.ffn],
            "use_absolute_embeddings": False, "layer_norm_eps": 1e-5, "initializer_range": 0.02,
            "dtype": "float32", **_labels(s.num_classes)}


def state_dict_to_hf(sd: dict[str, np.ndarray], name: str, cfg) -> dict[str, np.ndarray]:
    if name == "vit":
        hf, saved = hf_vision.vit_state_dict_to_hf(sd), VIT_SAVED
    else:
        hf, saved = hf_vision.swin_state_dict_to_hf(sd), SWIN_SAVED
    out = {}
    for k, v in hf.items():
        for rx, new in saved:
            k = re.sub(rx, new, k)
        out[k] = np.ascontiguousarray(v)
    return out
