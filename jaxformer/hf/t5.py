"""T5 (`T5ForConditionalGeneration`) <-> jaxformer `seq2seq`, T5 flavour (Seq2SeqConfig.t5()).

Mapping and its deliberate details (transformers 5.x modeling_t5.py; docs/numerics.md §22):
  * One shared token table (`shared`) -> share_embeddings=True, `embed.embed_tokens`, no
    embedding scaling, no absolute positions. `encoder.embed_tokens` / `decoder.embed_tokens`
    copies identical to `shared` are skipped (HF ties them); a checkpoint whose copies differ,
    or that has no `shared.weight`, is refused.
  * Relative position bias (position="t5"): the table lives in block 0's self-attention of each
    stack (`block.0.layer.0.SelfAttention.relative_attention_bias`, [num_buckets, heads]) and
    is shared by every layer of that stack -> `encoder.rel_bias` / `decoder.rel_bias`,
    bidirectional buckets in the encoder, causal in the decoder; relative_attention_num_buckets
    -> rel_num_buckets, relative_attention_max_distance -> rel_max_distance. Cross-attention
    has no position bias. The buckets come from jaxformer.tables.t5_bucket_table.
  * Scores are not scaled by 1/sqrt(d_kv) -> attn_scale=1.0; d_kv -> head_dim (independent of
    d_model / num_heads).
  * T5LayerNorm is an RMSNorm without bias, statistics in fp32 -> norm="rmsnorm",
    layer_norm_epsilon -> norm_eps; Pre-LN with a final norm per stack; no biases anywhere.
  * feed_forward_proj: "relu" -> ffn="relu", "gelu" -> "gelu" (exact), "gelu_new" ->
    "gelu_tanh"; "gated-gelu" (v1.1 / flan: HF's gelu_new, the tanh approximation) ->
    "geglu_tanh" with wi_0 -> gate_proj, wi_1 -> up_proj, wo -> down_proj; "gated-silu" ->
    "swiglu". Others ("gated-relu", ...) are refused. A stored dense_act_fn / is_gated_act
    must agree with feed_forward_proj.
  * The head: HF 5.x multiplies the decoder output by d_model ** -0.5 iff scale_decoder_outputs
    (when config.json lacks it: iff tie_word_embeddings is not false, i.e. v1.0) ->
    scale_decoder_output. The lm_head is tied to `shared` unless the checkpoint stores an
    lm_head.weight that differs from it (v1.1 / flan), then tie_output=False, as transformers
    5.x loads it (read through resolve_checkpoint).
  * Decoding starts from decoder_start_token_id -> bos_id; T5 sets it to pad_token_id (0). As
    HF's generate, a config.json without one starts from bos_token_id; with neither, from
    pad_token_id (noted: HF's generate then refuses to run).
    eos_token_id (one id) -> eos_id.
  * dropout_rate -> dropout, attn_dropout, ffn_dropout and embed_dropout. HF also drops out
    each stack's final-norm output in training; jaxformer does not (eval is identical).
  * n_positions (old configs) -> max_len (the longest sequence jaxformer accepts; the relative
    scheme itself has no limit), else 512.
  * Unsupported (an error naming the option): is_decoder=True, an eos_token_id list of more than
    one id, bucket settings whose log-spaced buckets are undefined.
  * HF T5 attends to every source token when attention_mask is None; jaxformer's seq2seq masks
    src_ids == pad_id then. Pass the mask explicitly to compare the two.
"""
from __future__ import annotations

import numpy as np

from jaxformer.config import ConfigError
from jaxformer.config.models import Seq2SeqConfig
from jaxformer.hf import llama
from jaxformer.hf.common import Family, MappingError, Options, Renamer, build_config, rename_all
from jaxformer.hf.exports import WRITES, Ignored, Need

ARCHITECTURES = {"T5ForConditionalGeneration": "seq2seq"}
MODEL_TYPE = "t5"
MODEL_TYPES = dict.fromkeys(ARCHITECTURES, MODEL_TYPE)  # config.json model_type of each
DEFAULTS = dict(vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_decoder_layers=None,
                num_heads=8, relative_attention_num_buckets=32, relative_attention_max_distance=128,
                dropout_rate=0.1, layer_norm_epsilon=1e-6, feed_forward_proj="relu", pad_token_id=0,
                eos_token_id=1, classifier_dropout=0.0, is_decoder=False, tie_word_embeddings=None,
                scale_decoder_outputs=None, dense_act_fn=None, is_gated_act=None,
                decoder_start_token_id=None, n_positions=512, bos_token_id=None)
IGNORED = {"classifier_dropout": "used by T5ForSequenceClassification's head, not by this class"}
# feed_forward_proj's activation -> ffn kind, plain and gated (HF maps "gated-gelu" to gelu_new)
PLAIN_FFN = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}
GATED_FFN = {"gelu_new": "geglu_tanh", "gelu_pytorch_tanh": "geglu_tanh", "silu": "swiglu"}
# ffn kind -> the feed_forward_proj export writes (HF derives the same activation from it)
FFN_TO_HF = {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_new", "geglu_tanh": "gated-gelu",
             "swiglu": "gated-silu"}
EMBED_COPIES = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")


def _rules(gated: bool) -> Renamer:
    """HF <-> torch_ref names; `wi` (plain FFN) or `wi_0`/`wi_1` (gated) by the config."""
    rules = [("shared.weight", "embed.embed_tokens.weight"), ("lm_head.weight", "lm_head.weight")]
    ffn = [("wi_0", "gate_proj"), ("wi_1", "up_proj")] if gated else [("wi", "up_proj")]
    ffn.append(("wo", "down_proj"))
    for stack, ff in (("encoder", 1), ("decoder", 2)):
        block = stack + ".block.{i}.layer."
        rules.append((stack + ".block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                      stack + ".rel_bias.relative_attention_bias.weight"))
        rules.append((stack + ".final_layer_norm.weight", stack + ".final_norm.weight"))
        rules.append((block + "0.layer_norm.weight", stack + ".layers.{i}.attn_norm.weight"))
        subs = [("0.SelfAttention", "self_attn")]
        if stack == "decoder":
            subs.append(("1.EncDecAttention", "cross_attn"))
            rules.append((block + "1.layer_norm.weight", stack + ".layers.{i}.cross_attn_norm.weight"))
        for hf_sub, ours in subs:
            for p in "qkvo":
                rules.append((f"{block}{hf_sub}.{p}.weight", f"{stack}.layers.{{i}}.{ours}.{p}_proj.weight"))
        for hf_name, ours in ffn:
            rules.append((f"{block}{ff}.DenseReluDense.{hf_name}.weight", f"{stack}.layers.{{i}}.ffn.{ours}.weight"))
        rules.append((f"{block}{ff}.layer_norm.weight", stack + ".layers.{i}.ffn_norm.weight"))
    return Renamer(rules)


def _ffn(o: Options) -> str:
    """The ffn kind of feed_forward_proj, as T5Config.__post_init__ parses it."""
    proj = o["feed_forward_proj"]
    parts = proj.split("-") if isinstance(proj, str) else []
    if not parts or len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated"):
        o.problem("feed_forward_proj", "expected 'ACT' or 'gated-ACT'")
        return "relu"
    gated, act = len(parts) == 2, parts[-1]
    if proj == "gated-gelu":
        act = "gelu_new"  # HF's backwards-compatible special case: the tanh approximation
    stored_act, stored_gated = o["dense_act_fn"], o["is_gated_act"]
    if stored_act is not None and stored_act != act:
        o.problem("dense_act_fn", f"disagrees with feed_forward_proj={proj!r} (which gives {act!r})")
    if stored_gated is not None and stored_gated != gated:
        o.problem("is_gated_act", f"disagrees with feed_forward_proj={proj!r}")
    table = GATED_FFN if gated else PLAIN_FFN
    if act not in table:
        o.problem("feed_forward_proj", f"jaxformer's T5 FFNs: {sorted(FFN_TO_HF.values())} "
                  f"({'gated' if gated else 'plain'} {act!r} has no jaxformer kind)")
        return "relu"
    return table[act]


def _int_id(o: Options, key: str, vocab: int, value) -> int:
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value < vocab):
        o.problem(key, f"must be one token id in [0, vocab_size={vocab})")
        return 0
    return value


def config_from_hf(raw: dict, arch: str, keys=()) -> tuple[str, Seq2SeqConfig, list[str]]:
    o = Options(raw, DEFAULTS, family=f"t5 {arch}", ignored=IGNORED)
    ffn = _ffn(o)
    o.require("is_decoder", (False,), "T5ForConditionalGeneration's stacks set it themselves")
    vocab = o["vocab_size"]
    pad = _int_id(o, "pad_token_id", vocab, o["pad_token_id"])
    eos = _int_id(o, "eos_token_id", vocab, o["eos_token_id"])
    start, bos = o.get("decoder_start_token_id"), o["bos_token_id"]
    if start is None:  # HF's generate falls back to bos_token_id
        start = bos
    if start is None:
        o.notes.append(f"decoder_start_token_id and bos_token_id are not set: decoding starts from "
                       f"pad_token_id={pad}, T5's convention (HF's generate needs one of them)")
        start = pad
    start = _int_id(o, "decoder_start_token_id", vocab, start)
    scale = o["scale_decoder_outputs"]
    if scale is not None and not isinstance(scale, bool):
        o.problem("scale_decoder_outputs", "expected true or false")
        scale = True
    if scale is None:  # T5Config: v1.0 configs lack tie_word_embeddings, v1.1 set it false
        scale = o["tie_word_embeddings"] is not False
    else:
        o["tie_word_embeddings"]  # 5.x always writes true; the head's tie comes from the weights
    buckets, distance = o["relative_attention_num_buckets"], o["relative_attention_max_distance"]
    if isinstance(buckets, int) and isinstance(distance, int) and (buckets < 4 or distance <= buckets // 2):
        o.problem("relative_attention_max_distance", f"with relative_attention_num_buckets={buckets} the "
                  "log-spaced buckets are undefined (needs num_buckets >= 4 and max_distance > num_buckets // 2)")
    drop = float(o["dropout_rate"])
    fields = dict(
        vocab_size=vocab, d_model=o["d_model"], num_heads=o["num_heads"], head_dim=o["d_kv"], d_ff=o["d_ff"],
        num_layers=o["num_layers"], num_decoder_layers=o["num_decoder_layers"], ffn=ffn, norm="rmsnorm",
        norm_eps=float(o["layer_norm_epsilon"]), norm_position="pre", final_norm=True, bias=False,
        dropout=drop, attn_dropout=drop, ffn_dropout=drop, embed_dropout=drop, position="t5",
        rel_num_buckets=buckets, rel_max_distance=distance, attn_scale=1.0, max_len=o["n_positions"],
        scale_embedding=False, share_embeddings=True, tie_output=True, scale_decoder_output=bool(scale),
        pad_id=pad, bos_id=start, eos_id=eos, dtype="float32")
    return "seq2seq", build_config(Seq2SeqConfig, fields, o), o.notes


def resolve_checkpoint(ckpt, name: str, cfg: Seq2SeqConfig, notes: list[str]) -> Seq2SeqConfig:
    """What the config cannot say, read from the weights as transformers 5.x loads them: an
    lm_head.weight that differs from shared.weight unties the head (v1.1 / flan); encoder /
    decoder embed_tokens copies must equal shared.weight."""
    import dataclasses
    if "shared.weight" not in ckpt.tensors:
        raise ConfigError("checkpoint has no shared.weight (T5's one token table); jaxformer's T5 "
                          "import needs it")
    shared = ckpt.read("shared.weight")
    for key in EMBED_COPIES:
        if key in ckpt.tensors and not np.array_equal(ckpt.read(key), shared):
            raise ConfigError(f"{key} differs from shared.weight: separate encoder/decoder tables are not "
                              "supported by jaxformer's T5 import")
    if "lm_head.weight" in ckpt.tensors and not np.array_equal(ckpt.read("lm_head.weight"), shared):
        notes.append("lm_head.weight differs from shared.weight: loaded untied (tie_output=False), "
                     "as transformers 5.x does")
        return dataclasses.replace(cfg, tie_output=False)
    return cfg


def tensor_fn(name: str, cfg: Seq2SeqConfig, arch: str):
    rules = _rules(cfg.feedforward.kind in ("geglu_tanh", "swiglu"))

    def fn(key: str, x: np.ndarray):
        if key in EMBED_COPIES or (key == "lm_head.weight" and cfg.tie_output):
            return None  # copies identical to shared.weight (resolve_checkpoint checked them)
        if key == "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight":
            return None  # HF's _keys_to_ignore_on_load_unexpected: cross-attention has no bias
        new = rules.to_torch(key)
        if new is None:
            raise MappingError(f"unmapped: {key} has no jaxformer seq2seq (T5) equivalent")
        return {new: x}
    return fn


# ----------------------------------------------------------------------------- export
# Written: the sizes, the buckets, one dropout_rate, the tokens, the head (tied or its own
# lm_head, which resolve_checkpoint reads back); required: T5's relative bias without a score
# scale, Pre-LN RMSNorm without biases, one shared table, full multi-head attention
EXPORTS = {"seq2seq": dict(
    vocab_size=WRITES, d_model=WRITES, num_heads=WRITES, head_dim=WRITES, d_ff=WRITES, num_layers=WRITES,
    num_decoder_layers=WRITES, rel_num_buckets=WRITES, rel_max_distance=WRITES, norm_eps=WRITES,
    scale_decoder_output=WRITES, max_len=WRITES, pad_id=WRITES, bos_id=WRITES, eos_id=WRITES, tie_output=WRITES,
    position="t5", attn_scale=1.0, norm="rmsnorm", norm_position="pre", final_norm=True, bias=False,
    scale_embedding=False, share_embeddings=True, sliding_window=None, qk_norm=False, type_vocab_size=0,
    embed_norm=False, rope_scaling=None, dtype="float32", **llama.biases("qkv", "out", "ffn"),
    layer_types=Ignored("without a sliding_window every layer attends fully"),
    num_kv_heads=Need(lambda c: c.resolved_kv_heads == c.attention.num_heads,
                      "attention.num_kv_heads={attention.num_kv_heads} (T5 has no grouped-query attention)"),
    ffn=Need(lambda c: c.feedforward.kind in FFN_TO_HF,
             f"feedforward.kind={{feedforward.kind!r}} (T5 feed_forward_proj has {sorted(FFN_TO_HF)})"),
    # one dropout_rate: the other three are written as it, which this makes them equal to
    dropout=Need(lambda c: c.dropout == c.attention.attn_dropout == c.feedforward.ffn_dropout == c.embed_dropout,
                 "dropout={dropout}, attention.attn_dropout={attention.attn_dropout}, "
                 "feedforward.ffn_dropout={feedforward.ffn_dropout} and embed_dropout={embed_dropout} differ "
                 "(T5 has one dropout_rate)"),
    attn_dropout=WRITES, ffn_dropout=WRITES, embed_dropout=WRITES,
    tgt_vocab_size=Need(lambda c: not c.tie_output or c.resolved_tgt_vocab == c.vocab_size,
                        "tgt_vocab_size={tgt_vocab_size}: a target vocabulary of its own (T5 shares one table)"))}


def config_to_hf(name: str, cfg: Seq2SeqConfig) -> dict:
    return {"architectures": ["T5ForConditionalGeneration"], "model_type": MODEL_TYPE,
            "vocab_size": cfg.vocab_size, "d_model": cfg.d_model, "d_kv": cfg.resolved_head_dim,
            "d_ff": cfg.feedforward.d_ff, "num_layers": cfg.num_layers,
            "num_decoder_layers": cfg.resolved_decoder_layers,
            "num_heads": cfg.attention.num_heads, "relative_attention_num_buckets": cfg.positions.rel_num_buckets,
            "relative_attention_max_distance": cfg.positions.rel_max_distance, "dropout_rate": cfg.dropout,
            "layer_norm_epsilon": cfg.norms.norm_eps, "feed_forward_proj": FFN_TO_HF[cfg.feedforward.kind],
            "scale_decoder_outputs": cfg.scale_decoder_output, "tie_word_embeddings": True,
            "is_encoder_decoder": True, "n_positions": cfg.max_len, "pad_token_id": cfg.pad_id,
            "eos_token_id": cfg.eos_id, "decoder_start_token_id": cfg.bos_id, "initializer_factor": 1.0,
            "dtype": "float32"}


def state_dict_to_hf(sd: dict[str, np.ndarray], name: str, cfg: Seq2SeqConfig) -> dict[str, np.ndarray]:
    return rename_all(sd, _rules(cfg.feedforward.kind in ("geglu_tanh", "swiglu")).to_hf, "T5")


FAMILY = Family(name="t5", architectures=ARCHITECTURES, model_types=MODEL_TYPES, config_from_hf=config_from_hf,
                tensor_fn=tensor_fn, config_to_hf=config_to_hf, state_dict_to_hf=state_dict_to_hf,
                hf_defaults=dict.fromkeys(ARCHITECTURES, DEFAULTS), exports=EXPORTS,
                resolve_checkpoint=resolve_checkpoint)
