"""Token choice in both frameworks (jaxformer.generation, torch_ref.generation): greedy and
beam search give the same token ids in both, left padding, EOS, sampling filters, an
exhaustive beam search check, bad input and config validation."""
from __future__ import annotations

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from generation_helpers import LMS, PROMPTS, S2S, SOURCES, N, jitted, pair

from jaxformer import generation as jgen
from jaxformer.config.models import GenerationConfig, Seq2SeqConfig
from torch_ref import generation as tgen


# ----------------------------------------------------------------------------- cross-framework
@pytest.mark.parametrize("flavour", ["gpt2", "llama_gqa", "alibi_postln"])
def test_lm_greedy_tokens_match_across_frameworks(flavour):
    t, j = pair("lm", LMS[flavour])
    ids, mask = jgen.pad_prompts(PROMPTS, 0)
    gen = GenerationConfig(max_new_tokens=N, stop_at_eos=False)
    a, b = jgen.lm_generate(j, ids, mask, gen), tgen.lm_generate(t, ids, mask, gen)
    assert a.shape == (3, N)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("flavour", sorted(S2S))
def test_seq2seq_greedy_and_beam_match_across_frameworks(flavour):
    t, j = pair("seq2seq", S2S[flavour])
    gen = GenerationConfig(max_new_tokens=N, stop_at_eos=False)
    np.testing.assert_array_equal(jgen.seq2seq_generate(j, SOURCES, gen=gen),
                                  tgen.seq2seq_generate(t, SOURCES, gen=gen))
    beam = GenerationConfig(max_new_tokens=12, strategy="beam", num_beams=4, length_penalty=0.6)
    (ja, js), (ta, ts) = jgen.seq2seq_generate(j, SOURCES, gen=beam), tgen.seq2seq_generate(t, SOURCES, gen=beam)
    np.testing.assert_array_equal(ja, ta)
    assert np.abs(js - ts).max() <= 1e-5


def test_lm_beam_matches_across_frameworks():
    t, j = pair("lm", LMS["llama_gqa"])
    ids, mask = jgen.pad_prompts(PROMPTS, 0)
    # 8 tokens: generate's program for this model and prompt batch is then test_decode_layout's
    # and test_generation_cache's (one compile per process, not one per test)
    gen = GenerationConfig(max_new_tokens=8, strategy="beam", num_beams=3)
    (ja, js), (ta, ts) = jgen.lm_generate(j, ids, mask, gen), tgen.lm_generate(t, ids, mask, gen)
    np.testing.assert_array_equal(ja, ta)
    assert np.abs(js - ts).max() <= 1e-5


@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_left_padded_rows_generate_like_unpadded(framework):
    t, j = pair("lm", LMS["gpt2"])
    g = jgen if framework == "jax" else tgen
    model = j if framework == "jax" else t
    gen = GenerationConfig(max_new_tokens=N, stop_at_eos=False)  # the batch: the greedy test's program
    batch = g.lm_generate(model, *g.pad_prompts(PROMPTS, 0), gen)
    for row, prompt in zip(batch, PROMPTS, strict=True):
        np.testing.assert_array_equal(row, g.lm_generate(model, np.array([prompt]), None, gen)[0])


@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_generation_stops_at_eos_and_pads(framework):
    t, j = pair("lm", LMS["llama_gqa"])
    g, model = (jgen, j) if framework == "jax" else (tgen, t)
    ids, mask = g.pad_prompts(PROMPTS, 0)
    # N tokens: `free` is test_lm_greedy_tokens_match_across_frameworks's program
    free = g.lm_generate(model, ids, mask, GenerationConfig(max_new_tokens=N, stop_at_eos=False))
    eos = int(free[0, 5])  # make row 0's 6th token the EOS
    out = g.lm_generate(model, ids, mask, GenerationConfig(max_new_tokens=N, eos_id=eos))
    for r in range(len(PROMPTS)):
        hits = np.flatnonzero(free[r] == eos)
        if len(hits) == 0:
            np.testing.assert_array_equal(out[r], free[r])
        else:
            k = hits[0]
            np.testing.assert_array_equal(out[r, :k + 1], free[r, :k + 1])
            assert (out[r, k + 1:] == 0).all()  # pad_id after EOS


# ----------------------------------------------------------------------------- sampling
def _np_filter(x, temperature, top_k, top_p):
    x = x / temperature
    if top_k:
        x = np.where(x < np.sort(x, -1)[:, ::-1][:, top_k - 1:top_k], -np.inf, x)
    if top_p < 1:
        s = np.sort(x, -1)[:, ::-1]
        p = np.exp(s - s.max(-1, keepdims=True))
        p = p / p.sum(-1, keepdims=True)
        n = ((np.cumsum(p, -1) - p) < top_p).sum(-1)
        x = np.where(x < s[np.arange(len(s)), n - 1][:, None], -np.inf, x)
    return x


@pytest.mark.parametrize("settings", [(1.0, 0, 0.9), (0.7, 5, 1.0), (1.3, 10, 0.6), (1.0, 1, 1.0), (0.5, 0, 0.05)])
def test_filter_logits_matches_across_frameworks_and_reference(settings):
    temperature, top_k, top_p = settings
    logits = np.random.RandomState(7).standard_normal((6, 50)).astype(np.float32) * 3
    a = np.asarray(jgen.filter_logits(jnp.asarray(logits), temperature=temperature, top_k=top_k, top_p=top_p))
    b = tgen.filter_logits(torch.as_tensor(logits), temperature=temperature, top_k=top_k, top_p=top_p).numpy()
    ref = _np_filter(logits.astype(np.float64), temperature, top_k, top_p)
    np.testing.assert_array_equal(np.isinf(a), np.isinf(ref))
    np.testing.assert_array_equal(np.isinf(b), np.isinf(ref))
    kept = ~np.isinf(ref)
    assert np.abs(a[kept] - b[kept]).max() <= 1e-6
    if top_k:
        assert (kept.sum(-1) <= top_k).all()
    assert (kept.sum(-1) >= 1).all()


@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_samples_stay_in_the_nucleus_and_follow_its_probabilities(framework):
    logits = np.random.RandomState(8).standard_normal((1, 20)).astype(np.float32) * 2
    rows = np.repeat(logits, 4000, 0)
    gen = GenerationConfig(strategy="sample", temperature=0.8, top_k=6, top_p=0.8)
    if framework == "jax":
        draws = np.asarray(jgen.select_tokens(jnp.asarray(rows), jax.random.key(0), gen))
    else:
        draws = tgen.select_tokens(torch.as_tensor(rows), torch.Generator().manual_seed(0), gen).numpy()
    allowed = _np_filter(logits.astype(np.float64), 0.8, 6, 0.8)[0]
    assert np.isfinite(allowed[draws]).all()
    p = np.exp(allowed - allowed[np.isfinite(allowed)].max())
    p = p / p.sum()
    freq = np.bincount(draws, minlength=20) / len(draws)
    assert np.abs(freq - p).max() < 0.03  # 4000 draws: standard error < 0.008


@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_sampling_reproducible_and_top_k_1_is_greedy(framework):
    t, j = pair("lm", LMS["gpt2"])
    g, model = (jgen, j) if framework == "jax" else (tgen, t)
    ids, mask = g.pad_prompts(PROMPTS, 0)
    # N tokens: the greedy reference is test_lm_greedy_tokens_match_across_frameworks's program
    sample = GenerationConfig(max_new_tokens=N, strategy="sample", temperature=5.0, stop_at_eos=False, seed=1)
    a, b = g.lm_generate(model, ids, mask, sample), g.lm_generate(model, ids, mask, sample)
    np.testing.assert_array_equal(a, b)
    assert (a != g.lm_generate(model, ids, mask, dataclasses.replace(sample, seed=2))).any()
    greedy = g.lm_generate(model, ids, mask, GenerationConfig(max_new_tokens=N, stop_at_eos=False))
    np.testing.assert_array_equal(g.lm_generate(model, ids, mask, dataclasses.replace(sample, top_k=1)), greedy)


# ----------------------------------------------------------------------------- beam search
@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_beam_search_finds_the_exhaustive_best(framework):
    """Vocab 8, 3 new tokens, 64 beams (>= 8^2): beam search must return the best of all 512
    continuations under score = sum log p / length ** 0.7 (a sequence ends at its first EOS),
    the log p of the same framework's model (JAX's forward jitted: one compile, not one per op)."""
    cfg = Seq2SeqConfig.tiny(max_len=64, vocab_size=8, eos_id=2)
    t, j = pair("seq2seq", cfg)
    src = np.array([[3, 4, 5, 6, 7]], np.int32)
    seqs = np.array(list(itertools.product(range(8), repeat=3)), np.int32)  # [512, 3]
    tgt = np.concatenate([np.full((512, 1), cfg.bos_id, np.int32), seqs[:, :2]], 1)
    if framework == "jax":
        logits = jitted(j)(np.repeat(src, 512, 0), tgt).astype(np.float64)
    else:
        with torch.no_grad():
            logits = t(torch.as_tensor(np.repeat(src, 512, 0)).long(), torch.as_tensor(tgt).long()).numpy()
        logits = logits.astype(np.float64)
    logp = logits - np.logaddexp.reduce(logits, -1, keepdims=True)
    tok_lp = np.take_along_axis(logp, seqs[:, :, None], -1)[:, :, 0]  # [512, 3]
    best, best_seq = -np.inf, None
    for s, lp in zip(seqs, tok_lp, strict=True):
        n = int(np.argmax(s == 2)) + 1 if (s == 2).any() else 3
        score = lp[:n].sum() / n ** 0.7
        if score > best + 1e-9:
            best, best_seq = score, list(s[:n]) + [0] * (3 - n)
    gen = GenerationConfig(max_new_tokens=3, strategy="beam", num_beams=64, length_penalty=0.7)
    g, model = (jgen, j) if framework == "jax" else (tgen, t)
    tokens, score = g.seq2seq_generate(model, src, gen=gen)
    assert list(tokens[0]) == best_seq
    assert abs(float(score[0]) - best) <= 1e-5


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_bad_generation_input_raises(framework):
    cfg = LMS["gpt2"]
    t, j = pair("lm", cfg)
    g, model = (jgen, j) if framework == "jax" else (tgen, t)
    gen = GenerationConfig(max_new_tokens=8)
    ok = np.array([[5, 6, 7]], np.int32)
    for bad in (-1, cfg.vocab_size):
        with pytest.raises(ValueError, match="out of range"):
            g.lm_generate(model, np.array([[5, bad, 7]]), None, gen)
    with pytest.raises(ValueError, match="exceeds max_len"):  # the prompt alone is too long
        g.lm_generate(model, np.full((1, cfg.max_len + 1), 5), None, gen)
    with pytest.raises(ValueError, match="exceeds max_len"):  # prompt + new tokens too long
        g.lm_generate(model, ok, None, GenerationConfig(max_new_tokens=cfg.max_len))
    with pytest.raises(ValueError, match="exceeds the KV cache"):  # more new tokens than the cache holds
        g.lm_generate(model, ok, None, GenerationConfig(max_new_tokens=8, cache_len=10))
    with pytest.raises(ValueError, match="at least one token"):
        g.lm_generate(model, ok, np.array([[0, 0, 0]]), gen)
    s_cfg = S2S["shared_tied"]
    ts, js = pair("seq2seq", s_cfg)
    s_model = js if framework == "jax" else ts
    with pytest.raises(ValueError, match="out of range"):
        g.seq2seq_generate(s_model, np.array([[5, s_cfg.vocab_size]]), gen=gen)
    with pytest.raises(ValueError, match="exceeds max_len"):
        g.seq2seq_generate(s_model, np.full((1, s_cfg.max_len + 1), 5), gen=gen)
    with pytest.raises(ValueError, match="exceeds max_len"):
        g.seq2seq_generate(s_model, ok, gen=GenerationConfig(max_new_tokens=s_cfg.max_len))
    with pytest.raises(ValueError, match="exceeds the KV cache"):
        g.seq2seq_generate(s_model, ok, gen=GenerationConfig(max_new_tokens=8, cache_len=4))


def test_generation_config_is_validated():
    for bad in (dict(strategy="nucleus"), dict(temperature=0.0), dict(top_p=0.0), dict(top_k=-1),
                dict(max_new_tokens=0), dict(num_beams=0)):
        with pytest.raises(ValueError):
            GenerationConfig(**bad)
