"""RoBERTa and XLM-R (jaxformer/hf/roberta.py) against transformers 5.x: positions derived from
the padding (docs/numerics.md §36), the classification head as pooler + classifier.

Tiny random HF models of odd configurations (no download), each built once: the hidden states
on real tokens, the pooled vector and the logits of a batch with a right-padded and a
left-padded row within 1e-5 x max(1, max|out|) fp32; the export loads back in transformers
with identical weights and outputs; options not implemented are refused by name. Worst
measured difference (fp32, -s prints them): 7.2e-7 (max |out| 1.6; roberta_model_pooler's hidden states).
"""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import check_hf_encoder, hf_encoder_outputs, jit_call, randomize

from jaxformer import hf
from jaxformer.config import ConfigError
from jaxformer.convert import ConversionError
from jaxformer.hf import roberta
from jaxformer.models import build_model
from jaxformer.parity import setup_precision

T = pytest.importorskip("transformers")
V = 97
BASE = dict(vocab_size=V, hidden_size=48, num_hidden_layers=2, num_attention_heads=4, intermediate_size=72,
            max_position_embeddings=40)
# tag -> (HF class, config kwargs, Auto class of the export); pad ids 1 (RoBERTa's) and 2 (odd)
CASES = {
    "roberta_model_pooler": (T.RobertaModel, dict(BASE, type_vocab_size=1, pad_token_id=1), T.AutoModel),
    "roberta_cls_gelu_new_3_layers": (T.RobertaForSequenceClassification, dict(
        BASE, num_hidden_layers=3, hidden_size=36, num_attention_heads=3, intermediate_size=50, hidden_act="gelu_new",
        num_labels=3, pad_token_id=1, layer_norm_eps=1e-5), T.AutoModelForSequenceClassification),
    "xlmr_cls_pad2_types2": (T.XLMRobertaForSequenceClassification, dict(
        BASE, type_vocab_size=2, pad_token_id=2, num_labels=5, max_position_embeddings=16),
        T.AutoModelForSequenceClassification),
}


def _batch(pad: int, seed: int = 0):
    """ids [3, 11]: a full row, a right-padded row (7 tokens), a left-padded row (8 tokens)."""
    ids = np.random.RandomState(seed).randint(3, V, size=(3, 11))
    mask = np.ones_like(ids)
    mask[1, 7:] = 0
    mask[2, :3] = 0
    ids[mask == 0] = pad
    return ids, mask


@pytest.fixture(autouse=True)
def _precision():
    setup_precision()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("roberta")
    out = {}
    for tag, (cls, kw, _) in CASES.items():
        model = randomize(cls(cls.config_class(**kw)))
        model.save_pretrained(root / tag)
        out[tag] = (model, str(root / tag))
    return out


@pytest.mark.parametrize("tag", sorted(CASES))
def test_import_matches_hf_and_export_round_trips(tag, saved, tmp_path):
    hf_model, path = saved[tag]
    cls, kw, auto = CASES[tag]
    ids, mask = _batch(kw["pad_token_id"])
    _, model, cfg = check_hf_encoder(tag, hf_model, path, ids, mask, auto, str(tmp_path / "out"))
    assert cfg.positions_from_padding and cfg.pad_id == kw["pad_token_id"] and cfg.pooler
    if tag.startswith("roberta_model"):
        # the check can fail: positions counted from 0 (BERT's) move every real token's output
        plain = build_model("encoder", dataclasses.replace(cfg, positions_from_padding=False), seed=0)
        nnx.update(plain, nnx.state(model, nnx.Param))
        wrong = np.asarray(jit_call(plain, jnp.asarray(ids), jnp.asarray(mask))[0])
        ref = hf_encoder_outputs(hf_model, ids, mask)[0]
        assert np.abs(wrong - ref)[mask.astype(bool)].max() > 1e-2


def test_masked_lm_imports_as_its_encoder():
    """RobertaForMaskedLM (roberta-base's architecture) imports as its encoder: lm_head.* skipped
    and noted, every other weight mapped (no pooler: RobertaForMaskedLM has none)."""
    from torch_ref.models import build_model as tbuild
    hf_model = T.XLMRobertaForMaskedLM(T.XLMRobertaConfig(**dict(BASE, type_vocab_size=1)))
    sd = hf_model.state_dict()
    arch = "XLMRobertaForMaskedLM"
    name, cfg, notes = roberta.config_from_hf(hf_model.config.to_dict(), arch, tuple(sd))
    assert name == "encoder" and not cfg.pooler and any("lm_head" in n for n in notes)
    fn = roberta.tensor_fn(name, cfg, arch)
    mapped = {}
    for k, x in sd.items():
        mapped.update(fn(k, x.numpy()) or {})
    assert set(mapped) == set(tbuild("encoder", cfg).state_dict())


REFUSED = {
    "position_embedding_type": dict(position_embedding_type="relative_key_query"),
    "is_decoder": dict(is_decoder=True),
    "add_cross_attention": dict(add_cross_attention=True),
    "hidden_act": dict(hidden_act="swish"),
    "classifier_dropout": dict(classifier_dropout=2.0),
    "pad_token_id": dict(pad_token_id=500, vocab_size=100),
}


@pytest.mark.parametrize("key", sorted(REFUSED))
def test_unsupported_options_are_refused_by_name(key):
    arch = "XLMRobertaForSequenceClassification"
    raw = {"architectures": [arch], "model_type": "xlm-roberta", **REFUSED[key]}
    with pytest.raises(ConfigError, match=f"{key}="):
        roberta.config_from_hf(raw, arch)


def test_export_refuses_what_roberta_cannot_express():
    from jaxformer.config.models import ClassifierConfig, LMConfig
    from jaxformer.models import abstract_model
    cls = ClassifierConfig.tiny(position="learned", positions_from_padding=True, pad_id=1, type_vocab_size=1,
                                pooler=True, pooler_act="gelu", pooling="mean", scale_embedding=False,
                                embed_norm=True, final_norm=False)
    lm = LMConfig.tiny("gpt2", positions_from_padding=True, pad_id=1)
    for name, cfg, msg in (("classifier", cls, "pooler_act='gelu'"), ("lm", lm, "positions_from_padding=True")):
        with pytest.raises(ConversionError, match=msg):
            hf.save_pretrained(abstract_model(name, cfg), name, cfg, "/nonexistent/never-written")
