"""T5ForConditionalGeneration (jaxformer/hf/t5.py) against transformers 5.x: v1.0 (ReLU, tied
head rescaled by d_model ** -0.5) and v1.1 / flan (gated tanh-GELU, untied head) on odd tiny
random configs (no download): forward logits with left-padded source rows, greedy and beam ids
of HF generate, export back to HF, T5's bucket table, and refusals that name the option.

Tolerance 1e-5 x max(1, max|logit|) in fp32 (docs/numerics.md §19, §22). Worst measured
|logit| differences over 5 seeds (CPU): v1.0 3.1e-7 (max |logit| 0.41), v1.1 1.7e-6 (2.4).
"""
from __future__ import annotations

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from helpers import randomize

from jaxformer import hf, tables
from jaxformer.config import ConfigError
from jaxformer.config.models import GenerationConfig, Seq2SeqConfig
from jaxformer.convert import ConversionError
from jaxformer.generation import generate
from jaxformer.parity import setup_precision

T = pytest.importorskip("transformers")
V = 100
RNG = np.random.RandomState(0)
# 16 source tokens: beyond max_distance (13 / 9), so the saturated buckets are used; rows 1 and
# 2 left-padded. 10 target tokens starting from T5's decoder start (pad, 0).
SRC = RNG.randint(2, V, size=(3, 16))
SRC_MASK = np.ones_like(SRC)
SRC_MASK[1, :5], SRC_MASK[2, :9] = 0, 0
SRC[SRC_MASK == 0] = 0
TGT = RNG.randint(2, V, size=(3, 10))
TGT[:, 0] = 0
ODD = dict(vocab_size=V, relative_attention_num_buckets=10, relative_attention_max_distance=13,
           decoder_start_token_id=0)
CASES = {  # tag -> (T5Config kwargs, untied lm_head, eos logit boost)
    # v1.0: d_kv 7 (not d_model / heads), a deeper decoder
    "v10": (dict(ODD, d_model=24, d_kv=7, d_ff=37, num_layers=2, num_decoder_layers=3, num_heads=3), False, 1.0),
    # v1.0, 5 heads of 3, eps 1e-3, equal depths (HF's generate caches num_layers decoder layers)
    "v10_gen": (dict(ODD, d_model=20, d_kv=3, d_ff=30, num_layers=2, num_heads=5, layer_norm_epsilon=1e-3,
                     relative_attention_max_distance=9), False, 3.0),
    # v1.1 / flan: gated-gelu, untied head; EOS made likely so beams finish at different lengths
    "v11": (dict(ODD, d_model=24, d_kv=5, d_ff=41, num_layers=2, num_heads=4, feed_forward_proj="gated-gelu",
                 tie_word_embeddings=False), True, 2.5),
}


@pytest.fixture(autouse=True)
def _precision():
    setup_precision()


def _build(tag: str, seed: int = 1):
    kw, untie, boost = CASES[tag]
    model = T.T5ForConditionalGeneration(T.T5Config(**kw))
    if untie:  # HF 5.x ties lm_head to shared in a fresh model; v1.1 checkpoints store their own
        model.lm_head.weight = torch.nn.Parameter(torch.empty(V, kw["d_model"]))
    randomize(model, seed)
    with torch.no_grad():
        model.lm_head.weight[1] *= boost  # eos (1)
    return model


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("t5")
    out = {}
    for tag in CASES:
        model = _build(tag)
        model.save_pretrained(root / tag)
        out[tag] = (model, str(root / tag))
    return out


def _hf_logits(model) -> np.ndarray:
    with torch.no_grad():
        return model(input_ids=torch.from_numpy(SRC), attention_mask=torch.from_numpy(SRC_MASK),
                     decoder_input_ids=torch.from_numpy(TGT)).logits.numpy()


@nnx.jit
def _call(model, src, tgt, mask):
    return model(src, tgt, mask)


@pytest.mark.parametrize("tag", sorted(CASES))
def test_forward_matches_hf(tag, saved):
    hf_model, path = saved[tag]
    model, name, cfg, report = hf.from_pretrained(path, return_report=True)
    assert name == "seq2seq" and cfg.positions.kind == "t5" and cfg.attention.attn_scale == 1.0
    assert cfg.tie_output == (tag != "v11") and cfg.scale_decoder_output == (tag != "v11")
    assert cfg.feedforward.kind == ("geglu_tanh" if tag == "v11" else "relu") and cfg.bos_id == 0
    ref, ours = _hf_logits(hf_model), np.asarray(_call(model, jnp.asarray(SRC), jnp.asarray(TGT), jnp.asarray(SRC_MASK)))
    d, top = float(np.abs(ref - ours).max()), float(np.abs(ref).max())
    print(f"[t5 vs HF] {tag}: max |logit diff| {d:.2e}, max |logit| {top:.2f}")
    assert d <= 1e-5 * max(1.0, top), f"{tag}: max |logits diff| vs HF {d:.2e}"


def _until_eos(row, eos=1) -> list[int]:
    row = [int(x) for x in row]
    return row[: row.index(eos) + 1] if eos in row else row


@pytest.mark.parametrize("tag,lp", [("v10_gen", 0.5), ("v11", 1.0)])
def test_greedy_and_beam_ids_match_hf_generate(tag, lp, saved):
    """Greedy and beam search (3 beams) from left-padded sources; ids equal up to each row's
    EOS. v10_gen's beams depend on HF's rules (only the first W candidates may finish, the
    early-stopping heuristic): a beam search that lets every EOS candidate finish differs."""
    hf_model, path = saved[tag]
    model, _, _ = hf.from_pretrained(path)
    src, mask, n = torch.from_numpy(SRC), torch.from_numpy(SRC_MASK), 8
    with torch.no_grad():
        ref = hf_model.generate(src, attention_mask=mask, max_new_tokens=n, do_sample=False).numpy()[:, 1:]
    ours = generate(model, SRC, SRC_MASK, gen=GenerationConfig(max_new_tokens=n))
    np.testing.assert_array_equal(ours[:, : ref.shape[1]], ref)  # both pad with 0 after EOS
    with torch.no_grad():
        out = hf_model.generate(src, attention_mask=mask, max_new_tokens=n, num_beams=3, length_penalty=lp,
                                do_sample=False, output_scores=True, return_dict_in_generate=True)
    tokens, scores = generate(model, SRC, SRC_MASK, gen=GenerationConfig(
        max_new_tokens=n, strategy="beam", num_beams=3, length_penalty=lp))
    for theirs, mine in zip(out.sequences.numpy()[:, 1:], tokens, strict=False):
        assert _until_eos(mine) == _until_eos(theirs), f"{tag} lp={lp}"
    if tag == "v11":  # some best beam ends at EOS before max_new_tokens (v10_gen's do not)
        assert any(1 in row for row in tokens)
    assert np.abs(scores - out.sequences_scores.numpy()).max() <= 1e-5


@pytest.mark.parametrize("tag", ["v10", "v11"])
def test_export_loads_in_transformers_with_identical_logits(tag, saved, tmp_path):
    hf_model, path = saved[tag]
    model, name, cfg = hf.from_pretrained(path)
    hf.save_pretrained(model, name, cfg, str(tmp_path / "out"))
    back = T.T5ForConditionalGeneration.from_pretrained(str(tmp_path / "out")).eval()
    assert back.config.scale_decoder_outputs == cfg.scale_decoder_output
    assert (back.lm_head.weight.data_ptr() == back.shared.weight.data_ptr()) == cfg.tie_output
    np.testing.assert_array_equal(_hf_logits(back), _hf_logits(hf_model))
    _, _, again = hf.from_pretrained(str(tmp_path / "out"))
    assert again == cfg


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("buckets,distance", [(32, 128), (10, 13), (7, 20), (6, 4), (33, 17)])
def test_bucket_table_matches_hf(bidirectional, buckets, distance):
    """jaxformer.tables.t5_bucket_table (clipped to +-max_distance) against HF's own
    _relative_position_bucket on every relative position in [-3 max_distance, 3 max_distance]."""
    rel = np.arange(-3 * distance, 3 * distance + 1)
    theirs = T.models.t5.modeling_t5.T5Attention._relative_position_bucket(
        torch.from_numpy(rel), bidirectional=bidirectional, num_buckets=buckets, max_distance=distance).numpy()
    table = tables.t5_bucket_table(bidirectional, buckets, distance)
    np.testing.assert_array_equal(table[np.clip(rel, -distance, distance) + distance], theirs)


@pytest.mark.parametrize("raw", [{}, {"tie_word_embeddings": False}, {"tie_word_embeddings": True},
                                 {"tie_word_embeddings": True, "scale_decoder_outputs": False},
                                 {"scale_decoder_outputs": True}])
def test_output_rescale_follows_t5config(raw):
    """scale_decoder_outputs as T5Config derives it (v1.0 configs lack tie_word_embeddings,
    v1.1 ones set it false, 5.x writes both keys)."""
    full = {"architectures": ["T5ForConditionalGeneration"], "model_type": "t5", "vocab_size": V, "d_model": 8,
            "d_kv": 4, "d_ff": 8, "num_layers": 1, "num_heads": 2, **raw}
    fam, arch = hf.family_for_architecture(full)
    _, cfg, _ = fam.config_from_hf(full, arch)
    theirs = T.T5Config(**{k: v for k, v in full.items() if k not in ("architectures", "model_type")})
    assert cfg.scale_decoder_output == theirs.scale_decoder_outputs


@pytest.mark.parametrize("raw,start", [({"decoder_start_token_id": 3, "bos_token_id": 5}, 3),
                                       ({"bos_token_id": 5}, 5), ({"pad_token_id": 2}, 2)])
def test_decoder_start_as_hf_generate_picks_it(raw, start):
    """decoder_start_token_id, else bos_token_id (HF generate's fallback), else pad (T5's
    convention, noted)."""
    full = {"architectures": ["T5ForConditionalGeneration"], "model_type": "t5", "vocab_size": V, "d_model": 8,
            "d_kv": 4, "d_ff": 8, "num_layers": 1, "num_heads": 2, **raw}
    fam, arch = hf.family_for_architecture(full)
    _, cfg, notes = fam.config_from_hf(full, arch)
    assert cfg.bos_id == start and any("pad_token_id" in n for n in notes) == ("pad_token_id" in raw)


REFUSED = {  # config.json changes -> the option the error names
    "gated_relu": (dict(feed_forward_proj="gated-relu"), "feed_forward_proj"),
    "plain_silu": (dict(feed_forward_proj="silu"), "feed_forward_proj"),
    "bad_proj": (dict(feed_forward_proj="gated-gelu-x"), "feed_forward_proj"),
    "act_disagrees": (dict(feed_forward_proj="relu", dense_act_fn="gelu_new"), "dense_act_fn"),
    "is_decoder": (dict(is_decoder=True), "is_decoder"),
    "eos_list": (dict(eos_token_id=[1, 2]), "eos_token_id"),
    "buckets": (dict(relative_attention_num_buckets=16, relative_attention_max_distance=8),
                "relative_attention_max_distance"),
    "unknown": (dict(use_fancy_attention=True), "use_fancy_attention"),
}


@pytest.mark.parametrize("row", sorted(REFUSED))
def test_unimplemented_options_are_refused_by_name(row, saved):
    changes, word = REFUSED[row]
    with open(os.path.join(saved["v10"][1], "config.json")) as f:
        raw = {**json.load(f), **changes}
    fam, arch = hf.family_for_architecture(raw)
    with pytest.raises(ConfigError, match=word):
        fam.config_from_hf(raw, arch)


def test_distinct_embedding_copy_is_refused(saved, tmp_path):
    from safetensors.torch import load_file, save_file
    _, path = saved["v10"]
    sd = load_file(os.path.join(path, "model.safetensors"))
    sd["encoder.embed_tokens.weight"] = sd["shared.weight"] + 1
    save_file(sd, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(path, "config.json")) as f:
        (tmp_path / "config.json").write_text(f.read())
    with pytest.raises(ConfigError, match="encoder.embed_tokens.weight"):
        hf.from_pretrained(str(tmp_path))


def test_export_refuses_a_non_t5_seq2seq():
    from jaxformer.config.models import LMConfig
    with pytest.raises(ConversionError, match="positions.kind='sinusoidal'"):  # Vaswani: no T5 export
        hf.exporter("seq2seq", Seq2SeqConfig.tiny())
    with pytest.raises(ConversionError, match="attn_scale"):  # a T5-style score scale elsewhere
        hf.exporter("lm", LMConfig.tiny("llama", attn_scale=1.0))
