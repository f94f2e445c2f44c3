"""Multi-slice (parallel.slices, `jaxformer compile --slices N`; issue 50 §5): the hybrid mesh
puts each slice's devices in its own block of the axis split across slices (data or fsdp), a
two-slice TPU compile reports the bytes its program moves between slices (DCN) apart from the
collectives inside a slice (ICI), and a CPU run over two simulated slices trains as one mesh."""
from __future__ import annotations

import json
import math
import os
import sys

import numpy as np
import pytest
from helpers import step_losses

sys.path.insert(0, os.path.dirname(__file__))
from test_train import run_cfg

from jaxformer.cli import main
from jaxformer.config import ConfigError
from jaxformer.train import aot, sharding
from jaxformer.train.config import config_from_dict
from jaxformer.train.jax_trainer import JaxTrainer

TINY = ["model.d_model=64", "model.num_heads=4", "model.num_kv_heads=2", "model.d_ff=128", "model.num_layers=2",
        "data.seq_len=128", "model.max_len=128", "train.batch_size=8", "train.precision=bf16",
        "model.scan_layers=true", "parallel.mode=mesh", "parallel.mesh.fsdp=2"]


@pytest.mark.parametrize("dcn_axis", ["data", "fsdp"])
def test_hybrid_mesh_blocks_follow_the_slices(dcn_axis):
    """Two v5e:2x2 slices (8 devices, each with its slice_index), mesh data 2 x fsdp 4: the axis
    named by dcn_axis has slice 0's devices in its first half and slice 1's in its second; every
    other axis stays inside one slice."""
    devices = aot.tpu_devices("v5e:2x2", slices=2)
    assert sorted({d.slice_index for d in devices}) == [0, 1]
    mesh = sharding.make_mesh(2, 4, devices=devices, slices=2, dcn_axis=dcn_axis)
    slice_of = np.vectorize(lambda d: d.slice_index)(mesh.devices)
    axis = sharding.MESH_AXES.index(dcn_axis)
    half = mesh.devices.shape[axis] // 2
    assert (np.take(slice_of, range(half), axis=axis) == 0).all()
    assert (np.take(slice_of, range(half, 2 * half), axis=axis) == 1).all()
    with pytest.raises(ValueError, match=r"the data axis \(3\) must divide by slices \(2\)"):
        sharding.make_mesh(3, 2, devices=devices[:3] + devices[4:7], slices=2)
    with pytest.raises(ValueError, match="devices are on 2 slice"):
        sharding.make_mesh(2, 4, devices=devices, slices=4, dcn_axis="fsdp")


def test_two_slice_compile_reports_dcn_bytes(capsys):
    """`jaxformer compile --slices 2` of a tiny llama on two v5e:2x2 slices, data split across
    them: 8 chips, the gradient's all-reduce between slices as DCN transfers, costed at v5e's
    DCN rate in the roofline; the collectives inside a slice counted apart."""
    assert main(["compile", "--config", "llama", "--topology", "v5e:2x2", "--slices", "2", "--json",
                 "--set=parallel.mesh.data=4", *(f"--set={s}" for s in TINY)]) == 0
    out = capsys.readouterr().out
    r = json.loads(out.strip().splitlines()[-1])
    assert (r["chips"], r["slices"], r["dcn_axis"], r["mesh"]["data"], r["mesh"]["fsdp"]) == (8, 2, "data", 4, 2)
    assert r["dcn_transfers"]["all-reduce"]["count"] > 0 and r["dcn_bytes"] > 0
    assert r["dcn_bytes"] == sum(v["bytes"] for v in r["dcn_transfers"].values())
    assert math.isclose(r["roofline"]["dcn_s"], r["dcn_bytes"] / aot.CHIPS["v5e"].dcn_bytes_per_s)
    assert r["collectives"]["all-gather"]["count"] > 0  # fsdp's gathers, inside a slice
    assert "between the 2 slices (DCN, data axis): all-reduce" in out


def test_slices_refused_where_they_cannot_apply():
    with pytest.raises(ValueError, match="--slices / parallel.slices is for TPU slices"):
        aot.devices_for("h100:8", slices=2)
    cfg = run_cfg("lm_gpt2", steps=1)
    with pytest.raises(ConfigError, match="parallel.slices: 2 slices need parallel.mode: mesh"):
        JaxTrainer(config_from_dict({**cfg.to_dict(), "parallel": {"mode": "none", "slices": 2}}), "unused",
                   progress=False)
    with pytest.raises(ConfigError, match="dcn_axis"):
        config_from_dict({**cfg.to_dict(), "parallel": {"mode": "mesh", "slices": 2, "dcn_axis": "tensor"}})


def test_two_simulated_slices_train_as_one_mesh(tmp_path):
    """On the CPU's 8 devices, two simulated slices (contiguous halves, data split across them)
    run the same program as the one-slice mesh: the same losses, bit for bit."""
    d = run_cfg("lm_gpt2", steps=3, batch_size=16, eval_every=10**6, checkpoint_every=10**6).to_dict()
    losses = {}
    for slices in (1, 2):
        cfg = config_from_dict({**d, "parallel": {"mode": "mesh", "mesh": {"data": 4, "fsdp": 2}, "slices": slices}})
        tr = JaxTrainer(cfg, str(tmp_path / str(slices)), progress=False)
        assert dict(tr.mesh.shape)["data"] == 4
        losses[slices] = step_losses(tr)
    assert losses[1] == losses[2], losses
