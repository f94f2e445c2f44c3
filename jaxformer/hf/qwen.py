"""Qwen2 (`Qwen2ForCausalLM`) and Qwen3 (`Qwen3ForCausalLM`) <-> jaxformer `lm`.

Both are LLaMA-style decoders (jaxformer/hf/llama.py: same names, RMSNorm, SwiGLU, GQA,
rotate-half RoPE with the same scaling options). What differs, and how it maps:
  * Qwen2: biases on q/k/v only (no o_proj bias, no MLP bias) -> attn_qkv_bias=True,
    attn_out_bias=False, ffn_bias=False. head_dim = hidden_size / num_attention_heads unless
    config.json gives one.
  * Qwen3: per-head RMSNorm on q and k before RoPE (`self_attn.q_norm` / `k_norm`, weights
    [head_dim], eps rms_norm_eps) -> qk_norm=True; attention_bias covers all four attention
    projections; head_dim defaults to 128.
  * use_mrope (Qwen2.5's config.json ships `false`): false is plain RoPE; true is an error.
  * Sliding windows: use_sliding_window must be false (then sliding_window and
    max_window_layers have no effect, as in HF), and layer_types, when given, must be all
    "full_attention"; anything else is an error naming the option.
"""
from __future__ import annotations

import numpy as np

from jaxformer.config.models import LMConfig
from jaxformer.hf import llama
from jaxformer.hf.common import Family, Options, Renamer, build_config, full_attention_only, rename_all
from jaxformer.hf.exports import WRITES, Need

ARCHITECTURES = {"Qwen2ForCausalLM": "lm", "Qwen3ForCausalLM": "lm"}
MODEL_TYPES = {"Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}
EMBED_KEYS = llama.EMBED_KEYS
_SHARED = dict(vocab_size=151936, hidden_size=4096, intermediate_size=22016, num_hidden_layers=32,
               num_attention_heads=32, num_key_value_heads=32, hidden_act="silu",
               max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=False,
               rope_theta=10000.0, rope_scaling=None, rope_parameters=None, use_sliding_window=False,
               sliding_window=None, max_window_layers=28, layer_types=None, attention_dropout=0.0,
               bos_token_id=None, eos_token_id=None, pad_token_id=None, use_mrope=False)
DEFAULTS = {"Qwen2ForCausalLM": dict(_SHARED, head_dim=None),
            "Qwen3ForCausalLM": dict(_SHARED, head_dim=128, attention_bias=False)}
RULES = Renamer(llama.RULES.rules + [
    ("model.layers.{i}.self_attn.q_norm.weight", "decoder.layers.{i}.self_attn.q_norm.weight"),
    ("model.layers.{i}.self_attn.k_norm.weight", "decoder.layers.{i}.self_attn.k_norm.weight"),
])


def config_from_hf(raw: dict, arch: str, keys=()) -> tuple[str, LMConfig, list[str]]:
    o = Options(raw, DEFAULTS[arch], family=f"{MODEL_TYPES[arch]} {arch}")
    full_attention_only(o)
    o.require("use_mrope", (False,), "multimodal RoPE (Qwen2-VL's position sections) is not implemented")
    if arch == "Qwen2ForCausalLM":
        fields = llama.decoder_fields(o, qkv_bias=True, out_bias=False, ffn_bias=False)
    else:
        bias = o["attention_bias"]
        fields = llama.decoder_fields(o, qkv_bias=bias, out_bias=bias, ffn_bias=False, qk_norm=True)
    return "lm", build_config(LMConfig, fields, o), o.notes


def tensor_fn(name: str, cfg: LMConfig, arch: str):
    return llama.tensor_fn(name, cfg, arch, rules=RULES, what=arch)


# ----------------------------------------------------------------------------- export
def architecture(cfg) -> str:
    return "Qwen3ForCausalLM" if cfg.attention.qk_norm else "Qwen2ForCausalLM"


# LLaMA's with Qwen3's q/k norms (qk_norm names the architecture) and Qwen's biases
EXPORTS = {"lm": dict(
    llama.DECODER, qk_norm=WRITES, **llama.biases("ffn"),
    attn_qkv_bias=Need(lambda c: c.attention.qk_norm or c.resolved_qkv_bias is True,
                       "qkv_bias={resolved_qkv_bias} (Qwen2's q/k/v projections have biases)"),
    attn_out_bias=Need(lambda c: c.resolved_out_bias == (c.resolved_qkv_bias if c.attention.qk_norm else False),
                       "out_bias={resolved_out_bias} with qkv_bias={resolved_qkv_bias} (Qwen3's attention_bias "
                       "covers all four projections; Qwen2's o_proj has none)"))}


def claims(c) -> bool:  # q/k norms (Qwen3) or biases on q/k/v only (Qwen2)
    return c.positions.kind == "rope" and (c.attention.qk_norm or c.resolved_qkv_bias != c.resolved_out_bias)


def config_to_hf(name: str, cfg: LMConfig) -> dict:
    arch = architecture(cfg)
    out = {"architectures": [arch], "model_type": MODEL_TYPES[arch], **llama.common_config_to_hf(cfg),
           "use_sliding_window": False, "max_window_layers": cfg.num_layers}
    if arch == "Qwen3ForCausalLM":
        out["attention_bias"] = cfg.resolved_qkv_bias
    return out


def state_dict_to_hf(sd: dict[str, np.ndarray], name: str, cfg: LMConfig) -> dict[str, np.ndarray]:
    return rename_all(sd, RULES.to_hf, architecture(cfg))


FAMILY = Family(name="qwen", architectures=ARCHITECTURES, model_types=MODEL_TYPES, config_from_hf=config_from_hf,
                tensor_fn=tensor_fn, config_to_hf=config_to_hf, state_dict_to_hf=state_dict_to_hf,
                hf_defaults=DEFAULTS, exports=EXPORTS, claims=claims, embed_keys=EMBED_KEYS)
