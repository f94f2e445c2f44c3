"""Sliding-window attention (jaxformer's own LMs, both trees) and the HF families that use it:
Mistral (jaxformer/hf/mistral.py) and Gemma2 (jaxformer/hf/gemma2.py) against transformers 5.x.

Window semantics (docs/numerics.md §21): a query sees itself and the window - 1 keys before it,
as transformers' sliding_window_overlay. Every check uses prompts longer than the window.
  * KV cache: a sliding-window layer's cache is a ring of `window` slots; cached logits equal a
    full recompute in both trees (a mixed local/global stack, a scanned stack too), the ring
    holds `window` slots whatever the cache length, greedy and beam ids agree across trees.
  * HF: unimplemented options refused by name. The tiny random HF models are rows of
    tests/hf_rows.py, and tests/test_hf_table.py checks their forward logits within
    1e-5 x max(1, max|logit|) fp32 with a left-padded row, greedy and beam ids equal to HF
    generate's past the window, the export loading back in transformers with HF's logits.
Worst measured |logit| differences (fp32, printed by check_hf_logits, docs/numerics.md §21):
Mistral 8.3e-7 (max |logit| 2.6), Gemma2 3.6e-6 (max |logit| 4.8; float32 rounding on both
sides, measured against float64).
"""
from __future__ import annotations

import dataclasses
import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from helpers import converted_pair
from hf_helpers import built
from hf_rows import row

from jaxformer import convert, hf
from jaxformer import generation as jgen
from jaxformer.config import ConfigError
from jaxformer.config.models import GenerationConfig, LMConfig
from jaxformer.models import build_model
from jaxformer.parity import setup_precision
from torch_ref import generation as tgen

T = pytest.importorskip("transformers")


@pytest.fixture(autouse=True)
def _precision():
    setup_precision()


REFUSED = {  # config.json changes -> the option the error names
    "mistral_layer_types": ("mistral/w3", dict(layer_types=["sliding_attention", "full_attention"]), "layer_types"),
    "mistral_bad_window": ("mistral/w3", dict(sliding_window=0), "sliding_window"),
    "mistral_act": ("mistral/w3", dict(hidden_act="gelu"), "hidden_act"),
    "mistral_unknown": ("mistral/w3", dict(attention_bias=True), "attention_bias"),
    "gemma2_bidirectional": ("gemma2/default_layers_caps", dict(use_bidirectional_attention=True),
                             "use_bidirectional_attention"),
    "gemma2_act": ("gemma2/default_layers_caps", dict(hidden_activation="relu"), "hidden_activation"),
    "gemma2_chunked": ("gemma2/default_layers_caps", dict(layer_types=["chunked_attention"] * 3), "layer_types"),
    "gemma2_no_window": ("gemma2/default_layers_caps", dict(sliding_window=None), "sliding_window"),
    "gemma2_legacy_act": ("gemma2/default_layers_caps", dict(hidden_act="gelu"), "hidden_act"),
    "gemma2_bad_cap": ("gemma2/default_layers_caps", dict(attn_logit_softcapping=-1.0), "attn_logit_softcapping"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unimplemented_options_are_refused_by_name(case, tmp_path_factory):
    tag, changes, word = REFUSED[case]
    with open(os.path.join(built(row(tag), tmp_path_factory)[1], "config.json")) as f:
        raw = {**json.load(f), **changes}
    fam, arch = hf.family_for_architecture(raw)
    with pytest.raises(ConfigError, match=word):
        fam.config_from_hf(raw, arch)


# ----------------------------------------------------------------------------- our own LMs
PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12, 13], [3, 4], [12, 13, 14, 15, 16, 17]]  # longest > window
WINDOW = 4
OWN = {  # every layer local (Mistral-like) and alternating local/global (Gemma2-like), both scanned
    "all_local": LMConfig.tiny("llama", max_len=40, sliding_window=WINDOW),
    "mixed": LMConfig.tiny("llama", max_len=40, num_layers=3, sliding_window=WINDOW,
                           layer_types=("sliding_attention", "full_attention", "sliding_attention")),
}


def _jax_cached(model, ids, mask, n):
    """Greedy through lm_step: prefill (longer than the window), then one token per step."""
    graphdef, state = nnx.split(model)
    b, p = ids.shape
    slot_mask = np.zeros((b, p + n), np.int32)
    slot_mask[:, :p] = mask
    cache = model.init_cache(b, p + n)
    logits, cache = jgen.lm_step(graphdef, state, jnp.asarray(ids), jnp.asarray(slot_mask), cache, 0)
    steps = [np.asarray(logits[:, -1])]
    for i in range(n - 1):
        slot_mask[:, p + i] = 1
        tok = steps[-1].argmax(-1).astype(np.int32)[:, None]
        logits, cache = jgen.lm_step(graphdef, state, jnp.asarray(tok), jnp.asarray(slot_mask), cache, p + i)
        steps.append(np.asarray(logits[:, 0]))
    return np.stack(steps), cache


@torch.no_grad()
def _torch_cached(model, ids, mask, n):
    b, p = ids.shape
    slot_mask = torch.zeros((b, p + n), dtype=torch.long)
    slot_mask[:, :p] = torch.as_tensor(mask)
    out = model(torch.as_tensor(ids).long(), slot_mask, cache=model.init_cache(b, p + n), cache_index=0)
    logits, cache = out.logits, out.cache
    steps = [logits[:, -1].numpy()]
    for i in range(n - 1):
        slot_mask[:, p + i] = 1
        tok = torch.as_tensor(steps[-1].argmax(-1))[:, None]
        out = model(tok, slot_mask, cache=cache, cache_index=p + i)
        logits, cache = out.logits, out.cache
        steps.append(logits[:, 0].numpy())
    return np.stack(steps), cache


def _recompute(forward, ids, mask, steps):
    """Logits after the prompt and the greedy tokens, without a cache (one padded length)."""
    b, p = ids.shape
    n = steps.shape[0]
    tokens = steps.argmax(-1).T  # [B, n]
    seq = np.zeros((b, p + n), np.int32)
    seq[:, :p], seq[:, p:] = ids, tokens
    m = np.ones_like(seq)
    m[:, :p] = mask
    full = forward(seq, m)  # [B, p + n, V]
    return np.stack([full[:, p + k - 1] for k in range(n)])


@pytest.mark.parametrize("kind", sorted(OWN))
def test_ring_cache_equals_full_recompute_in_both_trees(kind):
    cfg = OWN[kind]
    t, j = converted_pair("lm", cfg)
    ids, mask = jgen.pad_prompts(PROMPTS, 0)
    n = 9  # 9 + 9 tokens: every ring wraps
    fwd = nnx.jit(lambda m, s, k: m(s, k))
    steps, cache = _jax_cached(j, ids, mask, n)
    ref_j = _recompute(lambda s, m: np.asarray(fwd(j, jnp.asarray(s), jnp.asarray(m))), ids, mask, steps)
    assert np.abs(steps - ref_j).max() <= 1e-5
    local = cfg.local_layers()
    slots = [c["self"]["k"].shape[2] for c in cache]
    assert slots == [WINDOW if is_local else ids.shape[1] + n for is_local in local]  # ring: window slots
    steps_t, cache_t = _torch_cached(t, ids, mask, n)
    ref_t = _recompute(lambda s, m: t(torch.as_tensor(s).long(), torch.as_tensor(m)).detach().numpy(),
                       ids, mask, steps_t)
    assert np.abs(steps_t - ref_t).max() <= 1e-5
    assert [c["self"]["k"].shape[2] for c in cache_t] == slots
    assert np.abs(steps_t - steps).max() <= 1e-5

    # the scanned stack decodes the same logits (all local: a stacked ring; mixed: L slots each)
    js = build_model("lm", dataclasses.replace(cfg, scan_layers=True))
    convert.load_torch_state_dict(js, t.state_dict())
    js.eval()
    steps_s, cache_s = _jax_cached(js, ids, mask, n)
    assert np.abs(steps_s - steps).max() <= 1e-5
    seq = np.concatenate([ids, steps.argmax(-1).T], axis=1).astype(np.int32)  # the scan's forward too
    seq_mask = np.concatenate([mask, np.ones((len(ids), n), np.int32)], axis=1)
    full = np.asarray(fwd(j, jnp.asarray(seq), jnp.asarray(seq_mask)))
    assert np.abs(np.asarray(fwd(js, jnp.asarray(seq), jnp.asarray(seq_mask))) - full).max() <= 1e-5
    print(f"[ring cache] {kind}: cached vs recompute jax {np.abs(steps - ref_j).max():.1e}, "
          f"torch {np.abs(steps_t - ref_t).max():.1e}, scanned vs unrolled {np.abs(steps_s - steps).max():.1e}")
    assert cache_s["self"]["k"].shape[3] == (WINDOW if all(local) else ids.shape[1] + n)


def test_beam_matches_across_trees():
    """Beam search reorders the rings with the rest of the cache (torch tree too); left padding."""
    t, j = converted_pair("lm", OWN["mixed"])
    ids, mask = jgen.pad_prompts(PROMPTS, 0)
    beam = GenerationConfig(max_new_tokens=8, strategy="beam", num_beams=3)
    (ja, js), (ta, ts) = jgen.lm_generate(j, ids, mask, beam), tgen.lm_generate(t, ids, mask, beam)
    np.testing.assert_array_equal(ja, ta)
    assert np.abs(js - ts).max() <= 1e-5


def test_layer_types_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="layer_types"):
        LMConfig.tiny("llama", sliding_window=2, layer_types=("sliding_attention",))  # 1 entry, 2 layers
    with pytest.raises(ConfigError, match="layer_types"):
        LMConfig.tiny("llama", layer_types=("sliding_attention", "full_attention"))  # no window
    with pytest.raises(ConfigError, match="attn_logit_softcap"):
        LMConfig.tiny("llama", attn_logit_softcap=0.0)
    with pytest.raises(ConfigError, match="final_logit_softcap"):
        LMConfig.tiny("llama", final_logit_softcap=-1.0)
    assert LMConfig.tiny("llama", sliding_window=2, layer_types=["full_attention", "sliding_attention"]
                         ).local_layers() == (False, True)


def test_window_semantics_match_transformers_mask():
    """Our mask equals transformers' sliding_window_causal_mask_function for every (q, kv)."""
    from transformers.masking_utils import sliding_window_causal_mask_function

    from jaxformer.layers.attention import make_sliding_window_mask
    fn = sliding_window_causal_mask_function(3)
    ours = np.asarray(make_sliding_window_mask(7, 7, 3))[0, 0]
    theirs = np.array([[bool(fn(0, 0, torch.tensor(q), torch.tensor(k))) for k in range(7)] for q in range(7)])
    np.testing.assert_array_equal(ours, theirs)
    assert ours[6].sum() == 3 and ours[6, 4:].all()  # the query and the 2 keys before it


def test_embedding_normalizer_takes_the_stream_dtype():
    """HF Gemma multiplies by embed_scale.to(dtype) of the stream it computes in: a bf16 model
    by bf16(sqrt(D)) (59.75 for D = 3584, not 59.87), torch_ref's bf16 module too; jaxformer
    computes in float32 under a bf16 table (models.cast_params), so by float32(sqrt(D)), as HF
    does running the same bf16 weights in float32 (docs/numerics.md §21)."""
    from flax import nnx as _nnx

    from jaxformer.layers.embedding import Embedding as JEmbedding
    from torch_ref.layers.embedding import Embedding as TEmbedding
    d = 3584
    table = np.random.RandomState(0).standard_normal((2, d)).astype(np.float32)
    j = JEmbedding(2, d, scale=True, rngs=_nnx.Rngs(0))
    j.embedding.set_value(jnp.asarray(table, jnp.bfloat16))
    t = TEmbedding(2, d, scale=True).to(torch.bfloat16)
    with torch.no_grad():
        t.weight.copy_(torch.from_numpy(table))
    want = torch.from_numpy(table).to(torch.bfloat16)[[1]] * torch.tensor(59.75, dtype=torch.bfloat16)
    assert float(torch.tensor(d ** 0.5, dtype=torch.bfloat16)) == 59.75
    assert torch.equal(t(torch.tensor([[1]]))[0], want)
    got_j = np.asarray(j(jnp.asarray([[1]]))[0])
    assert got_j.dtype == np.float32
    rows = torch.from_numpy(table).to(torch.bfloat16)[[1]].float().numpy()
    np.testing.assert_array_equal(got_j, rows * np.float32(d ** 0.5))
