"""Chunked prefill (GenerationConfig.prefill_chunk, generation.lm_prefill; docs/numerics.md §31).
JAX: greedy and beam ids identical to the one-pass prefill (RoPE + GQA, chunks that do not
divide the prompt), the cache and the last logits within float rounding of it (ring caches of
sliding-window layers with chunks shorter and longer than the window, a mixed stack); torch:
its chunked prefill gives the same ids (greedy, sampling, rings). The compiled prefill's
scratch memory drops from O(P^2) to O(chunk x P); bad values are refused."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from generation_helpers import pair

from jaxformer import generation as jgen
from jaxformer.config import ConfigError
from jaxformer.config.models import GenerationConfig, LMConfig, Seq2SeqConfig
from jaxformer.config.moe import MoEConfig
from jaxformer.models import build_model as jbuild
from jaxformer.models.lm import LM
from torch_ref import generation as tgen
from torch_ref.models import build_model as tbuild

# 21 and 13 tokens (left-padded): no chunk below divides 21, so the odd first call runs too
PROMPTS = [list(np.random.default_rng(0).integers(1, 64, 21)), list(np.random.default_rng(1).integers(1, 64, 13))]
LLAMA = LMConfig.tiny("llama", max_len=64)  # RoPE, GQA (4 query heads, 2 key/value heads)
SLIDING = LMConfig.tiny("llama", max_len=64, sliding_window=8)  # every layer a ring of 8 slots
MIXED = LMConfig.tiny("llama", max_len=64, sliding_window=8, layer_types=("sliding_attention", "full_attention"))


def _gen(**kw) -> GenerationConfig:
    return GenerationConfig(max_new_tokens=12, stop_at_eos=False, **kw)


def test_ids_identical_greedy_rope_gqa():
    t, j = pair("lm", LLAMA)
    ids, mask = jgen.pad_prompts(PROMPTS, 0)
    one = jgen.lm_generate(j, ids, mask, _gen())
    np.testing.assert_array_equal(jgen.lm_generate(j, ids, mask, _gen(prefill_chunk=4)), one)
    # the torch twin's chunked prefill gives the same ids; its sampling path too (its RNG
    # stream is its own, so against its own one pass)
    np.testing.assert_array_equal(tgen.lm_generate(t, ids, mask, _gen(prefill_chunk=4)), one)
    sample = dict(strategy="sample", temperature=2.0, seed=3)
    np.testing.assert_array_equal(tgen.lm_generate(t, ids, mask, _gen(**sample, prefill_chunk=4)),
                                  tgen.lm_generate(t, ids, mask, _gen(**sample)))


def test_ids_identical_beam():
    # greedy and sampling share decode_loop, which sees only the prefill's last logits and
    # cache; beam search is the other loop (and prefills B x W rows). The reference is the
    # torch twin's one-pass beam search, which gives jaxformer's one-pass ids
    # (tests/test_generation_strategies.py); one JAX compile fewer
    t, j = pair("lm", LLAMA)
    ids, mask = jgen.pad_prompts(PROMPTS, 0)
    beam = dict(strategy="beam", num_beams=3, max_new_tokens=8)
    one_ids, one_scores = tgen.lm_generate(t, ids, mask, GenerationConfig(**beam))
    for g, model in ((jgen, j), (tgen, t)):
        ids_c, scores_c = g.lm_generate(model, ids, mask, GenerationConfig(**beam, prefill_chunk=6))
        np.testing.assert_array_equal(ids_c, one_ids)
        np.testing.assert_allclose(scores_c, one_scores, rtol=0, atol=1e-5)


def _prefill(model, chunk, batch, cache_len):
    graphdef, state = nnx.split(model)

    def run(state, ids, slot_mask):
        m = nnx.merge(graphdef, state)
        return jgen.lm_prefill(m, ids, slot_mask, m.init_cache(batch, cache_len), chunk)
    return jax.jit(run), state


def _prefill_inputs():
    ids, mask = jgen.pad_prompts(PROMPTS, 0)
    cache_len = ids.shape[1] + 8
    slot_mask = np.zeros((2, cache_len), np.int32)
    slot_mask[:, :ids.shape[1]] = mask
    return ids, slot_mask, cache_len


def _max_diffs(model, chunks):
    """-> per chunk: max(|last logits - one pass|, |cache - one pass|) of a chunked prefill."""
    ids, slot_mask, cache_len = _prefill_inputs()
    run, state = _prefill(model, None, 2, cache_len)
    want_last, want_cache = run(state, ids, slot_mask)
    out = []
    for chunk in chunks:
        run, state = _prefill(model, chunk, 2, cache_len)
        last, cache = run(state, ids, slot_mask)
        assert last.shape == want_last.shape == (2, model.cfg.vocab_size)
        diffs = [jnp.max(jnp.abs(a - b)) for a, b in zip(jax.tree.leaves((last, cache)),
                                                          jax.tree.leaves((want_last, want_cache)), strict=True)]
        out.append(float(max(diffs)))
    return out


# Measured (fp32, XLA:CPU): last logits and caches within 9.5e-7 of the one pass (entries up to
# ~4): the same sums rounded in another order (docs/numerics.md §31). A key in the wrong slot
# or a ring mis-masked fails it (an off-by-one slot fails every test here).
def test_sliding_window_rings():
    t, j = pair("lm", SLIDING)
    assert max(_max_diffs(j, (5, 12))) < 1e-5  # chunks shorter and longer than the window of 8
    ids, mask = jgen.pad_prompts(PROMPTS, 0)
    one = tgen.lm_generate(t, ids, mask, _gen())
    for chunk in (5, 12):
        np.testing.assert_array_equal(tgen.lm_generate(t, ids, mask, _gen(prefill_chunk=chunk)), one)


def test_cache_and_last_logits_close_mixed_layers():
    assert max(_max_diffs(LM(MIXED, rngs=nnx.Rngs(0)), (5,))) < 1e-5  # a ring layer, then a full one


def test_prefill_memory_is_chunk_times_length():
    """Compiled scratch bytes of the prefill (no run, no timing) at prompts of 512 and 1024:
    the one pass holds [P, L] scores and [P, V] logits, so doubling P about quadruples it;
    chunks of 64 hold [64, L], so it about doubles. Measured (XLA:CPU, 2 layers): one pass
    8.9 MB -> 34.5 MB, chunked 1.1 MB -> 2.2 MB."""
    def temp(p, chunk):
        cfg = LMConfig.tiny("llama", max_len=1040)
        run, state = _prefill(LM(cfg, rngs=nnx.Rngs(0)), chunk, 1, p + 16)
        lowered = run.lower(state, jax.ShapeDtypeStruct((1, p), jnp.int32), jax.ShapeDtypeStruct((1, p + 16), jnp.int32))
        return lowered.compile().memory_analysis().temp_size_in_bytes

    one = {p: temp(p, None) for p in (512, 1024)}
    chunked = {p: temp(p, 64) for p in (512, 1024)}
    assert one[1024] / one[512] > 3.5  # quadratic
    assert chunked[1024] / chunked[512] < 2.5  # linear
    assert chunked[1024] * 10 < one[1024]


def test_bad_prefill_chunk():
    for bad in (0, -4, 2.5, True, "8"):
        with pytest.raises(ConfigError, match="prefill_chunk"):
            GenerationConfig(prefill_chunk=bad)
    ids, mask = jgen.pad_prompts(PROMPTS, 0)
    moe = LMConfig.tiny("llama", max_len=64, moe=MoEConfig(num_experts=4, top_k=2, router="softmax_topk", d_expert=16,
                                                                    capacity_factor=1.0))
    with pytest.raises(ValueError, match="capacity_factor"):
        jgen.lm_generate(nnx.eval_shape(lambda: LM(moe, rngs=nnx.Rngs(0))), ids, mask, _gen(prefill_chunk=4))
    s2s = Seq2SeqConfig.tiny(max_len=64)
    for g, model in ((jgen, nnx.eval_shape(lambda: jbuild("seq2seq", s2s))), (tgen, tbuild("seq2seq", s2s))):
        with pytest.raises(ValueError, match="prefill_chunk applies to LM prompts"):
            g.seq2seq_generate(model, np.array([[5, 6, 7]]), gen=_gen(prefill_chunk=2))
