"""Scale-out on 8 host CPU devices: mesh sharding (data, FSDP, tensor) and pmap against a single
device, FSDP memory, checkpoints across mesh shapes, two real processes through
jax.distributed, scan over layers and remat."""
import json
import os
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest
import yaml
from helpers import host_devices_env, step_losses

from jaxformer.train.config import config_from_dict, load_config
from jaxformer.train.jax_trainer import JaxTrainer, checkpoint_steps, params_numpy

sys.path.insert(0, os.path.dirname(__file__))
from test_train import FAMILIES, ROOT, run_cfg

MESHES = {"data8": dict(data=8), "fsdp8": dict(data=1, fsdp=8), "data2_fsdp2_tensor2": dict(data=2, fsdp=2, tensor=2)}
SCALE_FAMILIES = ["lm_gpt2", "lm_llama_gqa"] + (["vit"] if "vit" in FAMILIES else [])


def _cfg(family, mesh=None, **train):
    cfg = run_cfg(family, **{"steps": 5, "batch_size": 16, "grad_accum_steps": 2, "init": "normal_0.02", **train})
    if mesh is None:
        return cfg
    return config_from_dict({**cfg.to_dict(), "parallel": {"mode": "mesh", "mesh": mesh}})


@pytest.fixture(scope="module")
def single_device_runs(tmp_path_factory):
    """{"lm_gpt2": (per-step records, workdir)} of the one-device GPT-2 run, computed once for
    the mesh and pmap cases and the two-process test (which also compares its eval loss and
    loads its model)."""
    wd = tmp_path_factory.mktemp("lm_gpt2")
    return {"lm_gpt2": (JaxTrainer(_cfg("lm_gpt2"), str(wd), progress=False).run(), wd)}


@pytest.fixture(scope="module")
def single_device_losses(single_device_runs, tmp_path_factory):
    """{family: per-step losses} on one device: GPT-2's run; the other families' trainer's own
    train step (helpers.step_losses: the losses run() logs, without the eval, checkpoint and model
    export that only the GPT-2 run's readers need)."""
    out = {fam: [r["loss"] for r in history] for fam, (history, _) in single_device_runs.items()}
    for fam in SCALE_FAMILIES:
        if fam not in out:
            out[fam] = step_losses(JaxTrainer(_cfg(fam), str(tmp_path_factory.mktemp(fam)), progress=False))
    return out


# Every mesh on the GQA LM (the family with the most sharding rules); the other families on the
# mesh that uses all three axes at once (each one-axis mesh is a special case of its rules).
# FSDP alone and all three axes on the LLaMA flavour, the three-axis mesh on the other
# families, data alone on GPT-2 (the three-axis run's checkpoint: test_checkpoint_restores_under_other_meshes)
MESH_CASES = [("lm_llama_gqa", m) for m in ("fsdp8", "data2_fsdp2_tensor2")] + \
    [(f, "data2_fsdp2_tensor2") for f in SCALE_FAMILIES if f != "lm_llama_gqa"] + [("lm_gpt2", "data8")]


@pytest.fixture(scope="module")
def fsdp8_trainer(tmp_path_factory):
    """The GQA LM's trainer on the fsdp=8 mesh, built once for its mesh case and the FSDP
    memory test (the state's shardings are the same before and after its 5 steps)."""
    tr = JaxTrainer(_cfg("lm_llama_gqa", MESHES["fsdp8"]), str(tmp_path_factory.mktemp("fsdp8")), progress=False)
    yield tr
    tr.close()


@pytest.fixture(scope="module")
def gqa_three_axis_run(tmp_path_factory):
    """The GQA LM's 5-step run on the data x fsdp x tensor mesh -> (trainer, per-step losses,
    workdir): its mesh case, and the step-5 checkpoint (step == steps) that
    test_checkpoint_restores_under_other_meshes restores under other meshes (one compiled
    mesh program for both)."""
    wd = str(tmp_path_factory.mktemp("gqa_three_axis"))
    tr = JaxTrainer(_cfg("lm_llama_gqa", MESHES["data2_fsdp2_tensor2"]), wd, progress=False)
    return tr, [r["loss"] for r in tr.run()], wd


@pytest.mark.parametrize("family,mesh", MESH_CASES)
def test_mesh_matches_single_device(family, mesh, single_device_losses, tmp_path, request):
    assert jax.device_count() == 8
    if (family, mesh) == ("lm_llama_gqa", "data2_fsdp2_tensor2"):
        tr, losses, _ = request.getfixturevalue("gqa_three_axis_run")
    else:  # the trainer's own mesh train step (run()'s eval, checkpoint and export on a mesh:
        # gqa_three_axis_run's run() and the two-process test; the losses are what is compared)
        tr = request.getfixturevalue("fsdp8_trainer") if (family, mesh) == ("lm_llama_gqa", "fsdp8") else \
            JaxTrainer(_cfg(family, MESHES[mesh]), str(tmp_path), progress=False)
        losses = step_losses(tr)
    diffs = [abs(a - b) for a, b in zip(losses, single_device_losses[family], strict=False)]
    print(f"{family} {mesh}: max per-step loss diff {max(diffs):.1e}, memory {tr.memory_report()}")
    assert len(losses) == 5 and max(diffs) <= 1e-5


def test_pmap_matches_single_device(single_device_losses, tmp_path):
    """pmap over the 8 local devices gives the one-device losses within 1e-5 (the gradient
    psum sums in another order); the trainer's final state is unreplicated from one device's
    own copy: no program over all 8 devices, whose all-reduce XLA:CPU aborts the process on
    when the devices miss its rendezvous timeout under load (jax_trainer.py _unreplicate)."""
    cfg = config_from_dict({**_cfg("lm_gpt2").to_dict(), "parallel": {"mode": "pmap"}})
    tr = JaxTrainer(cfg, str(tmp_path), progress=False)
    assert tr.devices == jax.local_device_count() == 8
    losses = [r["loss"] for r in tr.run()]
    diffs = [abs(a - b) for a, b in zip(losses, single_device_losses["lm_gpt2"], strict=False)]
    print("pmap vs single-device loss diffs:", [f"{d:.1e}" for d in diffs])
    assert len(losses) == 5 and max(diffs) <= 1e-5
    assert all(x.devices() == {jax.local_devices()[0]} for x in jax.tree.leaves(tr.state))
    # resuming under pmap: the restored arrays (committed to one device) are placed one copy per
    # device as pmap takes them (a sharding mismatch ValueError before)
    resumed = JaxTrainer(config_from_dict({**cfg.to_dict(), "train": {**cfg.to_dict()["train"], "steps": 6}}),
                         str(tmp_path), resume=True, progress=False)
    assert resumed.start_step == 5
    assert [r["step"] for r in resumed.run()] == [6]


def test_fsdp8_shards_params_and_optimizer(fsdp8_trainer):
    tr = fsdp8_trainer
    m = tr.memory_report()
    small = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tr.state["params"]) if x.ndim < 2)
    print("fsdp=8:", m, "replicated 1-D leaves:", small)
    assert m["param_bytes_per_device"] <= m["param_bytes_total"] / 8 + small
    assert m["opt_bytes_per_device"] <= m["opt_bytes_total"] / 8 + 2 * small + 64


def test_checkpoint_restores_under_other_meshes(gqa_three_axis_run, tmp_path):
    """The step-5 checkpoint of the GQA LM sharded over data x fsdp x tensor restores under
    data alone and on one device to the saved params, bit for bit."""
    import shutil
    saved, _, saved_wd = gqa_three_axis_run
    assert checkpoint_steps(os.path.join(saved_wd, "checkpoints")) == [5]
    ref = params_numpy(saved.state)
    wd = str(tmp_path / "w")
    shutil.copytree(saved_wd, wd)  # the resumes below write in their workdir
    for mesh in (MESHES["data8"], None):
        c = _cfg("lm_llama_gqa", mesh, steps=10)  # resuming needs steps left to train
        tr = JaxTrainer(c, wd, resume=True, progress=False)
        assert tr.start_step == 5
        got = params_numpy(tr.state)
        assert all(np.array_equal(got[k], ref[k]) for k in ref)
        if mesh is not None:
            leaf = tr.state["params"]["decoder"]["layers"][0]["ffn"]["up_proj"]["kernel"]
            assert leaf.get_value().sharding.mesh.shape["data"] == 8
        tr.close()  # release the workdir lock for the next restore


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_match_single_process(single_device_runs, tmp_path):
    """2 processes x 2 devices (mesh data=4) through jax.distributed, each reading its own half
    of every batch (train/data/pipeline.py process_rows), against the one-device run: per-step
    losses and the eval loss within 1e-5 (the reductions differ, the batches do not); each
    process saves its own pipeline state in the checkpoint, which restores in a single process;
    process 0 writes the run's model from the gathered params."""
    # no end-of-run sample: process 0 would compile and run its decode programs, which no
    # assertion reads (tests/test_export.py's CLI run checks the sample)
    cfg = _cfg("lm_gpt2", {"data": -1}, checkpoint_every=5, sample_tokens=0)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg.to_dict()))
    env = host_devices_env(2)
    port = _free_port()
    wd = tmp_path / "multi"
    procs = [subprocess.Popen([sys.executable, "-m", "jaxformer", "train", "--config", str(path), "--workdir",
                               str(wd), "--no-progress", "--coordinator", f"127.0.0.1:{port}",
                               "--num-processes", "2", "--process-id", str(i)], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs[0][-3000:] + outs[1][-3000:]
    with open(wd / "metrics.jsonl") as f:
        multi = [json.loads(line) for line in f]
    single, single_wd = single_device_runs["lm_gpt2"]  # _cfg("lm_gpt2"): this config on one device
    diffs = [abs(a[k] - b[k]) for a, b in zip(multi, single, strict=False) for k in ("loss", "eval_loss") if k in a]
    print("2 processes x 2 devices vs 1 device, per-step loss and eval loss diffs:", [f"{d:.1e}" for d in diffs])
    assert len(multi) == 5 and len(diffs) == 6 and max(diffs) <= 1e-5
    for i in range(2):  # each process saved its own pipeline state
        assert json.loads((wd / "checkpoints" / "5" / "data" / f"process_{i}-of-2.json").read_text()) == {"next_index": 5}
    # the checkpoint both processes wrote restores in a single process
    tr = JaxTrainer(load_config(str(path), ["train.steps=10"]), str(wd), resume=True, progress=False)
    assert tr.start_step == 5
    # process 0 wrote the run's model checkpoint from the gathered params: the single-process
    # run's weights within the same rounding as the losses
    import jaxformer
    model, _ = jaxformer.load(str(wd))
    tr.close()
    from flax import nnx
    got = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    ref = nnx.to_pure_dict(nnx.state(jaxformer.load(str(single_wd))[0], nnx.Param))
    diffs = jax.tree.leaves(jax.tree.map(lambda a, b: float(np.abs(np.asarray(a) - np.asarray(b)).max()), got, ref))
    print("2 processes vs 1: max |param diff|", max(diffs))
    assert max(diffs) <= 1e-6, max(diffs)


# ------------------------------------------------------------------ scan over layers, remat
def _scan_cfg(family, scan, remat=False, **train):
    model, data = FAMILIES[family]
    return config_from_dict({"model": {**model, "scan_layers": scan},
                             "data": dict(data),
                             "train": {**TRAIN_SMALL, "init": "xavier_uniform", "remat": remat, **train}})


TRAIN_SMALL = {"steps": 5, "batch_size": 8, "grad_accum_steps": 2, "lr": 3e-3, "warmup_steps": 2,
               "eval_every": 5, "eval_batches": 1, "checkpoint_every": 5, "async_checkpoint": False,
               "dropout": 0.0}


# the decoder-only stack (every variant, GQA + RoPE) and the encoder + cross-attention decoder
# stacks of seq2seq: between them every scanned stack kind (vit's encoder is seq2seq's)
@pytest.mark.parametrize("family", ["lm_llama_gqa", "seq2seq"])
def test_scan_matches_unrolled_and_remat(family, tmp_path):
    """5 steps scanned (and rematerialised) vs a Python loop over layers. Catches weight decay
    keyed on ndim >= 2, which would also decay the stacked [L, D] norm scales."""
    from jaxformer.convert import scan_prefixes
    runs = {}
    variants = [("loop", False, False), ("scan", True, False), ("scan_remat", True, True)]
    if family == "lm_llama_gqa":
        variants.append(("loop_remat", False, True))
    for tag, scan, remat in variants:
        tr = JaxTrainer(_scan_cfg(family, scan, remat), str(tmp_path / tag), progress=False)
        runs[tag] = (step_losses(tr), params_numpy(tr.state, scan_prefixes(tr.model)))
        if scan:
            assert scan_prefixes(tr.model), "the scanned model must report its stacked prefix"
    base_losses, base_params = runs["loop"]
    for tag, (losses, params) in runs.items():
        d = max(abs(a - b) for a, b in zip(losses, base_losses, strict=False))
        p = max(float(np.abs(params[k] - base_params[k]).max()) for k in base_params)
        print(f"{family} {tag}: max loss diff {d:.1e}, max param diff {p:.1e}")
        assert set(params) == set(base_params)
        assert d <= 1e-5


def test_scanned_checkpoint_converts_both_ways():
    import torch

    from jaxformer.convert import load_torch_state_dict, to_torch_state_dict
    from jaxformer.models import build_model as jbuild
    from jaxformer.parity import check_parity
    from torch_ref.models import build_model as tbuild
    cfg = _scan_cfg("lm_llama_gqa", True).model
    tmod = tbuild("lm", cfg, seed=0)  # torch loops over layers.{i}
    jmod = jbuild("lm", cfg, seed=1)
    leaf = jmod.decoder.layers.self_attn.q_proj.kernel
    assert leaf.shape[0] == cfg.num_layers  # stacked [L, in, out]
    load_torch_state_dict(jmod, tmod.state_dict())
    back = to_torch_state_dict(jmod)
    assert set(back) == set(tmod.state_dict())
    assert all(torch.equal(back[k], v) for k, v in tmod.state_dict().items())
    ids = np.random.RandomState(0).randint(3, 259, (2, 12)).astype(np.int32)
    r = check_parity(tmod, jmod, {"ids": ids})
    print(f"scanned lm vs torch: out {r.max_abs_out:.1e}, grad {r.max_abs_grad:.1e}")
    assert r.ok, r.worst()
