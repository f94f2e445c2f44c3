"""GPT-NeoX (`GPTNeoXForCausalLM`: Pythia, GPT-NeoX-20B) <-> jaxformer `lm`.

Mapping and its deliberate details (docs/numerics.md §35):
  * Partial rotary: the first rotary_dim = int(head_dim * partial_rotary_factor) dims of each
    head rotate (rotate-half within them, frequencies of a rotary_dim-wide head), the rest
    pass through -> rotary_dim (None when it is the whole head). The factor is HF's:
    rope_parameters.partial_rotary_factor (5.x), else rotary_pct (4.x files, default 0.25);
    an odd or zero rotary_dim is refused by name (HF would rotate a width of its own).
  * rotary_emb_base (4.x files) is the RoPE base unless rope_parameters gives rope_theta;
    RoPE scaling (linear, dynamic, llama3, yarn) as for LLaMA (common.rope_from_hf, §20).
  * use_parallel_residual -> parallel_residual: x + attn(ln1(x)) + mlp(ln2(x)); false is the
    ordinary pre-norm block (norm_position="pre" either way).
  * attention.query_key_value fuses q, k and v PER HEAD: its output rows are [H, 3, K]
    (head h's q, then its k, then its v): split into q_proj / k_proj / v_proj at import and
    interleaved back at export. attention.dense -> o_proj; attention_bias covers both.
  * LayerNorm with biases (layer_norm_eps -> norm_eps), a final LayerNorm; the MLP
    (dense_h_to_4h, dense_4h_to_h) is plain with biases; hidden_act from common's table
    ("gelu" exact, "gelu_new" / "gelu_fast" / "gelu_pytorch_tanh" tanh, "relu").
  * Scores scaled by 1/sqrt(head_dim); no embedding scaling; tie_word_embeddings ->
    tie_embeddings (the head is `lm_head`, `embed_out` in older files).
  * Dropouts map, so training matches too: hidden_dropout -> dropout (HF's post-attention
    and post-MLP dropouts) and embed_dropout (its emb_dropout); attention_dropout ->
    attn_dropout. classifier_dropout belongs to the sequence / token classification heads
    (ignored). Buffers of old checkpoints (attention.bias / masked_bias: the causal mask;
    rotary_emb.inv_freq: recomputed) are skipped.
  * Refused by name: an odd or zero rotary_dim, other activations, is_decoder / cross-attention,
    any key jaxformer does not know.
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
    hf_max_positions,
    partial_factor,
    rename_all,
    rope_from_hf,
    rope_to_hf,
    token_ids,
)
from jaxformer.hf.exports import WRITES, Need, plain_multi_head

ARCHITECTURES = {"GPTNeoXForCausalLM": "lm"}
MODEL_TYPE = "gpt_neox"
MODEL_TYPES = dict.fromkeys(ARCHITECTURES, MODEL_TYPE)
EMBED_KEYS = ("gpt_neox.embed_in.weight",)
DEFAULTS = dict(vocab_size=50432, hidden_size=6144, num_hidden_layers=44, num_attention_heads=64,
                intermediate_size=24576, hidden_act="gelu", rotary_pct=0.25, rotary_emb_base=10000.0,
                attention_dropout=0.0, hidden_dropout=0.0, classifier_dropout=0.1, max_position_embeddings=2048,
                layer_norm_eps=1e-5, bos_token_id=0, eos_token_id=2, pad_token_id=None,
                tie_word_embeddings=False, use_parallel_residual=True, rope_scaling=None, rope_parameters=None,
                attention_bias=True)
IGNORED = {"classifier_dropout": "dropout of GPTNeoXForSequenceClassification / TokenClassification "
                                 "heads, unused by GPTNeoXForCausalLM"}
LAYER = "gpt_neox.layers.{i}."
RULES = Renamer([
    ("gpt_neox.embed_in.weight", "embed.embed_tokens.weight"),
    (LAYER + "input_layernorm.{leaf}", "decoder.layers.{i}.attn_norm.{leaf}"),
    (LAYER + "post_attention_layernorm.{leaf}", "decoder.layers.{i}.ffn_norm.{leaf}"),
    (LAYER + "attention.dense.{leaf}", "decoder.layers.{i}.self_attn.o_proj.{leaf}"),
    (LAYER + "mlp.dense_h_to_4h.{leaf}", "decoder.layers.{i}.ffn.up_proj.{leaf}"),
    (LAYER + "mlp.dense_4h_to_h.{leaf}", "decoder.layers.{i}.ffn.down_proj.{leaf}"),
    ("gpt_neox.final_layer_norm.{leaf}", "decoder.final_norm.{leaf}"),
    ("lm_head.weight", "lm_head.weight"),
    ("embed_out.weight", "lm_head.weight"),  # older files' name of the head
])
QKV = re.compile(r"gpt_neox\.layers\.(\d+)\.attention\.query_key_value\.(weight|bias)")
BUFFERS = re.compile(r"gpt_neox\.(layers\.\d+\.attention\.(bias|masked_bias|rotary_emb\.inv_freq)"
                     r"|rotary_emb\.inv_freq)")


def _rotary_dim(o: Options, head_dim: int) -> int | None:
    """rotary_dim from HF's partial_rotary_factor (rope_parameters / rope_scaling, else
    rotary_pct), as HF computes it: int(head_dim * factor). None = the whole head."""
    spec = o.raw.get("rope_scaling") or o.raw.get("rope_parameters")
    key, pct = "rotary_pct", o["rotary_pct"]
    if isinstance(spec, dict) and "partial_rotary_factor" in spec:
        key = "rope_scaling" if o.raw.get("rope_scaling") else "rope_parameters"
        pct = spec["partial_rotary_factor"]
    if not (isinstance(pct, (int, float)) and not isinstance(pct, bool) and 0 < pct <= 1):
        o.problem(key, f"partial_rotary_factor={pct!r} must be a number in (0, 1]")
        return None
    dim = int(head_dim * pct)
    if dim <= 0 or dim % 2:
        o.problem(key, f"partial_rotary_factor={pct!r} gives int(head_dim={head_dim} * {pct}) = {dim} "
                  "rotated dims; jaxformer rotates an even number > 0 (HF would rotate a width of its own)")
        return None
    return None if dim == head_dim else dim


def config_from_hf(raw: dict, arch: str, keys=()) -> tuple[str, LMConfig, list[str]]:
    o = Options(raw, DEFAULTS, family=f"gpt_neox {arch}", ignored=IGNORED)
    d, heads = o["hidden_size"], o["num_attention_heads"]
    if not (isinstance(d, int) and isinstance(heads, int) and heads > 0 and d % heads == 0):
        o.problem("num_attention_heads", f"must divide hidden_size={d}")
        heads = 1
    ffn = ffn_from_hf(o, "hidden_act")
    vocab, max_pos = o["vocab_size"], o["max_position_embeddings"]
    rope_base, rope_scaling = rope_from_hf(o, max_pos, default_theta=o["rotary_emb_base"], partial=True)
    rotary_dim = _rotary_dim(o, d // heads)
    bias, hidden_dropout = bool(o["attention_bias"]), float(o["hidden_dropout"])
    ids = token_ids(o, vocab, need_bos_eos=True)
    fields = dict(
        vocab_size=vocab, d_model=d, num_heads=heads, d_ff=o["intermediate_size"],
        num_layers=o["num_hidden_layers"], ffn=ffn, norm="layernorm", norm_eps=float(o["layer_norm_eps"]),
        norm_bias=True, norm_position="pre", parallel_residual=bool(o["use_parallel_residual"]),
        final_norm=True, bias=bias, attn_qkv_bias=bias, attn_out_bias=bias, ffn_bias=True,
        dropout=hidden_dropout, attn_dropout=float(o["attention_dropout"]), ffn_dropout=0.0,
        embed_dropout=hidden_dropout, position="rope", rope_base=rope_base, rope_scaling=rope_scaling,
        rotary_dim=rotary_dim, max_len=max_pos, scale_embedding=False,
        tie_embeddings=bool(o["tie_word_embeddings"]), dtype="float32", **ids)
    return "lm", build_config(LMConfig, fields, o), o.notes


def tensor_fn(name: str, cfg: LMConfig, arch: str):
    """HF key, array -> {torch_ref key: array}, or None for a skipped buffer / tied head."""
    h, k = cfg.attention.num_heads, cfg.resolved_head_dim

    def fn(key: str, x: np.ndarray):
        if key in ("lm_head.weight", "embed_out.weight") and cfg.tie_embeddings:
            return None  # a copy identical to embed_in (hf.read_config checked it; HF ties them)
        if BUFFERS.fullmatch(key):
            return None
        m = QKV.fullmatch(key)
        if m:  # rows [H, 3, K] (per head: q, k, v) -> three [H * K] row blocks
            p = f"decoder.layers.{m.group(1)}.self_attn."
            split = x.reshape(h, 3, k, *x.shape[1:])
            return {p + f"{n}_proj.{m.group(2)}": split[:, j].reshape(h * k, *x.shape[1:])
                    for j, n in enumerate("qkv")}
        new = RULES.to_torch(key)
        if new is None:
            raise MappingError(f"unmapped: {key} has no jaxformer lm (GPT-NeoX) equivalent")
        return {new: x}
    return fn


# ----------------------------------------------------------------------------- export
# Written: the sizes, the RoPE (partial: rotary_pct), the parallel block, the dropouts, the
# attention biases; required: LayerNorm with biases, Pre-LN, MLP biases, full multi-head attention
EXPORTS = {"lm": dict(
    vocab_size=WRITES, d_model=WRITES, num_heads=WRITES, d_ff=WRITES, num_layers=WRITES, max_len=WRITES,
    norm_eps=WRITES, rope_base=WRITES, rope_scaling=llama.ROPE_SCALING, rotary_dim=WRITES,
    parallel_residual=WRITES, attn_dropout=WRITES, dropout=WRITES, tie_embeddings=WRITES, bos_id=WRITES,
    eos_id=WRITES, pad_id=WRITES, bias=WRITES, attn_qkv_bias=WRITES,
    attn_out_bias=Need(lambda c: c.resolved_out_bias == c.resolved_qkv_bias,
                       "attention.attn_qkv_bias={resolved_qkv_bias} with attention.attn_out_bias={resolved_out_bias} "
                       "(GPT-NeoX's attention_bias covers query_key_value and dense)"),
    **llama.biases("ffn", want=True),
    position="rope", norm="layernorm", norm_bias=True, norm_position="pre", final_norm=True, scale_embedding=False,
    sliding_window=None, layer_types=None, ffn_dropout=0.0, type_vocab_size=0, embed_norm=False, qk_norm=False,
    qk_norm_full=False, attn_logit_softcap=None, query_pre_attn_scalar=None, final_logit_softcap=None,
    embed_dropout=Need(lambda c: c.embed_dropout == c.dropout, "embed_dropout={embed_dropout} (GPT-NeoX needs "
                       "dropout={dropout}: one hidden_dropout)"),
    **plain_multi_head("GPT-NeoX"))}


def claims(c) -> bool:
    return c.positions.kind == "rope" and (c.norms.kind == "layernorm" or c.norms.parallel_residual)


def config_to_hf(name: str, cfg: LMConfig) -> dict:
    rope = rope_to_hf(cfg)["rope_parameters"]  # rope_theta inside, as transformers 5.x writes it
    rope["partial_rotary_factor"] = partial_factor(cfg.resolved_rotary_dim, cfg.resolved_head_dim)
    eos = list(cfg.eos_id) if isinstance(cfg.eos_id, tuple) else cfg.eos_id
    return {"architectures": ["GPTNeoXForCausalLM"], "model_type": MODEL_TYPE, "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.d_model, "num_hidden_layers": cfg.num_layers,
            "num_attention_heads": cfg.attention.num_heads, "intermediate_size": cfg.feedforward.d_ff,
            "hidden_act": ffn_to_hf(cfg.feedforward.kind), "rope_parameters": rope,
            "attention_dropout": cfg.attention.attn_dropout, "hidden_dropout": cfg.dropout,
            "max_position_embeddings": hf_max_positions(cfg), "layer_norm_eps": cfg.norms.norm_eps,
            "use_parallel_residual": cfg.norms.parallel_residual, "attention_bias": cfg.resolved_qkv_bias,
            "tie_word_embeddings": cfg.tie_embeddings, "bos_token_id": cfg.bos_id, "eos_token_id": eos,
            "pad_token_id": cfg.pad_id, "initializer_range": 0.02, "dtype": "float32"}


def state_dict_to_hf(sd: dict[str, np.ndarray], name: str, cfg: LMConfig) -> dict[str, np.ndarray]:
    """torch_ref lm state_dict -> GPTNeoXForCausalLM state_dict (query_key_value per head)."""
    sd, h, k = dict(sd), cfg.attention.num_heads, cfg.resolved_head_dim

    def take(key: str) -> np.ndarray:
        if key not in sd:
            raise ConversionError([f"missing: {key} (needed by GPTNeoXForCausalLM)"])
        return sd.pop(key)

    out = {}
    for i in range(cfg.num_layers):
        p, fused = f"decoder.layers.{i}.self_attn.", f"gpt_neox.layers.{i}.attention.query_key_value."
        for leaf in ("weight", "bias") if cfg.resolved_qkv_bias else ("weight",):
            parts = [take(p + f"{n}_proj.{leaf}") for n in "qkv"]  # [H * K, ...] each
            rest = parts[0].shape[1:]
            out[fused + leaf] = np.stack([x.reshape(h, k, *rest) for x in parts], axis=1).reshape(3 * h * k, *rest)
    out.update(rename_all(sd, RULES.to_hf, "GPT-NeoX"))
    return out


FAMILY = Family(name="gpt_neox", architectures=ARCHITECTURES, model_types=MODEL_TYPES, config_from_hf=config_from_hf,
                tensor_fn=tensor_fn, config_to_hf=config_to_hf, state_dict_to_hf=state_dict_to_hf,
                hf_defaults=dict.fromkeys(ARCHITECTURES, DEFAULTS), exports=EXPORTS, claims=claims,
                embed_keys=EMBED_KEYS)
