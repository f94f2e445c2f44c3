"""Scale-out on 8 host CPU devices: mesh sharding (data, FSDP, tensor) against a single device,
FSDP memory, checkpoints across mesh shapes, and two real processes through jax.distributed."""
import os
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest
import yaml

from train.config import config_from_dict, load_config
from train.jax_trainer import JaxTrainer, params_numpy

sys.path.insert(0, os.path.dirname(__file__))
from test_train import FAMILIES, ROOT, run_cfg  # noqa: E402

MESHES = {"data8": dict(data=8), "fsdp8": dict(data=1, fsdp=8), "fsdp4_tensor2": dict(data=1, fsdp=4, tensor=2),
          "data2_fsdp2_tensor2": dict(data=2, fsdp=2, tensor=2)}
SCALE_FAMILIES = ["lm_gpt2", "lm_llama_gqa"] + (["vit"] if "vit" in FAMILIES else [])


def _cfg(family, mesh=None, **train):
    cfg = run_cfg(family, steps=5, batch_size=16, grad_accum_steps=2, init="normal_0.02", **train)
    if mesh is None:
        return cfg
    return config_from_dict({**cfg.to_dict(), "parallel": {"mode": "mesh", "mesh": mesh}})


@pytest.fixture(scope="module")
def single_device_losses(tmp_path_factory):
    out = {}
    for fam in SCALE_FAMILIES:
        out[fam] = [r["loss"] for r in JaxTrainer(_cfg(fam), str(tmp_path_factory.mktemp(fam)),
                                                  progress=False).run()]
    return out


@pytest.mark.parametrize("family", SCALE_FAMILIES)
@pytest.mark.parametrize("mesh", sorted(MESHES))
def test_mesh_matches_single_device(family, mesh, single_device_losses, tmp_path):
    assert jax.device_count() == 8
    tr = JaxTrainer(_cfg(family, MESHES[mesh]), str(tmp_path), progress=False)
    losses = [r["loss"] for r in tr.run()]
    diffs = [abs(a - b) for a, b in zip(losses, single_device_losses[family])]
    print(f"{family} {mesh}: max per-step loss diff {max(diffs):.1e}, memory {tr.memory_report()}")
    assert len(losses) == 5 and max(diffs) <= 1e-5


def test_fsdp8_shards_params_and_optimizer(tmp_path):
    tr = JaxTrainer(_cfg("lm_llama_gqa", MESHES["fsdp8"]), str(tmp_path), progress=False)
    m = tr.memory_report()
    small = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tr.state["params"]) if x.ndim < 2)
    print("fsdp=8:", m, "replicated 1-D leaves:", small)
    assert m["param_bytes_per_device"] <= m["param_bytes_total"] / 8 + small
    assert m["opt_bytes_per_device"] <= m["opt_bytes_total"] / 8 + 2 * small + 64


def test_checkpoint_restores_under_other_meshes(tmp_path):
    cfg = _cfg("lm_llama_gqa", MESHES["fsdp4_tensor2"], checkpoint_every=5)
    saved = JaxTrainer(cfg, str(tmp_path), progress=False)
    saved.run()
    ref = params_numpy(saved.state)
    for mesh in (MESHES["data8"], None):
        c = _cfg("lm_llama_gqa", mesh)
        tr = JaxTrainer(c, str(tmp_path), resume=True, progress=False)
        assert tr.start_step == 5
        got = params_numpy(tr.state)
        assert all(np.array_equal(got[k], ref[k]) for k in ref)
        if mesh is not None:
            leaf = tr.state["params"]["decoder"]["layers"][0]["ffn"]["up_proj"]["kernel"]
            assert leaf.get_value().sharding.mesh.shape["data"] == 8


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_match_single_process(tmp_path):
    cfg = _cfg("lm_gpt2", {"data": -1}, checkpoint_every=5)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg.to_dict()))
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}
    port = _free_port()
    wd = tmp_path / "multi"
    procs = [subprocess.Popen([sys.executable, "-m", "jaxformer", "train", "--config", str(path), "--workdir",
                               str(wd), "--no-progress", "--coordinator", f"127.0.0.1:{port}",
                               "--num-processes", "2", "--process-id", str(i)], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs[0][-3000:] + outs[1][-3000:]
    import json
    multi = [json.loads(line)["loss"] for line in open(wd / "metrics.jsonl")]
    single = [r["loss"] for r in JaxTrainer(_cfg("lm_gpt2"), str(tmp_path / "single"), progress=False).run()]
    diffs = [abs(a - b) for a, b in zip(multi, single)]
    print("2 processes x 2 devices vs 1 device, per-step loss diffs:", ["%.1e" % d for d in diffs])
    assert len(multi) == 5 and max(diffs) <= 1e-5
    # the checkpoint both processes wrote restores in a single process
    tr = JaxTrainer(load_config(str(path)), str(wd), resume=True, progress=False)
    assert tr.start_step == 5
