"""ViT (`ViTForImageClassification`, and `ViTModel`: the backbone with its pooler) <-> `vit`
and Swin (`SwinForImageClassification`) <-> `swin`: configs and weights, strict config.json
import, streaming import and export.

Two entry points share one mapping. The checkpoint-directory family API of jaxformer.hf
(config_from_hf on a config.json dict, tensor_fn, EXPORTS (the fields export writes), config_to_hf,
state_dict_to_hf) reads config.json strictly (dropouts carried over, every other option
checked or an error) and exports in the names HF's save_pretrained writes (transformers 4.x
names, which 5.x renames on load). The in-memory API works on transformers objects: the
config's attributes and a model's state_dict, in transformers 5.x in-memory names (the 4.x
names of hub checkpoints, e.g. `attention.attention.query`, are read too). It imports neither
jax nor torch: state_dict values pass through (torch tensors or numpy arrays) and are only
reshaped where the layouts differ. Then `jaxformer.convert` takes torch_ref -> flax as usual.

    cfg = vit_config_from_hf(hf_model.config)
    sd = vit_state_dict_from_hf(hf_model.state_dict())   # load into torch_ref ViT(cfg), strict

Deliberate differences and how they are mapped:

ViT (ViTForImageClassification)
  * images: HF takes NCHW, jaxformer NHWC (x.permute(0, 2, 3, 1)).
  * position_embeddings [1, N, D] -> embed_positions.weight [N, D]; cls_token kept [1, 1, D].
  * layer_norm_eps (HF default 1e-12, not torch's 1e-5 nor flax's 1e-6) -> norm_eps, carried over.
  * hidden_act "gelu" is exact GELU -> ffn="gelu"; "gelu_new"/"gelu_pytorch_tanh" -> "gelu_tanh".
  * HF always has an o_proj bias and a q/k/v bias iff qkv_bias -> ViTConfig.qkv_bias (the
    encoder's attn_qkv_bias), bias=True for o_proj and the MLP.
  * layers.i.{layernorm_before, attention, layernorm_after, mlp.fc1, mlp.fc2} ->
    encoder.layers.i.{attn_norm, self_attn, ffn_norm, ffn.up_proj, ffn.down_proj};
    vit.layernorm -> encoder.final_norm. Pooling: HF takes the [CLS] output (pool="cls").
  * ViTModel (no classifier; keys without the `vit.` prefix): head="pooler", pooler.dense ->
    pooler, pooler_output = tanh(pooler([CLS] output)) is the model's output and its
    last_hidden_state the intermediate "encoder.final_norm". pooler_act must be tanh and
    pooler_output_size the width (what ViTModel builds); num_labels does not apply.
  * config.json: hidden_dropout_prob -> dropout and embed_dropout (HF uses it for both),
    attention_probs_dropout_prob -> attn_dropout. encoder_stride (masked-image-modelling
    decoder) does not apply, nor pooler_* to the classifier (ViTModel's pooler).
Swin (SwinForImageClassification)
  * same NCHW / NHWC difference; blocks keep HF's structure and order, renamed only.
  * HF builds the patch-embedding norm and the patch-merging norms with torch's default eps
    1e-5 whatever layer_norm_eps says: layer_norm_eps -> norm_eps (blocks, final norm), and
    patch_norm_eps=1e-5.
  * HF's shift mask adds -100 to masked scores; we mask with booleans (exactly 0 weight). The
    two agree to fp32 rounding unless scores differ by ~100.
  * HF crashes (bias [49, 49] vs scores [16, 16]) when a stage is smaller than window_size,
    because its bias table is never clamped; we clamp (see models/swin.py). Only
    use_absolute_embeddings=False (HF's default) maps.
  * config.json: attention_probs_dropout_prob -> attn_dropout, drop_path_rate ->
    drop_path_rate, hidden_dropout_prob -> dropout (attention and MLP outputs) and
    embed_dropout (after the patch embedding), where HF applies it. hidden_size and num_layers
    are derived (checked), out_features/out_indices/stage_names are the backbone API.
Both: class names (id2label) are not kept: jaxformer keeps num_classes only; export writes
LABEL_i names. `relative_position_index` buffers some checkpoints carry are recomputed.
"""
from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import numpy as np

from jaxformer.config.vision import SwinConfig, ViTConfig
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

ARCHITECTURES = {"ViTForImageClassification": "vit", "ViTModel": "vit", "SwinForImageClassification": "swin"}
MODEL_TYPES = {"ViTForImageClassification": "vit", "ViTModel": "vit", "SwinForImageClassification": "swin"}
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
TANH_GELU = "gelu_pytorch_tanh"  # torch's own tanh GELU, the op torch_ref's gelu_tanh runs

# ----------------------------------------------------------------------------- names
# Per layer / block: (transformers 5.x name, 4.x name, jaxformer name). {leaf} is weight/bias.
_VIT_LAYER = [
    ("layernorm_before.{leaf}", "layernorm_before.{leaf}", "attn_norm.{leaf}"),
    ("attention.q_proj.{leaf}", "attention.attention.query.{leaf}", "self_attn.q_proj.{leaf}"),
    ("attention.k_proj.{leaf}", "attention.attention.key.{leaf}", "self_attn.k_proj.{leaf}"),
    ("attention.v_proj.{leaf}", "attention.attention.value.{leaf}", "self_attn.v_proj.{leaf}"),
    ("attention.o_proj.{leaf}", "attention.output.dense.{leaf}", "self_attn.o_proj.{leaf}"),
    ("layernorm_after.{leaf}", "layernorm_after.{leaf}", "ffn_norm.{leaf}"),
    ("mlp.fc1.{leaf}", "intermediate.dense.{leaf}", "ffn.up_proj.{leaf}"),
    ("mlp.fc2.{leaf}", "output.dense.{leaf}", "ffn.down_proj.{leaf}"),
]
_VIT_TOP = [
    ("vit.embeddings.cls_token", "cls_token"),
    ("vit.embeddings.position_embeddings", "embed_positions.weight"),
    ("vit.embeddings.patch_embeddings.projection.{leaf}", "patch_embed.proj.{leaf}"),
    ("vit.layernorm.{leaf}", "encoder.final_norm.{leaf}"),
    ("classifier.{leaf}", "classifier.{leaf}"),
    ("vit.pooler.dense.{leaf}", "pooler.{leaf}"),  # ViTModel (its keys read with the prefix, _hf_key)
]
_SWIN_BLOCK = [
    ("layernorm_before.{leaf}", "layernorm_before.{leaf}", "attn_norm.{leaf}"),
    ("attention.q_proj.{leaf}", "attention.self.query.{leaf}", "self_attn.q_proj.{leaf}"),
    ("attention.k_proj.{leaf}", "attention.self.key.{leaf}", "self_attn.k_proj.{leaf}"),
    ("attention.v_proj.{leaf}", "attention.self.value.{leaf}", "self_attn.v_proj.{leaf}"),
    ("attention.o_proj.{leaf}", "attention.output.dense.{leaf}", "self_attn.o_proj.{leaf}"),
    ("attention.relative_position_bias.relative_position_bias_table",
     "attention.self.relative_position_bias_table", "self_attn.relative_position_bias_table"),
    ("layernorm_after.{leaf}", "layernorm_after.{leaf}", "ffn_norm.{leaf}"),
    ("mlp.fc1.{leaf}", "intermediate.dense.{leaf}", "ffn.up_proj.{leaf}"),
    ("mlp.fc2.{leaf}", "output.dense.{leaf}", "ffn.down_proj.{leaf}"),
]
_SWIN_TOP = [
    ("swin.embeddings.patch_embeddings.projection.{leaf}", "patch_embed.proj.{leaf}"),
    ("swin.embeddings.norm.{leaf}", "patch_embed.norm.{leaf}"),
    ("swin.encoder.layers.{i}.downsample.reduction.{leaf}", "stages.{i}.downsample.reduction.{leaf}"),
    ("swin.encoder.layers.{i}.downsample.norm.{leaf}", "stages.{i}.downsample.norm.{leaf}"),
    ("swin.layernorm.{leaf}", "final_norm.{leaf}"),
    ("classifier.{leaf}", "classifier.{leaf}"),
]
VIT_RULES = _VIT_TOP + [("vit.layers.{i}." + new, "encoder.layers.{i}." + ours)
                        for new, _, ours in _VIT_LAYER]
VIT_SAVED_RULES = _VIT_TOP + [("vit.encoder.layer.{i}." + old, "encoder.layers.{i}." + ours)
                              for _, old, ours in _VIT_LAYER]
_BLOCK = "swin.encoder.layers.{i}.blocks.{j}."
SWIN_RULES = _SWIN_TOP + [(_BLOCK + new, "stages.{i}.blocks.{j}." + ours) for new, _, ours in _SWIN_BLOCK]
SWIN_SAVED_RULES = _SWIN_TOP + [(_BLOCK + old, "stages.{i}.blocks.{j}." + ours)
                                for _, old, ours in _SWIN_BLOCK]
# import reads either naming of each part (after _hf_key); export writes 5.x names (in
# memory) or 4.x names (files)
RENAMERS = {"vit": Renamer(VIT_RULES + [("vit.layers.{i}." + old, "encoder.layers.{i}." + ours)
                                        for _, old, ours in _VIT_LAYER]),
            "swin": Renamer(SWIN_RULES + SWIN_SAVED_RULES)}
RENAMERS_5X = {"vit": Renamer(VIT_RULES), "swin": Renamer(SWIN_RULES)}
RENAMERS_SAVED = {"vit": Renamer(VIT_SAVED_RULES), "swin": Renamer(SWIN_SAVED_RULES)}


def _is_buffer(key: str) -> bool:
    return key.endswith("relative_position_index")  # recomputed, not loaded


_VIT_BARE = ("embeddings.", "encoder.", "layers.", "layernorm.", "pooler.")  # ViTModel's keys


def _hf_key(name: str, key: str) -> str:
    """A key with the 5.x layer container: ViT's 4.x `vit.encoder.layer.{i}` is `vit.layers.{i}`;
    ViTModel and Swin checkpoints of the bare model have no `vit.` / `swin.` prefix."""
    if name == "vit" and key.startswith(_VIT_BARE):
        key = "vit." + key
    if name == "vit" and key.startswith("vit.encoder.layer."):
        return "vit.layers." + key[len("vit.encoder.layer."):]
    if name == "swin" and key.startswith(("encoder.", "embeddings.")):
        return "swin." + key
    return key


def _state_dict_from_hf(name: str, state_dict: Mapping[str, Any], legacy: bool) -> dict[str, Any]:
    renamer = RENAMERS[name] if legacy else RENAMERS_5X[name]
    sd = {k: v for k, v in state_dict.items() if not _is_buffer(k)}
    bare = name == "vit" and any(k.startswith(_VIT_BARE) for k in sd)  # a ViTModel's keys
    out = rename_all(sd, lambda k: renamer.to_torch(_hf_key(name, k) if legacy else ("vit." + k if bare else k)),
                     f"jaxformer {name}")
    if "embed_positions.weight" in out:
        out["embed_positions.weight"] = position_table_from_hf(out["embed_positions.weight"])
    return out


def _state_dict_to_hf(name: str, state_dict: Mapping[str, Any], renamers) -> dict[str, Any]:
    sd = {k: v for k, v in state_dict.items() if not _is_buffer(k)}
    out = rename_all(sd, renamers[name].to_hf, f"HF {name}")
    pos = out.get("vit.embeddings.position_embeddings")
    if pos is not None:
        out["vit.embeddings.position_embeddings"] = pos.reshape((1,) + tuple(pos.shape))
    if "vit.pooler.dense.weight" in out:  # ViTModel: its keys carry no `vit.` prefix
        out = {k.removeprefix("vit."): v for k, v in out.items()}
    return out


# ----------------------------------------------------------------------------- in-memory API
def vit_config_from_hf(hf: Any, **overrides) -> ViTConfig:
    """ViTConfig from a transformers ViTConfig (attributes) for ViTForImageClassification
    (head="pooler" for ViTModel)."""
    image, patch = hf.image_size, hf.patch_size
    image = image if isinstance(image, int) else square_size(image, "image_size")
    patch = patch if isinstance(patch, int) else square_size(patch, "patch_size")
    kw = dict(image_size=image, patch_size=patch, num_channels=hf.num_channels,
              num_classes=hf.num_labels, d_model=hf.hidden_size, num_heads=hf.num_attention_heads,
              d_ff=hf.intermediate_size, num_layers=hf.num_hidden_layers, ffn=plain_activation(hf.hidden_act),
              norm_eps=float(hf.layer_norm_eps), bias=True, qkv_bias=None if hf.qkv_bias else False,
              class_token=True, pool="cls")
    kw.update(overrides)
    return ViTConfig(**kw)


def vit_state_dict_from_hf(state_dict: Mapping[str, Any], *, legacy: bool = True) -> dict[str, Any]:
    """HF ViTForImageClassification (or ViTModel) state_dict -> torch_ref ViT state_dict.
    legacy: also read transformers 4.x names."""
    return _state_dict_from_hf("vit", state_dict, legacy)


def vit_state_dict_to_hf(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """torch_ref ViT state_dict -> HF ViTForImageClassification (head "pooler": ViTModel)
    state_dict (the inverse)."""
    return _state_dict_to_hf("vit", state_dict, RENAMERS_5X)


def swin_config_from_hf(hf: Any, **overrides) -> SwinConfig:
    """SwinConfig from a transformers SwinConfig for SwinForImageClassification."""
    if getattr(hf, "use_absolute_embeddings", False):
        raise ValueError("HF Swin use_absolute_embeddings=True is not supported")
    image, patch = hf.image_size, hf.patch_size
    kw = dict(image_size=image if isinstance(image, int) else square_size(image, "image_size"),
              patch_size=patch if isinstance(patch, int) else square_size(patch, "patch_size"),
              num_channels=hf.num_channels, num_classes=hf.num_labels, embed_dim=hf.embed_dim,
              depths=tuple(hf.depths), num_heads=tuple(hf.num_heads), window_size=hf.window_size,
              mlp_ratio=float(hf.mlp_ratio), qkv_bias=bool(hf.qkv_bias), ffn=plain_activation(hf.hidden_act),
              norm_eps=float(hf.layer_norm_eps), patch_norm_eps=1e-5)  # HF: torch's default there
    kw.update(overrides)
    return SwinConfig(**kw)


def swin_state_dict_from_hf(state_dict: Mapping[str, Any], *, legacy: bool = True) -> dict[str, Any]:
    """HF SwinForImageClassification state_dict -> torch_ref SwinTransformer state_dict."""
    return _state_dict_from_hf("swin", state_dict, legacy)


def swin_state_dict_to_hf(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    return _state_dict_to_hf("swin", state_dict, RENAMERS_5X)


# ----------------------------------------------------------------------------- config.json
def config_from_hf(raw: dict, arch: str, keys=()):
    if arch in ("ViTForImageClassification", "ViTModel"):
        pooler = arch == "ViTModel"
        defaults = {**VIT_DEFAULTS, **({"pooler_act": "tanh", "pooler_output_size": None} if pooler else {})}
        ignored = {k: v for k, v in VIT_IGNORED.items() if not (pooler and k.startswith("pooler_"))}
        if pooler:
            ignored.update({"id2label": "ViTModel has no classifier", "label2id": "ViTModel has no classifier",
                            "num_labels": "ViTModel has no classifier"})
        o = Options(raw, defaults, family=f"vit {arch}", ignored=ignored)
        if pooler:
            o.require("pooler_act", lambda v: v == "tanh", "only tanh (ViTModel's default) is implemented")
            o.require("pooler_output_size", lambda v: v is None or v == o["hidden_size"],
                      "must be hidden_size (the pooler keeps the width)")
        ns = SimpleNamespace(**{k: o[k] for k in VIT_DEFAULTS}, num_labels=1 if pooler else o.num_labels())
        drop = float(ns.hidden_dropout_prob)
        extra = {"head": "pooler"} if pooler else {}
        cfg = finish_config(lambda: vit_config_from_hf(
            ns, dropout=drop, embed_dropout=drop, attn_dropout=float(ns.attention_probs_dropout_prob), **extra), o)
        return "vit", cfg, o.notes
    o = Options(raw, SWIN_DEFAULTS, family="swin SwinForImageClassification", ignored=SWIN_IGNORED)
    ns = SimpleNamespace(**{k: o[k] for k in SWIN_DEFAULTS}, num_labels=o.num_labels())
    n = len(ns.depths)
    if "hidden_size" in raw:
        o.require("hidden_size", lambda v: v == ns.embed_dim * 2 ** (n - 1),
                  f"must be embed_dim * 2**(len(depths)-1) = {ns.embed_dim * 2 ** (n - 1)}")
    if "num_layers" in raw:
        o.require("num_layers", lambda v: v == n, f"must equal len(depths) = {n}")
    drop = float(ns.hidden_dropout_prob)
    cfg = finish_config(lambda: swin_config_from_hf(
        ns, dropout=drop, embed_dropout=drop, attn_dropout=float(ns.attention_probs_dropout_prob),
        drop_path_rate=float(ns.drop_path_rate)), o)
    return "swin", cfg, o.notes


def tensor_fn(name: str, cfg, arch: str):
    renamer = RENAMERS[name]

    def fn(key: str, x: np.ndarray):
        if _is_buffer(key):
            return None
        new = renamer.to_torch(_hf_key(name, key))
        if new is None:
            raise MappingError(f"unmapped: {key} has no jaxformer {name} equivalent")
        return {new: position_table_from_hf(x) if new == "embed_positions.weight" else x}
    return fn


# ----------------------------------------------------------------------------- export
# ViT: the sizes, the dropouts, the head (a classifier or ViTModel's pooler); required: [CLS]
# pooling, biases, no LayerScale, one hidden dropout. Swin: its stages and windows; the patch
# and merge norms' eps is torch's default.
VIT = dict(
    d_model=WRITES, num_heads=WRITES, d_ff=WRITES, num_layers=WRITES, dropout=WRITES, attn_dropout=WRITES,
    norm_eps=WRITES, image_size=WRITES, patch_size=WRITES, num_channels=WRITES, qkv_bias=WRITES, head=WRITES,
    num_classes=WRITES, class_token=True, pool="cls", bias=True, layer_scale=None,
    interpolate_positions=Ignored("HF ViT takes interpolate_pos_encoding at call time; config.json has no key"),
    ffn=Need(lambda c: c.ffn in exportable_ffns(), f"ffn={{ffn!r}} (HF vit activations: {exportable_ffns()})"),
    embed_dropout=Need(lambda c: c.embed_dropout == c.dropout,
                       "embed_dropout={embed_dropout} != dropout={dropout} (HF ViT has one hidden_dropout_prob)"))
SWIN = dict(
    image_size=WRITES, patch_size=WRITES, num_channels=WRITES, embed_dim=WRITES, depths=WRITES, num_heads=WRITES,
    window_size=WRITES, mlp_ratio=WRITES, qkv_bias=WRITES, dropout=WRITES, attn_dropout=WRITES,
    drop_path_rate=WRITES, norm_eps=WRITES, num_classes=WRITES,
    patch_norm_eps=Need(lambda c: c.patch_norm_eps == 1e-5, "patch_norm_eps={patch_norm_eps} (HF Swin keeps 1e-5 "
                        "in its patch and merge norms)"),
    ffn=Need(lambda c: c.ffn in exportable_ffns(), f"ffn={{ffn!r}} (HF swin activations: {exportable_ffns()})"),
    embed_dropout=Need(lambda c: c.embed_dropout == c.dropout, "embed_dropout={embed_dropout} != dropout={dropout} "
                       "(HF Swin has one hidden_dropout_prob for both)"))
EXPORTS = {"vit": VIT, "swin": SWIN}


def config_to_hf(name: str, cfg) -> dict:
    act = ffn_to_hf(cfg.ffn, tanh=TANH_GELU)
    if name == "vit":
        c: ViTConfig = cfg
        head = ({"architectures": ["ViTModel"], "pooler_act": "tanh", "pooler_output_size": c.d_model}
                if c.head == "pooler" else {"architectures": ["ViTForImageClassification"], **label_maps(c.num_classes)})
        return {**head, "model_type": "vit",
                "hidden_size": c.d_model, "num_hidden_layers": c.num_layers,
                "num_attention_heads": c.num_heads, "intermediate_size": c.d_ff,
                "hidden_act": act, "hidden_dropout_prob": c.dropout,
                "attention_probs_dropout_prob": c.attn_dropout, "layer_norm_eps": c.norm_eps,
                "image_size": c.image_size, "patch_size": c.patch_size, "num_channels": c.num_channels,
                "qkv_bias": c.qkv_bias is not False, "initializer_range": 0.02, "dtype": "float32"}
    s: SwinConfig = cfg
    return {"architectures": ["SwinForImageClassification"], "model_type": "swin",
            "image_size": s.image_size, "patch_size": s.patch_size, "num_channels": s.num_channels,
            "embed_dim": s.embed_dim, "depths": list(s.depths), "num_heads": list(s.num_heads),
            "window_size": s.window_size, "mlp_ratio": s.mlp_ratio, "qkv_bias": s.qkv_bias,
            "hidden_dropout_prob": s.dropout, "attention_probs_dropout_prob": s.attn_dropout,
            "drop_path_rate": s.drop_path_rate, "hidden_act": act,
            "use_absolute_embeddings": False, "layer_norm_eps": s.norm_eps, "initializer_range": 0.02,
            "dtype": "float32", **label_maps(s.num_classes)}


def state_dict_to_hf(sd: dict[str, np.ndarray], name: str, cfg) -> dict[str, np.ndarray]:
    """torch_ref state_dict -> the HF state_dict in the names save_pretrained writes."""
    return {k: np.ascontiguousarray(v) for k, v in _state_dict_to_hf(name, sd, RENAMERS_SAVED).items()}


FAMILY = Family(name="vision", architectures=ARCHITECTURES, model_types=MODEL_TYPES, config_from_hf=config_from_hf,
                tensor_fn=tensor_fn, config_to_hf=config_to_hf, state_dict_to_hf=state_dict_to_hf,
                hf_defaults={a: SWIN_DEFAULTS if a.startswith("Swin") else VIT_DEFAULTS for a in ARCHITECTURES},
                exports=EXPORTS)
