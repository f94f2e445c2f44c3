"""LLaMA (`LlamaForCausalLM`) <-> jaxformer `lm`, LLaMA flavour (configs/llama.yaml).

Mapping and its deliberate details:
  * Names only, no layout change: HF LLaMA stores Linear weights [out, in] like torch_ref.
    RoPE is HF's rotate-half layout in both (docs/numerics.md §6), so q/k need no permutation.
  * GQA: num_key_value_heads -> num_kv_heads (query head h reads kv head h // (H / G) in both).
  * head_dim (HF 5.x) -> head_dim (absent: hidden_size / num_attention_heads).
  * rms_norm_eps -> norm_eps; rope_theta (5.x: rope_parameters.rope_theta) -> rope_base;
    max_position_embeddings -> max_len (the RoPE table length).
  * RoPE scaling (5.x rope_parameters, 4.x rope_scaling) of rope_type linear, dynamic, llama3
    (every Llama 3.x) and yarn -> rope_scaling (common.rope_from_hf, docs/numerics.md §20);
    any other rope_type or key is an error naming it.
  * hidden_act must be "silu" (SwiGLU). attention_bias -> attn_qkv_bias and attn_out_bias,
    mlp_bias -> ffn_bias.
  * eos_token_id may be a list (generation stops at any); bos/eos outside the vocabulary are
    kept as metadata. A tied config whose checkpoint stores a different lm_head.weight loads
    untied, as transformers 5.x does (jaxformer/hf/__init__.py read_config).
  * nanotron exports (SmolLM) write `is_llama_config` (a marker: ignored) and
    `rope_interleaved: false` (rotate-half RoPE, which is HF's; true is an error).
  * pretraining_tp only splits the same matmuls into slices: accepted. Rotary `inv_freq`
    buffers of old checkpoints are recomputed from rope_theta, so they are skipped.
"""
from __future__ import annotations

import numpy as np

from jaxformer.config.models import LMConfig
from jaxformer.hf.common import (
    Family,
    MappingError,
    Options,
    Renamer,
    build_config,
    ffn_from_hf,
    ffn_to_hf,
    hf_max_positions,
    rename_all,
    rope_from_hf,
    rope_to_hf,
    token_ids,
)
from jaxformer.hf.exports import WRITES, Ignored, Need

ARCHITECTURES = {"LlamaForCausalLM": "lm"}
MODEL_TYPE = "llama"
MODEL_TYPES = dict.fromkeys(ARCHITECTURES, MODEL_TYPE)  # config.json model_type of each
EMBED_KEYS = ("model.embed_tokens.weight",)  # the table a tied lm_head.weight copies
DEFAULTS = dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                num_attention_heads=32, num_key_value_heads=None, head_dim=None, hidden_act="silu",
                max_position_embeddings=2048, rms_norm_eps=1e-6, pretraining_tp=1,
                tie_word_embeddings=False, rope_theta=10000.0, rope_scaling=None, rope_parameters=None,
                attention_bias=False, attention_dropout=0.0, mlp_bias=False, bos_token_id=1,
                eos_token_id=2, pad_token_id=None, rope_interleaved=False)
RULES = Renamer([
    ("model.embed_tokens.weight", "embed.embed_tokens.weight"),
    ("model.layers.{i}.self_attn.{attn}.{leaf}", "decoder.layers.{i}.self_attn.{attn}.{leaf}"),
    ("model.layers.{i}.mlp.{mlp}.{leaf}", "decoder.layers.{i}.ffn.{mlp}.{leaf}"),
    ("model.layers.{i}.input_layernorm.weight", "decoder.layers.{i}.attn_norm.weight"),
    ("model.layers.{i}.post_attention_layernorm.weight", "decoder.layers.{i}.ffn_norm.weight"),
    ("model.norm.weight", "decoder.final_norm.weight"),
    ("lm_head.weight", "lm_head.weight"),
])


def decoder_fields(o: Options, *, qkv_bias: bool, out_bias: bool, ffn_bias: bool,
                   default_head_dim=None, qk_norm: bool = False, rope: tuple | None = None) -> dict:
    """The LMConfig fields of a LLaMA-style decoder (LLaMA, Qwen2, Qwen3, Phi-3) from its
    options. rope: (rope_base, rope_scaling) the family read itself (Phi-3's longrope), else
    common.rope_from_hf reads them."""
    d, heads = o["hidden_size"], o["num_attention_heads"]
    ffn = ffn_from_hf(o, "hidden_act", gated=True, why="jaxformer's LLaMA FFN is SwiGLU (silu gate)")
    kv = o["num_key_value_heads"]
    head_dim = o["head_dim"] if "head_dim" in o.defaults else default_head_dim
    vocab, max_pos = o["vocab_size"], o["max_position_embeddings"]
    rope_base, rope_scaling = rope if rope is not None else rope_from_hf(o, max_pos)
    ids = token_ids(o, vocab, need_bos_eos=True)
    return dict(
        vocab_size=vocab, d_model=d, num_heads=heads,
        num_kv_heads=None if kv in (None, heads) else kv,
        head_dim=None if head_dim in (None, d // heads) and d % heads == 0 else head_dim,
        d_ff=o["intermediate_size"], num_layers=o["num_hidden_layers"], ffn=ffn, norm="rmsnorm",
        norm_eps=float(o["rms_norm_eps"]), norm_position="pre", final_norm=True, bias=bool(qkv_bias),
        attn_qkv_bias=bool(qkv_bias), attn_out_bias=bool(out_bias), ffn_bias=bool(ffn_bias),
        qk_norm=qk_norm, dropout=0.0, attn_dropout=float(o["attention_dropout"]), ffn_dropout=0.0,
        embed_dropout=0.0, position="rope", rope_base=rope_base, rope_scaling=rope_scaling,
        max_len=max_pos, scale_embedding=False, tie_embeddings=bool(o["tie_word_embeddings"]),
        dtype="float32", **ids)


def config_from_hf(raw: dict, arch: str, keys=()) -> tuple[str, LMConfig, list[str]]:
    o = Options(raw, DEFAULTS, family=f"llama {arch}",
                ignored={"pretraining_tp": "slices the same matmuls (tensor-parallel pretraining)",
                         "is_llama_config": "nanotron's export marker (SmolLM); transformers reads nothing from it"})
    o["pretraining_tp"]
    o.require("rope_interleaved", (False,), "transformers' Llama rotates halves whatever this says, so an "
              "interleaved-RoPE checkpoint would not run as trained")
    attn_bias, mlp_bias = o["attention_bias"], o["mlp_bias"]
    fields = decoder_fields(o, qkv_bias=attn_bias, out_bias=attn_bias, ffn_bias=mlp_bias)
    return "lm", build_config(LMConfig, fields, o), o.notes


def tensor_fn(name: str, cfg: LMConfig, arch: str, rules: Renamer = RULES, what: str = "LLaMA"):
    def fn(key: str, x: np.ndarray):
        if key.endswith("rotary_emb.inv_freq"):
            return None  # recomputed from rope_theta
        if key == "lm_head.weight" and cfg.tie_embeddings:
            return None  # a copy identical to embed_tokens (hf.read_config checked it; HF ties them)
        new = rules.to_torch(key)
        if new is None:
            raise MappingError(f"unmapped: {key} has no jaxformer lm ({what}) equivalent")
        return {new: x}
    return fn


# ----------------------------------------------------------------------------- export
ROPE_SCALING = Need(lambda c: c.positions.rope_scaling is None or c.positions.rope_scaling.rope_type != "longrope",
                    "positions.rope_scaling={positions.rope_scaling.rope_type!r} (only Phi-3 writes longrope)")
SAME_ATTENTION_BIAS = Need(lambda c: c.resolved_out_bias == c.resolved_qkv_bias,
                           "attention.attn_qkv_bias={resolved_qkv_bias} with "
                           "attention.attn_out_bias={resolved_out_bias} "
                           "(one attention_bias covers all four attention projections)")
_BIAS_FIELDS = {"qkv": "attn_qkv_bias", "out": "attn_out_bias", "ffn": "ffn_bias"}


def biases(*kinds: str, want: bool = False) -> dict:
    """The declaration of a decoder whose biases of `kinds` ("qkv", "out", "ffn") are `want`."""
    return {_BIAS_FIELDS[k]: Need(lambda c, k=k: getattr(c, f"resolved_{k}_bias") == want,
                                  f"{k}_bias={{resolved_{k}_bias}} (needs {want})") for k in kinds}


# What every LLaMA-style decoder (LLaMA, Mistral, Qwen, OLMo 2, Phi-3, the MoE ones) exports of
# an lm (common_config_to_hf) and requires of it; each family changes what it writes otherwise
DECODER = dict(
    vocab_size=WRITES, d_model=WRITES, num_heads=WRITES, num_kv_heads=WRITES, head_dim=WRITES, d_ff=WRITES,
    num_layers=WRITES, max_len=WRITES, norm_eps=WRITES, rope_base=WRITES, rope_scaling=ROPE_SCALING,
    attn_dropout=WRITES, tie_embeddings=WRITES, bos_id=WRITES, eos_id=WRITES, pad_id=WRITES,
    bias=WRITES,  # the default of the three below, which the family declares
    attn_qkv_bias=WRITES, attn_out_bias=SAME_ATTENTION_BIAS, ffn_bias=WRITES,
    position="rope", norm="rmsnorm", ffn="swiglu", norm_position="pre", final_norm=True, scale_embedding=False,
    dropout=0.0, ffn_dropout=0.0, embed_dropout=0.0, type_vocab_size=0, embed_norm=False, qk_norm=False,
    sliding_window=None, layer_types=Ignored("without a sliding_window every layer attends fully"),
    attn_logit_softcap=None, query_pre_attn_scalar=None, final_logit_softcap=None)


def common_config_to_hf(cfg: LMConfig) -> dict:
    """The config.json keys LLaMA, Qwen2 and Qwen3 share."""
    eos = list(cfg.eos_id) if isinstance(cfg.eos_id, tuple) else cfg.eos_id
    return {"vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "intermediate_size": cfg.feedforward.d_ff,
            "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.attention.num_heads,
            "num_key_value_heads": cfg.resolved_kv_heads, "head_dim": cfg.resolved_head_dim,
            "hidden_act": ffn_to_hf(cfg.feedforward.kind), "max_position_embeddings": hf_max_positions(cfg),
            "rms_norm_eps": cfg.norms.norm_eps, **rope_to_hf(cfg), "attention_dropout": cfg.attention.attn_dropout,
            "tie_word_embeddings": cfg.tie_embeddings, "bos_token_id": cfg.bos_id, "eos_token_id": eos,
            "pad_token_id": cfg.pad_id, "initializer_range": 0.02, "dtype": "float32"}


def config_to_hf(name: str, cfg: LMConfig) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": MODEL_TYPE, **common_config_to_hf(cfg),
            "attention_bias": cfg.resolved_qkv_bias, "mlp_bias": cfg.resolved_ffn_bias, "pretraining_tp": 1}


def state_dict_to_hf(sd: dict[str, np.ndarray], name: str, cfg: LMConfig) -> dict[str, np.ndarray]:
    return rename_all(sd, RULES.to_hf, "LLaMA")


FAMILY = Family(name="llama", architectures=ARCHITECTURES, model_types=MODEL_TYPES, config_from_hf=config_from_hf,
                tensor_fn=tensor_fn, config_to_hf=config_to_hf, state_dict_to_hf=state_dict_to_hf,
                hf_defaults=dict.fromkeys(ARCHITECTURES, DEFAULTS), exports={"lm": DECODER},
                claims=lambda c: c.positions.kind == "rope", embed_keys=EMBED_KEYS)
