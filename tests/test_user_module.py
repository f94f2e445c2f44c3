"""Any NNX module through the trainer (issue 48): a ported nanoGPT-style LM and a ported Hugging
Face OPT (a family jaxformer does not import), named by a YAML's `model: {module: FILE.py:CLASS,
torch: FILE.py:FUNC}` with `task: causal_lm`. Each trains 20 steps with the JAX trainer and,
from the same YAML, 20 steps of the original torch module in the torch trainer (the same start:
the torch trainer loads the JAX init under the torch module's keys); the losses agree within the
trajectory bound of our own families. The same run on the 8-device mesh (fsdp 4 x tensor 2, by
the logical axes the port wrote) equals one device; the compile takes model.axes overrides; a resume from the step-10
checkpoint is exact; the export, loaded with load_state_dict(strict=True) into the torch module,
gives the JAX model's outputs; generate and compile take the module too. Each run is made once
per module (fixtures), and the ports are written by the live `jaxformer port`."""
from __future__ import annotations

import os
import shutil

import jax
import numpy as np
import pytest
import torch
import user_modules
import yaml
from flax import nnx
from helpers import shared_port

import jaxformer
from jaxformer.cli import main
from jaxformer.train.config import load_config
from jaxformer.train.jax_trainer import JaxTrainer

HERE = os.path.dirname(os.path.abspath(__file__))
FACTORIES = os.path.join(HERE, "user_modules.py")
TRAIN = {"steps": 20, "batch_size": 8, "lr": 3e-3, "warmup_steps": 2, "eval_every": 10, "eval_batches": 1,
         "checkpoint_every": 10, "keep_checkpoints": 2, "async_checkpoint": False, "sample_tokens": 0}
RTOL = 1e-4  # the trajectory bound of our own families (tests/test_train.py, train/trajectory.py)
MESH_RTOL = 1e-5  # mesh against one device
MESH = {"mode": "mesh", "mesh": {"data": 1, "fsdp": 4, "tensor": 2}}
# the harness's output tolerance (jaxformer/parity/results.py): atol 1e-6 + rtol 2e-6 x max |torch|
OUT_ATOL, OUT_RTOL = 1e-6, 2e-6


def _write_cfg(folder, module: str, factory: str, parallel=None, **model) -> str:
    raw = {"model": {"module": module, "torch": f"{FACTORIES}:{factory}", **model}, "task": "causal_lm",
           "data": {"name": "stdlib_docs", "seq_len": 16}, "train": TRAIN}
    if parallel:
        raw["parallel"] = parallel
    path = folder / f"cfg_{len(list(folder.glob('cfg_*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


class Run:
    """A ported module's YAML (FILE relative to the YAML's folder) and its 20-step JAX run."""

    def __init__(self, tmp_path_factory, name: str, example, factory: str, axes: dict, into_heads: str):
        folder = tmp_path_factory.mktemp(name)
        self.folder, self.factory, self.axes, self.into_heads = folder, factory, axes, into_heads
        source, cls = shared_port(tmp_path_factory, factory, example)  # one port per run, shared by workers
        (folder / "ported.py").write_text(source)
        self.spec = f"ported.py:{cls}"
        self.cfg_path = _write_cfg(folder, self.spec, factory)
        self.cfg = load_config(self.cfg_path)
        self.workdir = str(folder / "jax")
        self.history = JaxTrainer(self.cfg, self.workdir, progress=False).run()

    def torch_module(self):
        return getattr(user_modules, self.factory)()


@pytest.fixture(scope="module")
def gpt(tmp_path_factory):
    axes = {r"wte\.embedding": ["vocab", "embed"], r"c_attn\.kernel": ["embed", "heads"],
            r"c_fc\.kernel": ["embed", "mlp"], r"mlp\.c_proj\.kernel": ["mlp", "embed"]}
    return Run(tmp_path_factory, "gpt", user_modules.gpt_example, "make_gpt", axes, "c_attn.kernel")


@pytest.fixture(scope="module")
def opt(tmp_path_factory):
    axes = {r"embed_tokens\.embedding": ["vocab", "embed"], r"(q|k|v)_proj\.kernel": ["embed", "heads"],
            r"fc1\.kernel": ["embed", "mlp"], r"fc2\.kernel": ["mlp", "embed"]}
    return Run(tmp_path_factory, "opt", user_modules.opt_example, "make_opt", axes, "q_proj.kernel")


@pytest.fixture(params=["gpt", "opt"])
def run(request):
    return request.getfixturevalue(request.param)


def _worst(a: list[dict], b: list[dict], key: str) -> float:
    return max(abs(x[key] - y[key]) / max(1.0, abs(y[key])) for x, y in zip(a, b, strict=True))


def test_torch_trainer_follows_the_same_trajectory(run, tmp_path):
    """20 steps of the torch module in the torch trainer, from the same YAML, against the JAX
    run: loss, lr and gradient norm per step, and the final weights under the torch keys."""
    from jaxformer import module_weights
    from jaxformer.checkpoint_io import load_run
    from jaxformer.train.torch.trainer import TorchTrainer
    tt = TorchTrainer(run.cfg, str(tmp_path / "torch"), progress=False)
    th = tt.run()
    assert len(th) == len(run.history) == 20
    worst = {k: _worst(run.history, th, k) for k in ("loss", "lr", "grad_norm")}
    final = module_weights.torch_state_dict(load_run(run.workdir, 20)[2], run.torch_module())
    diffs = {k: float((final[k] - v).abs().max()) for k, v in tt.module.state_dict().items()}
    # OPT's key-projection bias: softmax cancels it, so its true gradient is 0 and each framework's
    # is rounding noise that Adam turns into lr-sized steps (docs/numerics.md §15; our own layers
    # cut that gradient, a ported module has it as torch does). It moves no loss.
    free = {k for k in diffs if k.endswith("k_proj.bias")}
    params = max(v for k, v in diffs.items() if k not in free)
    print(f"{run.factory}: worst relative loss {worst['loss']:.2e}, lr {worst['lr']:.2e}, grad_norm "
          f"{worst['grad_norm']:.2e}, final params max |d| {params:.2e}"
          + (f" (key biases, gradient 0 in exact arithmetic: {max(diffs[k] for k in free):.2e})" if free else ""))
    assert max(worst.values()) <= RTOL, worst
    assert params <= RTOL
    assert th[-1]["eval_loss"] == pytest.approx(run.history[-1]["eval_loss"], rel=RTOL)


def test_mesh_equals_one_device(run, tmp_path):
    """fsdp 4 x tensor 2 on 8 devices, by the logical axes the port wrote (no model.axes): the
    trainer's rules split them (a projection into the heads over fsdp x tensor, a norm's scale
    and a Linear's bias not at all); every loss equals one device's."""
    from jax.sharding import PartitionSpec as P

    from jaxformer.train.sharding import _key_of
    cfg = load_config(_write_cfg(run.folder, run.spec, run.factory, MESH))
    tr = JaxTrainer(cfg, str(tmp_path / "mesh"), progress=False)
    specs = {_key_of(p): s.spec for p, s in jax.tree_util.tree_flatten_with_path(tr.shardings["params"])[0]}
    heads = next(k for k in specs if k.endswith(run.into_heads))
    assert specs[heads] == P("fsdp", "tensor"), specs
    assert all(s in (P(None), P()) for k, s in specs.items() if k.endswith("bias") or "norm" in k), specs
    history = tr.run()
    worst = _worst(history, run.history, "loss")
    print(f"{run.factory}: mesh vs one device, worst relative loss {worst:.2e}")
    assert worst <= MESH_RTOL
    mem = tr.memory_report()
    assert mem["param_bytes_per_device"] < mem["param_bytes_total"]


def test_resume_from_a_mid_run_checkpoint_is_exact(gpt, tmp_path):
    wd = str(tmp_path / "resumed")
    shutil.copytree(gpt.workdir, wd)
    shutil.rmtree(os.path.join(wd, "checkpoints", "20"))
    history = JaxTrainer(gpt.cfg, wd, resume=True, progress=False).run()
    assert [r["step"] for r in history] == list(range(11, 21))
    assert [r["loss"] for r in history] == [r["loss"] for r in gpt.history[10:]]
    assert history[-1]["eval_loss"] == gpt.history[-1]["eval_loss"]


def test_export_loads_strictly_into_the_torch_module(run, tmp_path, capsys):
    """export --to torch (.safetensors and .pt): the torch module's own state_dict keys (the tied
    head under both names, the mask buffer), loaded with strict=True; its logits are the JAX
    model's within the harness's output tolerance. The Python helper gives the same tensors."""
    from safetensors.torch import load_file

    from jaxformer import module_weights
    model, _ = jaxformer.load(run.workdir)
    ids = np.random.RandomState(3).randint(1, user_modules.VOCAB, (2, 16))
    ours = np.asarray(_logits(model(ids)))
    live = module_weights.torch_state_dict(model, run.torch_module())
    for suffix, read in ((".safetensors", load_file), (".pt", lambda p: torch.load(p, weights_only=True))):
        out = str(tmp_path / f"w{suffix}")
        assert main(["export", run.workdir, "--to", "torch", out]) == 0
        module = run.torch_module().eval()
        state = read(out)
        assert set(state) == set(module.state_dict())
        module.load_state_dict(state, strict=True)
        with torch.no_grad():
            theirs = _logits(module(torch.from_numpy(ids))).numpy()
        diff = float(np.abs(ours - theirs).max())
        with capsys.disabled():
            print(f"{run.factory} {suffix}: max |jax - torch| logits {diff:.2e} (max |torch| "
                  f"{float(np.abs(theirs).max()):.2f})")
        assert diff <= OUT_ATOL + OUT_RTOL * float(np.abs(theirs).max())
        assert all(torch.equal(state[k], live[k]) for k in state)
    assert "state dict of" in capsys.readouterr().out


def _logits(out):
    from jaxformer.config.module import logits_of
    return logits_of(out)


def test_generate_decodes_the_module(gpt, capsys):
    """jaxformer generate on the run (uncached): greedy ids, the argmax of the model's own logits."""
    assert main(["generate", "--weights", gpt.workdir, "--ids", "--prompt", "75 104 111",
                 "--max-new-tokens", "4", "--strategy", "greedy", "--no-eos-stop"]) == 0
    got = [int(t) for t in capsys.readouterr().out.split()]
    model, _ = jaxformer.load(gpt.workdir)
    ids = [75, 104, 111]
    for _ in range(4):
        ids.append(int(np.argmax(np.asarray(model(np.asarray([ids])))[0, -1])))
    assert got == ids[3:]


def test_compile_reports_the_module_on_a_tpu_slice(gpt):
    from jaxformer.train import aot
    cfg = load_config(_write_cfg(gpt.folder, gpt.spec, gpt.factory,
                                 {"mode": "mesh", "mesh": {"data": 1, "fsdp": 2, "tensor": 2}}, axes=gpt.axes))
    r = aot.compile_report(cfg, "v5e:2x2")
    assert r["model"] == "module" and r["fits"] and r["chips"] == 4
    params = sum(int(np.prod(v.shape)) for v in jax.tree.leaves(nnx.state(jaxformer.load(gpt.workdir)[0], nnx.Param)))
    assert r["param_count"] == params
    assert r["bytes_per_chip"]["params"] < 4 * params  # split over fsdp x tensor where the axes say
    assert r["collectives"]["all-gather"]["count"] > 0


def test_handwritten_module_with_kwargs_trains_a_classifier(tmp_path):
    """Your own NNX class (package.module:CLASS form), its constructor's kwargs from the YAML,
    task classification on text_source; the logits' class count is checked against the data."""
    raw = {"model": {"module": "user_modules:TinyClassifier", "kwargs": {"vocab": 259, "width": 16, "classes": 3}},
           "task": "classification", "data": {"name": "text_source", "seq_len": 16, "examples_per_class": 64},
           "train": {**TRAIN, "steps": 3, "eval_every": 3, "checkpoint_every": 3}}
    path = tmp_path / "cls.yaml"
    path.write_text(yaml.safe_dump(raw))
    history = JaxTrainer(load_config(str(path)), str(tmp_path / "w"), progress=False).run()
    assert len(history) == 3 and "eval_accuracy" in history[-1]
    raw["model"]["kwargs"]["classes"] = 2
    path.write_text(yaml.safe_dump(raw))
    from jaxformer.config import ConfigError
    with pytest.raises(ConfigError, match="2 entries, fewer than the 3 classes"):
        JaxTrainer(load_config(str(path)), str(tmp_path / "w2"), progress=False)
