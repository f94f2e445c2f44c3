"""DINOv2 (`Dinov2Model`, `Dinov2ForImageClassification`) <-> `vit`: configs and weights,
strict config.json import, streaming import and export.

DINOv2 (Oquab et al. 2023) is a Pre-LN ViT with LayerScale on both sublayers, a bicubic
resampling of its position table for other image sizes, and (classifier) a head on [CLS]
concatenated with the mean of the patch outputs. jaxformer's ViT holds all three as options
(ViTConfig.layer_scale, interpolate_positions, pool="cls_mean"); Dinov2Model is the headless
ViT (num_classes=0, pool="cls"): the model returns HF's pooler_output, and its
"encoder.final_norm" intermediate is HF's last_hidden_state.

Two entry points share one mapping, as in vision.py: the checkpoint-directory family API
(config_from_hf on a config.json dict, tensor_fn, EXPORTS (the fields export writes), config_to_hf,
state_dict_to_hf; files in the names save_pretrained writes, transformers 4.x names with the
SwiGLU FFN's fused `weights_in`), and the in-memory API on transformers objects (5.x names).

    cfg = dinov2_config_from_hf(hf_model.config, classifier=True)
    sd = dinov2_state_dict_from_hf(hf_model.state_dict())   # load into torch_ref ViT(cfg), strict

Deliberate differences and how they are mapped:
  * images: HF takes NCHW, jaxformer NHWC (x.permute(0, 2, 3, 1)). Sides must be multiples of
    patch_size (HF's conv drops a remainder silently; we refuse it).
  * other image sizes: HF resamples the patch positions with torch's bicubic interpolation
    (size=(H/p, W/p), align_corners=False, no antialias, in float32) unless the grid is the
    config's; interpolate_positions=True does the same (docs/numerics.md §37).
  * position_embeddings [1, N, D] -> embed_positions.weight [N, D]; cls_token kept [1, 1, D].
  * layers.i.{norm1, attention.{q,k,v,o}_proj, layer_scale1.lambda1, norm2, mlp.fc1, mlp.fc2,
    layer_scale2.lambda1} -> encoder.layers.i.{attn_norm, self_attn.{q,k,v,o}_proj,
    attn_layer_scale.gamma, ffn_norm, ffn.up_proj, ffn.down_proj, ffn_layer_scale.gamma};
    layernorm -> encoder.final_norm. 4.x names: attention.attention.{query,key,value},
    attention.output.dense.
  * use_swiglu_ffn: ffn="swiglu" with biases, d_ff = HF's rounding of 2/3 of
    int(hidden_size * mlp_ratio) up to a multiple of 8; hidden_act is not used then (HF's
    SwiGLU is SiLU whatever it says). The 4.x file's fused mlp.weights_in [2F, D] is gate
    (first half) then up; mlp.weights_out -> ffn.down_proj.
  * HF DINOv2 has no dropout on the sublayer outputs: hidden_dropout_prob is the embedding
    dropout only (embed_dropout), attention_probs_dropout_prob -> attn_dropout.
  * mask_token (use_mask_token) is read by HF only with bool_masked_pos (masked-image
    pretraining), which jaxformer does not implement: the tensor is skipped on import and
    export writes use_mask_token=false. drop_path_rate (stochastic depth) acts in training
    only: eval outputs are unchanged; a nonzero value is reported in the import notes, since
    fine-tuning in jaxformer then runs without it.
  * apply_layernorm / reshape_hidden_states / out_features / out_indices / stage_names are
    Dinov2Backbone's options (not these classes').
  * layerscale_value only initialises lambda1 (the checkpoint's values are loaded):
    ViTConfig.layer_scale keeps it so that a fresh model starts as HF's does.
Class names (id2label) are not kept: export writes LABEL_i names.
"""
from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import numpy as np

from jaxformer.config.vision import ViTConfig
from jaxformer.hf.common import (
    Family,
    MappingError,
    Options,
    Renamer,
    exportable_ffns,
    ffn_to_hf,
    finish_config,
    label_maps,
    plain_activation,
    position_table_from_hf,
    rename_all,
    square_size,
)
from jaxformer.hf.exports import WRITES, Ignored, Need
from jaxformer.hf.vision import TANH_GELU

ARCHITECTURES = {"Dinov2Model": "vit", "Dinov2ForImageClassification": "vit"}
MODEL_TYPES = {"Dinov2Model": "dinov2", "Dinov2ForImageClassification": "dinov2"}
DEFAULTS = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, mlp_ratio=4,
                hidden_act="gelu", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                layer_norm_eps=1e-6, image_size=224, patch_size=14, num_channels=3, qkv_bias=True,
                layerscale_value=1.0, drop_path_rate=0.0, use_swiglu_ffn=False, use_mask_token=True)
IGNORED = {"apply_layernorm": "Dinov2Backbone's feature maps only",
           "reshape_hidden_states": "Dinov2Backbone's feature maps only",
           "out_features": "the backbone API", "out_indices": "the backbone API",
           "stage_names": "the backbone API",
           "use_mask_token": "mask_token is used only with bool_masked_pos (masked-image pretraining, "
                             "not implemented); the tensor is skipped"}
PREFIX = "dinov2."

# ----------------------------------------------------------------------------- names
# Per layer: (transformers 5.x name, 4.x name as save_pretrained writes it, jaxformer name).
_LAYER = [
    ("norm1.{leaf}", "norm1.{leaf}", "attn_norm.{leaf}"),
    ("attention.q_proj.{leaf}", "attention.attention.query.{leaf}", "self_attn.q_proj.{leaf}"),
    ("attention.k_proj.{leaf}", "attention.attention.key.{leaf}", "self_attn.k_proj.{leaf}"),
    ("attention.v_proj.{leaf}", "attention.attention.value.{leaf}", "self_attn.v_proj.{leaf}"),
    ("attention.o_proj.{leaf}", "attention.output.dense.{leaf}", "self_attn.o_proj.{leaf}"),
    ("layer_scale1.lambda1", "layer_scale1.lambda1", "attn_layer_scale.gamma"),
    ("norm2.{leaf}", "norm2.{leaf}", "ffn_norm.{leaf}"),
    ("layer_scale2.lambda1", "layer_scale2.lambda1", "ffn_layer_scale.gamma"),
]
_MLP = [("mlp.fc1.{leaf}", "mlp.fc1.{leaf}", "ffn.up_proj.{leaf}"),
        ("mlp.fc2.{leaf}", "mlp.fc2.{leaf}", "ffn.down_proj.{leaf}")]
_SWIGLU = [("mlp.gate_proj.{leaf}", None, "ffn.gate_proj.{leaf}"),  # 4.x: half of mlp.weights_in
           ("mlp.up_proj.{leaf}", None, "ffn.up_proj.{leaf}"),
           ("mlp.down_proj.{leaf}", "mlp.weights_out.{leaf}", "ffn.down_proj.{leaf}")]
_TOP = [
    ("embeddings.cls_token", "cls_token"),
    ("embeddings.position_embeddings", "embed_positions.weight"),
    ("embeddings.patch_embeddings.projection.{leaf}", "patch_embed.proj.{leaf}"),
    ("layernorm.{leaf}", "encoder.final_norm.{leaf}"),
]
_BODY = "encoder.layer.{i}."


def _rules(layer: list, saved: bool) -> list:
    return _TOP + [(_BODY + (old if saved else new), "encoder.layers.{i}." + ours)
                   for new, old, ours in layer if (old if saved else new)]


# import reads either naming of either FFN; export writes one FFN's 5.x (in memory) or 4.x
# (files) names, so that no two HF names of one jaxformer key meet in one renamer
RENAMER_READ = Renamer(_rules(_LAYER + _SWIGLU, False) + _rules(_LAYER + _SWIGLU, True)
                       + _rules(_MLP, False) + _rules(_MLP, True))
RENAMERS_5X = {False: Renamer(_rules(_LAYER + _MLP, False)), True: Renamer(_rules(_LAYER + _SWIGLU, False))}
RENAMERS_SAVED = {False: Renamer(_rules(_LAYER + _MLP, True)), True: Renamer(_rules(_LAYER + _SWIGLU, True))}
_FUSED_IN = "mlp.weights_in."  # 4.x SwiGLU: [gate; up] along the output axis


def _swiglu_width(d_model: int, mlp_ratio) -> int:
    """HF Dinov2SwiGLUFFN's hidden width: 2/3 of int(D * mlp_ratio), up to a multiple of 8."""
    return (int(int(d_model * mlp_ratio) * 2 / 3) + 7) // 8 * 8


def _mlp_ratio(cfg: ViTConfig) -> int | None:
    """The integer mlp_ratio (transformers types it int) that gives cfg.d_ff, or None."""
    for r in range(1, 65):
        width = _swiglu_width(cfg.d_model, r) if cfg.ffn == "swiglu" else cfg.d_model * r
        if width == cfg.d_ff:
            return r
    return None


def _body_key(key: str) -> tuple[str, bool]:
    """-> (key without the classifier's `dinov2.` prefix, is it the head's own key)."""
    if key.startswith(PREFIX):
        return key[len(PREFIX):], False
    return key, key.startswith("classifier.")


def _skipped(key: str) -> bool:
    return _body_key(key)[0] == "embeddings.mask_token"


def _rename_in(key: str, renamer: Renamer) -> str | None:
    body, head = _body_key(key)
    return key if head else renamer.to_torch(body)


def _split_fused(key: str, x) -> dict[str, Any]:
    """A 4.x `...mlp.weights_in.{leaf}` tensor -> the gate_proj and up_proj halves."""
    body, _ = _body_key(key)
    i, leaf = body[len("encoder.layer."):].split(".")[0], body.rsplit(".", 1)[-1]
    half = x.shape[0] // 2
    return {f"encoder.layers.{i}.ffn.gate_proj.{leaf}": x[:half],
            f"encoder.layers.{i}.ffn.up_proj.{leaf}": x[half:]}


def _state_dict_from_hf(state_dict: Mapping[str, Any], renamer: Renamer) -> dict[str, Any]:
    sd, out = {}, {}
    for k, v in state_dict.items():
        if _skipped(k):
            continue
        if _FUSED_IN in k:
            out.update(_split_fused(k, v))
        else:
            sd[k] = v
    out.update(rename_all(sd, lambda k: _rename_in(k, renamer), "jaxformer vit"))
    if "embed_positions.weight" in out:
        out["embed_positions.weight"] = position_table_from_hf(out["embed_positions.weight"])
    return out


def _state_dict_to_hf(state_dict: Mapping[str, Any], renamer: Renamer, classifier: bool,
                      fuse: bool) -> dict[str, Any]:
    sd = dict(state_dict)
    out = {}
    if fuse:  # 4.x files: gate and up in one weights_in tensor
        for k in [k for k in sd if ".ffn.gate_proj." in k]:
            up = k.replace(".ffn.gate_proj.", ".ffn.up_proj.")
            i, leaf = k.split(".")[2], k.rsplit(".", 1)[-1]
            out[f"encoder.layer.{i}.{_FUSED_IN}{leaf}"] = np.concatenate([sd.pop(k), sd.pop(up)], 0)
    head = {k: sd.pop(k) for k in [k for k in sd if k.startswith("classifier.")]}
    out.update(rename_all(sd, renamer.to_hf, "HF dinov2"))
    pos = out.get("embeddings.position_embeddings")
    if pos is not None:
        out["embeddings.position_embeddings"] = pos.reshape((1,) + tuple(pos.shape))
    if classifier:
        out = {PREFIX + k: v for k, v in out.items()}
        out.update(head)
    elif head:
        raise MappingError(f"Dinov2Model has no classifier; got {sorted(head)}")
    return out


# ----------------------------------------------------------------------------- in-memory API
def dinov2_config_from_hf(hf: Any, *, classifier: bool, **overrides) -> ViTConfig:
    """ViTConfig from a transformers Dinov2Config: Dinov2ForImageClassification
    (classifier=True: num_labels classes, pool="cls_mean") or Dinov2Model (classifier=False:
    num_classes=0, pool="cls", the output is the pooler_output)."""
    image, patch = hf.image_size, hf.patch_size
    image = image if isinstance(image, int) else square_size(image, "image_size")
    patch = patch if isinstance(patch, int) else square_size(patch, "patch_size")
    d = hf.hidden_size
    swiglu = bool(hf.use_swiglu_ffn)
    kw = dict(image_size=image, patch_size=patch, num_channels=hf.num_channels,
              num_classes=hf.num_labels if classifier else 0, d_model=d, num_heads=hf.num_attention_heads,
              d_ff=_swiglu_width(d, hf.mlp_ratio) if swiglu else int(d * hf.mlp_ratio),
              num_layers=hf.num_hidden_layers, ffn="swiglu" if swiglu else plain_activation(hf.hidden_act),
              norm_eps=float(hf.layer_norm_eps), bias=True, qkv_bias=None if hf.qkv_bias else False,
              class_token=True, pool="cls_mean" if classifier else "cls",
              layer_scale=float(hf.layerscale_value), interpolate_positions=True)
    kw.update(overrides)
    return ViTConfig(**kw)


def dinov2_state_dict_from_hf(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """HF Dinov2Model / Dinov2ForImageClassification state_dict (5.x or 4.x names) ->
    torch_ref ViT state_dict. mask_token is skipped (module docstring)."""
    return _state_dict_from_hf(state_dict, RENAMER_READ)


def dinov2_state_dict_to_hf(state_dict: Mapping[str, Any], cfg: ViTConfig) -> dict[str, Any]:
    """torch_ref ViT state_dict -> HF state_dict in 5.x names (Dinov2ForImageClassification
    when cfg.num_classes > 0, else Dinov2Model; no mask_token)."""
    return _state_dict_to_hf(state_dict, RENAMERS_5X[cfg.ffn == "swiglu"], cfg.num_classes > 0, fuse=False)


# ----------------------------------------------------------------------------- config.json
def config_from_hf(raw: dict, arch: str, keys=()):
    classifier = arch == "Dinov2ForImageClassification"
    o = Options(raw, DEFAULTS, family=f"dinov2 {arch}", ignored=IGNORED)
    ns = SimpleNamespace(**{k: o[k] for k in DEFAULTS}, num_labels=o.num_labels() if classifier else 0)
    if not classifier:  # Dinov2Model has no head: its labels mean nothing
        o.used.update(("id2label", "label2id", "num_labels"))
    if ns.use_swiglu_ffn and "hidden_act" in raw:
        o.notes.append(f"hidden_act={raw['hidden_act']!r} is not used: HF's SwiGLU FFN is SiLU-gated")
    if ns.drop_path_rate:
        o.notes.append(f"drop_path_rate={ns.drop_path_rate}: stochastic depth acts in training only "
                       "(eval outputs unchanged); jaxformer's ViT has none, so fine-tuning runs without it")
    cfg = finish_config(lambda: dinov2_config_from_hf(
        ns, classifier=classifier, dropout=0.0, embed_dropout=float(ns.hidden_dropout_prob),
        attn_dropout=float(ns.attention_probs_dropout_prob)), o)
    return "vit", cfg, o.notes


def tensor_fn(name: str, cfg, arch: str):
    classifier = arch == "Dinov2ForImageClassification"

    def fn(key: str, x: np.ndarray):
        if _skipped(key):
            return None
        if _FUSED_IN in key:
            return _split_fused(key, x)
        body, head = _body_key(key)
        new = (key if classifier else None) if head else RENAMER_READ.to_torch(body)
        if new is None:
            raise MappingError(f"unmapped: {key} has no jaxformer {arch} equivalent")
        return {new: position_table_from_hf(x) if new == "embed_positions.weight" else x}
    return fn


# ----------------------------------------------------------------------------- export
def is_dinov2(cfg) -> bool:
    """A ViT config that only DINOv2 represents (LayerScale, the cls_mean head, no head); HF
    ViTModel's pooler head is ViT's (jaxformer/hf/vision.py)."""
    return cfg.head != "pooler" and (cfg.layer_scale is not None or cfg.pool == "cls_mean" or cfg.num_classes == 0)


# Written: the sizes, LayerScale, the dropouts HF has, the head (Dinov2ForImageClassification's,
# or none: Dinov2Model); required: [CLS], biases, a FFN width HF's int mlp_ratio gives, the
# pooling each HF class reads
EXPORTS = {"vit": dict(
    d_model=WRITES, num_heads=WRITES, num_layers=WRITES, attn_dropout=WRITES, embed_dropout=WRITES,
    norm_eps=WRITES, image_size=WRITES, patch_size=WRITES, num_channels=WRITES, num_classes=WRITES,
    class_token=True, bias=True,
    interpolate_positions=Ignored("HF DINOv2 resamples its position table at every image size"),
    ffn=Need(lambda c: c.ffn in exportable_ffns() or c.ffn == "swiglu",
             f"ffn={{ffn!r}} (HF DINOv2: {exportable_ffns()} or swiglu)"),
    dropout=Need(lambda c: c.dropout == 0.0, "dropout={dropout} (HF DINOv2 needs 0.0: it has no dropout on "
                 "sublayer outputs)"),
    pool=Need(lambda c: c.pool == ("cls_mean" if c.num_classes else "cls"),
              "pool={pool!r} (HF DINOv2: Dinov2ForImageClassification reads [CLS] and the patch mean, "
              "pool='cls_mean'; Dinov2Model's output is the [CLS] vector, pool='cls')"),
    layer_scale=Need(lambda c: c.layer_scale is not None, "layer_scale=None (HF DINOv2 always has LayerScale; "
                     "export a plain ViT as ViTForImageClassification)"),
    qkv_bias=Need(lambda c: not (c.qkv_bias is True and not c.bias), "qkv_bias=True with bias=False"),
    d_ff=Need(lambda c: _mlp_ratio(c) is not None, "d_ff={d_ff} is no HF DINOv2 FFN width for d_model={d_model} "
              "(transformers types mlp_ratio int: d_ff = d_model * mlp_ratio, rounded to 2/3 and a multiple of 8 "
              "for SwiGLU)"))}


def config_to_hf(name: str, cfg) -> dict:
    c: ViTConfig = cfg
    arch = "Dinov2ForImageClassification" if c.num_classes else "Dinov2Model"
    swiglu = c.ffn == "swiglu"
    return {"architectures": [arch], "model_type": "dinov2",
            "hidden_size": c.d_model, "num_hidden_layers": c.num_layers,
            "num_attention_heads": c.num_heads, "mlp_ratio": _mlp_ratio(c),
            "hidden_act": "gelu" if swiglu else ffn_to_hf(c.ffn, tanh=TANH_GELU),
            "hidden_dropout_prob": c.embed_dropout, "attention_probs_dropout_prob": c.attn_dropout,
            "layer_norm_eps": c.norm_eps, "image_size": c.image_size, "patch_size": c.patch_size,
            "num_channels": c.num_channels, "qkv_bias": c.qkv_bias is not False,
            "layerscale_value": c.layer_scale, "drop_path_rate": 0.0, "use_swiglu_ffn": swiglu,
            "use_mask_token": False, "initializer_range": 0.02, "dtype": "float32",
            **(label_maps(c.num_classes) if c.num_classes else {})}


def state_dict_to_hf(sd: dict[str, np.ndarray], name: str, cfg) -> dict[str, np.ndarray]:
    """torch_ref state_dict -> the HF state_dict in the names save_pretrained writes."""
    out = _state_dict_to_hf(sd, RENAMERS_SAVED[cfg.ffn == "swiglu"], cfg.num_classes > 0, fuse=True)
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


__all__ = ["dinov2_config_from_hf", "dinov2_state_dict_from_hf", "dinov2_state_dict_to_hf"]


FAMILY = Family(name="dinov2", architectures=ARCHITECTURES, model_types=MODEL_TYPES, config_from_hf=config_from_hf,
                tensor_fn=tensor_fn, config_to_hf=config_to_hf, state_dict_to_hf=state_dict_to_hf,
                hf_defaults=dict.fromkeys(ARCHITECTURES, DEFAULTS), exports=EXPORTS, claims=is_dinov2)
