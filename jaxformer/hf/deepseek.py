"""DeepSeek-V3 (`DeepseekV3ForCausalLM`) <-> jaxformer `lm` with multi-head latent attention
and a mixture-of-experts FFN (transformers 5.x's modeling_deepseek_v3.py).

A LLaMA-style pre-norm decoder (RMSNorm, SwiGLU, untied head by default) whose attention is
MLA (jaxformer/layers/mla.py; its docstring maps the attention keys) and whose layers from
first_k_dense_replace on are sparse. How it maps:
  * MLA: q_lora_rank (null = one q_proj), kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim,
    v_head_dim, rope_interleave (HF's default true) -> MLAConfig; the latent norms' eps is
    HF's RMSNorm default 1e-6. num_key_value_heads must equal num_attention_heads (HF repeats
    keys num_heads // num_key_value_heads times; any other value breaks HF's own forward).
    head_dim / qk_head_dim, which HF derives and save_pretrained writes, must agree with them.
  * attention_bias -> the biases of q_a_proj, kv_a_proj_with_mqa and o_proj (attn_qkv_bias,
    attn_out_bias); q_proj, q_b_proj and kv_b_proj never have one.
  * RoPE: rope_theta and rope_parameters / legacy rope_scaling (common.rope_from_hf), over the
    qk_rope_head_dim part; YaRN's mscale / mscale_all_dim give the rope factor and the score
    scale (docs/numerics.md §27).
  * MoE: router "sigmoid_grouped" (DeepseekV3TopkRouter: sigmoid scores in float32, the choice
    adds e_score_correction_bias -> moe.score_bias, keeps topk_group of n_group groups, top-k
    there; weights the unbiased scores, renormalised when norm_topk_prob, times
    routed_scaling_factor); n_routed_experts (alias num_local_experts) -> num_experts,
    num_experts_per_tok -> top_k, moe_intermediate_size -> d_expert; n_shared_experts -> one
    always-on SwiGLU of width n_shared_experts * moe_intermediate_size (num_shared_experts,
    d_shared). Layers i < first_k_dense_replace are dense SwiGLUs of width intermediate_size
    (moe.dense_layers, d_ff). HF's forward adds no auxiliary loss: aux_loss_coef stays 0.
  * Multi-token prediction: num_nextn_predict_layers (alias num_mtp_layers) MTP modules are
    stored as model.layers.{N}.. (N = num_hidden_layers) in published checkpoints. They are
    not part of DeepseekV3ForCausalLM's forward: transformers loads them only into a separate
    MtpModel for generate(use_mtp=True) (speculative decoding, which leaves greedy ids as the
    main model's) and reports them as unexpected keys of DeepseekV3ForCausalLM. They are
    skipped here too (noted); a layer index past N + num_nextn_predict_layers is an error.
  * Keys of the original DeepSeek code that transformers' DeepseekV3 does not read are
    accepted only at the values transformers' model computes: topk_method "noaux_tc",
    scoring_func "sigmoid", moe_layer_freq 1, ep_size 1. aux_loss_alpha / seq_aux (DeepSeek's
    training-only sequence balance loss) and auto_map (remote code) are ignored, stated.
    quantization_config (the fp8 block-quantized release) is refused: jaxformer does not
    dequantize weight_scale_inv.
Weights: the LLaMA names, the MLA names, and per expert `model.layers.{i}.mlp.experts.{e}.
gate_proj/up_proj/down_proj.weight` (published checkpoints and save_pretrained) or the fused
in-memory `mlp.experts.gate_up_proj` / `down_proj` (mixtral.fused_experts); `mlp.gate.weight`
-> ffn.router.weight; `mlp.gate.e_score_correction_bias` -> ffn.router.score_bias;
`mlp.shared_experts.*` -> ffn.shared_experts.*. Export writes save_pretrained's layout.
"""
from __future__ import annotations

import re

import numpy as np

from jaxformer.config import ConfigError, MLAConfig
from jaxformer.config.models import LMConfig
from jaxformer.hf import llama, mixtral
from jaxformer.hf.common import Family, Options, Renamer, rename_all
from jaxformer.hf.exports import WRITES, Ignored, Need, Sub

ARCHITECTURES = {"DeepseekV3ForCausalLM": "lm"}
MODEL_TYPE = "deepseek_v3"
MODEL_TYPES = dict.fromkeys(ARCHITECTURES, MODEL_TYPE)
EMBED_KEYS = llama.EMBED_KEYS
# DeepseekV3Config's defaults (transformers 5.24); q_lora_rank is read by hand (it may be null)
DEFAULTS = dict(vocab_size=129280, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
                num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128, n_shared_experts=1,
                n_routed_experts=256, output_router_logits=False, routed_scaling_factor=2.5, kv_lora_rank=512,
                qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128, n_group=8, topk_group=4,
                num_experts_per_tok=8, first_k_dense_replace=3, norm_topk_prob=True, hidden_act="silu",
                max_position_embeddings=4096, rms_norm_eps=1e-6, pad_token_id=None, bos_token_id=0,
                eos_token_id=1, pretraining_tp=1, tie_word_embeddings=False, rope_theta=10000.0,
                rope_scaling=None, rope_parameters=None, rope_interleave=True, attention_bias=False,
                attention_dropout=0.0, num_nextn_predict_layers=1,
                # the original DeepSeek code's keys, at the values transformers' model computes
                topk_method="noaux_tc", scoring_func="sigmoid", moe_layer_freq=1, ep_size=1)
Q_LORA_DEFAULT = 1536
IGNORED = {
    "pretraining_tp": "slices the same matmuls (tensor-parallel pretraining)",
    "aux_loss_alpha": "DeepSeek's sequence-wise balance loss (training only; transformers' forward never adds it)",
    "seq_aux": "DeepSeek's sequence-wise balance loss (training only; transformers' forward never adds it)",
    "auto_map": "the original remote code; transformers' own DeepseekV3 (this mapping) is used instead",
    "output_router_logits": "only whether HF's forward returns the router logits",
}
ATTN = ("q_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")
RULES = Renamer([
    ("model.layers.{i}.mlp.gate.weight", "decoder.layers.{i}.ffn.router.weight"),
    ("model.layers.{i}.mlp.gate.e_score_correction_bias", "decoder.layers.{i}.ffn.router.score_bias"),
    ("model.layers.{i}.mlp.experts.{j}.{mlp}.weight", "decoder.layers.{i}.ffn.experts.{mlp}[{j}]"),
    ("model.layers.{i}.mlp.shared_experts.{mlp}.weight", "decoder.layers.{i}.ffn.shared_experts.{mlp}.weight"),
    *[(f"model.layers.{{i}}.self_attn.{n}.{{leaf}}", f"decoder.layers.{{i}}.self_attn.{n}.{{leaf}}") for n in ATTN],
    *[(f"model.layers.{{i}}.self_attn.{n}.weight", f"decoder.layers.{{i}}.self_attn.{n}.weight")
      for n in ("q_a_layernorm", "kv_a_layernorm")],
    *[r for r in llama.RULES.rules if ".self_attn." not in r[0]],  # norms, embeddings, dense mlp, head
])
LAYER = re.compile(r"model\.layers\.(\d+)\.")


# ----------------------------------------------------------------------------- import
def _positive(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _mla(o: Options, heads: int) -> MLAConfig | None:
    o.used.add("q_lora_rank")
    q_lora = o.raw.get("q_lora_rank", Q_LORA_DEFAULT)
    if q_lora is not None and not _positive(q_lora):
        o.problem("q_lora_rank", "must be an integer >= 1 or null (one q_proj)")
        q_lora = None
    dims = {k: o.require(k, _positive, "must be an integer >= 1")
            for k in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")}
    interleave = o.raw.get("rope_interleave", True)
    o.used.add("rope_interleave")
    if interleave is None:  # HF's `if config.rope_interleave` reads null as false
        interleave = False
    elif not isinstance(interleave, bool):
        o.problem("rope_interleave", "expected true, false or null")
    o.require("num_key_value_heads", lambda v: v in (None, heads), f"must equal num_attention_heads={heads}: "
              "MLA expands per-head keys from one latent (HF's repeat_kv breaks on any other value)")
    derived = {"head_dim": dims["qk_rope_head_dim"], "qk_head_dim": dims["qk_nope_head_dim"] + dims["qk_rope_head_dim"]}
    for k, want in derived.items():
        if k in o.raw:
            o.require(k, lambda v, want=want: v == want, f"HF derives it as {want} from the MLA widths")
    try:
        return MLAConfig(q_lora_rank=q_lora, rope_interleave=bool(interleave), latent_norm_eps=1e-6, **dims)
    except ConfigError as e:
        o.problems.append(f"the MLA options map to an invalid MLAConfig: {e}")
        return None


def _mtp_layers(o: Options, num_layers: int, keys) -> int:
    """num_nextn_predict_layers (alias num_mtp_layers); every stored layer index must be a
    decoder layer or one of these MTP modules."""
    n = mixtral.num_experts(o, "num_nextn_predict_layers", "num_mtp_layers")  # the attribute_map alias reader
    if not (isinstance(n, int) and n >= 0):
        o.problem("num_nextn_predict_layers", "must be an integer >= 0")
        n = 0
    stored = sorted({int(m[1]) for k in keys if (m := LAYER.match(k))})
    beyond = [i for i in stored if i >= num_layers + n]
    if beyond:
        o.problems.append(f"the weights hold model.layers.{beyond[0]}, beyond num_hidden_layers={num_layers} + "
                          f"num_nextn_predict_layers={n}")
    mtp = [i for i in stored if num_layers <= i < num_layers + n]
    if mtp:
        o.notes.append(f"multi-token-prediction layers model.layers.{mtp} skipped: not part of "
                       "DeepseekV3ForCausalLM's forward (transformers loads them only for generate(use_mtp=True))")
    return n


def config_from_hf(raw: dict, arch: str, keys=()) -> tuple[str, LMConfig, list[str]]:
    o = Options(raw, DEFAULTS, family=f"{MODEL_TYPE} {arch}", ignored=IGNORED)
    for k, why in (("topk_method", "transformers' DeepseekV3 routes only as noaux_tc (grouped, biased choice)"),
                   ("scoring_func", "transformers' DeepseekV3 scores experts only with a sigmoid"),
                   ("moe_layer_freq", "transformers' DeepseekV3 makes every layer from first_k_dense_replace "
                                      "on sparse (frequency 1)"),
                   ("ep_size", "transformers' DeepseekV3 runs every expert in one process (1)")):
        o.require(k, (DEFAULTS[k],), why)
    if "quantization_config" in raw:
        o.used.add("quantization_config")
        o.problem("quantization_config", "quantized weights (fp8 blocks with weight_scale_inv) are not "
                  "dequantized by jaxformer; convert the checkpoint to bf16/fp32 first")
    bias = o["attention_bias"]
    fields = llama.decoder_fields(o, qkv_bias=bias, out_bias=bias, ffn_bias=False)
    fields["num_kv_heads"] = None
    mla = _mla(o, fields["num_heads"])
    _mtp_layers(o, fields["num_layers"], keys)
    first_k = o.require("first_k_dense_replace", lambda v: v >= 0, "must be an integer >= 0")
    shared = o.require("n_shared_experts", lambda v: v >= 1, "must be >= 1 (transformers builds the shared "
                       "experts of width n_shared_experts * moe_intermediate_size in every sparse layer)")
    norm = o.raw.get("norm_topk_prob", True)
    o.used.add("norm_topk_prob")
    if not isinstance(norm, bool) and norm is not None:
        o.problem("norm_topk_prob", "expected true, false or null")
    moe = dict(num_experts=mixtral.num_experts(o, "n_routed_experts", "num_local_experts"),
               top_k=o["num_experts_per_tok"], router="sigmoid_grouped", d_expert=o["moe_intermediate_size"],
               norm_topk_prob=bool(norm), expert_ffn=fields["ffn"], n_group=o["n_group"], topk_group=o["topk_group"],
               routed_scaling_factor=float(o["routed_scaling_factor"]), score_bias=True,
               num_shared_experts=max(shared, 1), dense_layers=tuple(range(min(max(first_k, 0), fields["num_layers"]))))
    return "lm", mixtral.build_moe_config(dict(fields, mla=mla), moe, o), o.notes


def tensor_fn(name: str, cfg: LMConfig, arch: str):
    """mixtral.moe_tensor_fn with the MTP layers (index >= num_layers; config_from_hf bounded
    them by num_nextn_predict_layers) skipped."""
    plain = mixtral.moe_tensor_fn(name, cfg, arch, RULES, "DeepSeek-V3")

    def fn(key: str, x: np.ndarray):
        m = LAYER.match(key)
        return None if m and int(m[1]) >= cfg.num_layers else plain(key, x)
    return fn


# ----------------------------------------------------------------------------- export
# LLaMA's with multi-head latent attention and DeepSeek's grouped sigmoid routing over the
# routed experts, shared experts, the first layers dense
MLA = dict(kv_lora_rank=WRITES, q_lora_rank=WRITES, qk_nope_head_dim=WRITES, qk_rope_head_dim=WRITES,
           v_head_dim=WRITES, rope_interleave=WRITES, latent_norm_eps=1e-6)  # HF's latent norms: 1e-6
TRAINING = "a training option (a loss or score_bias updates): no HF key, and the outputs do not depend on it"
MOE = dict(num_experts=WRITES, top_k=WRITES, d_expert=WRITES, n_group=WRITES, topk_group=WRITES,
           norm_topk_prob=WRITES, routed_scaling_factor=WRITES, d_shared=WRITES, router="sigmoid_grouped",
           score_bias=True, router_bias=False, expert_ffn="swiglu", expert_bias=False, capacity_factor=None,
           shared_expert_gate=False, aux_loss_coef=Ignored(TRAINING), z_loss_coef=Ignored(TRAINING),
           bias_update_rate=Ignored(TRAINING),
           dense_layers=Need(lambda m: m.dense_layers == tuple(range(len(m.dense_layers))),
                             "dense_layers={dense_layers!r} (DeepseekV3ForCausalLM's dense layers are the first "
                             "first_k_dense_replace)"),
           num_shared_experts=Need(lambda m: m.num_shared_experts >= 1 and m.resolved_d_shared % m.d_expert == 0,
                                   "num_shared_experts={num_shared_experts} of width {resolved_d_shared} "
                                   "(DeepseekV3ForCausalLM needs n_shared_experts >= 1 shared experts of width "
                                   "d_expert={d_expert})"))
EXPORTS = {"lm": dict(
    llama.DECODER, **llama.biases("ffn"),
    mla=Sub(MLA, missing="DeepseekV3ForCausalLM's attention is multi-head latent attention"),
    moe=Sub(MOE, missing="DeepseekV3ForCausalLM is a mixture of experts"))}


def claims(c) -> bool:
    return c.attention.mla is not None


def config_to_hf(name: str, cfg: LMConfig) -> dict:
    """What DeepseekV3Config.save_pretrained writes (transformers 5.24), ints as ints."""
    moe, mla = cfg.feedforward.moe, cfg.attention.mla
    out = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": MODEL_TYPE, **llama.common_config_to_hf(cfg)}
    out.update(
        head_dim=mla.qk_rope_head_dim, qk_head_dim=mla.qk_head_dim, q_lora_rank=mla.q_lora_rank,
        kv_lora_rank=mla.kv_lora_rank, qk_nope_head_dim=mla.qk_nope_head_dim, qk_rope_head_dim=mla.qk_rope_head_dim,
        v_head_dim=mla.v_head_dim, rope_interleave=mla.rope_interleave, attention_bias=cfg.resolved_qkv_bias,
        n_routed_experts=moe.num_experts, num_experts_per_tok=moe.top_k, moe_intermediate_size=moe.d_expert,
        n_shared_experts=moe.resolved_d_shared // moe.d_expert, n_group=moe.n_group, topk_group=moe.topk_group,
        norm_topk_prob=moe.norm_topk_prob, routed_scaling_factor=float(moe.routed_scaling_factor),
        first_k_dense_replace=len(moe.dense_layers), output_router_logits=False, pretraining_tp=1,
        use_cache=True, num_nextn_predict_layers=0)  # no MTP modules are exported
    return out


def state_dict_to_hf(sd: dict[str, np.ndarray], name: str, cfg: LMConfig) -> dict[str, np.ndarray]:
    return rename_all(mixtral.experts_to_slices(sd), RULES.to_hf, "DeepSeek-V3")


FAMILY = Family(name="deepseek", architectures=ARCHITECTURES, model_types=MODEL_TYPES, config_from_hf=config_from_hf,
                tensor_fn=tensor_fn, config_to_hf=config_to_hf, state_dict_to_hf=state_dict_to_hf,
                hf_defaults=dict.fromkeys(ARCHITECTURES, DEFAULTS), exports=EXPORTS, claims=claims,
                embed_keys=EMBED_KEYS)
