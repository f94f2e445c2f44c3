"""Pipeline parallelism (parallel.mesh.pipeline; layers/kernels/pipeline.py, GPipe; issue 50 §4):
a tiny scanned LLaMA trained 10 steps on the CPU's 8 devices with 2 pipeline stages composed
with data, fsdp and tensor (and with remat: each stage rematerialised per tick) gives the one-device run's losses and final weights within 1e-5;
the compile report gives the bubble fraction; what the pipeline does not take is refused."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from helpers import step_losses

sys.path.insert(0, os.path.dirname(__file__))
from test_train import run_cfg

from jaxformer.config import ConfigError
from jaxformer.layers.kernels import pipeline
from jaxformer.train import aot
from jaxformer.train.config import config_from_dict, load_config
from jaxformer.train.jax_trainer import JaxTrainer, params_numpy

STEPS = 10


def _params(tr) -> dict:
    return {k: np.asarray(v) for k, v in params_numpy(tr.state).items()}


def _cfg(parallel: dict | None = None, train: dict | None = None, **model):
    d = run_cfg("lm_llama_gqa", steps=STEPS, batch_size=16, grad_accum_steps=1, eval_every=10**6,
                checkpoint_every=10**6, **(train or {})).to_dict()
    d["model"] = {**d["model"], "num_layers": 4, "scan_layers": True, **model}
    return config_from_dict({**d, **({"parallel": parallel} if parallel else {})})


@pytest.fixture(scope="module")
def one_device(tmp_path_factory):
    tr = JaxTrainer(_cfg(), str(tmp_path_factory.mktemp("one")), progress=False)
    losses = step_losses(tr)
    return losses, _params(tr)


@pytest.mark.parametrize(("mesh", "train"), [({"pipeline": 2, "data": 2, "tensor": 2}, {}),
                                             ({"pipeline": 2, "data": 1, "fsdp": 4}, {"remat": True})],
                         ids=["pp2-dp2-tp2", "pp2-fsdp4-remat"])
def test_pipeline_trains_as_one_device(one_device, mesh, train, tmp_path, monkeypatch):
    ref_losses, ref_params = one_device
    traced = []
    real = pipeline.run
    monkeypatch.setattr(pipeline, "run", lambda *a: traced.append(a[0]) or real(*a))
    tr = JaxTrainer(_cfg({"mode": "mesh", "mesh": mesh, "pipeline_microbatches": 4}, train), str(tmp_path),
                    progress=False)
    q = tr.state["params"]["decoder"]["layers"]["self_attn"]["q_proj"]["kernel"].get_value()
    assert q.sharding.spec[0] == "pipeline"  # the stacked layer axis is split into the stages
    losses = step_losses(tr)
    params = _params(tr)
    loss_diff = max(abs(a - b) for a, b in zip(losses, ref_losses, strict=True))
    param_diff = max(float(np.abs(params[k] - ref_params[k]).max()) for k in ref_params)
    print(f"pipeline {mesh} {train}: {STEPS}-step losses within {loss_diff:.1e}, final weights within {param_diff:.1e}")
    assert traced  # the stack ran through the pipeline's schedule
    assert loss_diff <= 1e-5 and param_diff <= 1e-5
    assert losses[-1] < losses[0]


def test_compile_reports_the_bubble():
    """A tiny llama compiled for v5e:2x2 with 2 stages and 4 microbatches: bubble 1/5."""
    sets = ["model.d_model=64", "model.num_heads=4", "model.num_kv_heads=2", "model.d_ff=128", "model.num_layers=4",
            "data.seq_len=128", "model.max_len=128", "train.batch_size=16", "train.precision=bf16",
            "model.scan_layers=true", "parallel.mode=mesh", "parallel.mesh.pipeline=2", "parallel.mesh.data=2",
            "parallel.pipeline_microbatches=4"]
    r = aot.compile_report(load_config("llama", sets), "v5e:2x2")
    assert r["mesh"]["pipeline"] == 2 and r["pipeline_bubble"] == pytest.approx(1 / 5)
    assert r["pipeline_microbatches"] == 4
    assert r["collectives"]["collective-permute"]["count"] > 0  # the stages hand on their activations
    # the causal mask stays a static pattern inside the stages (only batch-shaped inputs travel
    # by microbatch), so the TPU kernel still takes it
    assert [c["kernel"] for c in r["attention_choices"]] == ["splash"], r["attention_choices"]
    assert pipeline.bubble(4, 12) == pytest.approx(3 / 15)


@pytest.mark.parametrize(("change", "match"), [
    ({"scan_layers": False}, "set model.scan_layers: true"),
    ({"num_layers": 3}, "num_layers=3 does not split into parallel.mesh.pipeline=2 stages"),
    ({"dropout": 0.1}, "dropout is not supported in pipeline stages"),
])
def test_refused_by_name(change, match):
    with pytest.raises(ConfigError, match=match):
        _cfg({"mode": "mesh", "mesh": {"pipeline": 2, "data": 4}}, **change)
