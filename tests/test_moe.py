"""Mixture of experts (layers/moe.py, both trees): ties, capacity dropping, the ragged dispatch
against a dense einsum, scan against loop, the auxiliary losses against transformers', the
score_bias buffer through the converter and checkpoints, and the refusals."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from jaxformer import convert
from jaxformer.config import ConfigError
from jaxformer.config.models import LMConfig
from jaxformer.config.moe import MoEConfig
from jaxformer.layers import moe as jmoe
from jaxformer.models import build_model as jbuild
from jaxformer.parity.cases import twin
from torch_ref.layers import moe as tmoe
from torch_ref.models import build_model as tbuild

D = 32


def _cfg(**kw) -> MoEConfig:
    return MoEConfig(**{"num_experts": 4, "top_k": 2, "router": "softmax_topk", "d_expert": 16, **kw})


def _pair(cfg: MoEConfig, seed: int = 0):
    """A torch MoE and its flax twin holding the same weights."""
    torch.manual_seed(seed)
    t = tmoe.MoE(D, cfg).eval()
    j = twin(lambda: jmoe.MoE(D, cfg, rngs=nnx.Rngs(seed)), seed)  # abstract until the load fills it
    convert.load_torch_state_dict(j, t.state_dict())
    j.eval()
    return t, j


# ---------------------------------------------------------------- ties (docs/numerics.md §26)
@pytest.mark.parametrize("row", [[1.0, 3.0, 3.0, 0.0, 3.0, 1.0], [1.0] * 16, [-0.0, 0.0, -0.0, 0.0],
                                 [0.5, 0.5, 2.0, 0.5, 2.0, 0.5, 0.5]])
def test_topk_breaks_ties_towards_the_lower_index_in_both_trees(row):
    k = 3 if len(row) > 3 else 2
    jv, ji = jmoe.topk(jnp.asarray([row], jnp.float32), k)
    tv, ti = tmoe.topk(torch.tensor([row]), k)
    expected = sorted(range(len(row)), key=lambda i: (-row[i], i))[:k]  # stable: lower index first
    assert np.asarray(ji)[0].tolist() == expected == ti[0].tolist()
    np.testing.assert_array_equal(np.asarray(jv), tv.numpy())


def test_torch_topk_alone_would_not_break_ties_towards_the_lower_index():
    """Why tmoe.topk sorts: torch.topk's order among equal values is not the index order."""
    assert torch.topk(torch.ones(1, 16), 4).indices[0].tolist() != [0, 1, 2, 3]


@pytest.mark.parametrize("router", ["softmax_topk", "topk_softmax", "sigmoid_grouped"])
def test_equal_router_rows_choose_the_same_experts_in_both_trees(router):
    extra = dict(n_group=4, topk_group=2, score_bias=True) if router == "sigmoid_grouped" else {}
    cfg = _cfg(router=router, num_experts=8, top_k=3, **extra)
    torch.manual_seed(0)
    t = tmoe.Router(D, cfg)
    with torch.no_grad():  # experts 2, 5, 6 (and groups 1 and 3 when grouped) always tie
        t.weight[5] = t.weight[2]
        t.weight[6] = t.weight[2]
        t.weight[7] = t.weight[3]
    j = jmoe.Router(D, cfg, rngs=nnx.Rngs(0))
    convert.load_torch_state_dict(j, t.state_dict())
    x = np.random.RandomState(0).standard_normal((64, D)).astype(np.float32) * 5
    _, _, ti = t(torch.tensor(x))
    _, _, ji = j(jnp.asarray(x))
    np.testing.assert_array_equal(np.asarray(ji), ti.numpy())
    if router != "sigmoid_grouped":  # of tied experts, a higher one is chosen only with the lower ones
        for row in ti.numpy().tolist():
            assert (6 not in row or {2, 5} <= set(row)) and (5 not in row or 2 in row) and (7 not in row or 3 in row)


# ---------------------------------------------------------------- capacity dropping
def test_capacity_drops_the_assignments_beyond_capacity_in_token_order():
    """Every token routes to experts 0 and 1 (zero router weight, bias 5 and 4). Capacity
    ceil(1.0 * 6 * 2 / 4) = 3: tokens 0-2 are kept by both experts, tokens 3-5 dropped by both."""
    cfg = _cfg(router="topk_softmax", router_bias=True, capacity_factor=1.0)
    t, j = _pair(cfg)
    with torch.no_grad():
        t.router.weight.zero_()
        t.router.bias.copy_(torch.tensor([5.0, 4.0, 0.0, 0.0]))
    convert.load_torch_state_dict(j, t.state_dict())
    t_free, j_free = _pair(dataclasses.replace(cfg, capacity_factor=None))
    t_free.load_state_dict(t.state_dict())
    convert.load_torch_state_dict(j_free, t.state_dict())
    x = np.random.RandomState(1).standard_normal((1, 6, D)).astype(np.float32)
    for out, free in ((t(torch.tensor(x)).detach().numpy(), t_free(torch.tensor(x)).detach().numpy()),
                      (np.asarray(j(jnp.asarray(x))), np.asarray(j_free(jnp.asarray(x))))):
        assert np.all(out[0, 3:] == 0) and np.all(np.abs(free[0, 3:]) > 0)
        np.testing.assert_allclose(out[0, :3], free[0, :3], rtol=1e-6, atol=1e-7)


def test_capacity_keeps_the_first_tokens_of_each_expert():
    cfg = _cfg(capacity_factor=0.5)
    assert jmoe.capacity(cfg, 12) == tmoe.capacity(cfg, 12) == 3
    assert jmoe.capacity(_cfg(), 12) is None


# ---------------------------------------------------------------- ragged dispatch = dense einsum
@pytest.mark.parametrize("cfg", [_cfg(num_experts=6, top_k=3),
                                 _cfg(router="topk_softmax", router_bias=True, expert_bias=True,
                                      expert_ffn="swiglu_clamped", swiglu_limit=0.05),
                                 _cfg(expert_ffn="gelu", expert_bias=True)], ids=["swiglu", "clamped_bias", "gelu"])
@pytest.mark.parametrize("blocked", [False, True], ids=["ragged_dot", "blocked"])
def test_ragged_dispatch_equals_dense_einsum_outputs_and_gradients(cfg, blocked, monkeypatch):
    monkeypatch.setattr(jmoe, "blocked_dispatch", lambda: blocked)  # both dispatches on any backend
    experts = jmoe.Experts(D, cfg, rngs=nnx.Rngs(0))
    if cfg.expert_bias:
        for name in ("gate_proj_bias", "up_proj_bias", "down_proj_bias"):
            v = getattr(experts, name)
            if v is not None:
                v.set_value(jax.random.normal(jax.random.key(1), v.shape) * 0.1)
    router = jmoe.Router(D, cfg, rngs=nnx.Rngs(1))
    x = jax.random.normal(jax.random.key(2), (20, D))
    _, w, idx = router(x)
    graphdef, params = nnx.split(experts)

    def loss(params, x, w, dense):
        e = nnx.merge(graphdef, params)
        y = jmoe.dense_experts(e, x, idx, w) if dense else e(x, idx, w)
        return jnp.sum(y * jnp.cos(jnp.arange(y.size, dtype=jnp.float32).reshape(y.shape))), y

    (l_r, y_r), g_r = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True), static_argnums=3)(
        params, x, w, False)
    (l_d, y_d), g_d = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(params, x, w, True)
    np.testing.assert_allclose(np.asarray(y_r), np.asarray(y_d), rtol=1e-5, atol=1e-6)
    for a, b in zip(jax.tree.leaves(g_r), jax.tree.leaves(g_d), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("blocked", [False, True], ids=["ragged_dot", "blocked"])
def test_experts_multiply_in_the_compute_dtype_and_sum_in_the_stream_dtype(blocked, monkeypatch):
    """Experts.dtype = bf16 (set_compute_dtype, docs/numerics.md §41): the routed rows and the
    expert matmuls are bf16, the output (the k-way sum) is the float32 input's dtype."""
    monkeypatch.setattr(jmoe, "blocked_dispatch", lambda: blocked)
    cfg = _cfg()
    experts = jmoe.Experts(D, cfg, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(2), (20, D))
    _, w, idx = jmoe.Router(D, cfg, rngs=nnx.Rngs(1))(x)
    experts.dtype = jnp.bfloat16
    jaxpr = jax.make_jaxpr(lambda x: experts(x, idx, w))(x)
    dots = [e for e in jaxpr.jaxpr.eqns if e.primitive.name in ("ragged_dot_general", "dot_general")]
    assert len(dots) == 3 and all(v.aval.dtype == jnp.bfloat16 for e in dots for v in e.invars[:2])
    y = experts(x, idx, w)
    experts.dtype = None
    y32 = experts(x, idx, w)
    rel = float(jnp.abs(y - y32).max() / jnp.abs(y32).max())  # bf16 rounding, seen relative to the output
    assert y.dtype == jnp.float32 and 1e-4 < rel < 3e-2, rel


# ---------------------------------------------------------------- scan = loop, return_aux
def _lm(**kw) -> LMConfig:
    return LMConfig.tiny("llama", moe=_cfg(**kw.pop("moe", {})), **kw)


def test_scanned_moe_stack_equals_the_loop_with_aux():
    cfg = _lm(moe=dict(router="sigmoid_grouped", num_experts=8, n_group=2, topk_group=1, score_bias=True))
    # both built abstractly (twin: torch's weights and score_bias fill every leaf below, the RNG
    # streams get keys): a concrete build of the scanned stack cost seconds of initialiser compiles
    loop = twin(lambda: jbuild("lm", cfg, seed=0), 0)
    tm = tbuild("lm", cfg, seed=0)
    with torch.no_grad():
        for layer in tm.decoder.layers:
            layer.ffn.router.score_bias.copy_(torch.linspace(-0.1, 0.1, 8))
    sd = tm.state_dict()
    convert.load_torch_state_dict(loop, sd)
    scan = twin(lambda: jbuild("lm", dataclasses.replace(cfg, scan_layers=True), seed=1), 1)
    convert.load_torch_state_dict(scan, sd)
    ids = jnp.asarray(np.random.RandomState(0).randint(1, 64, (2, 7)))
    run = nnx.jit(lambda m, i: m(i, return_aux=True))
    a, b = run(loop, ids), run(scan, ids)
    a_logits, a_aux, b_logits, b_aux = a.logits, a.aux, b.logits, b.aux
    np.testing.assert_allclose(np.asarray(a_logits), np.asarray(b_logits), rtol=1e-5, atol=1e-5)
    assert a_aux["router_logits"].shape == (2, 2, 7, 8) and a_aux["expert_load"].shape == (2, 8)
    np.testing.assert_allclose(np.asarray(a_aux["router_logits"]), np.asarray(b_aux["router_logits"]), atol=1e-5)
    np.testing.assert_array_equal(np.asarray(a_aux["expert_load"]), np.asarray(b_aux["expert_load"]))
    assert float(a_aux["expert_load"].sum()) == 2 * 2 * 7 * 2  # layers x tokens x top_k
    t_aux = tm(torch.tensor(np.asarray(ids)), return_aux=True).aux
    np.testing.assert_array_equal(t_aux["expert_load"].numpy(), np.asarray(a_aux["expert_load"]))


def test_mixed_dense_and_sparse_layers_refuse_scan():
    with pytest.raises(ConfigError, match="scan_layers.*dense_layers"):
        jbuild("lm", _lm(scan_layers=True, moe=dict(dense_layers=(0,))), seed=0)


def test_refusals():
    dense = jbuild("lm", LMConfig.tiny("llama"), seed=0)
    with pytest.raises(ValueError, match="return_aux.*model.moe"):
        dense(jnp.ones((1, 4), jnp.int32), return_aux=True)
    with pytest.raises(ValueError, match="return_aux.*not supported"):
        tbuild("lm", _lm(), seed=0)(torch.ones(1, 1, dtype=torch.long), cache=tbuild("lm", _lm(), seed=0)
                                     .init_cache(1, 4), cache_index=0, return_aux=True)
    for make in (lambda c: jmoe.MoE(D, c, rngs=nnx.Rngs(0)), lambda c: tmoe.MoE(D, c)):
        with pytest.raises(ConfigError, match="swiglu_clamped"):
            make(_cfg(expert_ffn="swiglu_clamped", num_shared_experts=1))


# ---------------------------------------------------------------- aux losses = transformers'
@pytest.mark.parametrize("masked", [False, True])
def test_load_balance_equals_transformers_and_z_loss(masked):
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func
    rng = np.random.RandomState(0)
    L, B, T, E = 3, 2, 5, 6
    logits = rng.standard_normal((L, B, T, E)).astype(np.float32) * 2
    mask = np.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], np.int64) if masked else None
    cfg = _cfg(num_experts=E, top_k=2)
    hf = load_balancing_loss_func(tuple(torch.tensor(lg.reshape(B * T, E)) for lg in logits), E, 2,
                                  None if mask is None else torch.tensor(mask))
    j = jmoe.moe_aux_losses(jnp.asarray(logits), None if mask is None else jnp.asarray(mask), cfg)
    t = tmoe.moe_aux_losses(torch.tensor(logits), None if mask is None else torch.tensor(mask), cfg)
    np.testing.assert_allclose(float(j["load_balance"]), float(hf), rtol=1e-6)
    np.testing.assert_allclose(float(t["load_balance"]), float(hf), rtol=1e-6)
    m = np.ones((B, T)) if mask is None else mask
    lse = np.log(np.exp(logits.astype(np.float64)).sum(-1))
    z = (lse ** 2 * m).sum() / (L * m.sum())
    np.testing.assert_allclose(float(j["z_loss"]), z, rtol=1e-6)
    np.testing.assert_allclose(float(t["z_loss"]), z, rtol=1e-6)


# ---------------------------------------------------------------- score_bias: saved, never trained
def test_score_bias_is_a_saved_buffer_that_no_gradient_or_optimiser_sees(tmp_path):
    from jaxformer import checkpoint_io
    cfg = _lm(moe=dict(router="sigmoid_grouped", num_experts=8, n_group=2, topk_group=1, score_bias=True))
    tm = tbuild("lm", cfg, seed=0)
    with torch.no_grad():
        tm.decoder.layers[1].ffn.router.score_bias.copy_(torch.linspace(-1, 1, 8))
    sd = tm.state_dict()
    assert "decoder.layers.1.ffn.router.score_bias" in sd
    assert "decoder.layers.1.ffn.router.score_bias" not in dict(tm.named_parameters())
    jm = twin(lambda: jbuild("lm", cfg, seed=0), 0)  # abstract until the load fills it
    convert.load_torch_state_dict(jm, sd)
    back = convert.to_torch_state_dict(jm)
    assert set(back) == set(sd)
    for k in sd:  # torch -> flax -> torch bit-exact
        assert torch.equal(back[k], sd[k]), k
    params = nnx.state(jm, nnx.Param)  # what the optimiser and the gradient take
    assert not any("score_bias" in str(p) for p, _ in nnx.to_flat_state(params))
    checkpoint_io.save_model(jm, "lm", cfg, str(tmp_path / "m"))
    _, _, loaded = checkpoint_io.load_model(str(tmp_path / "m"))
    np.testing.assert_array_equal(np.asarray(loaded.decoder.layers[1].ffn.router.score_bias[...]),
                                  sd["decoder.layers.1.ffn.router.score_bias"].numpy())
