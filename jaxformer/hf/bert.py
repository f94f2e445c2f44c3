"""BERT (`BertModel` <-> `encoder`, `BertForSequenceClassification` <-> `classifier`;
`BertForMaskedLM` -> `encoder`).

Mapping and its deliberate details:
  * BERT is a Post-LN encoder without a final norm: norm_position="post", final_norm=False,
    learned absolute positions (max_position_embeddings -> max_len), no embedding scaling,
    and the TransformerConfig BERT options: type_vocab_size (token type embeddings),
    embed_norm (the embedding LayerNorm) and pooler (dense + tanh on [CLS]).
  * One layer_norm_eps (HF default 1e-12) for every LayerNorm -> norm_eps.
  * hidden_act "gelu" is exact GELU -> ffn="gelu" ("gelu_new"/... -> "gelu_tanh", "relu").
  * Dropouts: hidden_dropout_prob -> dropout and embed_dropout, attention_probs_dropout_prob
    -> attn_dropout; classifier_dropout (the dropout before the head; null = hidden_dropout_prob)
    -> ClassifierConfig.classifier_dropout.
  * problem_type picks HF's training loss only (the logits do not depend on it): any of HF's
    values is accepted, with a note that jaxformer trains with single-label cross-entropy.
  * The pooler is there iff the checkpoint has pooler weights (BertModel(add_pooling_layer=
    False) has none); BertForSequenceClassification always has it.
  * Unsupported (an error naming the option): position_embedding_type other than "absolute",
    is_decoder / add_cross_attention, pruned heads.
  * BertForMaskedLM (bert-base-uncased and most published BERTs) imports as its encoder, as
    transformers' AutoModel loads such a checkpoint: the masked-LM head (`cls.predictions.*`)
    is skipped, and a note says so. Export writes a BertModel.
  * Legacy names (`LayerNorm.gamma/beta`) are read; `embeddings.position_ids` buffers are
    skipped. Export writes HF's current names.
  * HF BERT attends to every token when attention_mask is None; jaxformer's classifier masks
    ids == pad_id then. Pass attention_mask explicitly to compare the two.
"""
from __future__ import annotations

import numpy as np

from jaxformer.config import TransformerConfig
from jaxformer.config.models import ClassifierConfig
from jaxformer.hf.common import (
    Family,
    MappingError,
    Options,
    Renamer,
    bert_relative_key,
    build_config,
    ffn_from_hf,
    ffn_to_hf,
    rename_all,
    token_ids,
)
from jaxformer.hf.exports import WRITES, Ignored, Need, plain_multi_head

ARCHITECTURES = {"BertModel": "encoder", "BertForSequenceClassification": "classifier",
                 "BertForMaskedLM": "encoder"}
MODEL_TYPE = "bert"
MODEL_TYPES = dict.fromkeys(ARCHITECTURES, MODEL_TYPE)  # config.json model_type of each
DEFAULTS = dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                intermediate_size=3072, hidden_act="gelu", hidden_dropout_prob=0.1,
                attention_probs_dropout_prob=0.1, max_position_embeddings=512, type_vocab_size=2,
                layer_norm_eps=1e-12, pad_token_id=0, position_embedding_type="absolute",
                classifier_dropout=None, is_decoder=False, add_cross_attention=False,
                problem_type=None, pruned_heads={}, tie_word_embeddings=True,
                bos_token_id=None, eos_token_id=None)
PROBLEM_TYPES = (None, "single_label_classification", "multi_label_classification", "regression")
IGNORED = {"tie_word_embeddings": "ties BertForMaskedLM's prediction head, which is not imported",
           "bos_token_id": "no generation", "eos_token_id": "no generation"}
LAYER = "encoder.layer.{i}."
RULES = Renamer([
    ("embeddings.word_embeddings.weight", "embed.embed_tokens.weight"),
    ("embeddings.position_embeddings.weight", "embed.embed_positions.weight"),
    ("embeddings.token_type_embeddings.weight", "embed.embed_token_types.weight"),
    ("embeddings.LayerNorm.{leaf}", "embed.norm.{leaf}"),
    (LAYER + "attention.self.query.{leaf}", "encoder.layers.{i}.self_attn.q_proj.{leaf}"),
    (LAYER + "attention.self.key.{leaf}", "encoder.layers.{i}.self_attn.k_proj.{leaf}"),
    (LAYER + "attention.self.value.{leaf}", "encoder.layers.{i}.self_attn.v_proj.{leaf}"),
    (LAYER + "attention.output.dense.{leaf}", "encoder.layers.{i}.self_attn.o_proj.{leaf}"),
    (LAYER + "attention.output.LayerNorm.{leaf}", "encoder.layers.{i}.attn_norm.{leaf}"),
    (LAYER + "intermediate.dense.{leaf}", "encoder.layers.{i}.ffn.up_proj.{leaf}"),
    (LAYER + "output.dense.{leaf}", "encoder.layers.{i}.ffn.down_proj.{leaf}"),
    (LAYER + "output.LayerNorm.{leaf}", "encoder.layers.{i}.ffn_norm.{leaf}"),
    ("pooler.dense.{leaf}", "pooler.{leaf}"),
])


def encoder_fields(o: Options, what: str) -> dict:
    """TransformerConfig fields of a BERT-layout config.json (BERT, RoBERTa / XLM-R), after
    refusing by name what has no jaxformer equivalent; `what` names the family in the messages."""
    ffn = ffn_from_hf(o, "hidden_act")
    o.require("position_embedding_type", ("absolute",),
              f"jaxformer's {what} has absolute learned positions only")
    o.require("is_decoder", (False,), f"a decoder {what} has no jaxformer equivalent")
    o.require("add_cross_attention", (False,), f"a {what} with cross-attention has no jaxformer equivalent")
    o.require("pruned_heads", lambda v: not v, "pruned heads give layers different widths")
    drop = float(o["hidden_dropout_prob"])
    vocab = o["vocab_size"]
    return dict(
        vocab_size=vocab, d_model=o["hidden_size"], num_heads=o["num_attention_heads"],
        d_ff=o["intermediate_size"], num_layers=o["num_hidden_layers"], ffn=ffn,
        norm="layernorm", norm_eps=float(o["layer_norm_eps"]), norm_position="post", final_norm=False,
        bias=True, norm_bias=True, dropout=drop, attn_dropout=float(o["attention_probs_dropout_prob"]),
        ffn_dropout=0.0, embed_dropout=drop, position="learned", max_len=o["max_position_embeddings"],
        scale_embedding=False, type_vocab_size=o["type_vocab_size"], embed_norm=True,
        **token_ids(o, vocab, need_bos_eos=False))


def build_encoder(o: Options, fields: dict, encoder: bool, pooler: bool, head_note: str | None = None):
    """-> (name, config, notes): the encoder (with a pooler when the checkpoint has its weights)
    or the classifier ([CLS] pooler + classifier) of `fields`, classifier_dropout and
    problem_type read as HF does; `head_note` joins the classifier's notes."""
    if encoder:
        fields["pooler"] = pooler
        o["classifier_dropout"], o["problem_type"]  # no head: they do not apply
        return "encoder", build_config(TransformerConfig, fields, o), o.notes
    head_drop = o.require("classifier_dropout", lambda v: v is None or (
        isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1), "must be null or in [0, 1]")
    problem = o.require("problem_type", PROBLEM_TYPES, f"HF's problem types are {PROBLEM_TYPES}")
    if problem not in (None, "single_label_classification") and problem in PROBLEM_TYPES:
        o.notes.append(f"problem_type={problem!r} selects HF's training loss only (the logits are "
                       "the same); `jaxformer train` trains with single-label cross-entropy")
    if head_note:
        o.notes.append(head_note)
    fields.update(pooler=True, pooling="cls", num_classes=o.num_labels(), dtype="float32",
                  classifier_dropout=None if not isinstance(head_drop, (int, float)) else float(head_drop))
    return "classifier", build_config(ClassifierConfig, fields, o), o.notes


def config_from_hf(raw: dict, arch: str, keys=()) -> tuple[str, TransformerConfig, list[str]]:
    o = Options(raw, DEFAULTS, family=f"bert {arch}", ignored=IGNORED)
    fields = encoder_fields(o, "BERT")
    if arch == "BertForMaskedLM":
        o.notes.append("BertForMaskedLM: the encoder is imported (as transformers' AutoModel loads it); "
                       "the masked-LM head cls.predictions.* is not")
    encoder = arch in ("BertModel", "BertForMaskedLM")
    return build_encoder(o, fields, encoder, encoder and any((bert_relative_key(k, arch) or "").startswith("pooler.")
                                                             for k in keys))


def tensor_fn(name: str, cfg, arch: str):
    def fn(key: str, x: np.ndarray):
        k = bert_relative_key(key, arch)
        if k == "embeddings.position_ids":
            return None  # a buffer: arange(max_len)
        if arch == "BertForMaskedLM" and k.startswith("cls."):
            return None  # the masked-LM head: not part of the encoder (a note says so)
        if k in ("classifier.weight", "classifier.bias") and arch == "BertForSequenceClassification":
            return {k: x}
        new = None if k is None else RULES.to_torch(k)
        if new is None:
            raise MappingError(f"unmapped: {key} has no jaxformer {name} (BERT) equivalent")
        return {new: x}
    return fn


# ----------------------------------------------------------------------------- export
def encoder(family: str) -> dict:
    """What a BERT-style HF encoder (BERT, RoBERTa: `family`) exports of an encoder config and
    requires of it: learned positions, Post-LN with biases, an embedding norm, token types, full
    multi-head attention, one hidden dropout."""
    return dict(
        vocab_size=WRITES, d_model=WRITES, num_heads=WRITES, d_ff=WRITES, num_layers=WRITES, max_len=WRITES,
        norm_eps=WRITES, dropout=WRITES, attn_dropout=WRITES, pad_id=WRITES, pooler=WRITES,
        position="learned", norm="layernorm", norm_position="post", final_norm=False, bias=True, norm_bias=True,
        scale_embedding=False, sliding_window=None, embed_norm=True, ffn_dropout=0.0, attn_logit_softcap=None,
        query_pre_attn_scalar=None, attn_qkv_bias=None, attn_out_bias=None, ffn_bias=None, qk_norm=False,
        moe=None, mla=None, attn_sinks=False,
        layer_types=Ignored("without a sliding_window every layer attends fully"),
        type_vocab_size=Need(lambda c: c.bert.type_vocab_size >= 1,
                             f"bert.type_vocab_size={{bert.type_vocab_size}} "
                             f"({family} always has token type embeddings)"),
        **plain_multi_head(family),
        embed_dropout=Need(lambda c: c.embed_dropout == c.dropout, f"embed_dropout={{embed_dropout}} != "
                           f"dropout={{dropout}} ({family} has one hidden_dropout_prob)"))


# The classification head: [CLS] through the pooler, float32 (export float32 models)
CLASSIFIER = dict(num_classes=WRITES, classifier_dropout=WRITES, pooler=True, pooling="cls", dtype="float32")
EXPORTS = {"encoder": encoder("BERT"), "classifier": dict(encoder("BERT"), **CLASSIFIER)}


def config_to_hf(name: str, cfg) -> dict:
    arch = "BertModel" if name == "encoder" else "BertForSequenceClassification"
    out = {"architectures": [arch], "model_type": MODEL_TYPE, "vocab_size": cfg.vocab_size,
           "hidden_size": cfg.d_model, "num_hidden_layers": cfg.num_layers,
           "num_attention_heads": cfg.attention.num_heads, "intermediate_size": cfg.feedforward.d_ff,
           "hidden_act": ffn_to_hf(cfg.feedforward.kind), "hidden_dropout_prob": cfg.dropout,
           "attention_probs_dropout_prob": cfg.attention.attn_dropout, "max_position_embeddings": cfg.max_len,
           "type_vocab_size": cfg.bert.type_vocab_size, "layer_norm_eps": cfg.norms.norm_eps,
           "pad_token_id": cfg.pad_id, "position_embedding_type": "absolute",
           "classifier_dropout": getattr(cfg, "classifier_dropout", None), "is_decoder": False,
           "add_cross_attention": False,
           "initializer_range": 0.02, "dtype": "float32"}
    if name == "classifier":
        out["id2label"] = {str(i): f"LABEL_{i}" for i in range(cfg.num_classes)}
        out["label2id"] = {f"LABEL_{i}": i for i in range(cfg.num_classes)}
    return out


def state_dict_to_hf(sd: dict[str, np.ndarray], name: str, cfg) -> dict[str, np.ndarray]:
    if name == "encoder":
        return rename_all(sd, RULES.to_hf, "BERT")

    def rename(key: str) -> str | None:
        if key.startswith("classifier."):
            return key
        new = RULES.to_hf(key)
        return None if new is None else "bert." + new
    return rename_all(sd, rename, "BERT")


FAMILY = Family(name="bert", architectures=ARCHITECTURES, model_types=MODEL_TYPES, config_from_hf=config_from_hf,
                tensor_fn=tensor_fn, config_to_hf=config_to_hf, state_dict_to_hf=state_dict_to_hf,
                hf_defaults=dict.fromkeys(ARCHITECTURES, DEFAULTS), exports=EXPORTS)
