"""Phi-3 (`Phi3ForCausalLM`: Phi-3, Phi-3.5, Phi-4-mini) <-> jaxformer `lm`.

A LLaMA-style decoder (jaxformer/hf/llama.py: RMSNorm, SwiGLU, GQA, rotate-half RoPE, no
biases) with two fused projections and its own RoPE scaling. How it maps:
  * `self_attn.qkv_proj` [H K + 2 G K, D] is split at import into q_proj [H K, D], k_proj and
    v_proj [G K, D] (rows in that order, as HF slices them); `mlp.gate_up_proj` [2 F, D] into
    gate_proj (first F rows: HF's chunk(2) gives the gate first) and up_proj. The fused tensor
    is read once and its parts copied out (streaming.convert_stream): import memory stays
    about twice the largest tensor. Export concatenates them back.
  * rope_parameters (5.x) / rope_scaling (4.x; the non-empty one wins) of rope_type "default"
    or "longrope" ("su" and "yarn" are Phi-3's old names for longrope, renamed as HF does).
    longrope -> RopeScaling("longrope") with short_factor, long_factor (head_dim / 2 each),
    original_max_len = the TOP-LEVEL original_max_position_embeddings (HF overwrites the one in
    rope_parameters with it; default 4096), factor (absent: max_position_embeddings /
    original_max_position_embeddings, as HF) and attention_factor (absent: sqrt(1 + ln factor /
    ln original_max_len), 1 for factor <= 1). Short or long factors by the call's largest
    position + 1, as HF's longrope_frequency_update; docs/numerics.md §34. Generation that would
    cross original_max_len mid-way is refused (HF recomputes its cache there: §34).
  * partial_rotary_factor (top level or in rope_parameters; Phi-4-mini: 0.75) -> rotary_dim =
    int(head_dim * factor), as HF computes it: only those first dims of each head rotate, and
    longrope's factor lists then have rotary_dim / 2 entries (docs/numerics.md §35). A factor
    giving an odd or zero width is refused.
  * sliding_window -> sliding_window on every layer (HF masks every layer with it; §21), null
    = full attention. resid_pdrop -> dropout (the residual dropout of both sublayers),
    attention_dropout -> attn_dropout; embd_pdrop is ignored: transformers 5.x's Phi3Model
    applies no embedding dropout. original_max_position_embeddings without longrope changes
    nothing (HF reads it only for longrope). Phi3Config has no head_dim: heads are
    hidden_size / num_attention_heads wide, and a config.json head_dim that says otherwise is
    refused. bos/eos/pad ids, tie_word_embeddings: as LLaMA.
Export writes Phi3ForCausalLM for a LLaMA-style lm with longrope scaling or residual dropout
(the HF decoders that have them); without either the same model is a LLaMA (or a Mistral, with
a window) and exports as one, with identical outputs.
"""
from __future__ import annotations

import numpy as np

from jaxformer.config import ConfigError, RopeScaling
from jaxformer.config.models import LMConfig
from jaxformer.hf import llama
from jaxformer.hf.common import (
    Family,
    MappingError,
    Options,
    Renamer,
    build_config,
    is_number,
    partial_factor,
    rename_all,
)
from jaxformer.hf.exports import WRITES, Need

ARCHITECTURES = {"Phi3ForCausalLM": "lm"}
MODEL_TYPE = "phi3"
MODEL_TYPES = dict.fromkeys(ARCHITECTURES, MODEL_TYPE)
EMBED_KEYS = llama.EMBED_KEYS
DEFAULTS = dict(vocab_size=32064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
                num_attention_heads=32, num_key_value_heads=None, resid_pdrop=0.0, embd_pdrop=0.0,
                attention_dropout=0.0, hidden_act="silu", max_position_embeddings=4096,
                original_max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False,
                rope_theta=10000.0, rope_scaling=None, rope_parameters=None, partial_rotary_factor=1.0,
                bos_token_id=1, eos_token_id=32000, pad_token_id=32000, sliding_window=None, head_dim=None)
RULES = llama.RULES  # names of the unfused weights; the two fused ones below
FUSED = Renamer([  # an HF fused weight -> the stem of the jaxformer weights it holds
    ("model.layers.{i}.self_attn.qkv_proj.weight", "decoder.layers.{i}.self_attn."),
    ("model.layers.{i}.mlp.gate_up_proj.weight", "decoder.layers.{i}.ffn."),
])
LONGROPE_KEYS = ("short_factor", "long_factor", "factor", "attention_factor", "original_max_position_embeddings")


def _rope(o: Options, head_dim: int) -> tuple[float, RopeScaling | None, int | None]:
    """-> (rope_base, RopeScaling or None): Phi3Config's reading of its RoPE options."""
    params, legacy = o["rope_parameters"], o["rope_scaling"]
    key, spec = ("rope_scaling", legacy) if legacy else ("rope_parameters", params)
    spec = dict(spec or {})
    theta = spec.pop("rope_theta", o["rope_theta"])
    if not is_number(theta) or theta <= 0:
        o.problem(key, f"rope_theta={theta!r} must be a number > 0")
        theta = 10000.0
    # partial rotary: HF rotates int(head_dim * factor) dims; the factor lists below then have
    # rotary_dim // 2 entries, and so does LMConfig's check
    rotary = spec.pop("partial_rotary_factor", o["partial_rotary_factor"])  # rope_parameters' own wins, as HF
    rotary_dim = None
    if rotary != 1:
        dim = int(head_dim * rotary) if is_number(rotary) and 0 < rotary < 1 else 0
        if dim <= 0 or dim % 2:
            o.problems.append(f"partial_rotary_factor={rotary!r} must be in (0, 1] and rotate an even, "
                              f"nonzero int(head_dim={head_dim} * factor) dims")
        else:
            rotary_dim = dim
    rotated = rotary_dim or head_dim
    kind = spec.pop("rope_type", spec.pop("type", "default"))
    kind = "longrope" if kind in ("su", "yarn") else kind  # Phi3Config's renaming of old checkpoints
    orig_top = o["original_max_position_embeddings"]  # read whatever the kind: HF always stores it
    if kind == "default":
        for k in sorted(spec):
            o.problem(key, f"{k}={spec[k]!r} is not a default RoPE option")
        return float(theta), None, rotary_dim
    if kind != "longrope":
        o.problem(key, f"rope_type {kind!r}: Phi3ForCausalLM accepts only 'default' and 'longrope'")
        return float(theta), None, rotary_dim
    for k in sorted(set(spec) - set(LONGROPE_KEYS)):
        o.problem(key, f"{k}={spec[k]!r} is not a longrope option jaxformer implements")
    if spec.get("original_max_position_embeddings", orig_top) != orig_top:
        o.notes.append(f"{key}.original_max_position_embeddings={spec['original_max_position_embeddings']} "
                       f"is replaced by the top-level original_max_position_embeddings={orig_top}, as "
                       "transformers' Phi3Config does")
    factor = spec.get("factor")
    if factor is None:  # HF: the ratio of the two lengths
        factor = o["max_position_embeddings"] / orig_top if orig_top else None
    lengths = {name: len(spec[name]) if isinstance(spec.get(name), list) else None
               for name in ("short_factor", "long_factor")}
    for name, n in lengths.items():
        if n != rotated // 2:
            o.problem(key, f"{name} must be a list of rotated width / 2 = {rotated // 2} numbers, got "
                      f"{spec.get(name)!r}")
    try:
        return float(theta), RopeScaling(
            "longrope", factor, original_max_len=orig_top, attention_factor=spec.get("attention_factor"),
            short_factor=spec.get("short_factor"), long_factor=spec.get("long_factor")), rotary_dim
    except (ConfigError, TypeError) as e:
        o.problem(key, f"invalid longrope scaling: {e}")
        return float(theta), None, rotary_dim


def config_from_hf(raw: dict, arch: str, keys=()) -> tuple[str, LMConfig, list[str]]:
    o = Options(raw, DEFAULTS, family=f"phi3 {arch}",
                ignored={"embd_pdrop": "transformers 5.x's Phi3Model applies no embedding dropout"})
    d, heads = o["hidden_size"], o["num_attention_heads"]
    head_dim = d // heads if isinstance(d, int) and isinstance(heads, int) and heads > 0 else None
    o.require("head_dim", (None, head_dim), f"Phi3Config has no head_dim: heads are hidden_size // "
              f"num_attention_heads = {head_dim} wide")
    del o.defaults["head_dim"]  # decoder_fields: default_head_dim
    window = o["sliding_window"]
    if window is not None and not (isinstance(window, int) and not isinstance(window, bool) and window > 0):
        o.problem("sliding_window", "must be a positive integer or null")
        window = None
    rope_base, scaling, rotary_dim = _rope(o, head_dim or 2)
    fields = llama.decoder_fields(o, qkv_bias=False, out_bias=False, ffn_bias=False, default_head_dim=head_dim,
                                  rope=(rope_base, scaling))
    fields.update(sliding_window=window, dropout=float(o["resid_pdrop"]), rotary_dim=rotary_dim)
    return "lm", build_config(LMConfig, fields, o), o.notes


def _split(x: np.ndarray, sizes: list[int]) -> list[np.ndarray]:
    """Row blocks of x (views; the streaming engine copies each out)."""
    return np.split(x, np.cumsum(sizes)[:-1], axis=0)


def tensor_fn(name: str, cfg: LMConfig, arch: str):
    base = llama.tensor_fn(name, cfg, arch, rules=RULES, what="Phi3")
    k, h, g = cfg.resolved_head_dim, cfg.attention.num_heads, cfg.resolved_kv_heads

    def fn(key: str, x: np.ndarray):
        stem = FUSED.to_torch(key)
        if stem is None:
            if key.split(".")[-2] in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"):
                raise MappingError(f"unmapped: {key}; Phi3ForCausalLM stores qkv_proj and gate_up_proj fused")
            return base(key, x)
        if key.endswith("qkv_proj.weight"):  # rows [q (H K) | k (G K) | v (G K)]
            if x.ndim != 2 or x.shape[0] != (h + 2 * g) * k:
                raise MappingError(f"{key}: shape {tuple(x.shape)}, expected [{(h + 2 * g) * k}, D] "
                                   f"(q {h} x {k}, then k and v {g} x {k} rows)")
            return dict(zip((stem + f"{p}_proj.weight" for p in "qkv"), _split(x, [h * k, g * k, g * k]), strict=True))
        if x.ndim != 2 or x.shape[0] != 2 * cfg.feedforward.d_ff:  # rows [gate (F) | up (F)]
            raise MappingError(f"{key}: shape {tuple(x.shape)}, expected [{2 * cfg.feedforward.d_ff}, D] "
                               "(gate, then up)")
        return dict(zip((stem + "gate_proj.weight", stem + "up_proj.weight"),
                        _split(x, [cfg.feedforward.d_ff, cfg.feedforward.d_ff]), strict=True))
    return fn


# ----------------------------------------------------------------------------- export
# LLaMA's with residual dropout, a window, partial rotary, longrope (and no other scaling), no
# biases, and heads d_model // num_heads wide
EXPORTS = {"lm": dict(
    llama.DECODER, dropout=WRITES, sliding_window=WRITES, rotary_dim=WRITES, layer_types=None,
    **llama.biases("qkv", "out", "ffn"),
    rope_scaling=Need(lambda c: c.positions.rope_scaling is None or c.positions.rope_scaling.rope_type == "longrope",
                      "positions.rope_scaling={positions.rope_scaling.rope_type!r} "
                      "(Phi3ForCausalLM has only longrope)"),
    head_dim=Need(lambda c: c.attention.head_dim is None or c.attention.head_dim == c.d_model // c.attention.num_heads,
                  "attention.head_dim={attention.head_dim} (Phi3ForCausalLM's heads are d_model // num_heads wide)"))}


def claims(c) -> bool:  # only Phi-3 has longrope; residual dropout, partial rotary (Phi-4-mini)
    longrope = c.positions.rope_scaling is not None and c.positions.rope_scaling.rope_type == "longrope"
    return c.positions.kind == "rope" and (longrope or bool(c.dropout) or c.positions.rotary_dim is not None)


def config_to_hf(name: str, cfg: LMConfig) -> dict:
    common = llama.common_config_to_hf(cfg)
    del common["head_dim"]  # Phi3Config has none (hidden_size // num_attention_heads)
    s = cfg.positions.rope_scaling
    out = {"architectures": ["Phi3ForCausalLM"], "model_type": MODEL_TYPE, **common,
           "sliding_window": cfg.attention.sliding_window, "resid_pdrop": cfg.dropout, "embd_pdrop": 0.0}
    if s is not None and s.rope_type == "longrope":
        params = {"rope_type": "longrope", "rope_theta": float(cfg.positions.rope_base), "factor": float(s.factor),
                  "short_factor": list(s.short_factor), "long_factor": list(s.long_factor),
                  "original_max_position_embeddings": int(s.original_max_len)}
        if s.attention_factor is not None:
            params["attention_factor"] = float(s.attention_factor)
        out.update(rope_parameters=params, original_max_position_embeddings=int(s.original_max_len))
    if cfg.positions.rotary_dim is not None:  # Phi-4-mini's partial rotary (§35)
        out["rope_parameters"]["partial_rotary_factor"] = partial_factor(cfg.positions.rotary_dim,
                                                                         cfg.resolved_head_dim)
    return out


def state_dict_to_hf(sd: dict[str, np.ndarray], name: str, cfg: LMConfig) -> dict[str, np.ndarray]:
    out = rename_all(sd, RULES.to_hf, "Phi3")
    for i in range(cfg.num_layers):
        a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        out[a + "qkv_proj.weight"] = np.concatenate([out.pop(a + f"{p}_proj.weight") for p in "qkv"], axis=0)
        out[m + "gate_up_proj.weight"] = np.concatenate([out.pop(m + "gate_proj.weight"),
                                                         out.pop(m + "up_proj.weight")], axis=0)
    return out


FAMILY = Family(name="phi3", architectures=ARCHITECTURES, model_types=MODEL_TYPES, config_from_hf=config_from_hf,
                tensor_fn=tensor_fn, config_to_hf=config_to_hf, state_dict_to_hf=state_dict_to_hf,
                hf_defaults=dict.fromkeys(ARCHITECTURES, DEFAULTS), exports=EXPORTS, claims=claims,
                embed_keys=EMBED_KEYS)
