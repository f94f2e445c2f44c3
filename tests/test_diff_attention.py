"""Differential attention (Diff Transformer, arXiv 2410.05258; layers/diff_attention.py): the
torch module against the paper's formula written out in numpy, an LM of sliding / full layers
decoded through its KV cache (ring and linear layouts) against full recomputation in both
trees, the blockwise path against the plain one, and the config's refusals. Parity of the two
trees: jaxformer/parity/cases_diff_attn.py."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from generation_helpers import pair

from jaxformer import lowering
from jaxformer.config import ConfigError
from jaxformer.config.models import LMConfig
from torch_ref.layers.diff_attention import DifferentialAttention

B, T, D, H = 2, 6, 32, 4
LM = LMConfig.tiny("llama", max_len=64, num_kv_heads=2, sliding_window=3, diff_attn=0.8,
                   layer_types=("sliding_attention", "full_attention"))


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_module_is_the_papers_formula():
    torch.manual_seed(0)
    m = DifferentialAttention(D, H, lambda_init=0.5).eval()
    with torch.no_grad():
        m.subln.weight.copy_(torch.rand(D // H) + 0.5)
    x = np.random.RandomState(0).standard_normal((B, T, D)).astype(np.float32)
    with torch.no_grad():
        ours = m(torch.from_numpy(x), mask=torch.ones(1, 1, T, T, dtype=torch.bool).tril()).numpy()
    p = {k: v.detach().double().numpy() for k, v in m.state_dict().items()}
    lin = lambda name, a: a @ p[f"{name}.weight"].T + p[f"{name}.bias"]
    k_dim, half = D // H, D // H // 2
    q, k, v = (lin(n, x.astype(np.float64)).reshape(B, T, H, k_dim) for n in ("q_proj", "k_proj", "v_proj"))
    causal = np.tril(np.ones((T, T), bool))
    def attn_map(qh, kh):  # [B, H, T, T]
        s = np.einsum("bthk,bshk->bhts", qh, kh) * half ** -0.5
        return _softmax(np.where(causal, s, -np.inf))
    lam = (np.exp(p["lambda_q1"] @ p["lambda_k1"]) - np.exp(p["lambda_q2"] @ p["lambda_k2"]) + 0.5)
    w = attn_map(q[..., :half], k[..., :half]) - lam * attn_map(q[..., half:], k[..., half:])
    o = np.einsum("bhts,bshk->bthk", w, v)  # [B, T, H, K]
    o = o / np.sqrt(np.mean(o ** 2, -1, keepdims=True) + 1e-5) * p["subln.weight"] * (1 - 0.5)
    want = lin("o_proj", o.reshape(B, T, D))
    np.testing.assert_allclose(ours, want, atol=2e-5, rtol=1e-5)


def test_cached_decoding_equals_recompute_in_both_trees():
    """Prefill 5 tokens, then 4 one-token steps, through ring (window 3) and linear caches (the
    JAX side jitted: one prefill and one step program, cache_index traced)."""
    t, j = pair("lm", LM)
    ids = np.random.RandomState(1).randint(1, LM.vocab_size, size=(B, 9)).astype(np.int32)
    full_j = np.asarray(nnx.jit(lambda m, x: m(x))(j, jnp.asarray(ids)))
    cached = nnx.jit(lambda m, x, cache, index: m(x, cache=cache, cache_index=index))
    with torch.no_grad():
        full_t = t(torch.as_tensor(ids).long()).numpy()
    cache_j, cache_t = j.init_cache(B, 9), t.init_cache(B, 9)
    assert [c["self"].ring for c in cache_j] == [c["self"].ring for c in cache_t] == [True, False]
    steps_j, steps_t, start = [], [], 0
    for n in (5, 1, 1, 1, 1):
        out_j = cached(j, jnp.asarray(ids[:, start:start + n]), cache_j, jnp.int32(start))
        with torch.no_grad():
            out_t = t(torch.as_tensor(ids[:, start:start + n]).long(), cache=cache_t, cache_index=start)
        cache_j, cache_t = out_j.cache, out_t.cache
        steps_j.append(np.asarray(out_j.logits))
        steps_t.append(out_t.logits.numpy())
        start += n
    np.testing.assert_allclose(np.concatenate(steps_j, 1), full_j, atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(np.concatenate(steps_t, 1), full_t, atol=2e-5, rtol=1e-5)


def test_blockwise_path_computes_both_maps():
    _, j = pair("lm", LM)
    ids = jnp.asarray(np.random.RandomState(2).randint(1, LM.vocab_size, size=(B, 16)).astype(np.int32))
    plain = np.asarray(nnx.jit(lambda m, x: m(x))(j, ids))
    with lowering.tracing(attention="blockwise", attention_blocks=(8, 8)):  # read at the trace
        blockwise = np.asarray(nnx.jit(lambda m, x: m(x))(j, ids))
    np.testing.assert_allclose(blockwise, plain, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("bad, field", [(dict(diff_attn=1.0), "diff_attn"), (dict(attn_sinks=True), "attn_sinks"),
                                        (dict(head_dim=7), "head_dim"), (dict(qk_norm=True), "qk_norm")])
def test_config_refuses(bad, field):
    with pytest.raises(ConfigError, match=field):
        LMConfig.tiny("llama", **{"diff_attn": 0.8, **bad})
