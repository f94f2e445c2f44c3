"""KV-cache generation in both frameworks (jaxformer.generation, torch_ref.generation):
cached logits equal full recompute at every step, one compilation for all decode steps,
greedy and beam search give the same token ids in both frameworks, left padding, EOS,
sampling filters, exhaustive beam search check, bad input, and the `jaxformer generate` CLI."""
from __future__ import annotations

import dataclasses
import itertools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from jaxformer import cli, convert
from jaxformer import generation as jgen
from jaxformer.config.models import GenerationConfig, LMConfig, Seq2SeqConfig
from jaxformer import lowering
from jaxformer.layers import linear
from jaxformer.lowering import DecodeLayout
from jaxformer.models import build_model as jbuild
from jaxformer.parity import setup_precision
from jaxformer.parity.cases_models import GPT2, LLAMA, TINY, realistic_embeddings
from torch_ref import generation as tgen
from torch_ref.models import build_model as tbuild

setup_precision()
N = 32  # new tokens
BASE = {**TINY, "max_len": 64}
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [3, 4], [12, 13, 14, 15]]  # different lengths
LMS = {
    "gpt2": LMConfig(**BASE, **GPT2),
    "llama_gqa": LMConfig(**BASE, **LLAMA),
    "alibi_postln": LMConfig(**BASE, position="alibi", norm_position="post", tie_embeddings=False),
    "t5bias_sliding_window": LMConfig(**BASE, position="t5", norm_position="pre", sliding_window=5),
    "sinusoidal_scaled": LMConfig(**BASE, position="sinusoidal", norm_position="pre"),
}
S2S = {
    "shared_tied": Seq2SeqConfig(**BASE),
    "separate_untied_pre": Seq2SeqConfig(**BASE, share_embeddings=False, tie_output=False, tgt_vocab_size=48,
                                         num_decoder_layers=3, norm_position="pre"),
}
SOURCES = np.array([[5, 6, 7, 8, 9, 0, 0], [10, 11, 12, 13, 14, 15, 16], [17, 18, 0, 0, 0, 0, 0]], np.int32)


def pair(name, cfg, seed=0):
    """torch model and its JAX twin with the same weights; token embeddings rescaled to
    N(0, 1/D) (see parity_tests/cases_models.realistic_embeddings: with the constructor's
    N(0, 1) tied tables, logits reach |x| ~ 100 where float32's spacing is 7.6e-6 and cached vs
    recomputed torch logits differed by 1.1e-5, measured, by summation order alone)."""
    t = realistic_embeddings(tbuild(name, cfg, seed=seed).eval())
    j = jbuild(name, cfg, seed=seed)
    convert.load_torch_state_dict(j, t.state_dict())
    j.eval()
    return t, j


def jitted(model):
    """model(*args) as one jitted pure function (eager JAX would compile every op for every
    new shape)."""
    graphdef, state = nnx.split(model)
    fn = jax.jit(lambda state, *a: nnx.merge(graphdef, state)(*a))
    return lambda *a: np.asarray(fn(state, *[jnp.asarray(x) for x in a]))


# ----------------------------------------------------------------------------- cache vs recompute
def _jax_lm_cached(model, ids, mask, n, elementwise=None):
    """Greedy with the cache via the jitted pure step; -> (logits per step [n, B, V], tokens).
    elementwise: the one-token attention form (None = generate's on this backend)."""
    graphdef, state = nnx.split(model)
    b, p = ids.shape
    slot_mask = np.zeros((b, p + n), np.int32)
    slot_mask[:, :p] = mask
    logits, cache = jgen.lm_step(graphdef, state, jnp.asarray(ids), jnp.asarray(slot_mask),
                                 model.init_cache(b, p + n), 0, elementwise)
    steps = [np.asarray(logits[:, -1])]
    for i in range(n - 1):
        tok = steps[-1].argmax(-1).astype(np.int32)
        slot_mask[:, p + i] = 1
        logits, cache = jgen.lm_step(graphdef, state, jnp.asarray(tok[:, None]), jnp.asarray(slot_mask), cache,
                                     p + i, elementwise)
        steps.append(np.asarray(logits[:, 0]))
    return np.stack(steps), np.stack([s.argmax(-1) for s in steps], 1)


@torch.no_grad()
def _torch_lm_cached(model, ids, mask, n):
    b, p = ids.shape
    slot_mask = torch.zeros((b, p + n), dtype=torch.long)
    slot_mask[:, :p] = torch.as_tensor(mask)
    logits, cache = model(torch.as_tensor(ids).long(), slot_mask, cache=model.init_cache(b, p + n), cache_index=0)
    steps = [logits[:, -1].numpy()]
    for i in range(n - 1):
        tok = torch.as_tensor(steps[-1].argmax(-1))
        slot_mask[:, p + i] = 1
        logits, cache = model(tok[:, None], slot_mask, cache=cache, cache_index=p + i)
        steps.append(logits[:, 0].numpy())
    return np.stack(steps), np.stack([s.argmax(-1) for s in steps], 1)


def _recompute(forward, ids, mask, tokens, k):
    """Logits after prompt + tokens[:, :k], computed without a cache. The sequence is right-
    padded to a fixed length (masked keys, after the query anyway) so one compilation serves."""
    b, p = ids.shape
    seq = np.zeros((b, p + tokens.shape[1]), np.int32)
    seq[:, :p], seq[:, p:p + k] = ids, tokens[:, :k]
    m = np.zeros_like(seq)
    m[:, :p], m[:, p:p + k] = mask, 1
    return forward(seq, m)[:, p + k - 1]


# JAX runs both one-token attention forms: the broadcast multiply-and-sum that generate uses
# on CPU (lowering's elementwise_attention) and the batched dots it uses elsewhere
FORMS = {"jax": (True, False), "torch": (None,)}


@pytest.mark.parametrize("framework", ["jax", "torch"])
@pytest.mark.parametrize("flavour", sorted(LMS))
def test_lm_cached_logits_equal_full_recompute(flavour, framework):
    t, j = pair("lm", LMS[flavour])
    ids, mask = jgen.pad_prompts(PROMPTS, 0)
    for elementwise in FORMS[framework]:
        if framework == "jax":
            steps, tokens = _jax_lm_cached(j, ids, mask, N, elementwise)
            forward = jitted(j)
        else:
            steps, tokens = _torch_lm_cached(t, ids, mask, N)
            forward = lambda s, m: t(torch.as_tensor(s).long(), torch.as_tensor(m)).detach().numpy()
        diffs = [np.abs(steps[k] - _recompute(forward, ids, mask, tokens, k)).max() for k in range(N)]
        form = {True: " elementwise", False: " dots", None: ""}[elementwise]
        print(f"[cache vs recompute] lm_{flavour} {framework}{form}: max |diff| over {N} steps {max(diffs):.3e}")
        assert max(diffs) <= 1e-5, f"{form} step {int(np.argmax(diffs))}: {max(diffs):.3e}"


@pytest.mark.parametrize("framework", ["jax", "torch"])
@pytest.mark.parametrize("flavour", sorted(S2S))
def test_seq2seq_cached_logits_equal_full_recompute(flavour, framework):
    cfg = S2S[flavour]
    t, j = pair("seq2seq", cfg)
    b = SOURCES.shape[0]
    bos = np.full((b, 1), cfg.bos_id, np.int32)
    for elementwise in FORMS[framework]:
        steps = []
        if framework == "jax":
            graphdef, state = nnx.split(j)
            memory, mmask = j.encode(jnp.asarray(SOURCES))
            cache, tok = j.init_cache(memory, N + 1), bos
            for i in range(N):
                logits, cache = jgen.seq2seq_step(graphdef, state, jnp.asarray(tok), mmask, cache, i, elementwise)
                steps.append(np.asarray(logits[:, 0]))
                tok = steps[-1].argmax(-1)[:, None].astype(np.int32)
            fwd = jitted(j)
            forward = lambda tgt: fwd(SOURCES, tgt)
        else:
            with torch.no_grad():
                memory, mmask = t.encode(torch.as_tensor(SOURCES).long())
                cache, tok = t.init_cache(memory, N + 1), torch.as_tensor(bos).long()
                for i in range(N):
                    logits, cache = t.decode(tok, None, mmask, cache=cache, cache_index=i)
                    steps.append(logits[:, 0].numpy())
                    tok = torch.as_tensor(steps[-1].argmax(-1))[:, None]
            forward = lambda tgt: t(torch.as_tensor(SOURCES).long(), torch.as_tensor(tgt).long()).detach().numpy()
        tokens = np.stack([s.argmax(-1) for s in steps], 1).astype(np.int32)
        tgt = np.concatenate([bos, tokens[:, :-1]], 1)  # every prefix, right-padded to N (causal)
        diffs = [np.abs(steps[k] - forward(np.where(np.arange(N) <= k, tgt, cfg.pad_id))[:, k]).max()
                 for k in range(N)]
        form = {True: " elementwise", False: " dots", None: ""}[elementwise]
        print(f"[cache vs recompute] seq2seq_{flavour} {framework}{form}: max |diff| over {N} steps {max(diffs):.3e}")
        assert max(diffs) <= 1e-5, f"{form} step {int(np.argmax(diffs))}: {max(diffs):.3e}"


# ----------------------------------------------------------------------------- one compilation
def test_decode_step_compiles_once():
    _, j = pair("lm", dataclasses.replace(LMS["llama_gqa"], num_layers=3))  # compiled nowhere else
    ids, mask = jgen.pad_prompts(PROMPTS, 0)
    before = jgen.TRACES["lm_forward"]
    _jax_lm_cached(j, ids, mask, N)  # 1 prefill call + 31 one-token steps at 31 cache indices
    assert jgen.TRACES["lm_forward"] - before == 2  # one trace for the prefill, ONE for all steps
    _jax_lm_cached(j, ids[::-1], mask[::-1], N)  # new values, same shapes: no retrace at all
    assert jgen.TRACES["lm_forward"] - before == 2


def test_elementwise_decode_attention_reads_the_cache_without_copies():
    """The point of lowering's elementwise_attention: a decode loop compiled with it
    copies no KV cache (with the dot form XLA:CPU copied each cache two to four times per
    step). Counted in the optimized HLO of a 4-step loop, for MHA and for GQA."""
    for flavour in ("gpt2", "llama_gqa"):
        _, j = pair("lm", dataclasses.replace(LMS[flavour], num_layers=2))
        graphdef, state = nnx.split(j)
        cache = j.init_cache(1, 40)  # batch 1: the case that copied
        cache_type = "f32[" + ",".join(map(str, cache[0]["self"]["k"].shape)) + "]"

        def loop(state, cache, elementwise):
            model = nnx.merge(graphdef, state)

            def body(i, cache):
                with lowering.tracing(elementwise_attention=elementwise):
                    return model(jnp.ones((1, 1), jnp.int32), jnp.ones((1, 40), jnp.int32), cache=cache,
                                 cache_index=7 + i)[1]
            return jax.lax.fori_loop(0, 4, body, cache)

        counts = {}
        for elementwise in (True, False):
            hlo = jax.jit(loop, static_argnums=2, donate_argnums=1, compiler_options=lowering.CPU_COMPILER_OPTIONS).lower(
                state, cache, elementwise).compile().as_text()
            counts[elementwise] = sum(1 for line in hlo.splitlines()
                                      if " copy(" in line and line.split("=")[1].strip().startswith(cache_type))
        print(f"[decode attention] {flavour}: cache-sized copies in the loop: elementwise {counts[True]}, "
              f"dots {counts[False]}")
        assert counts[True] == 0, counts


def test_whole_generate_loop_compiles_once():
    _, j = pair("lm", dataclasses.replace(LMS["gpt2"], num_layers=3))  # compiled nowhere else
    gen = GenerationConfig(max_new_tokens=N, stop_at_eos=False)
    ids, mask = jgen.pad_prompts(PROMPTS, 0)
    before = jgen.TRACES["lm_generate"]
    a = jgen.lm_generate(j, ids, mask, gen)
    b = jgen.lm_generate(j, ids[::-1], mask[::-1], dataclasses.replace(gen, seed=3))
    assert jgen.TRACES["lm_generate"] - before == 1
    np.testing.assert_array_equal(a[::-1], b)  # greedy ignores the seed; rows just swapped


# ----------------------------------------------------------------------------- weight layout
@pytest.mark.parametrize("name,flavour", [("lm", "gpt2"), ("lm", "llama_gqa"), ("seq2seq", "separate_untied_pre")])
def test_transposed_weight_layout_generates_what_the_stored_one_does(name, flavour):
    """DecodeLayout.kernels: the [out, in] kernel copies (jaxformer/layers/linear.py) change
    only the order of fp32 additions inside each matmul; greedy and beam ids match."""
    _, j = pair(name, (LMS if name == "lm" else S2S)[flavour])
    args = jgen.pad_prompts(PROMPTS, 0) if name == "lm" else (SOURCES, None)
    for gen in (GenerationConfig(max_new_tokens=N, stop_at_eos=False),
                GenerationConfig(max_new_tokens=8, strategy="beam", num_beams=3)):
        stored = jgen.generate(j, *args, gen=gen, layout="stored")
        transposed = jgen.generate(j, *args, gen=gen, layout="transposed")
        if gen.strategy == "beam":  # (tokens, scores): scores may differ in the last bit
            np.testing.assert_allclose(transposed[1], stored[1], rtol=1e-6)
            stored, transposed = stored[0], transposed[0]
        np.testing.assert_array_equal(stored, transposed)


def test_kept_decode_weights_follow_the_model_weights():
    """DecodeLayout.keep_weights: the [out, in] copies are made once and reused;
    new kernel arrays (a training step, a weight load) are transposed again, so generation
    never runs stale weights; release_decode_weights and the model's death free them."""
    import gc
    _, j = pair("lm", dataclasses.replace(LMS["gpt2"], num_layers=2))
    ids, mask = jgen.pad_prompts(PROMPTS, 0)
    gen = GenerationConfig(max_new_tokens=8, stop_at_eos=False)
    layout = DecodeLayout("transposed")
    first = jgen.decode_kernels(j, layout)
    assert jgen.decode_kernels(j, layout) is first  # reused, not transposed again
    before = jgen.lm_generate(j, ids, mask, gen, layout)
    # new weights: every kernel scaled by -1 (a different model, same shapes)
    for m in linear.linear_modules(j):
        m.kernel.set_value(-m.kernel.get_value())
    assert jgen.decode_kernels(j, layout) is not first
    after = jgen.lm_generate(j, ids, mask, gen, layout)
    fresh = jgen.lm_generate(j, ids, mask, gen, dataclasses.replace(layout, keep_weights=False))
    stored = jgen.lm_generate(j, ids, mask, gen, dataclasses.replace(layout, kernels="stored"))
    np.testing.assert_array_equal(after, fresh)
    np.testing.assert_array_equal(after, stored)
    assert not np.array_equal(after, before)  # the new weights were used
    assert j not in lowering._KEPT_KERNELS  # keep_weights=False dropped the kept copies
    jgen.decode_kernels(j, layout)
    jgen.release_decode_weights(j)
    assert j not in lowering._KEPT_KERNELS
    jgen.decode_kernels(j, layout)
    n = len(lowering._KEPT_KERNELS)
    del j, m
    gc.collect()
    assert len(lowering._KEPT_KERNELS) == n - 1  # the copies went with the model


def test_linear_in_the_transposed_layout_computes_the_same_map():
    lin = linear.Linear(24, 40, rngs=nnx.Rngs(0))
    lin.bias[...] = jax.random.normal(jax.random.key(1), (40,))
    x = jax.random.normal(jax.random.key(2), (3, 5, 24))
    graphdef, state = nnx.split(lin)

    def apply(state, x, transposed):
        with lowering.tracing(transposed_kernels=transposed):
            m = nnx.merge(graphdef, state)
            if transposed:
                linear.transpose_kernels(m)
                assert m.kernel[...].shape == (40, 24)  # [out, in]
            return m(x), m(x, stop_bias_gradient=True)

    ref, ref_cut = jax.jit(apply, static_argnums=2)(state, x, False)
    out, out_cut = jax.jit(apply, static_argnums=2)(state, x, True)
    assert float(jnp.abs(out - ref).max()) <= 1e-6 * float(jnp.abs(ref).max())
    np.testing.assert_array_equal(ref, ref_cut)  # the cut bias is still added
    np.testing.assert_array_equal(out, out_cut)
    # the cut removes the bias gradient only
    grad = jax.grad(lambda st: jnp.sum(apply(st, x, False)[1] ** 2))(state)
    assert float(jnp.abs(grad["bias"][...]).max()) == 0.0
    assert float(jnp.abs(grad["kernel"][...]).max()) > 0.0


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
    gen = GenerationConfig(max_new_tokens=10, strategy="beam", num_beams=3)
    (ja, js), (ta, ts) = jgen.lm_generate(j, ids, mask, gen), tgen.lm_generate(t, ids, mask, gen)
    np.testing.assert_array_equal(ja, ta)
    assert np.abs(js - ts).max() <= 1e-5


@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_left_padded_rows_generate_like_unpadded(framework):
    t, j = pair("lm", LMS["gpt2"])
    g = jgen if framework == "jax" else tgen
    model = j if framework == "jax" else t
    gen = GenerationConfig(max_new_tokens=12, stop_at_eos=False)
    batch = g.lm_generate(model, *g.pad_prompts(PROMPTS, 0), gen)
    for row, prompt in zip(batch, PROMPTS):
        np.testing.assert_array_equal(row, g.lm_generate(model, np.array([prompt]), None, gen)[0])


@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_generation_stops_at_eos_and_pads(framework):
    t, j = pair("lm", LMS["llama_gqa"])
    g, model = (jgen, j) if framework == "jax" else (tgen, t)
    ids, mask = g.pad_prompts(PROMPTS, 0)
    free = g.lm_generate(model, ids, mask, GenerationConfig(max_new_tokens=16, stop_at_eos=False))
    eos = int(free[0, 5])  # make row 0's 6th token the EOS
    out = g.lm_generate(model, ids, mask, GenerationConfig(max_new_tokens=16, eos_id=eos))
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
    sample = GenerationConfig(max_new_tokens=16, strategy="sample", temperature=5.0, stop_at_eos=False, seed=1)
    a, b = g.lm_generate(model, ids, mask, sample), g.lm_generate(model, ids, mask, sample)
    np.testing.assert_array_equal(a, b)
    assert (a != g.lm_generate(model, ids, mask, dataclasses.replace(sample, seed=2))).any()
    greedy = g.lm_generate(model, ids, mask, GenerationConfig(max_new_tokens=16, stop_at_eos=False))
    np.testing.assert_array_equal(g.lm_generate(model, ids, mask, dataclasses.replace(sample, top_k=1)), greedy)


# ----------------------------------------------------------------------------- beam search
@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_beam_search_finds_the_exhaustive_best(framework):
    """Vocab 8, 3 new tokens, 64 beams (>= 8^2): beam search must return the best of all 512
    continuations under score = sum log p / length ** 0.7 (a sequence ends at its first EOS)."""
    cfg = Seq2SeqConfig(**{**BASE, "vocab_size": 8}, eos_id=2)
    t, j = pair("seq2seq", cfg)
    src = np.array([[3, 4, 5, 6, 7]], np.int32)
    seqs = np.array(list(itertools.product(range(8), repeat=3)), np.int32)  # [512, 3]
    tgt = np.concatenate([np.full((512, 1), cfg.bos_id, np.int32), seqs[:, :2]], 1)
    logits = np.asarray(j(jnp.asarray(np.repeat(src, 512, 0)), jnp.asarray(tgt)), np.float64)
    logp = logits - np.logaddexp.reduce(logits, -1, keepdims=True)
    tok_lp = np.take_along_axis(logp, seqs[:, :, None], -1)[:, :, 0]  # [512, 3]
    best, best_seq = -np.inf, None
    for s, lp in zip(seqs, tok_lp):
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


def test_decode_layout_is_validated():
    with pytest.raises(ValueError):
        DecodeLayout("column_major")
    _, j = pair("lm", dataclasses.replace(LMS["gpt2"], num_layers=1))
    with pytest.raises(ValueError, match="column_major"):
        jgen.lm_generate(j, np.array([[5, 6]]), layout="column_major")


# ----------------------------------------------------------------------------- CLI
@pytest.mark.parametrize("layout", ["torch", "flax"])
@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_cli_generate_from_converted_weights(tmp_path, capsys, layout, framework):
    cfg = LMS["llama_gqa"]
    t, j = pair("lm", cfg)
    pt = tmp_path / "lm.safetensors"
    convert.write_safetensors(str(pt), {k: v.numpy() for k, v in t.state_dict().items()},
                              {"format": "pt", **convert.model_metadata("lm", cfg)})
    path = pt
    if layout == "flax":
        path = tmp_path / "lm_flax.safetensors"
        convert.convert_file(str(pt), str(path), to="flax")
    rc = cli.main(["generate", "--weights", str(path), "--framework", framework, "--prompt", "5 6 7 8 9",
                   "--prompt", "3 4", "--max-new-tokens", "10", "--no-eos-stop", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    ids, mask = jgen.pad_prompts([[5, 6, 7, 8, 9], [3, 4]], 0)
    expected = jgen.lm_generate(j, ids, mask, GenerationConfig(max_new_tokens=10, stop_at_eos=False))
    assert out["tokens"] == expected.tolist()


@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_cli_generate_from_model_checkpoint_dir(tmp_path, capsys, framework):
    from jaxformer import checkpoint_io
    cfg = S2S["shared_tied"]
    _, j = pair("seq2seq", cfg)
    checkpoint_io.save_model(j, "seq2seq", cfg, str(tmp_path / "ckpt"))
    rc = cli.main(["generate", "--weights", str(tmp_path / "ckpt"), "--framework", framework,
                   "--prompt", "5 6 7 8 9", "--prompt", "17 18", "--max-new-tokens", "8", "--no-eos-stop",
                   "--json"])
    assert rc == 0
    expected = jgen.seq2seq_generate(j, SOURCES[[0, 2], :5], gen=GenerationConfig(max_new_tokens=8, stop_at_eos=False))
    assert json.loads(capsys.readouterr().out)["tokens"] == expected.tolist()


def test_cli_generate_errors_clearly(tmp_path, capsys):
    rc = cli.main(["generate", "--weights", str(tmp_path), "--config", "configs/lm.yaml", "--prompt", "5"])
    assert rc == 1 and "no loader" in capsys.readouterr().err  # a dir that is no model checkpoint
    cfg = LMS["gpt2"]
    t, _ = pair("lm", cfg)
    p = tmp_path / "lm.safetensors"
    convert.write_safetensors(str(p), {k: v.numpy() for k, v in t.state_dict().items()},
                              {"format": "pt", **convert.model_metadata("lm", cfg)})
    rc = cli.main(["generate", "--weights", str(p), "--prompt", f"5 {cfg.vocab_size}"])
    assert rc == 1 and "out of range" in capsys.readouterr().err
