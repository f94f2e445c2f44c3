"""KV-cache decoding in both frameworks: cached logits equal a full recompute at every step
(JAX in both one-token attention forms), one compilation for the prefill and one for every
decode step, one for the whole generate loop, and no copy of the KV cache in the optimized
HLO of a decode loop with the elementwise one-token attention; a scanned stack
(model.scan_layers) decodes like the unrolled one."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from generation_helpers import LMS, PROMPTS, S2S, SOURCES, N, jitted, pair

from jaxformer import generation as jgen
from jaxformer import lowering
from jaxformer.config.models import GenerationConfig, LMConfig


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
    out = model(torch.as_tensor(ids).long(), slot_mask, cache=model.init_cache(b, p + n), cache_index=0)
    logits, cache = out.logits, out.cache
    steps = [logits[:, -1].numpy()]
    for i in range(n - 1):
        tok = torch.as_tensor(steps[-1].argmax(-1))
        slot_mask[:, p + i] = 1
        out = model(tok[:, None], slot_mask, cache=cache, cache_index=p + i)
        logits, cache = out.logits, out.cache
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


# a seq2seq model's encoder as one compiled program (eager, every op of it compiles separately)
_encode = nnx.jit(lambda model, src: model.encode(src))


# GPT-NeoX's layout (docs/numerics.md §35): the first 6 of 12 dims of each head rotated, the
# parallel residual; JAX scans its stacked layers (scan_layers), torch loops over them
CACHE_LMS = {**LMS, "gpt_neox_partial_rotary_parallel_scanned": LMConfig.tiny(
    "gpt2", max_len=64, position="rope", head_dim=12, rotary_dim=6, parallel_residual=True, scan_layers=True)}

# JAX runs both one-token attention forms: the broadcast multiply-and-sum that generate uses
# on CPU (lowering's elementwise_attention) and the batched dots it uses elsewhere
FORMS = {"jax": (True, False), "torch": (None,)}


@pytest.mark.parametrize("framework", ["jax", "torch"])
@pytest.mark.parametrize("flavour", sorted(CACHE_LMS))
def test_lm_cached_logits_equal_full_recompute(flavour, framework):
    t, j = pair("lm", CACHE_LMS[flavour])
    ids, mask = jgen.pad_prompts(PROMPTS, 0)
    # the added flavour runs JAX in generate's form only (its RoPE acts before the cache)
    for elementwise in FORMS[framework] if flavour in LMS else FORMS["torch"]:
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
            memory, mmask = _encode(j, jnp.asarray(SOURCES))
            cache, tok = j.init_cache(memory, N + 1), bos
            for i in range(N):
                logits, cache = jgen.seq2seq_step(graphdef, state, jnp.asarray(tok), mmask, cache, i, elementwise)
                steps.append(np.asarray(logits[:, 0]))
                tok = steps[-1].argmax(-1)[:, None].astype(np.int32)
            fwd = jitted(j)
            forward = lambda tgt, fwd=fwd: fwd(SOURCES, tgt)
        else:
            with torch.no_grad():
                memory, mmask = t.encode(torch.as_tensor(SOURCES).long())
                cache, tok = t.init_cache(memory, N + 1), torch.as_tensor(bos).long()
                for i in range(N):
                    out = t.decode(tok, None, mmask, cache=cache, cache_index=i)
                    cache = out.cache
                    steps.append(out.logits[:, 0].numpy())
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

        def loop(state, cache, elementwise, graphdef=graphdef):
            model = nnx.merge(graphdef, state)

            def body(i, cache):
                with lowering.tracing(elementwise_attention=elementwise):
                    return model(jnp.ones((1, 1), jnp.int32), jnp.ones((1, 40), jnp.int32), cache=cache,
                                 cache_index=7 + i).cache
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


# ----------------------------------------------------------------------------- scanned stacks
def _scanned_twin(name, cfg, torch_model):
    """The model with model.scan_layers: true on the same weights (convert stacks the
    torch `layers.{i}` keys into [L, ...] leaves), built abstractly before the load (as
    generation_helpers.pair: no eager initializers of the stacked shapes)."""
    from jaxformer import convert
    from jaxformer.models import build_model
    from jaxformer.parity.cases import twin
    model = twin(lambda: build_model(name, dataclasses.replace(cfg, scan_layers=True)), 0)
    convert.load_torch_state_dict(model, torch_model.state_dict())
    model.eval()
    return model


def test_scanned_stack_decodes_like_the_unrolled_one():
    """scan_layers: true decodes with one stacked cache [L, B, G, S, K], scanned over the layers
    in the prefill and in every one-token step: the same logits (<= 1e-5) and greedy ids step
    by step, and the same beam search ids through generate's whole program, in its decode
    layout (on CPU the [out, in] kernel copies of the stacked [L, in, out] kernels), as the
    unrolled stack on the same weights, for lm and seq2seq."""
    # N steps in a cache of the cached-vs-recompute tests' length: the unrolled model's prefill
    # and step programs are theirs (one compile per process); the beam search's 8 tokens are
    # test_decode_layout's program
    n = N
    t, j = pair("lm", LMS["llama_gqa"])
    s = _scanned_twin("lm", LMS["llama_gqa"], t)
    assert s.init_cache(2, 5)["self"]["k"].shape == (2, 2, 2, 5, 8)  # [L, B, G, S, K]
    ids, mask = jgen.pad_prompts(PROMPTS, 0)
    steps_j, tokens_j = _jax_lm_cached(j, ids, mask, n)
    steps_s, tokens_s = _jax_lm_cached(s, ids, mask, n)
    diff = float(np.abs(steps_j - steps_s).max())
    print(f"[scanned decode] lm llama_gqa: max |logit diff| scanned vs unrolled over {n} steps {diff:.3e}")
    assert diff <= 1e-5
    np.testing.assert_array_equal(tokens_j, tokens_s)
    beam = GenerationConfig(max_new_tokens=8, strategy="beam", num_beams=3)  # generate's whole program
    a, b = jgen.lm_generate(j, ids, mask, beam), jgen.lm_generate(s, ids, mask, beam)
    np.testing.assert_allclose(b[1], a[1], rtol=1e-6)
    np.testing.assert_array_equal(a[0], b[0])
    cfg = S2S["separate_untied_pre"]
    t, j = pair("seq2seq", cfg)
    s = _scanned_twin("seq2seq", cfg, t)
    memory, mmask = _encode(j, jnp.asarray(SOURCES))
    logits, tokens = {}, {}
    for name, model in (("unrolled", j), ("scanned", s)):
        graphdef, state = nnx.split(model)
        cache, tok, steps = model.init_cache(memory, n + 1), np.full((len(SOURCES), 1), cfg.bos_id, np.int32), []
        for i in range(n):
            out, cache = jgen.seq2seq_step(graphdef, state, jnp.asarray(tok), mmask, cache, i)
            steps.append(np.asarray(out[:, 0]))
            tok = steps[-1].argmax(-1)[:, None].astype(np.int32)
        logits[name], tokens[name] = np.stack(steps), np.stack([x.argmax(-1) for x in steps], 1)
    diff = float(np.abs(logits["unrolled"] - logits["scanned"]).max())
    print(f"[scanned decode] seq2seq separate_untied_pre: max |logit diff| scanned vs unrolled over {n} steps "
          f"{diff:.3e}")
    assert diff <= 1e-5
    np.testing.assert_array_equal(tokens["unrolled"], tokens["scanned"])  # greedy
    a, b = jgen.seq2seq_generate(j, SOURCES, gen=beam), jgen.seq2seq_generate(s, SOURCES, gen=beam)
    np.testing.assert_allclose(b[1], a[1], rtol=1e-6)
    np.testing.assert_array_equal(a[0], b[0])
