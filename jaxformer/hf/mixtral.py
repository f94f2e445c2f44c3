"""Mixtral (`MixtralForCausalLM`) <-> jaxformer `lm` with a mixture-of-experts FFN.

A Mistral decoder (jaxformer/hf/mistral.py: LLaMA names, RMSNorm, GQA, rotate-half RoPE,
optional sliding window on every layer) whose every FFN is a sparse MoE block. How it maps:
  * num_local_experts (alias num_experts) -> moe.num_experts, num_experts_per_tok -> moe.top_k; router
    "softmax_topk" with norm_topk_prob=True (MixtralTopKRouter always renormalises the top k);
    each expert is a SwiGLU of width intermediate_size -> moe.d_expert (and d_ff, unused: no
    layer is dense).
  * router_aux_loss_coef -> moe.aux_loss_coef (training only). output_router_logits only says
    whether HF's forward returns the router logits (and, training, adds the aux loss): ignored,
    noted when it is false and the coefficient is not 0, since jaxformer's trainer adds it.
  * router_jitter_noise must be 0: HF multiplies the training inputs of the router by uniform
    noise, which jaxformer does not implement.
  * sliding_window -> sliding_window, as Mistral (a window on every layer; null = full).
  * rope_theta defaults to 1e6 (MixtralConfig.default_theta).

Weights, both layouts that exist (import):
  * per expert, as published checkpoints and transformers' save_pretrained store them:
    `model.layers.{i}.block_sparse_moe.experts.{e}.w1/w3/w2.weight` ([F, D], [F, D], [D, F])
    -> slice e of ffn.experts.gate_proj / up_proj / down_proj ([E, F, D], [E, F, D],
    [E, D, F]); `block_sparse_moe.gate.weight` [E, D] -> ffn.router.weight;
  * fused, as transformers 5.x holds them in memory (`model.state_dict()`):
    `model.layers.{i}.mlp.experts.gate_up_proj` [E, 2F, D] (gate rows, then up rows) and
    `mlp.experts.down_proj` [E, D, F]; `mlp.gate.weight`.
  Either prefix (block_sparse_moe, mlp) is read with either layout. Export writes the per-
  expert layout under block_sparse_moe, which transformers converts on load.
The helpers below (fused experts, per-expert export, MoE export checks) serve qwen_moe.py too.
"""
from __future__ import annotations

import re

import numpy as np

from jaxformer.config import MoEConfig
from jaxformer.config.models import LMConfig
from jaxformer.hf import llama, mistral
from jaxformer.hf.common import Family, MappingError, Options, Renamer, build_config, rename_all, uniform_window
from jaxformer.hf.exports import WRITES, Ignored, Sub

ARCHITECTURES = {"MixtralForCausalLM": "lm"}
MODEL_TYPE = "mixtral"
MODEL_TYPES = dict.fromkeys(ARCHITECTURES, MODEL_TYPE)
EMBED_KEYS = llama.EMBED_KEYS
DEFAULTS = dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                num_attention_heads=32, num_key_value_heads=8, head_dim=None, hidden_act="silu",
                max_position_embeddings=4096 * 32, rms_norm_eps=1e-5, tie_word_embeddings=False,
                rope_theta=1e6, rope_scaling=None, rope_parameters=None, sliding_window=None,
                layer_types=None, attention_dropout=0.0, num_experts_per_tok=2, num_local_experts=8,
                output_router_logits=False, router_aux_loss_coef=0.001, router_jitter_noise=0.0,
                bos_token_id=1, eos_token_id=2, pad_token_id=None)
# the LLaMA rules without the dense MLP (every Mixtral layer is sparse)
_DECODER = [r for r in llama.RULES.rules if ".mlp." not in r[0]]
_EXPERTS = "decoder.layers.{i}.ffn.experts"
RULES = Renamer([  # the first of two names is the one export writes
    *[(f"model.layers.{{i}}.{block}.gate.weight", "decoder.layers.{i}.ffn.router.weight")
      for block in ("block_sparse_moe", "mlp")],
    *[(f"model.layers.{{i}}.{block}.experts.{{j}}.{hf}.weight", f"{_EXPERTS}.{ours}[{{j}}]")
      for block in ("block_sparse_moe", "mlp")
      for hf, ours in (("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj"))],
    *_DECODER,
])
# transformers' in-memory fused experts: {layer}.{block}.experts.gate_up_proj / down_proj
FUSED = re.compile(r"model\.layers\.(?P<i>\d+)\.(?:block_sparse_moe|mlp)\.experts\.(?P<w>gate_up_proj|down_proj)$")


def fused_experts(key: str, x: np.ndarray) -> dict[str, np.ndarray] | None:
    """The fused expert tensors (Mixtral, Qwen2-MoE, Qwen3-MoE in transformers 5.x memory)
    as our stacked params: gate_up_proj [E, 2F, D] -> gate_proj = rows [:F], up_proj = rows
    [F:] (views); down_proj [E, D, F] as is. None for any other key."""
    m = FUSED.match(key)
    if m is None:
        return None
    base = _EXPERTS.format(i=m["i"])
    if m["w"] == "down_proj":
        return {f"{base}.down_proj": x}
    if x.ndim != 3 or x.shape[1] % 2:
        raise MappingError(f"shape: {key} has shape {tuple(x.shape)}, expected [E, 2 * F, D] "
                           "(gate rows, then up rows)")
    f = x.shape[1] // 2
    return {f"{base}.gate_proj": x[:, :f], f"{base}.up_proj": x[:, f:]}


def moe_tensor_fn(name: str, cfg: LMConfig, arch: str, rules: Renamer, what: str):
    """llama.tensor_fn with the fused expert layout read too."""
    plain = llama.tensor_fn(name, cfg, arch, rules=rules, what=what)

    def fn(key: str, x: np.ndarray):
        fused = fused_experts(key, x)
        return fused if fused is not None else plain(key, x)
    return fn


def experts_to_slices(sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Export: each stacked ffn.experts.* [E, ...] -> E keys common.expert_slice(key, e)."""
    out = {}
    for k, v in sd.items():
        if ".ffn.experts." in k:
            out.update({f"{k}[{e}]": v[e] for e in range(v.shape[0])})
        else:
            out[k] = v
    return out


# The routed experts of Mixtral and Qwen-MoE (softmax over all experts, top-k, dropless, bias-free
# SwiGLU experts): what config.json writes of MoEConfig and what it requires
MOE = dict(num_experts=WRITES, top_k=WRITES, d_expert=WRITES, aux_loss_coef=WRITES, router="softmax_topk",
           router_bias=False, expert_ffn="swiglu", expert_bias=False, capacity_factor=None,
           z_loss_coef=Ignored("a training loss term (ST-MoE): no HF key, and the outputs do not depend on it"))


def moe_config_to_hf(moe: MoEConfig) -> dict:
    """config.json keys of the routed experts shared by Mixtral and Qwen-MoE."""
    return {"num_experts_per_tok": moe.top_k, "router_aux_loss_coef": moe.aux_loss_coef,
            "output_router_logits": moe.aux_loss_coef > 0}


def num_experts(o: Options, name: str, alias: str) -> int:
    """The expert count of a config whose class maps `alias` onto `name` (attribute_map:
    config.json may carry either, as written by different transformers versions)."""
    if alias in o.raw and name in o.raw and o.raw[alias] != o.raw[name]:
        o.problem(alias, f"disagrees with {name}={o.raw[name]!r} (the same option)")
    o.used.add(alias)
    return o[name] if name in o.raw or alias not in o.raw else o._typed(name, o.raw[alias])


def router_options(o: Options) -> float:
    """-> aux_loss_coef from router_aux_loss_coef, with output_router_logits read and noted."""
    coef = float(o.require("router_aux_loss_coef", lambda v: v >= 0, "must be >= 0"))
    if not o["output_router_logits"] and coef > 0:
        o.notes.append(f"router_aux_loss_coef={coef} -> moe.aux_loss_coef: jaxformer's trainer adds "
                       "the load-balancing loss; HF adds it only with output_router_logits=true")
    return coef


# ----------------------------------------------------------------------------- import
def config_from_hf(raw: dict, arch: str, keys=()) -> tuple[str, LMConfig, list[str]]:
    o = Options(raw, DEFAULTS, family=f"mixtral {arch}")
    window = uniform_window(o)
    fields = llama.decoder_fields(o, qkv_bias=False, out_bias=False, ffn_bias=False)
    o.require("router_jitter_noise", (0, 0.0), "multiplies the router's training inputs by uniform "
              "noise, which jaxformer does not implement (only 0)")
    experts, top_k = num_experts(o, "num_local_experts", "num_experts"), o["num_experts_per_tok"]
    moe = dict(num_experts=experts, top_k=top_k, router="softmax_topk", d_expert=o["intermediate_size"],
               norm_topk_prob=True, expert_ffn=fields["ffn"], aux_loss_coef=router_options(o))
    return "lm", build_moe_config(dict(fields, sliding_window=window), moe, o), o.notes


def build_moe_config(fields: dict, moe: dict, o: Options) -> LMConfig:
    """build_config of an LMConfig whose moe is MoEConfig(**moe), every problem in one error."""
    from jaxformer.config import ConfigError
    try:
        moe_cfg = MoEConfig(**moe)
    except ConfigError as e:
        o.problems.append(f"the expert options map to an invalid MoEConfig: {e}")
        moe_cfg = None
    return build_config(LMConfig, dict(fields, moe=moe_cfg), o)


def tensor_fn(name: str, cfg: LMConfig, arch: str):
    return moe_tensor_fn(name, cfg, arch, RULES, "Mixtral")


# ----------------------------------------------------------------------------- export
# Mistral's with the routed experts in every layer (its intermediate_size is d_expert)
EXPORTS = {"lm": dict(
    mistral.EXPORTS["lm"], d_ff=Ignored("every layer's FFN is the mixture of experts (dense_layers=())"),
    moe=Sub(dict(MOE, norm_topk_prob=True, num_shared_experts=0, dense_layers=()),
            missing="MixtralForCausalLM is a mixture of experts"))}


def claims(c) -> bool:
    return c.feedforward.moe is not None


def config_to_hf(name: str, cfg: LMConfig) -> dict:
    out = {"architectures": ["MixtralForCausalLM"], "model_type": MODEL_TYPE, **llama.common_config_to_hf(cfg),
           "sliding_window": cfg.attention.sliding_window, "num_local_experts": cfg.feedforward.moe.num_experts,
           "router_jitter_noise": 0.0, **moe_config_to_hf(cfg.feedforward.moe)}
    out["intermediate_size"] = cfg.feedforward.moe.d_expert
    return out


def state_dict_to_hf(sd: dict[str, np.ndarray], name: str, cfg: LMConfig) -> dict[str, np.ndarray]:
    return rename_all(experts_to_slices(sd), RULES.to_hf, "Mixtral")


FAMILY = Family(name="mixtral", architectures=ARCHITECTURES, model_types=MODEL_TYPES, config_from_hf=config_from_hf,
                tensor_fn=tensor_fn, config_to_hf=config_to_hf, state_dict_to_hf=state_dict_to_hf,
                hf_defaults=dict.fromkeys(ARCHITECTURES, DEFAULTS), exports=EXPORTS, claims=claims,
                embed_keys=EMBED_KEYS)
