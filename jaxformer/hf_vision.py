"""Hugging Face ViT / Swin <-> jaxformer (torch_ref) weights and configs. Imports neither jax
nor torch: state_dict values pass through (torch tensors or numpy arrays) and are only
reshaped where the layouts differ. Then `jaxformer.convert` takes torch_ref -> flax as usual.

    cfg = vit_config_from_hf(hf_model.config)
    sd = vit_state_dict_from_hf(hf_model.state_dict())   # load into torch_ref ViT(cfg), strict

Deliberate differences and how they are mapped (HF transformers 5.x names; the 4.x names of
hub checkpoints, e.g. `attention.attention.query`, are renamed first by LEGACY_RENAMES):

ViT (ViTForImageClassification)
  * images: HF takes NCHW, jaxformer NHWC (x.permute(0, 2, 3, 1)).
  * position_embeddings [1, N, D] -> embed_positions.weight [N, D]; cls_token kept [1, 1, D].
  * layer_norm_eps (HF default 1e-12, not torch's 1e-5 nor flax's 1e-6) -> norm_eps, carried over.
  * hidden_act "gelu" is exact GELU -> ffn="gelu"; "gelu_new"/"gelu_pytorch_tanh" -> "gelu_tanh".
  * HF always has an o_proj bias and a q/k/v bias iff qkv_bias; our MultiHeadAttention has
    one `bias` flag for all four, so only qkv_bias=True (HF's default) maps.
  * layers.i.{layernorm_before, attention, layernorm_after, mlp.fc1, mlp.fc2} ->
    encoder.layers.i.{attn_norm, self_attn, ffn_norm, ffn.up_proj, ffn.down_proj};
    vit.layernorm -> encoder.final_norm. Pooling: HF takes the [CLS] output (pool="cls").
Swin (SwinForImageClassification)
  * same NCHW / NHWC difference; blocks keep HF's structure and order, renamed only.
  * HF builds the patch-embedding norm and the patch-merging norms with torch's default eps
    1e-5 whatever layer_norm_eps says; we use norm_eps everywhere, so layer_norm_eps must be 1e-5.
  * HF's shift mask adds -100 to masked scores; we mask with booleans (exactly 0 weight). The
    two agree to fp32 rounding unless scores differ by ~100.
  * HF crashes (bias [49, 49] vs scores [16, 16]) when a stage is smaller than window_size,
    because its bias table is never clamped; we clamp (see models/swin.py). Only
    use_absolute_embeddings=False (HF's default) maps.
"""
from __future__ import annotations

import re
from typing import Any, Mapping

from jaxformer.config.vision import SwinConfig, ViTConfig

HF_ACTS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
           "gelu_fast": "gelu_tanh", "relu": "relu"}

# (hf template, jaxformer template); {i}, {j} are layer indices, {leaf} is weight/bias
VIT_RULES = [
    ("vit.embeddings.cls_token", "cls_token"),
    ("vit.embeddings.position_embeddings", "embed_positions.weight"),
    ("vit.embeddings.patch_embeddings.projection.{leaf}", "patch_embed.proj.{leaf}"),
    ("vit.layers.{i}.layernorm_before.{leaf}", "encoder.layers.{i}.attn_norm.{leaf}"),
    ("vit.layers.{i}.attention.q_proj.{leaf}", "encoder.layers.{i}.self_attn.q_proj.{leaf}"),
    ("vit.layers.{i}.attention.k_proj.{leaf}", "encoder.layers.{i}.self_attn.k_proj.{leaf}"),
    ("vit.layers.{i}.attention.v_proj.{leaf}", "encoder.layers.{i}.self_attn.v_proj.{leaf}"),
    ("vit.layers.{i}.attention.o_proj.{leaf}", "encoder.layers.{i}.self_attn.o_proj.{leaf}"),
    ("vit.layers.{i}.layernorm_after.{leaf}", "encoder.layers.{i}.ffn_norm.{leaf}"),
    ("vit.layers.{i}.mlp.fc1.{leaf}", "encoder.layers.{i}.ffn.up_proj.{leaf}"),
    ("vit.layers.{i}.mlp.fc2.{leaf}", "encoder.layers.{i}.ffn.down_proj.{leaf}"),
    ("vit.layernorm.{leaf}", "encoder.final_norm.{leaf}"),
    ("classifier.{leaf}", "classifier.{leaf}"),
]
_BLOCK = "swin.encoder.layers.{i}.blocks.{j}"
SWIN_RULES = [
    ("swin.embeddings.patch_embeddings.projection.{leaf}", "patch_embed.proj.{leaf}"),
    ("swin.embeddings.norm.{leaf}", "patch_embed.norm.{leaf}"),
    (f"{_BLOCK}.layernorm_before.{{leaf}}", "stages.{i}.blocks.{j}.attn_norm.{leaf}"),
    (f"{_BLOCK}.attention.q_proj.{{leaf}}", "stages.{i}.blocks.{j}.self_attn.q_proj.{leaf}"),
    (f"{_BLOCK}.attention.k_proj.{{leaf}}", "stages.{i}.blocks.{j}.self_attn.k_proj.{leaf}"),
    (f"{_BLOCK}.attention.v_proj.{{leaf}}", "stages.{i}.blocks.{j}.self_attn.v_proj.{leaf}"),
    (f"{_BLOCK}.attention.o_proj.{{leaf}}", "stages.{i}.blocks.{j}.self_attn.o_proj.{leaf}"),
    (f"{_BLOCK}.attention.relative_position_bias.relative_position_bias_table",
     "stages.{i}.blocks.{j}.self_attn.relative_position_bias_table"),
    (f"{_BLOCK}.layernorm_after.{{leaf}}", "stages.{i}.blocks.{j}.ffn_norm.{leaf}"),
    (f"{_BLOCK}.mlp.fc1.{{leaf}}", "stages.{i}.blocks.{j}.ffn.up_proj.{leaf}"),
    (f"{_BLOCK}.mlp.fc2.{{leaf}}", "stages.{i}.blocks.{j}.ffn.down_proj.{leaf}"),
    ("swin.encoder.layers.{i}.downsample.reduction.{leaf}", "stages.{i}.downsample.reduction.{leaf}"),
    ("swin.encoder.layers.{i}.downsample.norm.{leaf}", "stages.{i}.downsample.norm.{leaf}"),
    ("swin.layernorm.{leaf}", "final_norm.{leaf}"),
    ("classifier.{leaf}", "classifier.{leaf}"),
]
# transformers 4.x checkpoint names -> 5.x (as transformers' own conversion_mapping), in order
LEGACY_RENAMES = [
    (r"^vit\.encoder\.layer\.", "vit.layers."), (r"^encoder\.", "swin.encoder."),
    (r"^embeddings\.", "swin.embeddings."),
    (r"attention\.attention\.query", "attention.q_proj"), (r"attention\.attention\.key", "attention.k_proj"),
    (r"attention\.attention\.value", "attention.v_proj"),
    (r"attention\.self\.query", "attention.q_proj"), (r"attention\.self\.key", "attention.k_proj"),
    (r"attention\.self\.value", "attention.v_proj"),
    (r"attention\.self\.relative_position_bias_table",
     "attention.relative_position_bias.relative_position_bias_table"),
    (r"attention\.output\.dense", "attention.o_proj"), (r"intermediate\.dense", "mlp.fc1"),
    (r"(?<!attention\.)output\.dense", "mlp.fc2"),
]
# buffers some checkpoints carry that are recomputed, not loaded
IGNORED = re.compile(r"relative_position_index$")


def _regex(template: str) -> re.Pattern:
    pattern = re.escape(template)
    for name, rx in (("i", r"\d+"), ("j", r"\d+"), ("leaf", r"weight|bias")):
        pattern = pattern.replace(re.escape("{" + name + "}"), f"(?P<{name}>{rx})")
    return re.compile(pattern + "$")


def _rename(state_dict: Mapping[str, Any], rules, *, reverse: bool, legacy: bool) -> dict[str, Any]:
    compiled = [(_regex(dst if reverse else src), src if reverse else dst) for src, dst in rules]
    out, problems = {}, []
    for key, value in state_dict.items():
        k = key
        if legacy:
            for rx, new in LEGACY_RENAMES:
                k = re.sub(rx, new, k)
        if IGNORED.search(k):
            continue
        for rx, target in compiled:
            m = rx.match(k)
            if m:
                out[target.format(**m.groupdict())] = value
                break
        else:
            problems.append(f"unmapped: {key}")
    if problems:
        raise ValueError("HF weight mapping failed:\n  " + "\n  ".join(problems))
    return out


def _reshape(x, shape):
    return x.reshape(shape)


# ----------------------------------------------------------------------------- ViT
def vit_config_from_hf(hf: Any, **overrides) -> ViTConfig:
    """ViTConfig from a transformers ViTConfig (attributes) for ViTForImageClassification."""
    image, patch = hf.image_size, hf.patch_size
    image = image if isinstance(image, int) else _square(image, "image_size")
    patch = patch if isinstance(patch, int) else _square(patch, "patch_size")
    if not hf.qkv_bias:
        raise ValueError("HF ViT qkv_bias=False has no jaxformer equivalent (one bias flag for q/k/v/o)")
    kw = dict(image_size=image, patch_size=patch, num_channels=hf.num_channels,
              num_classes=hf.num_labels, d_model=hf.hidden_size, num_heads=hf.num_attention_heads,
              d_ff=hf.intermediate_size, num_layers=hf.num_hidden_layers, ffn=_act(hf.hidden_act),
              norm_eps=float(hf.layer_norm_eps), bias=True, class_token=True, pool="cls")
    kw.update(overrides)
    return ViTConfig(**kw)


def vit_state_dict_from_hf(state_dict: Mapping[str, Any], *, legacy: bool = True) -> dict[str, Any]:
    """HF ViTForImageClassification state_dict -> torch_ref ViT state_dict."""
    out = _rename(state_dict, VIT_RULES, reverse=False, legacy=legacy)
    pos = out["embed_positions.weight"]
    out["embed_positions.weight"] = _reshape(pos, tuple(pos.shape[1:]))  # [1, N, D] -> [N, D]
    return out


def vit_state_dict_to_hf(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """torch_ref ViT state_dict -> HF ViTForImageClassification state_dict (the inverse)."""
    out = _rename(state_dict, VIT_RULES, reverse=True, legacy=False)
    pos = out["vit.embeddings.position_embeddings"]
    out["vit.embeddings.position_embeddings"] = _reshape(pos, (1,) + tuple(pos.shape))
    return out


# ----------------------------------------------------------------------------- Swin
def swin_config_from_hf(hf: Any, **overrides) -> SwinConfig:
    """SwinConfig from a transformers SwinConfig for SwinForImageClassification."""
    if getattr(hf, "use_absolute_embeddings", False):
        raise ValueError("HF Swin use_absolute_embeddings=True is not supported")
    if float(hf.layer_norm_eps) != 1e-5:
        raise ValueError(f"HF Swin layer_norm_eps={hf.layer_norm_eps}: HF keeps 1e-5 in the patch "
                         "and merge norms, jaxformer has one norm_eps; only 1e-5 maps exactly")
    image, patch = hf.image_size, hf.patch_size
    kw = dict(image_size=image if isinstance(image, int) else _square(image, "image_size"),
              patch_size=patch if isinstance(patch, int) else _square(patch, "patch_size"),
              num_channels=hf.num_channels, num_classes=hf.num_labels, embed_dim=hf.embed_dim,
              depths=tuple(hf.depths), num_heads=tuple(hf.num_heads), window_size=hf.window_size,
              mlp_ratio=float(hf.mlp_ratio), qkv_bias=bool(hf.qkv_bias), ffn=_act(hf.hidden_act),
              norm_eps=1e-5)
    kw.update(overrides)
    return SwinConfig(**kw)


def swin_state_dict_from_hf(state_dict: Mapping[str, Any], *, legacy: bool = True) -> dict[str, Any]:
    """HF SwinForImageClassification state_dict -> torch_ref SwinTransformer state_dict."""
    return _rename(state_dict, SWIN_RULES, reverse=False, legacy=legacy)


def swin_state_dict_to_hf(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    return _rename(state_dict, SWIN_RULES, reverse=True, legacy=False)


def _act(name: str) -> str:
    if name not in HF_ACTS:
        raise ValueError(f"HF hidden_act={name!r} has no jaxformer ffn kind; known: {sorted(HF_ACTS)}")
    return HF_ACTS[name]


def _square(v, field: str) -> int:
    v = tuple(v)
    if len(v) != 2 or v[0] != v[1]:
        raise ValueError(f"HF {field}={v}: only square sizes map")
    return int(v[0])
