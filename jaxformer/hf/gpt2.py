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
    embeddings a stored `lm_head.weight` identical to wte is skipped (HF ties them); a different
    one loads untied and one without wte gives wte, as transformers 5.x does (hf.read_config).
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
from jaxformer.hf import llama
from jaxformer.hf.common import (
    Family,
    MappingError,
    Options,
    Renamer,
    build_config,
    ffn_from_hf,
    ffn_to_hf,
    rename_all,
    token_ids,
)
from jaxformer.hf.exports import WRITES, Ignored, plain_multi_head

ARCHITECTURES = {"GPT2LMHeadModel": "lm"}
MODEL_TYPE = "gpt2"
MODEL_TYPES = dict.fromkeys(ARCHITECTURES, MODEL_TYPE)  # config.json model_type of each
EMBED_KEYS = ("transformer.wte.weight", "wte.weight")  # the table a tied lm_head.weight copies
DEFAULTS = dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12, n_inner=None,
                activation_function="gelu_new", resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1,
                layer_norm_epsilon=1e-5, scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False,
                reorder_and_upcast_attn=False, add_cross_attention=False, tie_word_embeddings=True,
                bos_token_id=50256, eos_token_id=50256, pad_token_id=None)
IGNORED = {k: "sequence-summary heads of GPT2DoubleHeadsModel, unused by GPT2LMHeadModel"
           for k in ("summary_type", "summary_use_proj", "summary_activation",
                     "summary_proj_to_labels", "summary_first_dropout")}
LAYER = "transformer.h.{i}."
RULES = Renamer([
    ("transformer.wte.weight", "embed.embed_tokens.weight"),
    ("transformer.wpe.weight", "embed.embed_positions.weight"),
    (LAYER + "ln_1.{leaf}", "decoder.layers.{i}.attn_norm.{leaf}"),
    (LAYER + "attn.c_proj.{leaf}", "decoder.layers.{i}.self_attn.o_proj.{leaf}"),
    (LAYER + "ln_2.{leaf}", "decoder.layers.{i}.ffn_norm.{leaf}"),
    (LAYER + "mlp.c_fc.{leaf}", "decoder.layers.{i}.ffn.up_proj.{leaf}"),
    (LAYER + "mlp.c_proj.{leaf}", "decoder.layers.{i}.ffn.down_proj.{leaf}"),
    ("transformer.ln_f.{leaf}", "decoder.final_norm.{leaf}"),
    ("lm_head.weight", "lm_head.weight"),
])
CONV1D = ("attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")  # stored [in, out]
C_ATTN = re.compile(r"transformer\.h\.(\d+)\.attn\.c_attn\.(weight|bias)")
BUFFERS = re.compile(r"transformer\.h\.\d+\.attn\.(bias|masked_bias)")


def config_from_hf(raw: dict, arch: str, keys=()) -> tuple[str, LMConfig, list[str]]:
    o = Options(raw, DEFAULTS, family=f"gpt2 {arch}", ignored=IGNORED)
    d, heads = o["n_embd"], o["n_head"]
    ffn = ffn_from_hf(o, "activation_function")
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
        num_layers=o["n_layer"], ffn=ffn, norm="layernorm",
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
        k = key if key.startswith("transformer.") else "transformer." + key  # old checkpoints
        if BUFFERS.fullmatch(k):
            return None
        m = C_ATTN.fullmatch(k)
        if m:  # weight [D, 3D] (in, out) -> three [D, D] (out, in); bias [3D] -> three [D]
            p, leaf = f"decoder.layers.{m.group(1)}.self_attn.", m.group(2)
            parts = [x[:, j * d:(j + 1) * d].T if leaf == "weight" else x[j * d:(j + 1) * d]
                     for j in range(3)]
            return {p + f"{n}_proj.{leaf}": y for n, y in zip("qkv", parts, strict=True)}
        new = None if k == "transformer.lm_head.weight" else RULES.to_torch(k)
        if new is None:
            raise MappingError(f"unmapped: {key} has no jaxformer lm (GPT-2) equivalent")
        return {new: x.T if k.endswith(CONV1D) else x}
    return fn


# ----------------------------------------------------------------------------- export
# Written: the sizes, the activation, the dropouts; required: GPT-2's learned positions, Pre-LN
# LayerNorm with biases, biases everywhere, full multi-head attention
EXPORTS = {"lm": dict(
    vocab_size=WRITES, d_model=WRITES, num_heads=WRITES, d_ff=WRITES, num_layers=WRITES, max_len=WRITES,
    norm_eps=WRITES, dropout=WRITES, embed_dropout=WRITES, attn_dropout=WRITES, tie_embeddings=WRITES,
    bos_id=WRITES, eos_id=WRITES, pad_id=WRITES,
    position="learned", norm="layernorm", norm_position="pre", final_norm=True, bias=True, norm_bias=True,
    scale_embedding=False, sliding_window=None, layer_types=Ignored("without a sliding_window every layer "
                                                                    "attends fully"),
    ffn_dropout=0.0, type_vocab_size=0, embed_norm=False, qk_norm=False, attn_logit_softcap=None,
    query_pre_attn_scalar=None, final_logit_softcap=None, **llama.biases("qkv", "out", "ffn", want=True),
    **plain_multi_head("GPT-2"))}


def config_to_hf(name: str, cfg: LMConfig) -> dict:
    return {"architectures": ["GPT2LMHeadModel"], "model_type": MODEL_TYPE,
            "vocab_size": cfg.vocab_size, "n_positions": cfg.max_len, "n_embd": cfg.d_model,
            "n_layer": cfg.num_layers, "n_head": cfg.attention.num_heads, "n_inner": cfg.feedforward.d_ff,
            "activation_function": ffn_to_hf(cfg.feedforward.kind), "resid_pdrop": cfg.dropout,
            "embd_pdrop": cfg.embed_dropout, "attn_pdrop": cfg.attention.attn_dropout,
            "layer_norm_epsilon": cfg.norms.norm_eps, "scale_attn_weights": True,
            "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
            "add_cross_attention": False, "tie_word_embeddings": cfg.tie_embeddings,
            "bos_token_id": cfg.bos_id,
            "eos_token_id": list(cfg.eos_id) if isinstance(cfg.eos_id, tuple) else cfg.eos_id, "pad_token_id": cfg.pad_id,
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
        p, h = f"decoder.layers.{i}.self_attn.", f"transformer.h.{i}.attn.c_attn."
        q, k, v = (take(p + f"{n}_proj.weight") for n in "qkv")
        out[h + "weight"] = np.concatenate([q.T, k.T, v.T], axis=1)  # [D, 3D]
        out[h + "bias"] = np.concatenate([take(p + f"{n}_proj.bias") for n in "qkv"])
    for k, x in rename_all(sd, RULES.to_hf, "GPT-2").items():
        out[k] = np.ascontiguousarray(x.T) if k.endswith(CONV1D) else x
    return out


FAMILY = Family(name="gpt2", architectures=ARCHITECTURES, model_types=MODEL_TYPES, config_from_hf=config_from_hf,
                tensor_fn=tensor_fn, config_to_hf=config_to_hf, state_dict_to_hf=state_dict_to_hf,
                hf_defaults=dict.fromkeys(ARCHITECTURES, DEFAULTS), exports=EXPORTS,
                embed_keys=EMBED_KEYS)
