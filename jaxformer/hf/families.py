"""The one registry of Hugging Face families, FAMILIES, and which of them exports a jaxformer
config: `exporter`. Import picks the family of a config.json by its architectures
(hf/__init__.py); export has only our config to go by: the first family in FAMILIES whose
models hold the config's and that claims it (Family.claims), then its declaration of the
fields it writes checks every field (hf/exports.py).
"""
from __future__ import annotations

from jaxformer.convert import ConversionError
from jaxformer.hf import (
    bert,
    deepseek,
    dinov2,
    gemma2,
    gemma3,
    gpt2,
    gpt_neox,
    gpt_oss,
    llama,
    mistral,
    mixtral,
    modernbert,
    olmo2,
    phi3,
    qwen,
    qwen_moe,
    roberta,
    t5,
    vision,
)
from jaxformer.hf import exports as declared
from jaxformer.hf.common import Family

# Export order: a family claims a config only if no family above it did (its claim names the
# feature of its HF class and may assume the ones above are absent: MoE before dense, Gemma's
# norms before LLaMA's, a sliding window before none, DINOv2's LayerScale before plain ViT).
FAMILIES: tuple[Family, ...] = (
    gpt_oss.FAMILY,  # attention sinks
    deepseek.FAMILY,  # multi-head latent attention
    qwen_moe.FAMILY,  # MoE with Qwen's q/k norm, gated shared expert or qkv-only bias
    mixtral.FAMILY,  # any other MoE
    gemma3.FAMILY,  # Gemma's norms with q/k norms or two RoPEs
    gemma2.FAMILY,  # Gemma's norms
    olmo2.FAMILY,  # post-sublayer norms, full-width q/k norms
    gpt_neox.FAMILY,  # RoPE with LayerNorm or the parallel block
    qwen.FAMILY,  # q/k norms or qkv-only biases
    phi3.FAMILY,  # longrope, residual dropout or partial rotary
    mistral.FAMILY,  # a sliding window
    llama.FAMILY,  # any other RoPE decoder
    gpt2.FAMILY,  # any other LM: GPT-2's learned positions, or refused by name
    roberta.FAMILY,  # RoBERTa's offset positions
    modernbert.FAMILY,  # a RoPE encoder
    bert.FAMILY,
    dinov2.FAMILY,  # LayerScale, the cls_mean head or no head
    vision.FAMILY,  # ViT, Swin
    t5.FAMILY,
)


def export_problems(fam: Family, name: str, cfg) -> list[str]:
    """What of `cfg` the family cannot write (its declaration, hf/exports.py), one line each."""
    def uncovered(label: str, value) -> str:
        writers = sorted(f.name for f in FAMILIES if f is not fam and name in f.exports
                         and declared.covers(declared.by_path(f.exports[name], type(cfg)), label, value))
        return (f"{label}={value!r} ({fam.name} writes no such option"
                + (f"; only {' and '.join(writers)} export it)" if writers else ")"))
    return declared.problems(fam.exports[name], cfg, uncovered)


def exporter(name: str, cfg) -> Family:
    """The family that exports this model, or ConversionError saying why none does."""
    fam = next((f for f in FAMILIES if name in f.exports and f.claims(cfg)), None)
    if fam is None:
        raise ConversionError([f"model {name!r} has no Hugging Face export (supported: "
                               f"{', '.join(dict.fromkeys(n for f in FAMILIES for n in f.exports))})"])
    problems = export_problems(fam, name, cfg)
    if problems:
        raise ConversionError([f"{name} config has no {fam.name} HF equivalent: {p}" for p in problems])
    return fam
