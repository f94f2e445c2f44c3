"""Training mixture-of-experts LMs: the aux losses in both trainers (trajectory parity), how they
compose over micro-batches, DeepSeek's score_bias rule, expert parallelism on 8 host devices
(tests/conftest.py) against one device, and the packaged `moe` config."""
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import step_losses

from jaxformer.train.config import config_from_dict, load_config
from jaxformer.train.jax_trainer import JaxTrainer, StepFns, build_jax_model, init_state, shape_batch
from jaxformer.train.optim import make_optax
from jaxformer.train.torch.trainer import TorchTrainer

sys.path.insert(0, os.path.dirname(__file__))
from test_train import FAMILIES, TRAIN, _pair

MOE = {"num_experts": 4, "top_k": 2, "router": "softmax_topk", "d_expert": 32, "dense_layers": [0],
       "aux_loss_coef": 0.1, "z_loss_coef": 0.01}
DEEPSEEK = {"num_experts": 8, "top_k": 2, "router": "sigmoid_grouped", "d_expert": 32, "n_group": 2,
            "topk_group": 1, "score_bias": True, "routed_scaling_factor": 2.5, "aux_loss_coef": 0.1}


def moe_cfg(moe=MOE, parallel=None, **train):
    model, data = FAMILIES["lm_llama_gqa"]
    d = {"model": {**model, "moe": dict(moe)}, "data": dict(data), "train": {**TRAIN, **train}}
    if parallel:
        d["parallel"] = parallel
    return config_from_dict(d)


def _score_biases(rest) -> np.ndarray:
    from jaxformer.train.sharding import _key_of
    leaves = jax.tree_util.tree_flatten_with_path(rest)[0]
    return np.stack([np.asarray(x) for p, x in leaves if _key_of(p).endswith("router.score_bias")])


def test_moe_trajectory_parity(tmp_path):
    """20 steps, 2 micro-batches each, aux and z-loss on: JAX and torch trainers agree."""
    cfg = moe_cfg()
    tmod, jmod = _pair(cfg)
    jh = JaxTrainer(cfg, str(tmp_path / "jax"), model=jmod, progress=False).run()
    th = TorchTrainer(cfg, str(tmp_path / "torch"), module=tmod, progress=False).run()
    assert len(jh) == len(th) == 20
    worst = {}
    for key in ("loss", "lr", "grad_norm", "moe_load_balance", "moe_z_loss"):
        worst[key] = max(abs(a[key] - b[key]) / max(1.0, abs(b[key])) for a, b in zip(jh, th, strict=True))
    print("moe trajectory, max |d|/max(1,|torch|):", {k: f"{v:.1e}" for k, v in worst.items()})
    assert max(worst.values()) <= 1e-4
    assert all(r["moe_load_balance"] >= 0.99 and r["moe_z_loss"] > 0 for r in jh)  # E * sum f P >= 1


def test_aux_terms_compose_per_micro_batch():
    """The step's objective is CE + coefs x aux, with load_balance the token-weighted mean of
    the micro-batches' values and z_loss that of the whole batch; eval is CE alone."""
    from jaxformer.layers.moe import moe_aux_losses
    cfg = moe_cfg(grad_accum_steps=2, batch_size=8, label_smoothing=0.0)
    model = build_jax_model(cfg)
    tx, schedule = make_optax(cfg.train, nnx.split(model, nnx.Param, ...)[1])
    fns = StepFns(cfg, model, tx, schedule)
    state = init_state(cfg, model, tx)
    tokens = np.asarray(jax.random.randint(jax.random.key(1), (8, 17), 3, 259), np.int32)
    _, out = jax.jit(fns.train_step)(state, shape_batch({"tokens": tokens}, 2))
    ev = jax.jit(fns.eval_step)(state["params"], state["rest"], {"tokens": tokens})
    model.eval()

    @nnx.jit
    def reference(model, toks):  # one program: CE, load balance, z-loss of a batch
        out = model(toks[:, :-1], return_aux=True)
        logits, aux = out.logits, out.aux
        losses = moe_aux_losses(aux["router_logits"], None, cfg.model.feedforward.moe)
        logp = jax.nn.log_softmax(logits, -1)
        ce = -jnp.mean(jnp.take_along_axis(logp, toks[:, 1:, None], -1))
        return ce, losses["load_balance"], losses["z_loss"]

    halves = [reference(model, jnp.asarray(h)) for h in (tokens[:4], tokens[4:])]
    ces, lbs = [float(h[0]) for h in halves], [float(h[1]) for h in halves]
    _, lb_all, z_all = map(float, reference(model, jnp.asarray(tokens)))
    m = cfg.model.feedforward.moe
    np.testing.assert_allclose(float(out["moe_load_balance"]), np.mean(lbs), rtol=1e-6)
    np.testing.assert_allclose(float(out["moe_z_loss"]), z_all, rtol=1e-6)
    assert abs(np.mean(lbs) - lb_all) > 1e-6  # the split matters for load_balance (not for z)
    ce = np.mean(ces)
    np.testing.assert_allclose(float(ev["loss"]) / float(ev["count"]), ce, rtol=1e-6)  # eval: CE alone
    np.testing.assert_allclose(float(out["loss"]), ce + m.aux_loss_coef * np.mean(lbs) + m.z_loss_coef * z_all,
                               rtol=1e-6)


def _bias_cfg(rate, **train):
    return moe_cfg({**DEEPSEEK, "bias_update_rate": rate}, **{"steps": 4, "eval_every": 4, "checkpoint_every": 4,
                                                              "weight_decay": 0.5, "decay_norms_and_biases": True,
                                                              "grad_clip": 0.01, **train})


@pytest.fixture(scope="module")
def bias_runs(tmp_path_factory):
    """{rate: (score_bias before, JAX trainer, torch trainer, their workdir root)} after 4 steps
    from the same converted weights: the bias-rule test reads them, the resume test resumes
    the rate > 0 run directories (one pair of runs, not two)."""
    out = {}
    for rate in (0.0, 1e-3):
        root = tmp_path_factory.mktemp(f"bias{rate}")
        cfg = _bias_cfg(rate)
        tmod, jmod = _pair(cfg)
        jt = JaxTrainer(cfg, str(root / "jax"), model=jmod, progress=False)
        start = _score_biases(jt.state["rest"])
        if rate:
            jt.run()
        else:  # read for its score_bias alone: the train steps, without run()'s eval, checkpoint
            step_losses(jt)  # and exports (the rate > 0 run does all three)
        tt = TorchTrainer(cfg, str(root / "torch"), module=tmod, progress=False)
        tt.run()
        out[rate] = (start, jt, tt, root)
    return out


@pytest.mark.parametrize("rate", [0.0, 1e-3])
def test_score_bias_moves_only_by_the_bias_rule(rate, bias_runs):
    """score_bias is outside the optimiser (weight decay on everything, clipping active): with
    rate 0 it stays bit-identical; with rate > 0 it moves by rate x sign per step, in both
    trainers alike."""
    start, jt, tt, _ = bias_runs[rate]
    got = _score_biases(jt.state["rest"])
    torch_got = np.stack([m.router.score_bias.numpy() for m in tt.module.modules()
                          if type(m).__name__ == "MoE"])
    assert got.shape == (2, 8) and not start.any()
    if rate == 0:
        assert np.array_equal(got, start) and not torch_got.any()
    else:
        steps = np.abs(got) / rate  # each step moves each entry by -rate, 0 or +rate
        assert np.abs(got).max() > 0 and np.allclose(steps, np.round(steps), atol=1e-3)
        np.testing.assert_array_equal(got, torch_got)


def _mesh_losses(cfg, tmp_path):
    tr = JaxTrainer(cfg, str(tmp_path), progress=False)
    return [r["loss"] for r in tr.run()], tr


@pytest.fixture(scope="module")
def moe_single_device(tmp_path_factory):
    """The one-device run's 4 train-step losses: the trainer's batches and jitted step, without
    run()'s eval, checkpoint and exports (the losses do not depend on them; the parallel runs
    below do all three)."""
    cfg = moe_cfg(steps=4, batch_size=16, grad_accum_steps=1, init="normal_0.02", eval_every=4,
                  checkpoint_every=4)
    return step_losses(JaxTrainer(cfg, str(tmp_path_factory.mktemp("single")), progress=False))


# One micro-batch per step: pmap's accumulation groups rows device-major ([D, A, B/(A D)]), so
# with grad_accum_steps > 1 its micro-batches hold other rows than one device's (tasks.py).
@pytest.mark.usefixtures("whole_replica_saves")  # its step-4 checkpoint is never restored
@pytest.mark.parametrize("parallel", [{"mode": "mesh", "mesh": {"expert": 4, "data": 2}}, {"mode": "pmap"}],
                         ids=["mesh_expert4_data2", "pmap8"])
def test_expert_parallel_matches_single_device(parallel, moe_single_device, tmp_path):
    assert jax.device_count() == 8
    cfg = moe_cfg(parallel=parallel, steps=4, batch_size=16, grad_accum_steps=1, init="normal_0.02",
                  eval_every=4, checkpoint_every=4)
    losses, tr = _mesh_losses(cfg, tmp_path)
    diff = max(abs(a - b) for a, b in zip(losses, moe_single_device, strict=False))
    print(f"{parallel['mode']}: max per-step loss diff vs one device {diff:.1e}")
    assert len(losses) == 4 and diff <= 1e-5
    if parallel["mode"] == "mesh":
        up = tr.state["params"]["decoder"]["layers"][1]["ffn"]["experts"]["up_proj"].get_value()  # [E, F, D]
        assert up.sharding.spec[0] == "expert" and up.addressable_shards[0].data.shape[0] == 1
        ops = _collectives(tr)
        print("compiled train step collectives:", {k: len(v) for k, v in ops.items()}, ops["all-gather"])
        # the MoE layer's dispatch and return (forward, and their transposes in the backward)
        assert len(ops["all-to-all"]) >= 4
        n = cfg.train.batch_size * cfg.data.seq_len  # the micro-batch's tokens
        moved = [shape for shape in ops["all-gather"] if {n, n * cfg.model.feedforward.moe.top_k} & set(shape)]
        assert not moved, f"routed activations all-gathered: {moved}"


def _collectives(tr) -> dict:
    """{op: [result shape, ...]} of the cross-device ops of the trainer's compiled train step."""
    import re
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tr.state)
    tokens = jax.ShapeDtypeStruct((1, tr.cfg.train.batch_size, tr.cfg.data.seq_len + 1), jnp.int32,
                                  sharding=tr.batch_sharding)
    with jax.set_mesh(tr.mesh):
        text = tr.train_step.lower(abstract, {"tokens": tokens}).compile().as_text()
    ops = {op: [] for op in ("all-to-all", "all-gather", "all-reduce", "reduce-scatter")}
    for m in re.finditer(r"= \(?\w+\[([\d,]*)\][^=]*? (all-to-all|all-gather|all-reduce|reduce-scatter)\(", text):
        ops[m.group(2)].append(tuple(int(d) for d in m.group(1).split(",") if d))
    return ops


def test_sharded_init_covers_moe_params():
    from jaxformer.train import init as init_lib
    from jaxformer.train import sharding
    cfg = moe_cfg({**DEEPSEEK, "num_shared_experts": 1}, init="xavier_uniform")
    am = init_lib.abstract_model(cfg.model_name, cfg.model)
    tx = make_optax(cfg.train, nnx.split(am, nnx.Param, ...)[1])[0]
    mesh = sharding.make_mesh(2, 1, 1, 4)
    sh = sharding.state_shardings(init_lib.abstract_state(cfg.model_name, cfg.model, cfg.train.seed, tx), mesh)
    state = init_lib.create_state(cfg.model_name, cfg.model, cfg.train.init, cfg.train.seed, tx, sh)
    single = init_lib.create_state(cfg.model_name, cfg.model, cfg.train.init, cfg.train.seed, tx)
    for (p, a), (_, b) in zip(jax.tree_util.tree_flatten_with_path(state["params"])[0],
                              jax.tree_util.tree_flatten_with_path(single["params"])[0], strict=False):
        assert np.array_equal(np.asarray(a), np.asarray(b)), jax.tree_util.keystr(p)
    ffn = state["params"]["decoder"]["layers"][0]["ffn"]
    for name in ("gate_proj", "up_proj", "down_proj"):
        assert ffn["experts"][name].get_value().sharding.spec[0] == "expert"
    assert ffn["router"]["weight"].get_value().sharding.spec[0] == "expert"
    assert not _score_biases(state["rest"]).any()  # the correction bias starts at 0


def test_packaged_moe_config_trains(tmp_path):
    cfg = load_config("moe", ["train.steps=2", "train.batch_size=4", "train.eval_every=2",
                              "train.eval_batches=1", "train.checkpoint_every=2", "train.async_checkpoint=false",
                              "model.num_layers=2", "data.seq_len=16"])
    m = cfg.model.feedforward.moe
    assert m.aux_loss_coef > 0 and m.z_loss_coef > 0
    hist = JaxTrainer(cfg, str(tmp_path), progress=False).run()
    assert {"moe_load_balance", "moe_z_loss", "eval_loss"} <= set(hist[-1])
    assert all(np.isfinite(r["loss"]) for r in hist)
    with open(tmp_path / "metrics.jsonl") as f:
        assert "moe_z_loss" in f.read()


def _torch_score_biases(module) -> np.ndarray:
    return np.stack([m.router.score_bias.numpy() for m in module.modules() if type(m).__name__ == "MoE"])


def test_init_from_loads_score_bias_in_both_trainers(tmp_path):
    """Fine-tuning from a model checkpoint starts from its DeepSeek score_bias (a saved buffer,
    outside the params), not from zeros: the JAX trainer (both its state paths) and the torch one."""
    from jaxformer.checkpoint_io import save_model
    from jaxformer.train.jax_trainer import build_jax_model
    from jaxformer.train.torch.trainer import build_torch_model
    cfg = moe_cfg(DEEPSEEK)
    src = build_jax_model(cfg)
    saved = []
    for _, m in nnx.iter_graph(src):
        if type(m).__name__ == "Router":
            m.score_bias[...] = jax.random.normal(jax.random.key(len(saved)), m.score_bias.shape)
            saved.append(np.asarray(m.score_bias[...]))
    save_model(src, cfg.model_name, cfg.model, str(tmp_path / "ckpt"))
    ft = moe_cfg(DEEPSEEK, init_from=str(tmp_path / "ckpt"), steps=2, eval_every=2, checkpoint_every=2)
    np.testing.assert_array_equal(_score_biases(nnx.split(build_jax_model(ft), nnx.Param, ...)[2]), saved)
    np.testing.assert_array_equal(_score_biases(JaxTrainer(ft, str(tmp_path / "j"), progress=False).state["rest"]),
                                  saved)
    np.testing.assert_array_equal(_torch_score_biases(build_torch_model(ft)), np.stack(saved))


def test_resume_restores_score_bias_in_both_trainers(bias_runs):
    """After steps that move score_bias (bias_update_rate > 0), resuming the run directory
    restores it exactly, in both trainers."""
    _, jt, tt, root = bias_runs[1e-3]
    more = _bias_cfg(1e-3, steps=6)  # resuming needs steps left to train
    moved = _score_biases(jt.state["rest"])
    assert np.abs(moved).max() > 0
    back = JaxTrainer(more, str(root / "jax"), resume=True, progress=False)
    assert back.start_step == 4
    np.testing.assert_array_equal(_score_biases(back.state["rest"]), moved)
    back.close()
    torch_moved = _torch_score_biases(tt.module)
    np.testing.assert_array_equal(torch_moved, moved)
    tback = TorchTrainer(more, str(root / "torch"), resume=True, progress=False)
    tback._restore()
    np.testing.assert_array_equal(_torch_score_biases(tback.module), torch_moved)
