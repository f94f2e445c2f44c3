"""Qwen2-MoE (`Qwen2MoeForCausalLM`) and Qwen3-MoE (`Qwen3MoeForCausalLM`) <-> jaxformer `lm`
with a mixture-of-experts FFN.

The decoders are Qwen2's and Qwen3's (jaxformer/hf/qwen.py); what the MoE adds, and how it maps:
  * num_experts (Qwen3-MoE: num_local_experts, its alias) -> moe.num_experts, num_experts_per_tok -> moe.top_k, router "softmax_topk"
    (softmax over all experts in float32, top-k) with norm_topk_prob -> moe.norm_topk_prob
    (renormalise the chosen k; Qwen's default is false). Experts are SwiGLUs of width
    moe_intermediate_size -> moe.d_expert.
  * Sparse layers: HF makes layer i sparse when i is not in mlp_only_layers and
    (i + 1) % decoder_sparse_step == 0; every other layer -> moe.dense_layers, a dense SwiGLU
    of width intermediate_size (d_ff). num_experts = 0 (every layer dense) is refused: that is
    a dense Qwen2 / Qwen3 checkpoint.
  * Qwen2-MoE's shared expert: one SwiGLU of width shared_expert_intermediate_size beside the
    routed experts, scaled by sigmoid(shared_expert_gate(x)) -> moe.num_shared_experts=1,
    d_shared, shared_expert_gate=True. Qwen2-MoE's qkv_bias -> attn_qkv_bias (o_proj never has
    a bias); Qwen3-MoE's attention_bias covers all four projections, q/k norms as Qwen3.
  * router_aux_loss_coef -> moe.aux_loss_coef; output_router_logits as Mixtral (mixtral.py).
  * Sliding windows as qwen.py: use_sliding_window must be false.
  * head_dim: config.json may give one (Qwen3-MoE checkpoints do); else hidden_size /
    num_attention_heads, as the HF attention reads it.
Weights: per expert `model.layers.{i}.mlp.experts.{e}.gate_proj/up_proj/down_proj.weight`
(published checkpoints and save_pretrained) or transformers' fused in-memory
`mlp.experts.gate_up_proj` / `down_proj` (mixtral.fused_experts); `mlp.gate.weight` ->
ffn.router.weight; `mlp.shared_expert.*` -> ffn.shared_experts.*; `mlp.shared_expert_gate.weight`
-> ffn.shared_expert_gate.weight; a dense layer's `mlp.*_proj` -> ffn.*_proj. Export writes the
per-expert layout.
"""
from __future__ import annotations

import numpy as np

from jaxformer.config.models import LMConfig
from jaxformer.hf import llama, mixtral, qwen
from jaxformer.hf.common import Family, Options, Renamer, full_attention_only, rename_all
from jaxformer.hf.exports import WRITES, Need, Sub

ARCHITECTURES = {"Qwen2MoeForCausalLM": "lm", "Qwen3MoeForCausalLM": "lm"}
MODEL_TYPES = {"Qwen2MoeForCausalLM": "qwen2_moe", "Qwen3MoeForCausalLM": "qwen3_moe"}
EMBED_KEYS = llama.EMBED_KEYS
_SHARED = dict(vocab_size=151936, hidden_size=2048, num_hidden_layers=24, head_dim=None, hidden_act="silu",
               max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=False,
               rope_theta=10000.0, rope_scaling=None, rope_parameters=None, use_sliding_window=False,
               sliding_window=None, max_window_layers=28, layer_types=None, attention_dropout=0.0,
               decoder_sparse_step=1, norm_topk_prob=False, output_router_logits=False,
               router_aux_loss_coef=0.001, mlp_only_layers=None, bos_token_id=None, eos_token_id=None,
               pad_token_id=None)
DEFAULTS = {
    "Qwen2MoeForCausalLM": dict(_SHARED, intermediate_size=5632, num_attention_heads=16, num_key_value_heads=16,
                                moe_intermediate_size=1408, shared_expert_intermediate_size=5632,
                                num_experts_per_tok=4, num_experts=60, qkv_bias=True),
    "Qwen3MoeForCausalLM": dict(_SHARED, intermediate_size=6144, num_attention_heads=32, num_key_value_heads=4,
                                moe_intermediate_size=768, num_experts_per_tok=8, num_local_experts=128,
                                attention_bias=False),
}
RULES = Renamer([
    ("model.layers.{i}.mlp.gate.weight", "decoder.layers.{i}.ffn.router.weight"),
    ("model.layers.{i}.mlp.experts.{j}.{mlp}.weight", "decoder.layers.{i}.ffn.experts.{mlp}[{j}]"),
    ("model.layers.{i}.mlp.shared_expert.{mlp}.weight", "decoder.layers.{i}.ffn.shared_experts.{mlp}.weight"),
    ("model.layers.{i}.mlp.shared_expert_gate.weight", "decoder.layers.{i}.ffn.shared_expert_gate.weight"),
    *qwen.RULES.rules,  # attention (q/k norms), norms, embeddings and the dense layers' mlp
])


def _dense_layers(o: Options, num_layers: int) -> tuple[int, ...]:
    """HF's placement: layer i is sparse iff i not in mlp_only_layers and (i + 1) % step == 0."""
    step = o.require("decoder_sparse_step", lambda v: isinstance(v, int) and v >= 1, "must be an integer >= 1")
    only = o["mlp_only_layers"]
    if only is None:
        only = []
    if not (isinstance(only, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in only)):
        o.problem("mlp_only_layers", "must be a list of layer indices")
        only = []
    outside = sorted(i for i in only if not 0 <= i < num_layers)
    if outside:
        o.notes.append(f"mlp_only_layers {outside} are not layers (num_hidden_layers={num_layers}); "
                       "no effect, as in HF")
    step = step if isinstance(step, int) and step >= 1 else 1
    return tuple(i for i in range(num_layers) if i in only or (i + 1) % step != 0)


def config_from_hf(raw: dict, arch: str, keys=()) -> tuple[str, LMConfig, list[str]]:
    o = Options(raw, DEFAULTS[arch], family=f"{MODEL_TYPES[arch]} {arch}")
    full_attention_only(o)
    if arch == "Qwen2MoeForCausalLM":
        bias = o["qkv_bias"]
        fields = llama.decoder_fields(o, qkv_bias=bias, out_bias=False, ffn_bias=False)
    else:
        bias = o["attention_bias"]
        fields = llama.decoder_fields(o, qkv_bias=bias, out_bias=bias, ffn_bias=False, qk_norm=True)
    experts = o["num_experts"] if arch == "Qwen2MoeForCausalLM" else mixtral.num_experts(
        o, "num_local_experts", "num_experts")
    if experts < 1:
        o.problem("num_experts", f"0 makes every layer dense: a dense {arch[:5]} checkpoint, not a mixture")
    moe = dict(num_experts=max(experts, 1), top_k=o["num_experts_per_tok"], router="softmax_topk",
               d_expert=o["moe_intermediate_size"], norm_topk_prob=bool(o["norm_topk_prob"]),
               expert_ffn=fields["ffn"], dense_layers=_dense_layers(o, fields["num_layers"]),
               aux_loss_coef=mixtral.router_options(o))
    if arch == "Qwen2MoeForCausalLM":
        width = o.require("shared_expert_intermediate_size", lambda v: v >= 1, "must be >= 1 (the shared "
                          "expert is always there)")
        moe.update(num_shared_experts=1, d_shared=max(width, 1), shared_expert_gate=True)
    return "lm", mixtral.build_moe_config(fields, moe, o), o.notes


def tensor_fn(name: str, cfg: LMConfig, arch: str):
    return mixtral.moe_tensor_fn(name, cfg, arch, RULES, arch)


# ----------------------------------------------------------------------------- export
def architecture(cfg) -> str:
    return "Qwen3MoeForCausalLM" if cfg.attention.qk_norm else "Qwen2MoeForCausalLM"


# LLaMA's with Qwen's q/k norms (Qwen3-MoE) or a gated shared expert (Qwen2-MoE) and its biases,
# the routed experts (Mixtral's) and the dense layers between them
EXPORTS = {"lm": dict(
    llama.DECODER, **llama.biases("ffn"),
    attn_out_bias=Need(lambda c: c.resolved_out_bias == (c.resolved_qkv_bias if c.attention.qk_norm else False),
                       "out_bias={resolved_out_bias} with qkv_bias={resolved_qkv_bias} (Qwen3-MoE's attention_bias "
                       "covers all four projections; Qwen2-MoE's o_proj has none)"),
    qk_norm=Need(lambda c: c.feedforward.moe is None or (c.feedforward.moe.num_shared_experts == 0
                                                         if c.attention.qk_norm
                                                         else c.feedforward.moe.shared_expert_gate),
                 "attention.qk_norm={attention.qk_norm} with "
                 "feedforward.moe.num_shared_experts={feedforward.moe.num_shared_experts}, "
                 "feedforward.moe.shared_expert_gate={feedforward.moe.shared_expert_gate} "
                 "(Qwen3-MoE has no shared expert; Qwen2-MoE's is gated)"),
    moe=Sub(dict(mixtral.MOE, norm_topk_prob=WRITES, dense_layers=WRITES, num_shared_experts=WRITES, d_shared=WRITES,
                 shared_expert_gate=WRITES), missing="Qwen-MoE is a mixture of experts"))}


def claims(c) -> bool:  # Qwen's q/k norm, gated shared expert or qkv-only bias
    return c.feedforward.moe is not None and (c.attention.qk_norm or c.feedforward.moe.shared_expert_gate
                                              or c.resolved_qkv_bias != c.resolved_out_bias)


def config_to_hf(name: str, cfg: LMConfig) -> dict:
    arch, moe = architecture(cfg), cfg.feedforward.moe
    out = {"architectures": [arch], "model_type": MODEL_TYPES[arch], **llama.common_config_to_hf(cfg),
           "use_sliding_window": False, "max_window_layers": cfg.num_layers, "num_experts": moe.num_experts,
           "moe_intermediate_size": moe.d_expert, "norm_topk_prob": moe.norm_topk_prob,
           "decoder_sparse_step": 1, "mlp_only_layers": list(moe.dense_layers), **mixtral.moe_config_to_hf(moe)}
    if arch == "Qwen2MoeForCausalLM":
        out.update(qkv_bias=cfg.resolved_qkv_bias, shared_expert_intermediate_size=moe.resolved_d_shared)
    else:
        out["attention_bias"] = cfg.resolved_qkv_bias
    return out


def state_dict_to_hf(sd: dict[str, np.ndarray], name: str, cfg: LMConfig) -> dict[str, np.ndarray]:
    return rename_all(mixtral.experts_to_slices(sd), RULES.to_hf, architecture(cfg))


FAMILY = Family(name="qwen_moe", architectures=ARCHITECTURES, model_types=MODEL_TYPES, config_from_hf=config_from_hf,
                tensor_fn=tensor_fn, config_to_hf=config_to_hf, state_dict_to_hf=state_dict_to_hf,
                hf_defaults=DEFAULTS, exports=EXPORTS, claims=claims,
                embed_keys=EMBED_KEYS)
