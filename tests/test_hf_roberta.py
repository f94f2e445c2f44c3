"""RoBERTa and XLM-R (jaxformer/hf/roberta.py) against transformers 5.x: positions derived from
the padding (docs/numerics.md §36), the classification head as pooler + classifier.

Tiny random HF models of odd configurations (no download; the rows "roberta/*" of
tests/hf_rows.py): tests/test_hf_table.py checks the hidden states on real tokens, the pooled
vector and the logits of a batch with a right-padded and a left-padded row within
1e-5 x max(1, max|out|) fp32, and the export loading back in transformers with identical
weights and outputs. Here: that check can fail, the masked LM, options not implemented are
refused by name. Worst
measured difference (fp32, -s prints them): 7.2e-7 (max |out| 1.6; roberta_model_pooler's hidden states).
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import hf_encoder_outputs, jit_call
from hf_helpers import built
from hf_rows import row

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


@pytest.fixture(autouse=True)
def _precision():
    setup_precision()


def test_positions_counted_from_zero_are_caught(tmp_path_factory):
    """The table's comparison (tests/test_hf_table.py) can fail: positions counted from 0
    (BERT's) move every real token's output."""
    hf_model, _, (model, _, cfg) = built(row("roberta/roberta_model_pooler"), tmp_path_factory)
    ids, mask = row("roberta/roberta_model_pooler").inputs()
    plain = build_model("encoder", cfg.replace(positions_from_padding=False), seed=0)
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
    assert name == "encoder" and not cfg.bert.pooler and any("lm_head" in n for n in notes)
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
