"""gpt-oss (`GptOssForCausalLM`) <-> jaxformer `lm` with attention sinks and a mixture of experts.

A LLaMA-style decoder (jaxformer/hf/llama.py names, RMSNorm pre-norm, rotate-half RoPE) with:
  * attention: q/k/v/o biases (attention_bias), GQA, head_dim, a learned per-head sink logit
    `self_attn.sinks` [H] in every softmax denominator (attn_sinks, docs/numerics.md §28);
    layer_types alternate sliding_attention / full_attention (HF default: even layers sliding)
    with sliding_window, as Gemma2's (jaxformer/hf/gemma2.py; ring caches when decoding).
  * RoPE: rope_theta (default 150000) and rope_parameters / rope_scaling yarn (HF default:
    factor 32, beta_fast 32, beta_slow 1, truncate false, original length 4096) through
    common.rope_from_hf.
  * every layer's FFN is the MoE (MoEConfig): router = Linear(D, E) with a bias, top-k of the
    logits then a softmax over the chosen k (topk_softmax); experts with biases and the clamped
    SwiGLU (swiglu_alpha, swiglu_limit; swiglu_clamped); num_local_experts -> num_experts,
    num_experts_per_tok -> top_k, intermediate_size -> d_expert, router_aux_loss_coef ->
    aux_loss_coef. The dense d_ff / ffn fields are unused (no dense layer).
Weights: HF stores the experts fused, as GptOssExperts' parameters:
    mlp.experts.gate_up_proj [E, D, 2F]   gate = columns 0::2, up = 1::2 (INTERLEAVED)
    mlp.experts.gate_up_proj_bias [E, 2F] the same interleaving
    mlp.experts.down_proj [E, F, D], down_proj_bias [E, D]
  -> ffn.experts.gate_proj / up_proj [E, F, D] (transposed), *_bias [E, F], down_proj [E, D, F].
Published checkpoints store gate_up_proj / down_proj as MXFP4 `*_blocks` + `*_scales` pairs:
jaxformer/hf/mxfp4.py dequantizes them on import (config.json's quantization_config must say
quant_method mxfp4). Export writes what transformers 5.x save_pretrained writes (fused,
interleaved, in the model's dtype); never MXFP4.
Refused by name: any other quantization, hidden_act other than silu, experts_per_token that
disagrees with num_experts_per_tok, unknown keys.
"""
from __future__ import annotations

import numpy as np

from jaxformer.config.models import LMConfig
from jaxformer.config.moe import MoEConfig
from jaxformer.hf import llama
from jaxformer.hf.common import (
    Family,
    Options,
    Renamer,
    build_config,
    ffn_from_hf,
    hf_max_positions,
    layer_types_and_window,
    rename_all,
    rope_from_hf,
    rope_to_hf,
    token_ids,
)
from jaxformer.hf.exports import WRITES, Ignored, Sub

ARCHITECTURES = {"GptOssForCausalLM": "lm"}
MODEL_TYPE = "gpt_oss"
MODEL_TYPES = dict.fromkeys(ARCHITECTURES, MODEL_TYPE)
EMBED_KEYS = llama.EMBED_KEYS
HF_YARN = dict(rope_type="yarn", factor=32.0, beta_fast=32.0, beta_slow=1.0, truncate=False,
               original_max_position_embeddings=4096)  # GptOssConfig's rope_parameters when absent
DEFAULTS = dict(vocab_size=201088, hidden_size=2880, intermediate_size=2880, num_hidden_layers=36,
                num_attention_heads=64, num_key_value_heads=8, head_dim=64, hidden_act="silu",
                max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=150000.0, rope_scaling=None,
                rope_parameters=HF_YARN, sliding_window=128, layer_types=None, attention_dropout=0.0,
                attention_bias=True, tie_word_embeddings=False, num_local_experts=128, num_experts_per_tok=4,
                swiglu_alpha=1.702, swiglu_limit=7.0, router_aux_loss_coef=0.001, bos_token_id=None,
                eos_token_id=None, pad_token_id=None)
IGNORED = {"output_router_logits": "a runtime switch (jaxformer returns router logits with return_aux)",
           "initial_context_length": "the original implementation's name of yarn's original length, "
                                     "which rope_parameters / rope_scaling carries"}
RULES = Renamer([
    ("model.embed_tokens.weight", "embed.embed_tokens.weight"),
    ("model.layers.{i}.self_attn.sinks", "decoder.layers.{i}.self_attn.sinks"),
    ("model.layers.{i}.self_attn.{attn}.{leaf}", "decoder.layers.{i}.self_attn.{attn}.{leaf}"),
    ("model.layers.{i}.mlp.router.{leaf}", "decoder.layers.{i}.ffn.router.{leaf}"),
    ("model.layers.{i}.mlp.experts.down_proj", "decoder.layers.{i}.ffn.experts.down_proj"),
    ("model.layers.{i}.mlp.experts.down_proj_bias", "decoder.layers.{i}.ffn.experts.down_proj_bias"),
    ("model.layers.{i}.input_layernorm.weight", "decoder.layers.{i}.attn_norm.weight"),
    ("model.layers.{i}.post_attention_layernorm.weight", "decoder.layers.{i}.ffn_norm.weight"),
    ("model.norm.weight", "decoder.final_norm.weight"),
    ("lm_head.weight", "lm_head.weight"),
])
GATE_UP = "model.layers.{i}.mlp.experts.gate_up_proj"
OURS = "decoder.layers.{i}.ffn.experts."


def _moe(o: Options) -> MoEConfig:
    k = o["num_experts_per_tok"]
    o.used.add("experts_per_token")
    if "experts_per_token" in o.raw and o.raw["experts_per_token"] != k:
        o.problem("experts_per_token", f"disagrees with num_experts_per_tok={k}")
    return MoEConfig(num_experts=o["num_local_experts"], top_k=k, router="topk_softmax",
                     d_expert=o["intermediate_size"], router_bias=True, expert_ffn="swiglu_clamped",
                     expert_bias=True, swiglu_alpha=float(o["swiglu_alpha"]), swiglu_limit=float(o["swiglu_limit"]),
                     aux_loss_coef=float(o["router_aux_loss_coef"]))


def config_from_hf(raw: dict, arch: str, keys=()) -> tuple[str, LMConfig, list[str]]:
    o = Options(raw, DEFAULTS, family=f"gpt_oss {arch}", ignored=IGNORED)
    d, heads, kv = o["hidden_size"], o["num_attention_heads"], o["num_key_value_heads"]
    ffn = ffn_from_hf(o, "hidden_act", gated=True, why="gpt-oss's experts use the clamped SwiGLU (silu)")
    quant = o.get("quantization_config")
    if quant is not None:
        if isinstance(quant, dict) and quant.get("quant_method") == "mxfp4":
            o.notes.append("MXFP4 expert weights dequantized at import (jaxformer/hf/mxfp4.py)")
        else:
            o.problem("quantization_config", "only quant_method mxfp4 (dequantized at import) is implemented")
    layer_types, window = layer_types_and_window(o, o["num_hidden_layers"])
    vocab, max_pos = o["vocab_size"], o["max_position_embeddings"]
    rope_base, rope_scaling = rope_from_hf(o, max_pos, default_theta=DEFAULTS["rope_theta"])
    bias, head_dim = bool(o["attention_bias"]), o["head_dim"]
    fields = dict(
        vocab_size=vocab, d_model=d, num_heads=heads, num_kv_heads=None if kv in (None, heads) else kv,
        head_dim=None if head_dim in (None, d // heads) and d % heads == 0 else head_dim,
        d_ff=o["intermediate_size"], num_layers=o["num_hidden_layers"], ffn=ffn, norm="rmsnorm",
        norm_eps=float(o["rms_norm_eps"]), norm_position="pre", final_norm=True, bias=bias, attn_qkv_bias=bias,
        attn_out_bias=bias, ffn_bias=False, dropout=0.0, attn_dropout=float(o["attention_dropout"]),
        ffn_dropout=0.0, embed_dropout=0.0, position="rope", rope_base=rope_base, rope_scaling=rope_scaling,
        max_len=max_pos, scale_embedding=False, tie_embeddings=bool(o["tie_word_embeddings"]),
        sliding_window=window, layer_types=layer_types, attn_sinks=True, moe=_moe(o), dtype="float32",
        **token_ids(o, vocab, need_bos_eos=True))
    return "lm", build_config(LMConfig, fields, o), o.notes


def tensor_fn(name: str, cfg: LMConfig, arch: str):
    base = llama.tensor_fn(name, cfg, arch, rules=RULES, what="gpt-oss")

    def fn(key: str, x: np.ndarray):
        for suffix, part in (("", "proj"), ("_bias", "proj_bias")):
            i = _layer(key, GATE_UP + suffix)
            if i is None:
                continue
            ours = OURS.format(i=i)
            if suffix:  # [E, 2F], interleaved
                return {f"{ours}gate_{part}": x[:, 0::2], f"{ours}up_{part}": x[:, 1::2]}
            # [E, D, 2F] interleaved -> [E, F, D] each
            return {f"{ours}gate_proj": np.swapaxes(x[:, :, 0::2], 1, 2),
                    f"{ours}up_proj": np.swapaxes(x[:, :, 1::2], 1, 2)}
        if _layer(key, "model.layers.{i}.mlp.experts.down_proj") is not None:  # [E, F, D] -> [E, D, F]
            return {RULES.to_torch(key): np.swapaxes(x, 1, 2)}
        return base(key, x)
    return fn


def _layer(key: str, template: str) -> int | None:
    head, tail = template.split("{i}")
    if key.startswith(head) and key.endswith(tail) and key[len(head):len(key) - len(tail)].isdigit():
        return int(key[len(head):len(key) - len(tail)])
    return None


# ----------------------------------------------------------------------------- export
# LLaMA's attention with sinks, per-layer windows, and only the routed experts (clamped SwiGLU
# with biases; the dense FFN fields are unused)
DENSE = Ignored("every layer's FFN is the mixture of experts (dense_layers=())")
EXPORTS = {"lm": dict(
    llama.DECODER, attn_sinks=True, sliding_window=WRITES, layer_types=WRITES, d_ff=DENSE, ffn=DENSE, ffn_bias=DENSE,
    moe=Sub(dict(num_experts=WRITES, top_k=WRITES, d_expert=WRITES, swiglu_alpha=WRITES, swiglu_limit=WRITES,
                 aux_loss_coef=WRITES, router="topk_softmax", router_bias=True, expert_ffn="swiglu_clamped",
                 expert_bias=True, num_shared_experts=0, dense_layers=(), capacity_factor=None,
                 z_loss_coef=Ignored("a training loss term (ST-MoE): no HF key, and the outputs do not depend on it")),
            missing="GptOssForCausalLM's every FFN is a mixture of experts"))}


def claims(c) -> bool:  # only gpt-oss has attention sinks
    return c.attention.attn_sinks


def config_to_hf(name: str, cfg: LMConfig) -> dict:
    m = cfg.feedforward.moe
    eos = list(cfg.eos_id) if isinstance(cfg.eos_id, tuple) else cfg.eos_id
    types = list(cfg.attention.layer_types) if cfg.attention.layer_types is not None else [
        "sliding_attention" if local else "full_attention" for local in cfg.local_layers()]
    return {"architectures": ["GptOssForCausalLM"], "model_type": MODEL_TYPE, "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.d_model, "intermediate_size": m.d_expert, "num_hidden_layers": cfg.num_layers,
            "num_attention_heads": cfg.attention.num_heads, "num_key_value_heads": cfg.resolved_kv_heads,
            "head_dim": cfg.resolved_head_dim, "hidden_act": "silu", "max_position_embeddings": hf_max_positions(cfg),
            "rms_norm_eps": cfg.norms.norm_eps, **rope_to_hf(cfg), "attention_bias": cfg.resolved_qkv_bias,
            "attention_dropout": cfg.attention.attn_dropout, "layer_types": types,
            # HF builds the sliding mask even when no layer uses it: a window as long as the context
            "sliding_window": cfg.attention.sliding_window if cfg.attention.sliding_window is not None else cfg.max_len,
            "num_local_experts": m.num_experts, "num_experts_per_tok": m.top_k, "swiglu_alpha": m.swiglu_alpha,
            "swiglu_limit": m.swiglu_limit, "router_aux_loss_coef": m.aux_loss_coef,
            "tie_word_embeddings": cfg.tie_embeddings, "bos_token_id": cfg.bos_id, "eos_token_id": eos,
            "pad_token_id": cfg.pad_id, "initializer_range": 0.02, "dtype": "float32"}


def state_dict_to_hf(sd: dict[str, np.ndarray], name: str, cfg: LMConfig) -> dict[str, np.ndarray]:
    sd, fused = dict(sd), {}
    for i in range(cfg.num_layers):
        ours, hf_key = OURS.format(i=i), GATE_UP.format(i=i)
        gate, up = sd.pop(f"{ours}gate_proj"), sd.pop(f"{ours}up_proj")  # [E, F, D] each
        e, f, d = gate.shape
        fused[hf_key] = np.stack([np.swapaxes(gate, 1, 2), np.swapaxes(up, 1, 2)], axis=-1).reshape(e, d, 2 * f)
        gate_b, up_b = sd.pop(f"{ours}gate_proj_bias"), sd.pop(f"{ours}up_proj_bias")  # [E, F] each
        fused[f"{hf_key}_bias"] = np.stack([gate_b, up_b], axis=-1).reshape(e, 2 * f)
        sd[f"{ours}down_proj"] = np.swapaxes(sd[f"{ours}down_proj"], 1, 2)  # [E, D, F] -> [E, F, D]
    return {**rename_all(sd, RULES.to_hf, "gpt-oss"), **fused}


FAMILY = Family(name="gpt_oss", architectures=ARCHITECTURES, model_types=MODEL_TYPES, config_from_hf=config_from_hf,
                tensor_fn=tensor_fn, config_to_hf=config_to_hf, state_dict_to_hf=state_dict_to_hf,
                hf_defaults=dict.fromkeys(ARCHITECTURES, DEFAULTS), exports=EXPORTS, claims=claims,
                embed_keys=EMBED_KEYS)
