"""Which Hugging Face family exports a jaxformer config: `exporter`. The import side picks the
family from config.json's architectures (hf/__init__.py); export has only our config to go by.
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
from jaxformer.hf.common import Family


def _longrope(c) -> bool:
    return c.rope_scaling is not None and c.rope_scaling.rope_type == "longrope"


def _qwen_moe(c) -> bool:  # Qwen's q/k norm, gated shared expert or qkv-only bias
    return c.qk_norm or c.moe.shared_expert_gate or c.resolved_qkv_bias != c.resolved_out_bias


def _gemma(c) -> bool:
    return c.norm == "rmsnorm_offset" or c.norm_position == "sandwich"


def _qwen(c) -> bool:
    return c.position == "rope" and (c.qk_norm or c.resolved_qkv_bias != c.resolved_out_bias)


LM, TEXT_ENCODERS = ("lm",), ("encoder", "classifier")
# Which family exports a config: the first row whose model names hold the config's and whose
# condition holds. Order matters: a row may assume the rows above it did not match.
EXPORT_TABLE = (
    (LM, _longrope, phi3.FAMILY),  # only Phi-3 has longrope
    (LM, lambda c: c.attn_sinks, gpt_oss.FAMILY),  # only gpt-oss has attention sinks
    (LM, lambda c: c.mla is not None, deepseek.FAMILY),  # multi-head latent attention
    (LM, lambda c: c.moe is not None and _qwen_moe(c), qwen_moe.FAMILY),
    (LM, lambda c: c.moe is not None, mixtral.FAMILY),
    (LM, lambda c: _gemma(c) and (c.qk_norm or c.rope_local_base is not None), gemma3.FAMILY),  # q/k norms, 2 RoPEs
    (LM, _gemma, gemma2.FAMILY),
    (LM, lambda c: c.norm_position == "post_sublayer" or c.qk_norm_full, olmo2.FAMILY),
    (LM, lambda c: c.position == "rope" and (c.norm == "layernorm" or c.parallel_residual), gpt_neox.FAMILY),
    (LM, _qwen, qwen.FAMILY),
    # residual dropout: Phi-3 is the LLaMA-style HF decoder that has it (resid_pdrop), and partial
    # rotary (Phi-4-mini)
    (LM, lambda c: c.position == "rope" and (c.dropout or c.rotary_dim is not None), phi3.FAMILY),
    (LM, lambda c: c.position == "rope" and c.sliding_window is not None, mistral.FAMILY),
    (LM, lambda c: c.position == "rope", llama.FAMILY),
    (LM, lambda c: True, gpt2.FAMILY),
    (TEXT_ENCODERS, lambda c: c.positions_from_padding, roberta.FAMILY),  # RoBERTa's offset positions
    (TEXT_ENCODERS, lambda c: c.position == "rope", modernbert.FAMILY),
    (TEXT_ENCODERS, lambda c: True, bert.FAMILY),
    (("vit",), dinov2.is_dinov2, dinov2.FAMILY),  # LayerScale, the cls_mean head or no head
    (("vit", "swin"), lambda c: True, vision.FAMILY),
    (("seq2seq",), lambda c: True, t5.FAMILY),
)
# Options only some families write (Family.writes): field -> (neutral value, why the others
# cannot). RoBERTa's positions, ModernBERT's first layer (docs/numerics.md §36), a local RoPE
# (Gemma3 §33, ModernBERT), partial rotary and the parallel block (§35), a score scale (T5).
OPTIONAL_FIELDS = {"positions_from_padding": (False, None), "first_attn_norm": (True, None),
                   "rope_local_base": (None, None), "rope_local_scaling": (None, None), "rotary_dim": (None, None),
                   "parallel_residual": (False, None), "qk_norm_full": (False, None),
                   "attn_scale": (None, "the family scales scores by 1/sqrt(head_dim)")}
FAMILIES = tuple(dict.fromkeys(f for _, _, f in EXPORT_TABLE))


def exporter(name: str, cfg) -> Family:
    """The family that exports this model, or ConversionError saying why none does."""
    fam = next((f for names, when, f in EXPORT_TABLE if name in names and when(cfg)), None)
    if fam is None:
        raise ConversionError([f"model {name!r} has no Hugging Face export (supported: "
                               f"{', '.join(dict.fromkeys(n for names, _, _ in EXPORT_TABLE for n in names))})"])
    problems = list(fam.export_problems(name, cfg))
    for key, (neutral, why) in OPTIONAL_FIELDS.items():
        value = getattr(cfg, key, neutral)
        if key not in fam.writes and value != neutral:
            writers = " and ".join(sorted(f.name for f in FAMILIES if key in f.writes))
            problems.append(f"{key}={value!r} ({why or f'only {writers} export it'})")
    if problems:
        raise ConversionError([f"{name} config has no {fam.name} HF equivalent: {p}" for p in problems])
    return fam
