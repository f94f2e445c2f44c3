"""gpt-oss's attention sinks (docs/numerics.md §28) beyond the parity registry
(jaxformer/parity/cases_sinks.py): both trees against transformers' own eager_attention_forward
(an independent reference, PITFALLS #15), a row with no visible key outputs exactly 0, the
fused-backend switch falls back to the explicit path, and KV-cache decoding (full caches and
the ring caches of sliding layers) equals a full recompute."""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from generation_helpers import PROMPTS, N, jitted, pair
from test_generation_cache import FORMS, _jax_lm_cached, _recompute, _torch_lm_cached

from jaxformer import convert, lowering
from jaxformer import generation as jgen
from jaxformer.layers import attention as jatt
from jaxformer.parity.cases_sinks import GPT_OSS_ATTN
from torch_ref.layers import attention as tatt

B, T, H, G, K = 2, 6, 4, 2, 8


def _inputs(seed=0):
    r = np.random.RandomState(seed)
    q, k, v = (r.standard_normal((B, T, n, K)).astype(np.float32) for n in (H, G, G))
    sinks = (2.0 * r.standard_normal(H)).astype(np.float32)
    mask = np.tril(np.ones((T, T), bool))[None, None].repeat(B, 0)
    mask[1, :, :, :2] = False  # left padding: row 1's queries 0 and 1 see no key
    return q, k, v, sinks, mask


def test_sinks_match_transformers_eager_attention():
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward
    q, k, v, sinks, mask = _inputs()
    module = torch.nn.Module()
    module.sinks, module.num_key_value_groups = torch.nn.Parameter(torch.from_numpy(sinks)), H // G
    additive = torch.zeros(mask.shape).masked_fill(~torch.from_numpy(mask), torch.finfo(torch.float32).min)
    ref, _ = eager_attention_forward(module.eval(), *(torch.from_numpy(a).transpose(1, 2) for a in (q, k, v)),
                                     additive, scaling=K ** -0.5)
    ref = ref.detach().numpy()  # [B, T, H, K]
    ours_t = tatt.dot_product_attention(*(torch.from_numpy(a) for a in (q, k, v)), mask=torch.from_numpy(mask),
                                        scores=tatt.ScoreMods(sinks=torch.from_numpy(sinks))).numpy()
    ours_j = np.asarray(jatt.dot_product_attention(*(jnp.asarray(a) for a in (q, k, v)), mask=jnp.asarray(mask),
                                                   scores=jatt.ScoreMods(sinks=jnp.asarray(sinks))))
    for name, ours in (("torch", ours_t), ("jax", ours_j)):
        d = float(np.abs(ours - ref).max())
        print(f"[sinks vs HF eager] {name}: max |diff| {d:.2e}")
        assert d <= 1e-6, name
    # HF gives the sink every weight of a row with no visible key; both trees output exactly 0
    assert np.all(ours_t[1, :2] == 0) and np.all(ours_j[1, :2] == 0)
    assert np.abs(ref[1, :2]).max() == 0.0


def test_sinks_take_weight_and_refuse_a_wrong_shape():
    q, k, v, sinks, mask = _inputs()
    args = [jnp.asarray(a) for a in (q, k, v)]
    with_sinks = jatt.dot_product_attention(*args, mask=jnp.asarray(mask), scores=jatt.ScoreMods(sinks=jnp.asarray(sinks)))
    plain = jatt.dot_product_attention(*args, mask=jnp.asarray(mask))
    assert float(jnp.abs(with_sinks - plain)[:, 2:].max()) > 1e-2  # the sink changes every output
    _, w = jatt.dot_product_attention(*args, mask=jnp.asarray(mask), scores=jatt.ScoreMods(sinks=jnp.asarray(sinks)),
                                     return_weights=True)
    assert float(w.sum(-1).max()) < 1.0  # the sink keeps its share of each row
    with pytest.raises(ValueError, match="one logit per query head"):
        jatt.dot_product_attention(*args, scores=jatt.ScoreMods(sinks=jnp.zeros(G)))
    with pytest.raises(ValueError, match="one logit per query head"):
        tatt.dot_product_attention(*(torch.from_numpy(a) for a in (q, k, v)), scores=tatt.ScoreMods(sinks=torch.zeros(G)))


@pytest.mark.parametrize("implementation", ["cudnn", "tokamax"])
def test_sinks_fall_back_from_fused_backends(implementation):
    """No fused kernel takes a sink: any backend named runs the explicit XLA path (on a CPU
    cuDNN and tokamax would raise, so equal figures prove the fallback)."""
    q, k, v, sinks, mask = _inputs()
    args = [jnp.asarray(a) for a in (q, k, v)]
    scores = jatt.ScoreMods(sinks=jnp.asarray(sinks))
    ref = jatt.dot_product_attention(*args, mask=jnp.asarray(mask), scores=scores)
    with lowering.tracing(fused_attention=implementation):
        out = jatt.dot_product_attention(*args, mask=jnp.asarray(mask), scores=scores)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(ref))


@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_sinks_cached_decoding_equals_full_recompute(framework):
    """Sliding layers decode from ring caches of sliding_window slots, full layers from full
    caches; the sinks ride along in each step's softmax."""
    cfg = dataclasses.replace(GPT_OSS_ATTN, max_len=64)
    t, j = pair("lm", cfg)
    with torch.no_grad():  # sinks of std 1.5 (the init draws 0.02), so they matter
        for name, p in t.named_parameters():
            if name.endswith("sinks"):
                p.normal_(0.0, 1.5)
    convert.load_torch_state_dict(j, t.state_dict())
    assert [c["self"]["k"].shape[2] for c in j.init_cache(1, 40)] == [3, 40, 3]  # ring, full, ring
    ids, mask = jgen.pad_prompts(PROMPTS, 0)
    for elementwise in FORMS[framework]:
        if framework == "jax":
            steps, tokens = _jax_lm_cached(j, ids, mask, N, elementwise)
            forward = jitted(j)
        else:
            steps, tokens = _torch_lm_cached(t, ids, mask, N)
            forward = lambda s, m: t(torch.as_tensor(s).long(), torch.as_tensor(m)).detach().numpy()
        diffs = [np.abs(steps[k] - _recompute(forward, ids, mask, tokens, k)).max() for k in range(N)]
        print(f"[sinks cache vs recompute] {framework} {elementwise}: max |diff| {max(diffs):.3e}")
        assert max(diffs) <= 1e-5
