"""LLaMA (`LlamaForCausalLM`) <-> jaxformer `lm`, LLaMA flavour (configs/llama.yaml).

Mapping and its deliberate details:
  * Names only, no layout change: HF LLaMA stores Linear weights [out, in] like torch_ref.
    RoPE is HF's rotate-half layout in both (docs/numerics.md §6), so q/k need no permutation.
  * GQA: num_key_value_heads -> num_kv_heads (query head h reads kv head h // (H / G) in both).
  * head_dim (HF 5.x) -> head_dim (absent: hidden_size / num_attention_heads).
  * rms_norm_eps -> norm_eps; rope_theta (5.x: rope_parameters.rope_theta) -> rope_base;
    max_position_embeddings -> max_len (the RoPE table length).
  * hidden_act must be "silu" (SwiGLU). attention_bias and mlp_bias must be equal: jaxformer
    has one `bias` flag for the attention and FFN projections.
  * Unsupported (an error naming the option): RoPE scaling (rope_scaling / rope_parameters
    with a rope_type other than "default"), other activations, unequal biases.
  * pretraining_tp only splits the same matmuls into slices: accepted. Rotary `inv_freq`
    buffers of old checkpoints are recomputed from rope_theta, so they are skipped.
"""
from __future__ import annotations

import numpy as np

from jaxformer.config.models import LMConfig
from jaxformer.hf.common import (MappingError, Options, Renamer, build_config, ffn_from_hf, ffn_to_hf,
                                 rename_all, token_ids)

ARCHITECTURES = {"LlamaForCausalLM": "lm"}
MODEL_TYPE = "llama"
MODEL_TYPES = dict.fromkeys(ARCHITECTURES, MODEL_TYPE)  # config.json model_type of each
DEFAULTS = dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                num_attention_heads=32, num_key_value_heads=None, head_dim=None, hidden_act="silu",
                max_position_embeddings=2048, rms_norm_eps=1e-6, pretraining_tp=1,
                tie_word_embeddings=False, rope_theta=10000.0, rope_scaling=None, rope_parameters=None,
                attention_bias=False, attention_dropout=0.0, mlp_bias=False, bos_token_id=1,
                eos_token_id=2, pad_token_id=None)
RULES = Renamer([
    ("model.embed_tokens.weight", "embed.embed_tokens.weight"),
    ("model.layers.{i}.self_attn.{attn}.{leaf}", "decoder.layers.{i}.self_attn.{attn}.{leaf}"),
    ("model.layers.{i}.mlp.{mlp}.{leaf}", "decoder.layers.{i}.ffn.{mlp}.{leaf}"),
    ("model.layers.{i}.input_layernorm.weight", "decoder.layers.{i}.attn_norm.weight"),
    ("model.layers.{i}.post_attention_layernorm.weight", "decoder.layers.{i}.ffn_norm.weight"),
    ("model.norm.weight", "decoder.final_norm.weight"),
    ("lm_head.weight", "lm_head.weight"),
])


def _rope_theta(o: Options) -> float:
    """rope_theta from 5.x rope_parameters or 4.x rope_theta/rope_scaling; scaling is an error."""
    params, scaling = o["rope_parameters"], o["rope_scaling"]
    theta = o["rope_theta"]
    for key, spec in (("rope_parameters", params), ("rope_scaling", scaling)):
        if spec is None:
            continue
        if not isinstance(spec, dict):
            o.problem(key, "expected a mapping")
            continue
        kind = spec.get("rope_type", spec.get("type", "default"))
        extra = sorted(set(spec) - {"rope_type", "type", "rope_theta"})
        if kind != "default" or extra:
            o.problem(key, f"RoPE scaling ({kind!r}, {extra}) is not implemented; jaxformer has "
                           "plain RoPE only")
        theta = spec.get("rope_theta", theta)
    return float(theta)


def config_from_hf(raw: dict, arch: str, keys=()) -> tuple[str, LMConfig, list[str]]:
    o = Options(raw, DEFAULTS, family=f"llama {arch}",
                ignored={"pretraining_tp": "slices the same matmuls (tensor-parallel pretraining)"})
    o["pretraining_tp"]
    d, heads = o["hidden_size"], o["num_attention_heads"]
    ffn = ffn_from_hf(o, "hidden_act", gated=True, why="jaxformer's LLaMA FFN is SwiGLU (silu gate)")
    attn_bias, mlp_bias = o["attention_bias"], o["mlp_bias"]
    if bool(attn_bias) != bool(mlp_bias):
        o.problem("attention_bias", f"with mlp_bias={mlp_bias}: jaxformer has one bias flag for "
                                    "the attention and FFN projections")
    kv = o["num_key_value_heads"]
    head_dim = o["head_dim"]
    vocab = o["vocab_size"]
    ids = token_ids(o, vocab, need_bos_eos=True)
    fields = dict(
        vocab_size=vocab, d_model=d, num_heads=heads,
        num_kv_heads=None if kv in (None, heads) else kv,
        head_dim=None if head_dim in (None, d // heads) and d % heads == 0 else head_dim,
        d_ff=o["intermediate_size"], num_layers=o["num_hidden_layers"], ffn=ffn, norm="rmsnorm",
        norm_eps=float(o["rms_norm_eps"]), norm_position="pre", final_norm=True, bias=bool(attn_bias),
        dropout=0.0, attn_dropout=float(o["attention_dropout"]), ffn_dropout=0.0, embed_dropout=0.0,
        position="rope", rope_base=_rope_theta(o), max_len=o["max_position_embeddings"],
        scale_embedding=False, tie_embeddings=bool(o["tie_word_embeddings"]), dtype="float32", **ids)
    return "lm", build_config(LMConfig, fields, o), o.notes


def tensor_fn(name: str, cfg: LMConfig, arch: str):
    def fn(key: str, x: np.ndarray):
        if key.endswith("rotary_emb.inv_freq"):
            return None  # recomputed from rope_theta
        if key == "lm_head.weight" and cfg.tie_embeddings:
            return None  # HF ties it to embed_tokens and ignores the stored copy
        new = RULES.to_torch(key)
        if new is None:
            raise MappingError(f"unmapped: {key} has no jaxformer lm (LLaMA) equivalent")
        return {new: x}
    return fn


# ----------------------------------------------------------------------------- export
def export_problems(name: str, cfg) -> list[str]:
    want = dict(position="rope", norm="rmsnorm", ffn="swiglu", norm_position="pre", final_norm=True,
                scale_embedding=False, sliding_window=None, dropout=0.0, ffn_dropout=0.0,
                embed_dropout=0.0, type_vocab_size=0, embed_norm=False)
    return [f"{k}={getattr(cfg, k)!r} (LLaMA needs {v!r})" for k, v in want.items()
            if getattr(cfg, k, v) != v]


def config_to_hf(name: str, cfg: LMConfig) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": MODEL_TYPE,
            "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "intermediate_size": cfg.d_ff,
            "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
            "num_key_value_heads": cfg.resolved_kv_heads, "head_dim": cfg.resolved_head_dim,
            "hidden_act": ffn_to_hf(cfg.ffn), "max_position_embeddings": cfg.max_len, "rms_norm_eps": cfg.norm_eps,
            "rope_theta": cfg.rope_base,
            "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_base},
            "attention_bias": cfg.bias, "mlp_bias": cfg.bias, "attention_dropout": cfg.attn_dropout,
            "tie_word_embeddings": cfg.tie_embeddings, "pretraining_tp": 1, "bos_token_id": cfg.bos_id,
            "eos_token_id": cfg.eos_id, "pad_token_id": cfg.pad_id, "initializer_range": 0.02,
            "dtype": "float32"}


def state_dict_to_hf(sd: dict[str, np.ndarray], name: str, cfg: LMConfig) -> dict[str, np.ndarray]:
    return rename_all(sd, RULES.to_hf, "LLaMA")
