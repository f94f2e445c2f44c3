"""ModernBERT (jaxformer/hf/modernbert.py) against transformers 5.x: alternating local
(bidirectional sliding window) and global attention, RoPE with a base per layer type, GeGLU
from the fused Wi, the embedding norm, no attn_norm before layer 0, the final norm, the
classification head (cls or mean pooling, dense + activation + norm); docs/numerics.md §36.

Tiny random HF models of odd configurations (no download; the rows "modernbert/*" of
tests/hf_rows.py), with windows (local_attention 2 to 5) much shorter than the 11-token rows:
tests/test_hf_table.py checks the hidden states on real tokens and the logits of a batch with a
right-padded and a left-padded row within 1e-5 x max(1, max|out|) fp32, and the export loading
back in transformers with identical weights and outputs. Here: that check can fail, the masked
LM, options not implemented are refused by name. Worst measured difference (fp32, -s
prints them): 8.3e-7 (max |out| 4.1; model_w4_every2's hidden states).
"""
from __future__ import annotations

import dataclasses

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
from jaxformer.hf import modernbert
from jaxformer.models import build_model
from jaxformer.parity import setup_precision

T = pytest.importorskip("transformers")
V = 97
BASE = dict(vocab_size=V, hidden_size=48, intermediate_size=40, num_hidden_layers=3, num_attention_heads=4,
            max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1,
            sep_token_id=2, global_rope_theta=500.0, local_rope_theta=50.0)


@pytest.fixture(autouse=True)
def _precision():
    setup_precision()


def test_a_narrower_window_or_one_rope_base_is_caught(tmp_path_factory):
    """The table's comparison (tests/test_hf_table.py) can fail: a window one narrower than
    HF's, or one RoPE base for every layer, moves the hidden states."""
    hf_model, _, (model, _, cfg) = built(row("modernbert/model_w4_every2"), tmp_path_factory)
    ids, mask = row("modernbert/model_w4_every2").inputs()
    ref = hf_encoder_outputs(hf_model, ids, mask)[0]
    for change in (dict(sliding_window=cfg.attention.sliding_window - 1), dict(rope_local_base=None)):
        wrong = build_model("encoder", cfg.replace(**change), seed=0)
        nnx.update(wrong, nnx.state(model, nnx.Param))
        out = np.asarray(jit_call(wrong, jnp.asarray(ids), jnp.asarray(mask)))
        assert np.abs(out - ref)[mask.astype(bool)].max() > 1e-3, change


def test_masked_lm_imports_as_its_encoder(tmp_path):
    """ModernBertForMaskedLM (the published checkpoints' architecture) imports as its encoder:
    head.* and decoder.* skipped and noted, every other weight mapped."""
    hf_model = T.ModernBertForMaskedLM(T.ModernBertConfig(**dict(BASE, local_attention=4)))
    sd = hf_model.state_dict()
    name, cfg, notes = modernbert.config_from_hf(hf_model.config.to_dict(), "ModernBertForMaskedLM", tuple(sd))
    assert name == "encoder" and any("head.*" in n for n in notes)
    fn = modernbert.tensor_fn(name, cfg, "ModernBertForMaskedLM")
    mapped = {}
    for k, x in sd.items():
        mapped.update(fn(k, x.numpy()) or {})
    from torch_ref.models import build_model as tbuild
    assert set(mapped) == set(tbuild("encoder", cfg).state_dict())


def _raw(**changes):
    arch = "ModernBertForSequenceClassification"
    return {"architectures": [arch], "model_type": "modernbert", **changes}


REFUSED = {
    "hidden_activation": dict(hidden_activation="relu"),
    "classifier_activation": dict(classifier_activation="mish"),
    "classifier_pooling": dict(classifier_pooling="max"),
    "rope_parameters": dict(rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0,
                                                                "rope_theta": 1e4},
                                             "sliding_attention": {"rope_type": "default"}}),
    "rope_scaling": dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
    "layer_types": dict(layer_types=["full_attention"], num_hidden_layers=2),
    "global_attn_every_n_layers": dict(global_attn_every_n_layers=0),
    "unknown_option": dict(unknown_option=1),
}


@pytest.mark.parametrize("key", sorted(REFUSED))
def test_unsupported_options_are_refused_by_name(key):
    with pytest.raises(ConfigError, match=f"{key}="):
        modernbert.config_from_hf(_raw(**REFUSED[key]), "ModernBertForSequenceClassification")


def test_published_config_keys_are_accepted():
    """A ModernBERT config.json in the 4.48 format (global/local_rope_theta,
    global_attn_every_n_layers, no layer_types), sizes shrunk, with the keys some published
    checkpoints add that transformers does not read (layer_norm_eps, position_embedding_type)."""
    raw = _raw(architectures=["ModernBertForMaskedLM"], attention_bias=False, attention_dropout=0.0, bos_token_id=50281,
               classifier_activation="gelu", classifier_bias=False, classifier_dropout=0.0,
               classifier_pooling="mean", cls_token_id=50281, decoder_bias=True, deterministic_flash_attn=False,
               embedding_dropout=0.0, eos_token_id=50282, global_attn_every_n_layers=3, global_rope_theta=160000.0,
               gradient_checkpointing=False, hidden_activation="gelu", hidden_size=48,
               initializer_cutoff_factor=2.0, initializer_range=0.02, intermediate_size=64, layer_norm_eps=2e-05,
               local_attention=128, local_rope_theta=10000.0, max_position_embeddings=8192, mlp_bias=False,
               mlp_dropout=0.0, norm_bias=False, norm_eps=1e-05, num_attention_heads=4, num_hidden_layers=4,
               pad_token_id=50283, position_embedding_type="absolute", sep_token_id=50282, tie_word_embeddings=True,
               torch_dtype="float32", transformers_version="4.48.0.dev0", vocab_size=50368)
    name, cfg, notes = modernbert.config_from_hf(raw, "ModernBertForMaskedLM")
    assert cfg.local_layers() == (False, True, True, False) and cfg.attention.sliding_window == 65
    assert (cfg.positions.rope_base, cfg.positions.rope_local_base, cfg.feedforward.kind, cfg.norms.norm_eps) == (
        160000.0, 10000.0, "geglu", 1e-5)
    assert any("layer_norm_eps=2e-05" in n for n in notes)


def test_export_refuses_what_modernbert_cannot_express():
    from jaxformer.config.models import ClassifierConfig, LMConfig
    from jaxformer.models import abstract_model
    cls = ClassifierConfig.tiny(position="rope", norm_position="pre", first_attn_norm=False, embed_norm=True,
                                ffn="geglu", pooler=True, pooler_act="gelu", pooler_norm=False, scale_embedding=False)
    lm = LMConfig.tiny("llama", first_attn_norm=False)
    for name, cfg, msg in (("classifier", cls, "pooler_norm=False"), ("lm", lm, "first_attn_norm=False")):
        with pytest.raises(ConversionError, match=msg):
            hf.save_pretrained(abstract_model(name, cfg), name, cfg, "/nonexistent/never-written")
    # a scanned stack is one layer's structure: layer 0 without attn_norm cannot be stacked
    with pytest.raises(ConfigError, match="scan_layers.*first_attn_norm"):
        abstract_model("classifier", dataclasses.replace(cls, scan_layers=True))
