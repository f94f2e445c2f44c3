"""Expert parallelism (jaxformer/layers/kernels/moe_parallel.py): the MoE layer under a mesh with an
`expert` axis (8 host devices, tests/conftest.py) sends its tokens to their experts' devices
with all-to-alls and equals the one-device layer on outputs, aux outputs and every gradient,
capacity drops included."""
import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxformer.config.moe import MoEConfig
from jaxformer.layers import moe as jmoe
from jaxformer.layers.sow import capture
from jaxformer.train.sharding import make_mesh

D = 32
CASES = {
    "softmax_topk": dict(num_experts=4, top_k=2, router="softmax_topk"),
    "capacity": dict(num_experts=4, top_k=2, router="softmax_topk", capacity_factor=0.5),
    "deepseek_bias": dict(num_experts=8, top_k=3, router="sigmoid_grouped", n_group=2, topk_group=1,
                          score_bias=True, expert_bias=True, num_shared_experts=1),
}


def _layer(cfg: MoEConfig):
    m = jmoe.MoE(D, cfg, rngs=nnx.Rngs(0))
    m.eval()
    key = jax.random.key(3)
    m.router.weight[...] = jax.random.normal(key, m.router.weight.shape)  # varied routing
    if cfg.score_bias:
        m.router.score_bias[...] = 0.3 * jax.random.normal(jax.random.fold_in(key, 1), (cfg.num_experts,))
    if cfg.expert_bias:
        m.experts.down_proj_bias[...] = jax.random.normal(jax.random.fold_in(key, 2), m.experts.down_proj_bias.shape)
    return m


def _run(m, x, mesh=None):
    """(loss, out, aux, grads wrt params and x), jitted, on `mesh` when given."""
    graphdef, params, rest = nnx.split(m, nnx.Param, ...)

    def f(params, x):
        y, aux = capture(lambda m, h: m(h))(nnx.merge(graphdef, params, rest), x)  # its sown router logits, load
        return jnp.sum(y * jnp.cos(jnp.arange(D))), (y, aux)

    fn = jax.jit(jax.value_and_grad(f, argnums=(0, 1), has_aux=True))
    if mesh is None:
        return fn(params, x), None
    with jax.set_mesh(mesh):
        compiled = fn.lower(params, x).compile()
        return compiled(params, x), compiled.as_text()


@functools.cache
def _one_device(case):
    """The layer of CASES[case] on one device: ((loss, (out, aux)), grads), computed once per
    case and process (three tests compare against it)."""
    return _run(_layer(MoEConfig(d_expert=16, **CASES[case])), jax.random.normal(jax.random.key(1), (8, 6, D)))[0]


@pytest.mark.parametrize("case", sorted(CASES))
def test_expert_parallel_layer_equals_one_device(case):
    cfg = MoEConfig(d_expert=16, **CASES[case])
    m = _layer(cfg)
    x = jax.random.normal(jax.random.key(1), (8, 6, D))
    (_, (y1, r1)), g1 = _one_device(case)
    ((_, (y2, r2)), g2), hlo = _run(m, x, make_mesh(2, 1, 1, 4))  # data 2 x expert 4
    assert len(re.findall(r" all-to-all\(", hlo)) >= 4  # dispatch, return and their transposes
    np.testing.assert_array_equal(np.asarray(r1["router_logits"]), np.asarray(r2["router_logits"]))
    np.testing.assert_array_equal(np.asarray(r1["expert_load"]), np.asarray(r2["expert_load"]))
    worst = {"out": float(jnp.max(jnp.abs(y1 - y2)) / max(1.0, float(jnp.max(jnp.abs(y1)))))}
    for (path, a), (_, b) in zip(jax.tree_util.tree_flatten_with_path(g1)[0],
                                 jax.tree_util.tree_flatten_with_path(g2)[0], strict=True):
        worst[jax.tree_util.keystr(path)] = float(jnp.max(jnp.abs(a - b)) / max(1.0, float(jnp.max(jnp.abs(a)))))
    print(case, {k: f"{v:.1e}" for k, v in worst.items()})
    assert max(worst.values()) <= 1e-6
    if cfg.capacity_factor is not None:  # the capacity really drops, and in the global token order
        assert dataclasses.replace(cfg, capacity_factor=None) == MoEConfig(d_expert=16, **CASES["softmax_topk"])
        (_, (y_free, _)), _ = _one_device("softmax_topk")  # the same layer without a capacity
        assert float(jnp.max(jnp.abs(y_free - y1))) > 1e-3
        cap = jmoe.capacity(cfg, 48)
        assert float(r1["expert_load"].max()) > cap  # some expert is over capacity


def test_no_expert_axis_keeps_the_one_device_program():
    """A mesh whose `expert` axis is 1 runs the one-device form (no shard_map, no all-to-all)."""
    cfg = MoEConfig(d_expert=16, **CASES["softmax_topk"])
    m = _layer(cfg)
    x = jax.random.normal(jax.random.key(1), (8, 6, D))
    (_, (y1, _)), _ = _one_device("softmax_topk")
    ((_, (y2, _)), _), hlo = _run(m, x, make_mesh(8, 1, 1, 1))
    assert " all-to-all(" not in hlo
    np.testing.assert_allclose(np.asarray(y2), np.asarray(y1), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("case", ["softmax_topk", "capacity"])
def test_tokens_stay_local_on_an_accelerator_mesh_without_expert_axis(case):
    """Traced for a TPU (or GPU) under the trainer's mesh with no expert axis (data 4 x fsdp 2),
    each device routes and runs its own tokens with every expert (moe_parallel.expert_mesh): no
    exchange, and no gather of the tokens' activations, yet the one-device layer's outputs and
    gradients (run here on the CPU devices: the accelerator path's ragged_dot runs anywhere)."""
    from jaxformer import lowering
    cfg = MoEConfig(d_expert=16, **CASES[case])
    m = _layer(cfg)
    x = jax.random.normal(jax.random.key(1), (8, 6, D))
    (_, (y1, r1)), g1 = _one_device(case)
    with lowering.tracing(platform="tpu", batch_axes=("data", "fsdp")):
        ((_, (y2, r2)), g2), hlo = _run(m, x, make_mesh(4, 2, 1, 1))
    assert " all-to-all(" not in hlo and "ragged-all-to-all" not in hlo
    gathered = [ln for ln in hlo.splitlines() if " all-gather(" in ln and f",{D}]" in ln.split("=")[1].split(" ")[1]
                and ln.split("=")[1].split("[")[1].split(",")[0] == "48"]
    assert not gathered, gathered  # no [48 tokens, D] activations gathered
    np.testing.assert_array_equal(np.asarray(r1["expert_load"]), np.asarray(r2["expert_load"]))
    worst = float(jnp.max(jnp.abs(y1 - y2)) / max(1.0, float(jnp.max(jnp.abs(y1)))))
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2), strict=True):
        worst = max(worst, float(jnp.max(jnp.abs(a - b)) / max(1.0, float(jnp.max(jnp.abs(a))))))
    assert worst <= 1e-6, worst
