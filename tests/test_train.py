"""Training: trajectory parity JAX vs torch (and what a run writes: its resolved config,
metrics.jsonl, TensorBoard events), exact resume after SIGKILL, corrupted checkpoints, config
loading, schedules and init schemes. (pmap and mesh against one device: tests/test_scale.py.)"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
import yaml
from helpers import cli_env
from workdir_helpers import child_run_dict, writing_compilation_cache

from jaxformer.config import ConfigError
from jaxformer.convert import load_torch_state_dict
from jaxformer.models import build_model as jbuild
from jaxformer.train.config import config_from_dict, load_config
from jaxformer.train.jax_trainer import JaxTrainer, params_numpy
from jaxformer.train.torch.trainer import TorchTrainer
from torch_ref.models import build_model as tbuild

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_TEXT = dict(d_model=32, num_heads=4, d_ff=64, num_layers=2, dropout=0.0)

# model section, data section per family: tiny, fast, dropout 0
FAMILIES = {
    "classifier_postln": ({"name": "classifier", "vocab_size": 259, "max_len": 32, "num_classes": 3,
                           "norm_position": "post", **TINY_TEXT},
                          {"name": "text_source", "seq_len": 32, "examples_per_class": 64}),
    "seq2seq": ({"name": "seq2seq", "vocab_size": 259, "max_len": 32, "norm_position": "pre", **TINY_TEXT},
                {"name": "dates", "train_examples": 256, "eval_examples": 32}),
    "lm_gpt2": ({"name": "lm", "vocab_size": 259, "max_len": 32, "norm_position": "pre", "position": "learned",
                 "ffn": "gelu_tanh", "tie_embeddings": True, **TINY_TEXT},
                {"name": "stdlib_docs", "seq_len": 16}),
    "lm_llama_gqa": ({"name": "lm", "vocab_size": 259, "max_len": 32, "norm_position": "pre", "position": "rope",
                      "norm": "rmsnorm", "ffn": "swiglu", "bias": False, "num_kv_heads": 2,
                      "tie_embeddings": False, "norm_eps": 1e-6, **TINY_TEXT},
                     {"name": "stdlib_docs", "seq_len": 16}),
    "vit": ({"name": "vit", "image_size": 16, "patch_size": 4, "num_channels": 1, "num_classes": 10,
             "d_model": 32, "num_heads": 4, "d_ff": 64, "num_layers": 2, "dropout": 0.0},
            {"name": "digits", "image_size": 16, "num_channels": 1}),
    "swin": ({"name": "swin", "image_size": 16, "patch_size": 2, "num_channels": 1, "num_classes": 10,
              "embed_dim": 16, "depths": [2, 2], "num_heads": [2, 4], "window_size": 4, "dropout": 0.0,
              "drop_path_rate": 0.0},
             {"name": "digits", "image_size": 16, "num_channels": 1}),
    "timeseries": ({"name": "timeseries", "input_len": 24, "num_channels": 3, "target_channels": [0],
                    "horizon": 4, "d_model": 32, "num_heads": 4, "d_ff": 64, "num_layers": 2,
                    "conv_layers": 2, "kernel_size": 3, "padding": "causal", "dropout": 0.0},
                   {"name": "series", "length": 600, "num_channels": 3, "input_len": 24, "horizon": 4,
                    "target_channels": [0]}),
}
TRAIN = {"steps": 20, "batch_size": 8, "grad_accum_steps": 2, "lr": 3e-3, "schedule": "warmup_cosine",
         "warmup_steps": 5, "grad_clip": 0.5, "label_smoothing": 0.1, "eval_every": 10, "eval_batches": 1,
         "checkpoint_every": 20, "async_checkpoint": False, "weight_decay": 0.01}


def run_cfg(family, **train):
    model, data = FAMILIES[family]
    return config_from_dict({"model": dict(model), "data": dict(data), "train": {**TRAIN, **train}})


def _pair(cfg):
    """(torch module, its flax twin with the same weights). The flax side is built abstractly
    (jaxformer.parity.cases.twin: an eager build compiles every initialiser shape, values the
    load overwrites); its RNG streams are never drawn from at dropout 0 (every family here)."""
    from jaxformer.parity.cases import twin
    tmod = tbuild(cfg.model_name, cfg.model, seed=3)
    jmod = twin(lambda: jbuild(cfg.model_name, cfg.model, seed=0), 0)
    load_torch_state_dict(jmod, tmod.state_dict())  # start from the same converted weights
    return tmod, jmod


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_trajectory_parity(family, tmp_path):
    cfg = run_cfg(family)
    tmod, jmod = _pair(cfg)
    jt = JaxTrainer(cfg, str(tmp_path / "jax"), model=jmod, progress=False)
    tt = TorchTrainer(cfg, str(tmp_path / "torch"), module=tmod, progress=False)
    jh, th = jt.run(), tt.run()
    assert len(jh) == len(th) == 20
    worst_loss = worst_lr = 0.0
    for a, b in zip(jh, th, strict=True):
        scale = max(1.0, abs(b["loss"]))
        worst_loss = max(worst_loss, abs(a["loss"] - b["loss"]) / scale)
        worst_lr = max(worst_lr, abs(a["lr"] - b["lr"]) / max(1.0, abs(b["lr"])))
    jp = params_numpy(jt.state)
    tp = {k: v.detach().numpy() for k, v in tt.module.state_dict().items()}
    assert set(jp) == set(tp)
    worst_param = max(float(np.abs(jp[k] - tp[k]).max()) for k in tp)
    print(f"{family}: max |dloss|/max(1,|loss|) {worst_loss:.2e}, max |dlr| {worst_lr:.2e}, "
          f"final params max abs diff {worst_param:.2e}")
    assert worst_loss <= 1e-4
    assert worst_lr <= 1e-4
    assert worst_param <= 1e-4
    first, last = np.mean([r["loss"] for r in jh[:5]]), np.mean([r["loss"] for r in jh[-5:]])
    if family != "vit":  # 20 steps of 8 digits leave ViT at chance (ln 10 = 2.30): no signal yet
        assert last < first, (first, last)  # it learns (means: single-batch losses are noisy)
    # what the JAX run wrote: its resolved config, a metrics line per step (eval on the last),
    # TensorBoard events
    wd = tmp_path / "jax"
    assert load_config(str(wd / "config.yaml")) == cfg
    with open(wd / "metrics.jsonl") as f:
        lines = [json.loads(line) for line in f]
    assert [r["step"] for r in lines] == list(range(1, 21))
    assert {"step", "loss", "lr", "grad_norm", "eval_loss"} <= set(lines[-1])
    if family == "classifier_postln":
        assert "eval_accuracy" in lines[-1]
    assert any(f.startswith("events") for f in os.listdir(wd / "tb"))


def _train_args(cfg_path, workdir, *extra):
    return ["train", "--config", cfg_path, "--workdir", workdir, "--no-progress", *extra]


def _train_in_process(cfg_path, workdir, *extra) -> None:
    """`jaxformer train` in this process (the killed run below is the one that needs its own)."""
    import contextlib
    import io

    from jaxformer import cli
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(_train_args(cfg_path, workdir, *extra))
    assert code == 0, out.getvalue()[-2000:]


def _losses(workdir):
    """(step, loss) per step; a resumed run's redone steps: the last line wins (read_metrics)."""
    from jaxformer.train.logging_utils import read_metrics
    return [(r["step"], r["loss"]) for r in read_metrics(workdir)]


def _logged_steps(workdir) -> list[int]:
    """Steps of the complete lines of a running job's metrics.jsonl (the last may be half written)."""
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line)["step"] for line in f if line.endswith("\n")]


def _checkpoint_steps(workdir) -> list[int]:
    """Finished checkpoints (orbax renames a step's folder to its number only once it is complete)."""
    ckpt = os.path.join(workdir, "checkpoints")
    return sorted(int(n) for n in os.listdir(ckpt) if n.isdigit()) if os.path.isdir(ckpt) else []


@pytest.fixture(scope="module")
def resume_setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("resume")
    # the suite's CLI child run (workdir_helpers.child_run_dict: dropout 0.1, the other children's
    # programs); inverse_sqrt: the lr does not depend on train.steps, so a run given more steps
    # follows this 12-step trajectory step for step (the killed run below relies on it); no
    # end-of-run sample (its decode programs are compiled and checked by tests/test_export.py's run)
    path = d / "cfg.yaml"
    path.write_text(yaml.safe_dump(child_run_dict(steps=12, checkpoint_every=4, eval_every=4, sample_tokens=0)))
    full = d / "full"
    with writing_compilation_cache():  # for the killed run's child, which trains the same run
        _train_in_process(str(path), str(full))
    return d, str(path), _losses(full)


def test_resume_after_sigkill_is_exact(resume_setup):
    """SIGKILL a training process mid-run, resume it, and get the uninterrupted run's losses."""
    d, path, reference = resume_setup
    wd = str(d / "killed")
    log_path = d / "killed.log"
    # 100000 steps: the run is still going whenever the kill lands, however fast the machine
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "jaxformer", *_train_args(path, wd, "--set", "train.steps=100000")],
                                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=cli_env())
    try:
        deadline = time.monotonic() + 300  # a generous bound for start-up and compiles on a loaded machine
        # kill once step 6 is logged and the step-4 checkpoint is complete: between checkpoints
        while len(_logged_steps(wd)) < 6 or 4 not in _checkpoint_steps(wd):
            assert proc.poll() is None, f"exited with {proc.returncode}: {log_path.read_text()[-2000:]}"
            assert time.monotonic() < deadline, "no step-4 checkpoint after 300 s"
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, log_path.read_text()[-2000:])
    logged, saved = _logged_steps(wd), _checkpoint_steps(wd)
    print(f"killed after step {logged[-1]}, checkpoints {saved}")
    assert logged[-1] >= 6 and saved[-1] < 12  # the resume below redoes steps up to 12
    _train_in_process(path, wd, "--resume")
    resumed = _losses(wd)
    assert [s for s, _ in resumed] == list(range(1, 13))
    assert resumed == reference  # identical losses, dropout RNG and data order included
    # every logged value too: the evals after the resume (steps 8, 12: eval_loss, token
    # accuracy, perplexity) and the train metrics (correct, grad_norm, lr), bit for bit
    from jaxformer.train.logging_utils import read_metrics
    assert read_metrics(wd) == read_metrics(str(d / "full"))


def test_corrupted_newest_checkpoint_falls_back(resume_setup):
    d, path, reference = resume_setup
    wd = d / "corrupt"
    shutil.copytree(d / "full", wd)
    ckpt = wd / "checkpoints"
    steps = sorted(int(p.name) for p in ckpt.iterdir() if p.name.isdigit())
    assert steps[-1] == 12
    newest = ckpt / str(steps[-1])
    for f in newest.rglob("*"):
        if f.is_file() and f.stat().st_size > 0 and "state" in str(f):
            f.write_bytes(b"\0" * 7)  # truncate/garble every array file of the newest step
    from jaxformer.train.checkpoint import Checkpointer
    cfg = load_config(path)
    trainer = JaxTrainer(cfg, str(d / "template"), progress=False)  # a fresh run: the state's layout
    trainer.close()
    state, record = Checkpointer(str(ckpt), keep=2, read_only=True).restore(trainer.state)
    assert record["step"] == steps[-2]  # fell back to the previous good checkpoint
    # and with every step corrupted: a clear error, not garbage
    for s in steps:
        for f in (ckpt / str(s)).rglob("*"):
            if f.is_file() and "state" in str(f):
                f.write_bytes(b"\0" * 7)
    from jaxformer.train.checkpoint import CheckpointError
    with pytest.raises(CheckpointError, match="no restorable checkpoint"):
        Checkpointer(str(ckpt), keep=2, read_only=True).restore(trainer.state)


def test_every_config_parses_and_unknown_keys_fail():
    files = sorted(f for f in os.listdir(os.path.join(ROOT, "configs")) if f.endswith(".yaml"))
    assert {"classifier.yaml", "seq2seq.yaml", "lm.yaml", "llama.yaml", "vit.yaml", "swin.yaml",
            "timeseries.yaml"} <= set(files)
    for f in files:
        cfg = load_config(os.path.join(ROOT, "configs", f))
        assert cfg.model_name and cfg.data_name
    p = os.path.join(ROOT, "configs", "lm.yaml")
    with pytest.raises(ConfigError, match="train.learning_rate"):
        load_config(p, ["train.learning_rate=1e-3"])
    with pytest.raises(ConfigError, match="model.num_layerz"):
        load_config(p, ["model.num_layerz=2"])
    with pytest.raises(ConfigError, match="train.steps: expected an int"):
        load_config(p, ["train.steps=many"])
    with pytest.raises(ConfigError, match="data.seq_len"):
        load_config(p, ["data.seq_len=-4"])
    cfg = load_config(p, ["train.lr=3e-4", "model.num_layers=2"])
    assert cfg.train.lr == 3e-4 and cfg.model.num_layers == 2


@pytest.mark.parametrize("schedule", ["warmup_cosine", "constant", "inverse_sqrt"])
def test_lr_schedules_align_step_for_step(schedule):
    import jax.numpy as jnp

    from jaxformer.train.optim import make_optax, make_torch_optimizer
    cfg = run_cfg("lm_gpt2", schedule=schedule, steps=40, warmup_steps=8).train
    _, sched = make_optax(cfg, {"w": jnp.zeros((2, 2))})
    opt, tsched = make_torch_optimizer(cfg, torch.nn.Linear(2, 2))
    for step in range(40):
        lr_t = opt.param_groups[0]["lr"]
        assert abs(float(sched(step)) - lr_t) <= 1e-4 * max(1.0, lr_t) + 1e-9, (step, float(sched(step)), lr_t)
        opt.step()
        tsched.step()


@pytest.mark.parametrize("scheme", ["xavier_uniform", "normal_0.02"])
def test_init_schemes_are_identical_across_frameworks(scheme):
    from jaxformer.convert import to_torch_state_dict
    from jaxformer.train.init import init_flax
    from jaxformer.train.torch.init import init_torch
    cfg = run_cfg("lm_llama_gqa")
    tmod, jmod = tbuild("lm", cfg.model, seed=1), jbuild("lm", cfg.model, seed=2)
    init_torch(tmod, scheme, 7)
    init_flax(jmod, scheme, 7)
    sd, back = tmod.state_dict(), to_torch_state_dict(jmod)
    for k in sd:
        assert torch.equal(sd[k], back[k]), k
    w = sd["decoder.layers.0.ffn.up_proj.weight"]
    if scheme == "xavier_uniform":
        a = (6.0 / sum(w.shape)) ** 0.5
        assert float(w.abs().max()) <= a and float(w.abs().max()) > 0.8 * a
    else:
        assert abs(float(w.std()) - 0.02) < 0.003
