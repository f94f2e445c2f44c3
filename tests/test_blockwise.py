"""Blockwise attention (jaxformer/layers/kernels/blockwise.py, docs/numerics.md §29): the skipped blocks,
the O(T) residuals, the torch twin against torch's plain path, and tiny LMs (both trees) whose logits and
parameter gradients with attention="blockwise" equal the plain path's. The kernel's own parity
against torch (outputs and gradients, every mask kind) is in jaxformer/parity/cases_blockwise.py.
"""
import dataclasses

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from jaxformer import lowering, tables
from jaxformer.config.models import LMConfig
from jaxformer.layers.attention import AttentionMask
from jaxformer.layers.kernels import blockwise
from jaxformer.models import build_model
from jaxformer.parity.results import GRAD_TOL, OUT_TOL

B, H, K = 1, 2, 4


def _qkv(t, g=H):
    r = np.random.RandomState(0)
    return tuple(jnp.asarray(r.standard_normal((B, t, n, K)), jnp.float32) for n in (H, g, g))


# ----------------------------------------------------------------------------- block skipping
@pytest.mark.parametrize("name, mask, expected", [
    # 8 x 8 blocks of 8: causal visits the 36 blocks on and below the diagonal
    ("causal", AttentionMask.self_attention(1, 64, causal=True), 36),
    # a window of 8: the diagonal block and the one before it (15 = 8 + 7)
    ("sliding", AttentionMask.self_attention(1, 64, causal=True).with_window(8), 15),
    # the first 24 keys padded (left padding): key blocks 0-2 never visited, 36 - 8 - 7 - 6
    ("left_padded", AttentionMask.self_attention(1, 64, causal=True,
                                                 key_valid=jnp.arange(64)[None] >= 24), 15),
    # two packed documents of 32 tokens: two causal triangles of 10 blocks
    ("segments", AttentionMask.self_attention(1, 64, causal=True,
                                              segment_ids=1 + (jnp.arange(64)[None] >= 32).astype(jnp.int32)), 20),
])
def test_fully_masked_blocks_are_skipped(name, mask, expected):
    q, k, v = _qkv(64)
    seen = blockwise.block_visits(q, k, v, mask, block_q=8, block_k=8)
    assert seen == {"forward": expected, "backward": expected, "blocks": 64}, name


def test_residuals_are_o_of_t():
    """What the custom_vjp keeps for the backward pass: the inputs, the output and the lse, no
    [T, S] array (the jaxpr of the forward-with-residuals, every intermediate of the loops
    included, is smaller than one [H, T, S] score matrix)."""
    t = 256
    q, k, v = _qkv(t)
    mask = AttentionMask.self_attention(1, t, causal=True)
    st, args = blockwise._prepare(q, k, v, mask, bias=None, scale=None, softcap=None, sinks=None,
                                  block_q=32, block_k=32)
    jaxpr = jax.make_jaxpr(lambda *a: blockwise._attend_fwd(st, *a))(*args)
    sizes = []

    def walk(jp):
        for eqn in jp.eqns:
            sizes.extend(int(np.prod(o.aval.shape)) for o in eqn.outvars if hasattr(o.aval, "shape"))
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                walk(sub)
    walk(jaxpr.jaxpr)
    assert max(sizes) < H * t * t // 4, max(sizes)  # the largest is a [bq, bk] block or an O(T) array
    residuals = jaxpr.out_avals[1:]
    assert max(int(np.prod(a.shape)) for a in residuals) <= B * t * H * K


# ----------------------------------------------------------------------------- the torch twin
def _torch_variants(t):
    from torch_ref.layers.attention import AttentionMask as TMask
    from torch_ref.layers.attention import ScoreMods
    valid = torch.arange(t)[None] >= 5
    seg = 1 + (torch.arange(t)[None] >= 11).long()
    causal = TMask.self_attention(1, t, causal=True)
    slopes = torch.tensor(tables.alibi_slopes(H))
    return {"causal_sdpa": (causal, {}),
            "padded_window_sinks": (TMask.self_attention(1, t, causal=True, key_valid=valid).with_window(4),
                                    {"scores": ScoreMods(sinks=torch.tensor([1.0, -0.5]))}),
            "segments_softcap": (TMask.self_attention(1, t, causal=True, segment_ids=seg), {"scores": ScoreMods(softcap=2.0)}),
            "alibi_bidirectional": (dataclasses.replace(TMask.self_attention(1, t, causal=False), alibi_slopes=slopes),
                                    {})}


@pytest.mark.parametrize("variant", ["causal_sdpa", "padded_window_sinks", "segments_softcap", "alibi_bidirectional"])
def test_torch_twin_matches_torch_plain(variant):
    from torch_ref import lowering as tlowering
    from torch_ref.layers.attention import dot_product_attention
    t = 21
    mask, kw = _torch_variants(t)[variant]
    r = np.random.RandomState(1)
    q, k, v = (torch.tensor(r.standard_normal((2, t, n, K)), dtype=torch.float32, requires_grad=True)
               for n in (H, 1, 1))
    w = torch.tensor(r.standard_normal((2, t, H, K)), dtype=torch.float32)
    results = []
    for attention in ("plain", "blockwise"):
        with tlowering.computing(attention=attention, attention_blocks=(8, 8)):
            out = dot_product_attention(q, k, v, mask=mask, **kw)
        grads = torch.autograd.grad((out * w).sum(), (q, k, v))
        results.append((out.detach(), grads))
    (o1, g1), (o2, g2) = results
    assert (o1 - o2).abs().max() < 1e-6
    assert max(float((a - b).abs().max()) for a, b in zip(g1, g2, strict=True)) < 3e-6


# ----------------------------------------------------------------------------- tiny LMs
LMS = {
    # RoPE, GQA, a sliding-window layer, packed documents (the registry's lm_blockwise_* case
    # has sliding and full layers with left padding)
    "rope_gqa_sliding_segments": LMConfig.tiny(position="rope", norm="rmsnorm", norm_position="pre", ffn="swiglu",
                                               num_kv_heads=2, num_layers=1, sliding_window=5, bias=False,
                                               layer_types=("sliding_attention",)),
    "alibi_padded": LMConfig.tiny(position="alibi", num_layers=1),
    "t5_bias": LMConfig.tiny(position="t5", rel_num_buckets=8, rel_max_distance=16, num_layers=1),
}


@pytest.mark.parametrize("name", sorted(LMS))
def test_lm_blockwise_equals_plain(name):
    """Logits and every parameter gradient of a tiny LM, attention="blockwise" (blocks 8 x 8 over
    T = 19) against "plain"; the measured maxima go to docs/numerics.md §29."""
    t = 19
    model = build_model("lm", LMS[name], seed=0)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    r = np.random.RandomState(2)
    ids = jnp.asarray(r.randint(1, 64, (2, t)), jnp.int32)
    mask = jnp.asarray(np.arange(t)[None] < np.array([[t], [12]]), jnp.int32)
    kw = {"attention_mask": mask}
    if "segments" in name:
        kw = {"segment_ids": jnp.asarray(np.where(np.arange(t) < 8, 1, 2)[None].repeat(2, 0), jnp.int32)}

    def loss(params):
        logits = nnx.merge(graphdef, params, rest)(ids, **kw)
        return jnp.sum(logits * jnp.cos(jnp.arange(logits.size, dtype=jnp.float32).reshape(logits.shape))), logits

    runs = {}
    for attention in ("plain", "blockwise"):
        with lowering.tracing(attention=attention, attention_blocks=(8, 8)):
            runs[attention] = jax.jit(jax.grad(loss, has_aux=True))(params)
    (g_plain, l_plain), (g_block, l_block) = runs["plain"], runs["blockwise"]
    # each leaf within the harness tolerance, atol + rtol * max |plain leaf| (docs/numerics.md §19)
    d_logits = float(jnp.max(jnp.abs(l_plain - l_block)))
    ratios = {}
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g_plain), jax.tree.leaves(g_block), strict=True):
        tol = GRAD_TOL.atol + GRAD_TOL.rtol * float(jnp.max(jnp.abs(a)))
        ratios[jax.tree_util.keystr(path)] = float(jnp.max(jnp.abs(a - b))) / tol
    worst = max(ratios, key=ratios.get)
    print(f"{name}: max |d logits| {d_logits:.2e}, worst gradient {worst} at {ratios[worst]:.3f}x tol")
    assert d_logits <= OUT_TOL.atol + OUT_TOL.rtol * float(jnp.max(jnp.abs(l_plain)))
    assert ratios[worst] <= 1.0


def test_splash_off_tpu_runs_blockwise():
    """attention="splash" names Pallas' TPU kernel; on any other backend it is the blockwise path
    (the same function, the same blocks visited)."""
    q, k, v = _qkv(24, g=1)
    mask = AttentionMask.self_attention(1, 24, causal=True).with_window(6)
    from jaxformer.layers.attention import dot_product_attention
    outs = []
    for attention in ("splash", "blockwise"):
        with lowering.tracing(attention=attention, attention_blocks=(8, 8)):
            outs.append(jax.jit(lambda q, k, v: dot_product_attention(q, k, v, mask=mask))(q, k, v))
    assert jax.default_backend() != "tpu"
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.parametrize("name", ["rope_gqa_sliding_segments", "alibi_padded"])
def test_torch_lm_blockwise_equals_plain(name):
    """The torch twin of test_lm_blockwise_equals_plain: torch_ref's LM under
    computing(attention="blockwise") against its plain path, logits and parameter gradients."""
    from torch_ref import lowering as tlowering
    from torch_ref.models import build_model as tbuild
    t = 19
    model = tbuild("lm", LMS[name], seed=0)
    r = np.random.RandomState(2)
    ids = torch.tensor(r.randint(1, 64, (2, t)))
    kw = {"attention_mask": torch.tensor(np.arange(t)[None] < np.array([[t], [12]])).long()}
    if "segments" in name:
        kw = {"segment_ids": torch.tensor(np.where(np.arange(t) < 8, 1, 2)[None].repeat(2, 0))}
    runs = {}
    for attention in ("plain", "blockwise"):
        model.zero_grad()
        with tlowering.computing(attention=attention, attention_blocks=(8, 8)):
            logits = model(ids, **kw)
        (logits * torch.cos(torch.arange(logits.numel(), dtype=torch.float32).reshape(logits.shape))).sum().backward()
        runs[attention] = (logits.detach(), {n: torch.zeros_like(p) if p.grad is None else p.grad.clone()
                                             for n, p in model.named_parameters()})  # None: a cut key bias
    (l1, g1), (l2, g2) = runs["plain"], runs["blockwise"]
    assert (l1 - l2).abs().max() <= OUT_TOL.atol + OUT_TOL.rtol * l1.abs().max()
    for n in g1:
        assert (g1[n] - g2[n]).abs().max() <= GRAD_TOL.atol + GRAD_TOL.rtol * g1[n].abs().max(), n
