"""Mistral (`MistralForCausalLM`) <-> jaxformer `lm`.

A LLaMA-style decoder (jaxformer/hf/llama.py: same names, RMSNorm, SwiGLU, GQA, rotate-half
RoPE with the same scaling options, no biases) whose every layer attends within a sliding
window. How it maps:
  * sliding_window -> sliding_window: a query sees itself and the window - 1 keys before it,
    as transformers' sliding_window_overlay (kv_idx > q_idx - sliding_window; docs/numerics.md
    §21); null = full attention. In KV-cache decoding each layer's cache is a ring of
    sliding_window slots.
  * layer_types: MistralForCausalLM applies sliding_window to every layer whatever this says
    (transformers only warns), so it is accepted only where it agrees: every entry
    "sliding_attention" with a window, or "full_attention" without one.
  * head_dim absent or null: hidden_size / num_attention_heads.
Export writes MistralForCausalLM for an lm with a sliding_window on every layer; without a
window the same model is a LLaMA and exports as LlamaForCausalLM (identical logits).
"""
from __future__ import annotations

import numpy as np

from jaxformer.config.models import LMConfig
from jaxformer.hf import llama
from jaxformer.hf.common import Family, Options, build_config, rename_all, uniform_window
from jaxformer.hf.exports import WRITES

ARCHITECTURES = {"MistralForCausalLM": "lm"}
MODEL_TYPE = "mistral"
MODEL_TYPES = dict.fromkeys(ARCHITECTURES, MODEL_TYPE)
EMBED_KEYS = llama.EMBED_KEYS
DEFAULTS = dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                num_attention_heads=32, num_key_value_heads=8, head_dim=None, hidden_act="silu",
                max_position_embeddings=4096 * 32, rms_norm_eps=1e-6, tie_word_embeddings=False,
                rope_theta=10000.0, rope_scaling=None, rope_parameters=None, sliding_window=4096,
                layer_types=None, attention_dropout=0.0, bos_token_id=1, eos_token_id=2, pad_token_id=None)
RULES = llama.RULES


def config_from_hf(raw: dict, arch: str, keys=()) -> tuple[str, LMConfig, list[str]]:
    o = Options(raw, DEFAULTS, family=f"mistral {arch}")
    window = uniform_window(o)
    fields = llama.decoder_fields(o, qkv_bias=False, out_bias=False, ffn_bias=False)
    return "lm", build_config(LMConfig, dict(fields, sliding_window=window), o), o.notes


def tensor_fn(name: str, cfg: LMConfig, arch: str):
    return llama.tensor_fn(name, cfg, arch, rules=RULES, what="Mistral")


# ----------------------------------------------------------------------------- export
# LLaMA's with the window it applies to every layer, and no biases
EXPORTS = {"lm": dict(llama.DECODER, sliding_window=WRITES, layer_types=None, **llama.biases("qkv", "out", "ffn"))}


def config_to_hf(name: str, cfg: LMConfig) -> dict:
    return {"architectures": ["MistralForCausalLM"], "model_type": MODEL_TYPE, **llama.common_config_to_hf(cfg),
            "sliding_window": cfg.attention.sliding_window}


def state_dict_to_hf(sd: dict[str, np.ndarray], name: str, cfg: LMConfig) -> dict[str, np.ndarray]:
    return rename_all(sd, RULES.to_hf, "Mistral")


FAMILY = Family(name="mistral", architectures=ARCHITECTURES, model_types=MODEL_TYPES, config_from_hf=config_from_hf,
                tensor_fn=tensor_fn, config_to_hf=config_to_hf, state_dict_to_hf=state_dict_to_hf,
                hf_defaults=dict.fromkeys(ARCHITECTURES, DEFAULTS), exports=EXPORTS,
                claims=lambda c: c.positions.kind == "rope" and c.attention.sliding_window is not None,
                embed_keys=EMBED_KEYS)
