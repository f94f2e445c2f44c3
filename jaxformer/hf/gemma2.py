"""Gemma2 (`Gemma2ForCausalLM`) <-> jaxformer `lm`.

Same attention names as LLaMA (q/k/v/o_proj, GQA, rotate-half RoPE with the same scaling
options, docs/numerics.md §6, §20), and what Gemma2 adds, field by field:
  * Embeddings scaled by sqrt(hidden_size) -> scale_embedding=True; HF rounds the normalizer to
    its compute dtype, jaxformer's Embedding to its own, float32 also under bfloat16 weights:
    a bf16 checkpoint gives HF's float32 logits on the same weights (docs/numerics.md §21).
  * RMSNorm scaled by (1 + w), computed in fp32 -> norm="rmsnorm_offset" (the stored w is
    Gemma's, copied as is).
  * Norms before and after attention and FFN (input_layernorm / post_attention_layernorm,
    pre_feedforward_layernorm / post_feedforward_layernorm) -> norm_position="sandwich":
    attn_norm, post_attn_norm, ffn_norm, post_ffn_norm.
  * GeGLU: hidden_activation gelu_pytorch_tanh -> ffn="geglu_tanh" (gelu -> "geglu").
  * Scores scaled by query_pre_attn_scalar ** -0.5 -> query_pre_attn_scalar.
  * attn_logit_softcapping -> attn_logit_softcap (cap * tanh(scores / cap) before the mask),
    final_logit_softcapping -> final_logit_softcap (on the logits); null = off.
  * layer_types (HF default: even layers sliding_attention, odd full_attention) with
    sliding_window -> layer_types, sliding_window; a sliding layer sees itself and the
    window - 1 keys before it, and decodes with a ring cache of sliding_window slots.
  * attention_bias covers all four attention projections; the MLP has no biases.
Accepted as transformers does: hidden_act (gemma-2 files carry it beside hidden_activation;
HF's Gemma2 reads only hidden_activation) when it names the same activation, and
cache_implementation "hybrid" (a generation setting, common.GENERIC_IGNORED).
Refused by name: use_bidirectional_attention true, other activations, a hidden_act that
disagrees with hidden_activation, sliding layers without a sliding_window, any key jaxformer
does not know.
"""
from __future__ import annotations

import numpy as np

from jaxformer.config.models import LMConfig
from jaxformer.hf import llama
from jaxformer.hf.common import (
    Family,
    Options,
    Renamer,
    build_config,
    hf_max_positions,
    layer_types_and_window,
    number_or_null,
    rename_all,
    rope_from_hf,
    rope_to_hf,
    token_ids,
)
from jaxformer.hf.exports import WRITES, Need

ARCHITECTURES = {"Gemma2ForCausalLM": "lm"}
MODEL_TYPE = "gemma2"
MODEL_TYPES = dict.fromkeys(ARCHITECTURES, MODEL_TYPE)
EMBED_KEYS = llama.EMBED_KEYS
DEFAULTS = dict(vocab_size=256000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                num_attention_heads=8, num_key_value_heads=4, head_dim=256, hidden_activation="gelu_pytorch_tanh",
                max_position_embeddings=8192, rms_norm_eps=1e-6, pad_token_id=0, eos_token_id=1, bos_token_id=2,
                tie_word_embeddings=True, rope_theta=10000.0, rope_scaling=None, rope_parameters=None,
                attention_bias=False, attention_dropout=0.0, query_pre_attn_scalar=256, sliding_window=4096,
                layer_types=None, final_logit_softcapping=30.0, attn_logit_softcapping=50.0,
                use_bidirectional_attention=None)
# HF activation -> gated ffn kind (gelu_pytorch_tanh is torch's tanh GELU, docs/numerics.md §2)
ACTIVATIONS = {"gelu_pytorch_tanh": "geglu_tanh", "gelu": "geglu"}
RULES = Renamer([
    ("model.embed_tokens.weight", "embed.embed_tokens.weight"),
    ("model.layers.{i}.self_attn.{attn}.{leaf}", "decoder.layers.{i}.self_attn.{attn}.{leaf}"),
    ("model.layers.{i}.mlp.{mlp}.{leaf}", "decoder.layers.{i}.ffn.{mlp}.{leaf}"),
    ("model.layers.{i}.input_layernorm.weight", "decoder.layers.{i}.attn_norm.weight"),
    ("model.layers.{i}.post_attention_layernorm.weight", "decoder.layers.{i}.post_attn_norm.weight"),
    ("model.layers.{i}.pre_feedforward_layernorm.weight", "decoder.layers.{i}.ffn_norm.weight"),
    ("model.layers.{i}.post_feedforward_layernorm.weight", "decoder.layers.{i}.post_ffn_norm.weight"),
    ("model.norm.weight", "decoder.final_norm.weight"),
    ("lm_head.weight", "lm_head.weight"),
])


def config_from_hf(raw: dict, arch: str, keys=()) -> tuple[str, LMConfig, list[str]]:
    o = Options(raw, DEFAULTS, family=f"gemma2 {arch}")
    d, heads, kv = o["hidden_size"], o["num_attention_heads"], o["num_key_value_heads"]
    act = o.require("hidden_activation", ACTIVATIONS, f"jaxformer's Gemma2 FFN gates with {sorted(ACTIVATIONS)}")
    if "hidden_act" in raw:  # published files carry both; HF's Gemma2 reads hidden_activation only
        o.require("hidden_act", (act,), f"transformers' Gemma2 ignores hidden_act and gates with "
                  f"hidden_activation={act!r}; a different value is ambiguous (make them agree)")
    o.require("use_bidirectional_attention", (None, False), "jaxformer's LM attention is causal")
    layer_types, window = layer_types_and_window(o, o["num_hidden_layers"])
    vocab, max_pos = o["vocab_size"], o["max_position_embeddings"]
    rope_base, rope_scaling = rope_from_hf(o, max_pos)
    bias = bool(o["attention_bias"])
    head_dim = o["head_dim"]
    fields = dict(
        vocab_size=vocab, d_model=d, num_heads=heads, num_kv_heads=None if kv in (None, heads) else kv,
        head_dim=None if head_dim == d // heads and d % heads == 0 else head_dim, d_ff=o["intermediate_size"],
        num_layers=o["num_hidden_layers"], ffn=ACTIVATIONS.get(act, "geglu_tanh"), norm="rmsnorm_offset",
        norm_eps=float(o["rms_norm_eps"]), norm_position="sandwich", final_norm=True, bias=bias,
        attn_qkv_bias=bias, attn_out_bias=bias, ffn_bias=False, dropout=0.0, attn_dropout=float(o["attention_dropout"]),
        ffn_dropout=0.0, embed_dropout=0.0, position="rope", rope_base=rope_base, rope_scaling=rope_scaling,
        max_len=max_pos, scale_embedding=True, tie_embeddings=bool(o["tie_word_embeddings"]),
        sliding_window=window, layer_types=layer_types, query_pre_attn_scalar=number_or_null(o, "query_pre_attn_scalar"),
        attn_logit_softcap=number_or_null(o, "attn_logit_softcapping"),
        final_logit_softcap=number_or_null(o, "final_logit_softcapping"), dtype="float32",
        **token_ids(o, vocab, need_bos_eos=True))
    if fields["query_pre_attn_scalar"] is None:
        o.problem("query_pre_attn_scalar", "Gemma2 scales scores by its -1/2 power; it must be set")
    return "lm", build_config(LMConfig, fields, o), o.notes


def tensor_fn(name: str, cfg: LMConfig, arch: str):
    return llama.tensor_fn(name, cfg, arch, rules=RULES, what="Gemma2")


# ----------------------------------------------------------------------------- export
# LLaMA's with Gemma's (1 + w) sandwich norms, scaled embeddings, gated GELU, the score scalar,
# soft caps and per-layer windows
EXPORTS = {"lm": dict(
    llama.DECODER, norm="rmsnorm_offset", norm_position="sandwich", scale_embedding=True, sliding_window=WRITES,
    layer_types=WRITES, attn_logit_softcap=WRITES, final_logit_softcap=WRITES, **llama.biases("ffn"),
    ffn=Need(lambda c: c.feedforward.kind in ACTIVATIONS.values(),
             f"feedforward.kind={{feedforward.kind!r}} (Gemma2ForCausalLM gates with {sorted(ACTIVATIONS.values())})"),
    query_pre_attn_scalar=Need(lambda c: c.attention.query_pre_attn_scalar is not None, "query_pre_attn_scalar=None "
                               "(Gemma2ForCausalLM needs a number; head_dim gives 1/sqrt(head_dim))"))}


def claims(c) -> bool:
    return c.norms.kind == "rmsnorm_offset" or c.norms.norm_position == "sandwich"


def config_to_hf(name: str, cfg: LMConfig) -> dict:
    eos = list(cfg.eos_id) if isinstance(cfg.eos_id, tuple) else cfg.eos_id
    types = list(cfg.attention.layer_types) if cfg.attention.layer_types is not None else [
        "sliding_attention" if local else "full_attention" for local in cfg.local_layers()]
    # HF builds the sliding mask even when no layer uses it: a window as long as the context
    window = cfg.attention.sliding_window if cfg.attention.sliding_window is not None else cfg.max_len
    return {"architectures": ["Gemma2ForCausalLM"], "model_type": MODEL_TYPE, "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.d_model, "intermediate_size": cfg.feedforward.d_ff, "num_hidden_layers": cfg.num_layers,
            "num_attention_heads": cfg.attention.num_heads, "num_key_value_heads": cfg.resolved_kv_heads,
            "head_dim": cfg.resolved_head_dim,
            "hidden_activation": next(k for k, v in ACTIVATIONS.items() if v == cfg.feedforward.kind),
            "max_position_embeddings": hf_max_positions(cfg), "rms_norm_eps": cfg.norms.norm_eps, **rope_to_hf(cfg),
            "attention_bias": cfg.resolved_qkv_bias, "attention_dropout": cfg.attention.attn_dropout,
            "query_pre_attn_scalar": cfg.attention.query_pre_attn_scalar, "sliding_window": window,
            "layer_types": types, "final_logit_softcapping": cfg.final_logit_softcap,
            "attn_logit_softcapping": cfg.attention.attn_logit_softcap,
            "tie_word_embeddings": cfg.tie_embeddings, "bos_token_id": cfg.bos_id, "eos_token_id": eos,
            "pad_token_id": cfg.pad_id, "initializer_range": 0.02, "dtype": "float32"}


def state_dict_to_hf(sd: dict[str, np.ndarray], name: str, cfg: LMConfig) -> dict[str, np.ndarray]:
    return rename_all(sd, RULES.to_hf, "Gemma2")


FAMILY = Family(name="gemma2", architectures=ARCHITECTURES, model_types=MODEL_TYPES, config_from_hf=config_from_hf,
                tensor_fn=tensor_fn, config_to_hf=config_to_hf, state_dict_to_hf=state_dict_to_hf,
                hf_defaults=dict.fromkeys(ARCHITECTURES, DEFAULTS), exports=EXPORTS, claims=claims,
                embed_keys=EMBED_KEYS)
