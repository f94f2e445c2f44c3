"""OLMo 2 (`Olmo2ForCausalLM`) <-> jaxformer `lm`.

A LLaMA-style decoder (jaxformer/hf/llama.py: q/k/v/o_proj, GQA, SwiGLU, RMSNorm, rotate-half
RoPE with the same scaling options, docs/numerics.md §6, §20). What OLMo 2 changes, and how
it maps (docs/numerics.md §35):
  * Norms on the sublayer OUTPUTS, none on their inputs: h = x + norm(attn(x)), then
    h + norm(mlp(h)) -> norm_position="post_sublayer"; post_attention_layernorm ->
    post_attn_norm, post_feedforward_layernorm -> post_ffn_norm (there is no input_layernorm).
  * q and k RMSNorm over the FULL projected width (q_norm weight [H * K], k_norm [G * K], eps
    rms_norm_eps), applied before the head split and before RoPE -> qk_norm_full=True
    (Qwen3's qk_norm is per head, weight [K]).
  * head_dim: transformers reads config.json's head_dim when present (hidden_size /
    num_attention_heads otherwise); export writes it.
  * attention_bias covers all four attention projections; the MLP has no biases;
    attention_dropout -> attn_dropout.
Refused by name: activations other than silu, any key jaxformer does not know.
"""
from __future__ import annotations

import numpy as np

from jaxformer.config.models import LMConfig
from jaxformer.hf import llama
from jaxformer.hf.common import Family, Options, Renamer, build_config, rename_all

ARCHITECTURES = {"Olmo2ForCausalLM": "lm"}
MODEL_TYPE = "olmo2"
MODEL_TYPES = dict.fromkeys(ARCHITECTURES, MODEL_TYPE)
EMBED_KEYS = llama.EMBED_KEYS
DEFAULTS = dict(vocab_size=50304, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                num_attention_heads=32, num_key_value_heads=None, head_dim=None, hidden_act="silu",
                max_position_embeddings=2048, pad_token_id=1, bos_token_id=None, eos_token_id=50279,
                tie_word_embeddings=False, rope_theta=10000.0, rope_scaling=None, rope_parameters=None,
                attention_bias=False, attention_dropout=0.0, rms_norm_eps=1e-5)
RULES = Renamer([
    ("model.embed_tokens.weight", "embed.embed_tokens.weight"),
    ("model.layers.{i}.self_attn.{attn}.{leaf}", "decoder.layers.{i}.self_attn.{attn}.{leaf}"),
    ("model.layers.{i}.self_attn.q_norm.weight", "decoder.layers.{i}.self_attn.q_norm.weight"),
    ("model.layers.{i}.self_attn.k_norm.weight", "decoder.layers.{i}.self_attn.k_norm.weight"),
    ("model.layers.{i}.mlp.{mlp}.{leaf}", "decoder.layers.{i}.ffn.{mlp}.{leaf}"),
    ("model.layers.{i}.post_attention_layernorm.weight", "decoder.layers.{i}.post_attn_norm.weight"),
    ("model.layers.{i}.post_feedforward_layernorm.weight", "decoder.layers.{i}.post_ffn_norm.weight"),
    ("model.norm.weight", "decoder.final_norm.weight"),
    ("lm_head.weight", "lm_head.weight"),
])


def config_from_hf(raw: dict, arch: str, keys=()) -> tuple[str, LMConfig, list[str]]:
    o = Options(raw, DEFAULTS, family=f"olmo2 {arch}")
    bias = o["attention_bias"]
    fields = llama.decoder_fields(o, qkv_bias=bias, out_bias=bias, ffn_bias=False)
    fields.update(norm_position="post_sublayer", qk_norm_full=True)
    return "lm", build_config(LMConfig, fields, o), o.notes


def tensor_fn(name: str, cfg: LMConfig, arch: str):
    return llama.tensor_fn(name, cfg, arch, rules=RULES, what="OLMo 2")


# ----------------------------------------------------------------------------- export
# LLaMA's with norms on the sublayer outputs and full-width q/k norms, no MLP biases
EXPORTS = {"lm": dict(llama.DECODER, norm_position="post_sublayer", qk_norm_full=True, layer_types=None,
                      **llama.biases("ffn"))}


def config_to_hf(name: str, cfg: LMConfig) -> dict:
    out = llama.common_config_to_hf(cfg)
    return {"architectures": ["Olmo2ForCausalLM"], "model_type": MODEL_TYPE, **out,
            "attention_bias": cfg.resolved_qkv_bias}


def state_dict_to_hf(sd: dict[str, np.ndarray], name: str, cfg: LMConfig) -> dict[str, np.ndarray]:
    return rename_all(sd, RULES.to_hf, "OLMo 2")


FAMILY = Family(name="olmo2", architectures=ARCHITECTURES, model_types=MODEL_TYPES, config_from_hf=config_from_hf,
                tensor_fn=tensor_fn, config_to_hf=config_to_hf, state_dict_to_hf=state_dict_to_hf,
                hf_defaults=dict.fromkeys(ARCHITECTURES, DEFAULTS), exports=EXPORTS,
                claims=lambda c: c.norms.norm_position == "post_sublayer" or c.attention.qk_norm_full,
                embed_keys=EMBED_KEYS)
