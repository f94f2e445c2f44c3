"""GPT-2 (`GPT2LMHeadModel`) <-> jaxformer `lm`, GPT-2 flavour (configs/lm.yaml).

Mapping and its deliberate details:
  * HF GPT-2 uses `Conv1D`, whose weight is already [in, out] (a Linear's is [out, in]):
    torch_ref weight = Conv1D weight transposed; jaxformer.convert then takes it to flax's
    [in, out] kernel as for any Linear.
  * `attn.c_attn` fuses q, k and v along its output axis ([D, 3D], bias [3D]): split into
    q_proj / k_proj / v_proj in that order, and concatenated back on export.
  * activation_function "gelu_new" (HF's tanh GELU, also "gelu_pytorch_tanh"/"gelu_fast") ->
    ffn="gelu_tanh"; "gelu" -> exact "gelu"; "relu". layer_norm_epsilon -> norm_eps.
  * Pre-LN with a final LayerNorm (ln_f), learned positions (wpe, n_positions -> max_len), no
    embedding scaling, biases everywhere; tie_word_embeddings -> tie_embeddings. With tied
    embeddings HF ignores any stored `lm_head.weight` (it uses wte), so do we.
  * Dropouts: resid_pdrop -> dropout, attn_pdrop -> attn_dropout, embd_pdrop -> embed_dropout.
  * Unsupported (an error naming the option): scale_attn_weights=False,
    scale_attn_by_inverse_layer_idx=True, add_cross_attention=True, other activations.
    reorder_and_upcast_attn only reorders/upcasts the same fp32 math, so it is accepted.
  * Buffers some checkpoints carry (`attn.bias`, `attn.masked_bias`: the causal mask) are
    skipped; old checkpoints without the `transformer.` prefix are read too.
"""
from __future__ import annotations

import re

import numpy as np

from jaxformer.config.models import LMConfig
from jaxformer.convert import ConversionError
from jaxformer.hf.common import Options, build_config, token_ids
from jaxformer.hf.loading import MappingError

ARCHITECTURES = {"GPT2LMHeadModel": "lm"}
MODEL_TYPE = "gpt2"
DEFAULTS = dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12, n_inner=None,
                activation_function="gelu_new", resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1,
                layer_norm_epsilon=1e-5, scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False,
                reorder_and_upcast_attn=False, add_cross_attention=False, tie_word_embeddings=True,
                bos_token_id=50256, eos_token_id=50256, pad_token_id=None)
IGNORED = {k: "sequence-summary heads of GPT2DoubleHeadsModel, unused by GPT2LMHeadModel"
           for k in ("summary_type", "summary_use_proj", "summary_activation",
                     "summary_proj_to_labels", "summary_first_dropout")}
ACTS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh",
        "gelu": "gelu", "relu": "relu"}
ACTS_TO_HF = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}

# per-layer HF name -> (jaxformer name, how): "linear" = Conv1D transposed, "copy" = as is
LAYER = {
    "ln_1.weight": ("attn_norm.weight", "copy"), "ln_1.bias": ("attn_norm.bias", "copy"),
    "attn.c_proj.weight": ("self_attn.o_proj.weight", "linear"),
    "attn.c_proj.bias": ("self_attn.o_proj.bias", "copy"),
    "ln_2.weight": ("ffn_norm.weight", "copy"), "ln_2.bias": ("ffn_norm.bias", "copy"),
    "mlp.c_fc.weight": ("ffn.up_proj.weight", "linear"), "mlp.c_fc.bias": ("ffn.up_proj.bias", "copy"),
    "mlp.c_proj.weight": ("ffn.down_proj.weight", "linear"),
    "mlp.c_proj.bias": ("ffn.down_proj.bias", "copy"),
}
TOP = {"wte.weight": "embed.embed_tokens.weight", "wpe.weight": "embed.embed_positions.weight",
       "ln_f.weight": "decoder.final_norm.weight", "ln_f.bias": "decoder.final_norm.bias"}
BUFFERS = ("attn.bias", "attn.masked_bias")


def config_from_hf(raw: dict, arch: str, keys=()) -> tuple[str, LMConfig, list[str]]:
    o = Options(raw, DEFAULTS, family=f"gpt2 {arch}", ignored=IGNORED)
    d, heads = o["n_embd"], o["n_head"]
    act = o.require("activation_function", ACTS, f"jaxformer FFN activations: {sorted(ACTS)}")
    o.require("scale_attn_weights", (True,), "jaxformer always scales scores by 1/sqrt(head_dim)")
    o.require("scale_attn_by_inverse_layer_idx", (False,),
              "jaxformer has no per-layer 1/(layer+1) attention scaling")
    o.require("add_cross_attention", (False,), "GPT2LMHeadModel with cross-attention has no "
              "jaxformer lm equivalent")
    o["reorder_and_upcast_attn"]  # same math in fp32 (HF upcasts to fp32, jaxformer is fp32)
    n_pos = o["n_positions"]
    if "n_ctx" in raw:  # GPT-2's legacy alias of n_positions
        o.require("n_ctx", lambda v: v == n_pos, f"legacy n_ctx must equal n_positions={n_pos}")
    vocab = o["vocab_size"]
    ids = token_ids(o, vocab, need_bos_eos=True)
    fields = dict(
        vocab_size=vocab, d_model=d, num_heads=heads, d_ff=o["n_inner"] or 4 * d,
        num_layers=o["n_layer"], ffn=ACTS.get(act, "gelu_tanh"), norm="layernorm",
        norm_eps=float(o["layer_norm_epsilon"]), norm_position="pre", final_norm=True, bias=True,
        norm_bias=True, dropout=float(o["resid_pdrop"]), attn_dropout=float(o["attn_pdrop"]),
        ffn_dropout=0.0, embed_dropout=float(o["embd_pdrop"]), position="learned", max_len=n_pos,
        scale_embedding=False, tie_embeddings=bool(o["tie_word_embeddings"]), dtype="float32", **ids)
    return "lm", build_config(LMConfig, fields, o), o.notes


def tensor_fn(name: str, cfg: LMConfig, arch: str):
    """HF key, array -> {torch_ref key: array} (views only), or None for a skipped buffer."""
    d = cfg.d_model

    def fn(key: str, x: np.ndarray):
        if key == "lm_head.weight":
            return None if cfg.tie_embeddings else {"lm_head.weight": x}
        k = key[len("transformer."):] if key.startswith("transformer.") else key
        if k in TOP:
            return {TOP[k]: x}
        m = re.fullmatch(r"h\.(\d+)\.(.+)", k)
        if m:
            p, rest = f"decoder.layers.{m.group(1)}.", m.group(2)
            if rest in BUFFERS:
                return None
            if rest == "attn.c_attn.weight":  # [D, 3D] (in, out) -> three [D, D] (out, in)
                return {p + f"self_attn.{n}_proj.weight": x[:, j * d:(j + 1) * d].T
                        for j, n in enumerate("qkv")}
            if rest == "attn.c_attn.bias":
                return {p + f"self_attn.{n}_proj.bias": x[j * d:(j + 1) * d] for j, n in enumerate("qkv")}
            if rest in LAYER:
                target, how = LAYER[rest]
                return {p + target: x.T if how == "linear" else x}
        raise MappingError(f"unmapped: {key} has no jaxformer lm (GPT-2) equivalent")
    return fn


# ----------------------------------------------------------------------------- export
def export_problems(name: str, cfg) -> list[str]:
    """Why this jaxformer model has no GPT2LMHeadModel equivalent ([] if it has one)."""
    want = dict(position="learned", norm="layernorm", norm_position="pre", final_norm=True, bias=True,
                norm_bias=True, scale_embedding=False, sliding_window=None, ffn_dropout=0.0,
                type_vocab_size=0, embed_norm=False)
    out = [f"{k}={getattr(cfg, k)!r} (GPT-2 needs {v!r})" for k, v in want.items()
           if getattr(cfg, k, v) != v]
    if cfg.ffn not in ACTS_TO_HF:
        out.append(f"ffn={cfg.ffn!r} (GPT-2 activations: {sorted(ACTS_TO_HF)})")
    if cfg.resolved_kv_heads != cfg.num_heads:
        out.append(f"num_kv_heads={cfg.num_kv_heads} (GPT-2 has no grouped-query attention)")
    if cfg.resolved_head_dim * cfg.num_heads != cfg.d_model:
        out.append(f"head_dim={cfg.head_dim} (GPT-2 needs d_model / num_heads)")
    return out


def config_to_hf(name: str, cfg: LMConfig) -> dict:
    return {"architectures": ["GPT2LMHeadModel"], "model_type": MODEL_TYPE,
            "vocab_size": cfg.vocab_size, "n_positions": cfg.max_len, "n_embd": cfg.d_model,
            "n_layer": cfg.num_layers, "n_head": cfg.num_heads, "n_inner": cfg.d_ff,
            "activation_function": ACTS_TO_HF[cfg.ffn], "resid_pdrop": cfg.dropout,
            "embd_pdrop": cfg.embed_dropout, "attn_pdrop": cfg.attn_dropout,
            "layer_norm_epsilon": cfg.norm_eps, "scale_attn_weights": True,
            "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
            "add_cross_attention": False, "tie_word_embeddings": cfg.tie_embeddings,
            "bos_token_id": cfg.bos_id, "eos_token_id": cfg.eos_id, "pad_token_id": cfg.pad_id,
            "initializer_range": 0.02, "dtype": "float32"}


def state_dict_to_hf(sd: dict[str, np.ndarray], name: str, cfg: LMConfig) -> dict[str, np.ndarray]:
    """torch_ref lm state_dict -> GPT2LMHeadModel state_dict (Conv1D layout, fused c_attn)."""
    sd = dict(sd)

    def take(key: str) -> np.ndarray:
        if key not in sd:
            raise ConversionError([f"missing: {key} (needed by GPT2LMHeadModel)"])
        return sd.pop(key)

    out = {}
    for i in range(cfg.num_layers):
        p, h = f"decoder.layers.{i}.", f"transformer.h.{i}."
        q, k, v = (take(p + f"self_attn.{n}_proj.weight") for n in "qkv")
        out[h + "attn.c_attn.weight"] = np.concatenate([q.T, k.T, v.T], axis=1)  # [D, 3D]
        out[h + "attn.c_attn.bias"] = np.concatenate([take(p + f"self_attn.{n}_proj.bias") for n in "qkv"])
        for hf_name, (ours, how) in LAYER.items():
            x = take(p + ours)
            out[h + hf_name] = np.ascontiguousarray(x.T) if how == "linear" else x
    for hf_name, ours in TOP.items():
        out["transformer." + hf_name] = take(ours)
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = take("lm_head.weight")
    if sd:
        raise ConversionError([f"unmapped: {k} has no GPT-2 name" for k in sorted(sd)])
    return out
