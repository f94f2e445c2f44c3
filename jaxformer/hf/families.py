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


def exporter(name: str, cfg):
    """The family module that exports this model, or ConversionError saying why none does."""
    scaling = getattr(cfg, "rope_scaling", None)
    if name == "lm" and scaling is not None and scaling.rope_type == "longrope":  # only Phi-3 has it
        fam = phi3
    elif name == "lm" and getattr(cfg, "attn_sinks", False):  # only gpt-oss has attention sinks
        fam = gpt_oss
    elif name == "lm" and getattr(cfg, "mla", None) is not None:  # multi-head latent attention
        fam = deepseek
    elif name == "lm" and getattr(cfg, "moe", None) is not None:  # Qwen's q/k norm or gated shared expert
        moe_qwen = cfg.qk_norm or cfg.moe.shared_expert_gate or cfg.resolved_qkv_bias != cfg.resolved_out_bias
        fam = qwen_moe if moe_qwen else mixtral
    elif name == "lm" and (cfg.norm == "rmsnorm_offset" or cfg.norm_position == "sandwich"):
        fam = gemma3 if cfg.qk_norm or cfg.rope_local_base is not None else gemma2  # Gemma3: q/k norms, two RoPEs
    elif name == "lm" and (cfg.norm_position == "post_sublayer" or cfg.qk_norm_full):
        fam = olmo2
    elif name == "lm" and cfg.position == "rope" and (cfg.norm == "layernorm" or cfg.parallel_residual):
        fam = gpt_neox
    elif name == "lm" and cfg.position == "rope":
        qwen_like = cfg.qk_norm or cfg.resolved_qkv_bias != cfg.resolved_out_bias
        # residual dropout: Phi-3 is the LLaMA-style HF decoder that has it (resid_pdrop)
        # and partial rotary (Phi-4-mini)
        fam = (qwen if qwen_like else phi3 if cfg.dropout or cfg.rotary_dim is not None
               else mistral if cfg.sliding_window is not None else llama)
    elif name == "lm":
        fam = gpt2
    elif name in ("encoder", "classifier") and cfg.positions_from_padding:  # RoBERTa's offset positions
        fam = roberta
    elif name in ("encoder", "classifier") and cfg.position == "rope":
        fam = modernbert
    elif name in ("encoder", "classifier"):
        fam = bert
    elif name == "vit" and dinov2.is_dinov2(cfg):  # LayerScale, the cls_mean head or no head
        fam = dinov2
    elif name in ("vit", "swin"):
        fam = vision
    elif name == "seq2seq":
        fam = t5
    else:
        raise ConversionError([f"model {name!r} has no Hugging Face export (supported: lm, encoder, "
                               "classifier, vit, swin, seq2seq)"])
    problems = fam.export_problems(name, cfg)
    # options only some families write: RoBERTa's positions, ModernBERT's first layer (§36),
    # a local RoPE (Gemma3 §33, ModernBERT), partial rotary and the parallel block (§35)
    only = {"positions_from_padding": (False, (roberta,)), "first_attn_norm": (True, (modernbert,)),
            "rope_local_base": (None, (gemma3, modernbert)), "rope_local_scaling": (None, (gemma3,)),
            "rotary_dim": (None, (gpt_neox, phi3)), "parallel_residual": (False, (gpt_neox,)),
            "qk_norm_full": (False, (olmo2,))}
    problems = [*problems, *(f"{k}={getattr(cfg, k)!r} (only {' and '.join(x.__name__.rsplit('.', 1)[-1] for x in f)} "
                             "export it)" for k, (neutral, f) in only.items()
                             if fam not in f and getattr(cfg, k, neutral) != neutral)]
    if getattr(cfg, "attn_scale", None) is not None and fam is not t5:  # only T5 writes a score scale
        problems = [*problems, f"attn_scale={cfg.attn_scale} (the family scales scores by 1/sqrt(head_dim))"]
    if problems:
        raise ConversionError([f"{name} config has no {fam.__name__.rsplit('.', 1)[-1]} HF "
                               f"equivalent: {p}" for p in problems])
    return fam
