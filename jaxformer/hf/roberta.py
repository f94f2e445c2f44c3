"""RoBERTa and XLM-RoBERTa (`RobertaModel` / `XLMRobertaModel` <-> `encoder`,
`RobertaForSequenceClassification` / `XLMRobertaForSequenceClassification` <-> `classifier`;
`*ForMaskedLM` -> `encoder`).

RoBERTa is BERT's network (jaxformer/hf/bert.py: Post-LN, no final norm, learned absolute
positions, token types, the embedding LayerNorm, exact GELU, the same weight names under a
`roberta.` prefix) with two differences, both mapped:
  * positions come from the padding (docs/numerics.md §36): the non-pad tokens (ids !=
    pad_token_id) count from pad_token_id + 1, pads sit at pad_token_id, wherever the padding
    is (HF create_position_ids_from_input_ids) -> positions_from_padding=True. The table keeps
    all max_position_embeddings rows (514 for roberta-base: 512 tokens after the offset of 2).
  * the classification head (`classifier.dense` + tanh + `classifier.out_proj` on <s>) is
    BERT's pooler + classifier in eval mode -> pooler (dense, tanh) and classifier. HF also
    drops the <s> vector before `dense` in training; jaxformer drops only before the
    classifier (noted: training only, the outputs are the same).
XLM-R (model_type xlm-roberta) is the same code with other defaults; export writes
`RobertaModel` / `RobertaForSequenceClassification` (model_type roberta), which compute the same.

Unsupported (an error naming the option): position_embedding_type other than "absolute",
is_decoder / add_cross_attention (RobertaForCausalLM-style decoders), pruned heads.
The masked-LM head (`lm_head.*`) of *ForMaskedLM is skipped, with a note (as AutoModel loads
it). HF attends to every token when attention_mask is None (its positions still skip pads);
jaxformer's classifier masks ids == pad_id then: pass attention_mask to compare.
"""
from __future__ import annotations

import numpy as np

from jaxformer.config import TransformerConfig
from jaxformer.hf import bert
from jaxformer.hf.common import Family, MappingError, Options, bert_relative_key, rename_all

ARCHITECTURES = {"RobertaModel": "encoder", "RobertaForSequenceClassification": "classifier",
                 "RobertaForMaskedLM": "encoder", "XLMRobertaModel": "encoder",
                 "XLMRobertaForSequenceClassification": "classifier", "XLMRobertaForMaskedLM": "encoder"}
MODEL_TYPES = {a: "xlm-roberta" if a.startswith("XLM") else "roberta" for a in ARCHITECTURES}
MODEL_TYPE = "roberta"
DEFAULTS = dict(vocab_size=50265, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                intermediate_size=3072, hidden_act="gelu", hidden_dropout_prob=0.1,
                attention_probs_dropout_prob=0.1, max_position_embeddings=512, type_vocab_size=2,
                layer_norm_eps=1e-12, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                position_embedding_type="absolute", classifier_dropout=None, is_decoder=False,
                add_cross_attention=False, problem_type=None, pruned_heads={}, tie_word_embeddings=True)
# XLMRobertaConfig's defaults are RobertaConfig's but for the vocabulary (tests/test_references.py)
XLM_DEFAULTS = {**DEFAULTS, "vocab_size": 30522}
IGNORED = {"tie_word_embeddings": "ties *ForMaskedLM's prediction head, which is not imported",
           "bos_token_id": "no generation (tokenizer metadata)", "eos_token_id": "no generation (tokenizer metadata)"}
HEAD = {"classifier.dense.weight": "pooler.weight", "classifier.dense.bias": "pooler.bias",
        "classifier.out_proj.weight": "classifier.weight", "classifier.out_proj.bias": "classifier.bias"}


def _strip(key: str, arch: str) -> str | None:
    """The RobertaModel-relative name of a key (`roberta.` removed; legacy gamma/beta read as
    weight/bias, common.bert_relative_key); the classification head's keys as they are; None for a key a
    classification checkpoint has no place for."""
    if arch.endswith("ForSequenceClassification") and key in HEAD:
        return key
    if key.startswith("roberta."):
        key = key[len("roberta."):]
    elif arch.endswith("ForSequenceClassification"):
        return None
    return bert_relative_key(key, "BertModel")


def config_from_hf(raw: dict, arch: str, keys=()) -> tuple[str, TransformerConfig, list[str]]:
    o = Options(raw, XLM_DEFAULTS if arch.startswith("XLM") else DEFAULTS, family=f"{MODEL_TYPES[arch]} {arch}",
                ignored=IGNORED)
    fields = {**bert.encoder_fields(o, "RoBERTa"), "positions_from_padding": True}
    if arch.endswith("ForMaskedLM"):
        o.notes.append(f"{arch}: the encoder is imported (as transformers' AutoModel loads it); "
                       "the masked-LM head lm_head.* is not")
    encoder = ARCHITECTURES[arch] == "encoder"
    return bert.build_encoder(
        o, fields, encoder, encoder and any((_strip(k, arch) or "").startswith("pooler.") for k in keys),
        head_note="the classification head's dense + tanh is the pooler; HF's head also drops the <s> "
                  "vector before dense in training, jaxformer only before the classifier (eval outputs equal)")


def tensor_fn(name: str, cfg, arch: str):
    def fn(key: str, x: np.ndarray):
        k = _strip(key, arch)
        if k in HEAD:
            return {HEAD[k]: x}
        if k in ("embeddings.position_ids", "embeddings.token_type_ids"):
            return None  # buffers: arange(max_len), zeros
        if arch.endswith("ForMaskedLM") and key.startswith("lm_head."):
            return None  # the masked-LM head: not part of the encoder (a note says so)
        new = None if k is None else bert.RULES.to_torch(k)
        if new is None:
            raise MappingError(f"unmapped: {key} has no jaxformer {name} (RoBERTa) equivalent")
        return {new: x}
    return fn


# ----------------------------------------------------------------------------- export
# BERT's with positions offset past the padding, and RoBERTa's head (dense + tanh on <s>, with a
# bias, without a norm)
ENCODER = dict(bert.encoder("RoBERTa"), positions_from_padding=True, first_attn_norm=True)
EXPORTS = {"encoder": ENCODER, "classifier": dict(ENCODER, **bert.CLASSIFIER, pooler_act="tanh", pooler_bias=True,
                                                  pooler_norm=False)}


def config_to_hf(name: str, cfg) -> dict:
    """BERT's config.json (the same fields) under RoBERTa's names."""
    arch = "RobertaModel" if name == "encoder" else "RobertaForSequenceClassification"
    return {**bert.config_to_hf(name, cfg), "architectures": [arch], "model_type": MODEL_TYPE}


def state_dict_to_hf(sd: dict[str, np.ndarray], name: str, cfg) -> dict[str, np.ndarray]:
    if name == "encoder":
        return rename_all(sd, bert.RULES.to_hf, "RoBERTa")
    head = {v: k for k, v in HEAD.items()}

    def rename(key: str) -> str | None:
        if key in head:
            return head[key]
        new = bert.RULES.to_hf(key)
        return None if new is None else "roberta." + new
    return rename_all(sd, rename, "RoBERTa")


FAMILY = Family(name="roberta", architectures=ARCHITECTURES, model_types=MODEL_TYPES, config_from_hf=config_from_hf,
                tensor_fn=tensor_fn, config_to_hf=config_to_hf, state_dict_to_hf=state_dict_to_hf,
                hf_defaults={a: XLM_DEFAULTS if a.startswith("XLM") else DEFAULTS for a in ARCHITECTURES}, exports=EXPORTS,
                claims=lambda c: c.positions.positions_from_padding)  # RoBERTa's offset positions
