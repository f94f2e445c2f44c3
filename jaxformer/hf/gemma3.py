"""Gemma3, text only (`Gemma3ForCausalLM`, model_type gemma3_text) <-> jaxformer `lm`.

Gemma2's decoder (jaxformer/hf/gemma2.py: sqrt(D)-scaled embeddings, (1 + w) RMSNorm in
sandwich position, GeGLU, query_pre_attn_scalar, sliding/full layer_types, docs/numerics.md
§21), and what Gemma3 adds, field by field (docs/numerics.md §33):
  * Per-head q/k RMSNorm before RoPE (`self_attn.q_norm` / `k_norm`, weights [head_dim]) with
    Gemma's (1 + w) -> qk_norm=True; the q/k norms follow `norm` (rmsnorm_offset).
  * Local and global layers with a RoPE each: HF's rope_parameters keyed by layer type
    (transformers 5.x; older files: rope_theta, rope_scaling for the full layers and
    rope_local_base_freq for the sliding ones, read as Gemma3TextConfig does) -> the full
    layers' rope_base / rope_scaling and the sliding layers' rope_local_base /
    rope_local_scaling (None when both kinds rotate alike).
  * layer_types absent: HF's pattern from sliding_window_pattern (default 6: five sliding
    layers, then one full).
  * final_logit_softcapping -> final_logit_softcap; null = off (Gemma3's default).
Accepted as transformers does: hidden_act when it names hidden_activation's activation (HF
reads only hidden_activation), cache_implementation (common.GENERIC_IGNORED), and
_sliding_window_pattern (the pattern transformers records when it saves; it reads
layer_types, else sliding_window_pattern, never this key).
Refused by name: attn_logit_softcapping other than null (transformers' Gemma3 keeps it in the
config but never applies it, so a value is ambiguous: the file's intent or HF's outputs),
use_bidirectional_attention true, other activations, rope_parameters keys other than
full_attention / sliding_attention (HF's Gemma3 does not apply a flat one), sliding layers
without a sliding_window, a sliding_window_pattern that is not a positive integer, any key
jaxformer does not know.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from jaxformer.config.models import LMConfig
from jaxformer.hf import gemma2, llama
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

ARCHITECTURES = {"Gemma3ForCausalLM": "lm"}
MODEL_TYPE = "gemma3_text"
MODEL_TYPES = dict.fromkeys(ARCHITECTURES, MODEL_TYPE)
EMBED_KEYS = llama.EMBED_KEYS
GLOBAL_THETA, LOCAL_THETA = 1_000_000.0, 10_000.0  # Gemma3TextConfig.default_theta
DEFAULTS = dict(vocab_size=262208, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                num_attention_heads=8, num_key_value_heads=4, head_dim=256, hidden_activation="gelu_pytorch_tanh",
                max_position_embeddings=131072, rms_norm_eps=1e-6, pad_token_id=0, eos_token_id=1, bos_token_id=2,
                tie_word_embeddings=True, rope_parameters=None, rope_scaling=None, rope_theta=GLOBAL_THETA,
                rope_local_base_freq=LOCAL_THETA, attention_bias=False, attention_dropout=0.0,
                query_pre_attn_scalar=256, sliding_window=4096, sliding_window_pattern=6, layer_types=None,
                final_logit_softcapping=None, attn_logit_softcapping=None, use_bidirectional_attention=False)
ACTIVATIONS = gemma2.ACTIVATIONS
RULES = Renamer(gemma2.RULES.rules + [
    ("model.layers.{i}.self_attn.q_norm.weight", "decoder.layers.{i}.self_attn.q_norm.weight"),
    ("model.layers.{i}.self_attn.k_norm.weight", "decoder.layers.{i}.self_attn.k_norm.weight"),
])
LAYER_ROPE_KEYS = ("full_attention", "sliding_attention")


def _pattern(o: Options) -> int:
    """sliding_window_pattern: every pattern-th layer is full when layer_types is absent."""
    p = o["sliding_window_pattern"]
    if not (isinstance(p, int) and not isinstance(p, bool) and p > 0):
        o.problem("sliding_window_pattern", "must be a positive integer")
        return DEFAULTS["sliding_window_pattern"]
    return p


def _layer_rope(o: Options, kind: str, spec: dict, max_pos: int, default_theta: float):
    """(base, scaling) of one layer type's rope_parameters entry (common.rope_from_hf's rules);
    its problems name rope_parameters[kind]."""
    sub = Options({"rope_parameters": spec}, dict(rope_parameters=None, rope_scaling=None, rope_theta=default_theta),
                  family=o.family)
    base, scaling = rope_from_hf(sub, max_pos, default_theta)
    o.problems += [p.replace("rope_parameters=", f"rope_parameters[{kind!r}]=", 1) for p in sub.problems]
    return base, scaling


def _ropes(o: Options, max_pos: int, local: bool) -> dict:
    """The RoPE fields of LMConfig, as Gemma3TextConfig.convert_rope_params_to_dict reads them:
    rope_parameters' per-layer-type entries (absent: default RoPE); rope_scaling updates the
    full layers' entry; an entry without rope_theta takes rope_theta (full) or
    rope_local_base_freq (sliding), else 1e6 / 1e4."""
    params, legacy = o["rope_parameters"], o["rope_scaling"]
    if params is not None and not isinstance(params, dict):
        o.problem("rope_parameters", "expected a mapping of full_attention / sliding_attention entries")
        params = None
    params = params or {}
    for k in sorted(set(params) - set(LAYER_ROPE_KEYS)):
        o.problem("rope_parameters", f"key {k!r}: transformers' Gemma3 applies only the per-layer-type "
                  f"entries {list(LAYER_ROPE_KEYS)} (a flat rope_parameters is not applied there)")
    specs = {}
    for kind, theta_key in zip(LAYER_ROPE_KEYS, ("rope_theta", "rope_local_base_freq"), strict=True):
        spec = params.get(kind) or {"rope_type": "default"}
        if not isinstance(spec, dict):
            o.problem("rope_parameters", f"{kind}: expected a mapping")
            spec = {"rope_type": "default"}
        spec = dict(spec)
        if kind == "full_attention" and legacy:
            if isinstance(legacy, dict):
                spec.update(legacy)
            else:
                o.problem("rope_scaling", "expected a mapping")
        spec.setdefault("rope_theta", o[theta_key])
        specs[kind] = _layer_rope(o, kind, spec, max_pos, DEFAULTS[theta_key])
    (base, scaling), (local_base, local_scaling) = specs["full_attention"], specs["sliding_attention"]
    own = local and (local_base, local_scaling) != (base, scaling)
    return dict(rope_base=base, rope_scaling=scaling, rope_local_base=local_base if own else None,
                rope_local_scaling=local_scaling if own else None)


def config_from_hf(raw: dict, arch: str, keys=()) -> tuple[str, LMConfig, list[str]]:
    o = Options(raw, DEFAULTS, family=f"gemma3_text {arch}",
                ignored={"_sliding_window_pattern": "transformers' record of the pattern when it saves; it "
                         "reads layer_types, else sliding_window_pattern"})
    d, heads, kv = o["hidden_size"], o["num_attention_heads"], o["num_key_value_heads"]
    act = o.require("hidden_activation", ACTIVATIONS, f"jaxformer's Gemma3 FFN gates with {sorted(ACTIVATIONS)}")
    if "hidden_act" in raw:  # HF's Gemma3 reads hidden_activation only
        o.require("hidden_act", (act,), f"transformers' Gemma3 ignores hidden_act and gates with "
                  f"hidden_activation={act!r}; a different value is ambiguous (make them agree)")
    o.require("use_bidirectional_attention", (None, False), "jaxformer's LM attention is causal")
    o.require("attn_logit_softcapping", (None,), "transformers' Gemma3 never applies it (its attention "
              "takes no soft cap), so a value is ambiguous; jaxformer's attn_logit_softcap is Gemma2's")
    layer_types, window = layer_types_and_window(o, o["num_hidden_layers"], _pattern(o))
    vocab, max_pos = o["vocab_size"], o["max_position_embeddings"]
    bias = bool(o["attention_bias"])
    head_dim = o["head_dim"]
    fields = dict(
        vocab_size=vocab, d_model=d, num_heads=heads, num_kv_heads=None if kv in (None, heads) else kv,
        head_dim=None if head_dim == d // heads and d % heads == 0 else head_dim, d_ff=o["intermediate_size"],
        num_layers=o["num_hidden_layers"], ffn=ACTIVATIONS.get(act, "geglu_tanh"), norm="rmsnorm_offset",
        norm_eps=float(o["rms_norm_eps"]), norm_position="sandwich", final_norm=True, bias=bias,
        attn_qkv_bias=bias, attn_out_bias=bias, ffn_bias=False, qk_norm=True, dropout=0.0,
        attn_dropout=float(o["attention_dropout"]), ffn_dropout=0.0, embed_dropout=0.0, position="rope",
        **_ropes(o, max_pos, layer_types is not None and "sliding_attention" in layer_types),
        max_len=max_pos, scale_embedding=True, tie_embeddings=bool(o["tie_word_embeddings"]),
        sliding_window=window, layer_types=layer_types,
        query_pre_attn_scalar=number_or_null(o, "query_pre_attn_scalar"),
        final_logit_softcap=number_or_null(o, "final_logit_softcapping"), dtype="float32",
        **token_ids(o, vocab, need_bos_eos=True))
    if fields["query_pre_attn_scalar"] is None:
        o.problem("query_pre_attn_scalar", "Gemma3 scales scores by its -1/2 power; it must be set")
    return "lm", build_config(LMConfig, fields, o), o.notes


def tensor_fn(name: str, cfg: LMConfig, arch: str):
    return llama.tensor_fn(name, cfg, arch, rules=RULES, what="Gemma3")


# ----------------------------------------------------------------------------- export
# Gemma2's with q/k norms, no score soft cap, and the sliding layers' own RoPE
EXPORTS = {"lm": dict(
    gemma2.EXPORTS["lm"], qk_norm=True, attn_logit_softcap=None, rope_local_base=WRITES, rope_local_scaling=WRITES,
    ffn=Need(lambda c: c.feedforward.kind in ACTIVATIONS.values(),
             f"feedforward.kind={{feedforward.kind!r}} (Gemma3ForCausalLM gates with {sorted(ACTIVATIONS.values())})"),
    query_pre_attn_scalar=Need(lambda c: c.attention.query_pre_attn_scalar is not None, "query_pre_attn_scalar=None "
                               "(Gemma3ForCausalLM needs a number; head_dim gives 1/sqrt(head_dim))"),
    d_model=Need(lambda c: c.d_model % c.attention.num_heads == 0,
                 "d_model={d_model} with attention.num_heads={attention.num_heads} "
                 "(Gemma3TextConfig needs hidden_size divisible by num_attention_heads)"))}


def claims(c) -> bool:  # Gemma's norms with q/k norms or two RoPEs
    return gemma2.claims(c) and (c.attention.qk_norm or c.positions.rope_local_base is not None)


def config_to_hf(name: str, cfg: LMConfig) -> dict:
    eos = list(cfg.eos_id) if isinstance(cfg.eos_id, tuple) else cfg.eos_id
    types = list(cfg.attention.layer_types) if cfg.attention.layer_types is not None else [
        "sliding_attention" if local else "full_attention" for local in cfg.local_layers()]
    # HF builds the sliding mask even when no layer uses it: a window as long as the context
    window = cfg.attention.sliding_window if cfg.attention.sliding_window is not None else cfg.max_len
    local_base, local_scaling = cfg.layer_rope(True)
    ropes = {"full_attention": rope_to_hf(cfg)["rope_parameters"],
             "sliding_attention": rope_to_hf(SimpleNamespace(
                 positions=SimpleNamespace(rope_base=local_base, rope_scaling=local_scaling)))[
                 "rope_parameters"]}
    cap = cfg.final_logit_softcap
    return {"architectures": ["Gemma3ForCausalLM"], "model_type": MODEL_TYPE, "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.d_model, "intermediate_size": cfg.feedforward.d_ff, "num_hidden_layers": cfg.num_layers,
            "num_attention_heads": cfg.attention.num_heads, "num_key_value_heads": cfg.resolved_kv_heads,
            "head_dim": cfg.resolved_head_dim,
            "hidden_activation": next(k for k, v in ACTIVATIONS.items() if v == cfg.feedforward.kind),
            "max_position_embeddings": hf_max_positions(cfg), "rms_norm_eps": cfg.norms.norm_eps,
            "rope_parameters": ropes, "attention_bias": cfg.resolved_qkv_bias,
            "attention_dropout": cfg.attention.attn_dropout,
            "query_pre_attn_scalar": cfg.attention.query_pre_attn_scalar, "sliding_window": window,
            "layer_types": types,
            "final_logit_softcapping": None if cap is None else float(cap), "attn_logit_softcapping": None,
            "use_bidirectional_attention": False, "tie_word_embeddings": cfg.tie_embeddings,
            "bos_token_id": cfg.bos_id, "eos_token_id": eos, "pad_token_id": cfg.pad_id, "initializer_range": 0.02,
            "dtype": "float32"}


def state_dict_to_hf(sd: dict[str, np.ndarray], name: str, cfg: LMConfig) -> dict[str, np.ndarray]:
    return rename_all(sd, RULES.to_hf, "Gemma3")


FAMILY = Family(name="gemma3", architectures=ARCHITECTURES, model_types=MODEL_TYPES, config_from_hf=config_from_hf,
                tensor_fn=tensor_fn, config_to_hf=config_to_hf, state_dict_to_hf=state_dict_to_hf,
                hf_defaults=dict.fromkeys(ARCHITECTURES, DEFAULTS), exports=EXPORTS, claims=claims,
                embed_keys=EMBED_KEYS)
