"""The training workdir's lifecycle (jaxformer/train/workdir.py): log_every fetches, append-only
metrics on resume, orbax keep-last + keep-best, model/last|best for use, non-finite skip inside
the jitted step, SIGTERM, `jaxformer eval`, the torch trainer's model export. The refusals
(non-empty workdir, lock, resume mismatches, full disk, ...) are rows of tests/test_bad_input.py."""
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from helpers import cli_env
from workdir_helpers import TINY_RUN, child_run_dict, tiny_run_config, wait_for_logged_steps

from jaxformer.train.jax_trainer import JaxTrainer, checkpoint_steps
from jaxformer.train.logging_utils import read_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One tiny 8-step run with log_every=3 and eval/checkpoints every 4 steps, counting the
    trainer's metric fetches."""
    wd = str(tmp_path_factory.mktemp("run") / "w")
    cfg = tiny_run_config(steps=8, checkpoint_every=4, eval_every=4, keep_checkpoints=1, log_every=3)
    trainer = JaxTrainer(cfg, wd, progress=False)
    calls = []
    fetch = trainer._fetch
    trainer._fetch = lambda outs: calls.append(len(outs)) or fetch(outs)
    trainer.run()
    return cfg, wd, trainer, calls


def test_log_every_controls_fetches(trained):
    """Metrics stay on the device between fetches: log_every=3 with eval/checkpoint steps 4 and
    8 fetches after steps 3, 4, 6 and 8, and metrics.jsonl still has a line per step."""
    cfg, wd, _, calls = trained
    assert calls == [3, 1, 2, 2]
    assert [r["step"] for r in read_metrics(wd)] == list(range(1, 9))
    with open(os.path.join(wd, "metrics.jsonl")) as f:
        for line in f:  # strict JSON
            json.loads(line, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))


def test_model_dirs(trained):
    cfg, wd, _, _ = trained
    records = {r["step"]: r for r in read_metrics(wd)}
    evals = {s: r["eval_loss"] for s, r in records.items() if "eval_loss" in r}
    assert sorted(evals) == [4, 8]
    best = min(evals, key=evals.get)
    assert checkpoint_steps(os.path.join(wd, "checkpoints")) == sorted({8, best})
    last = json.loads(Path(os.path.join(wd, "model", "last", "metrics.json")).read_text())
    best_info = json.loads(Path(os.path.join(wd, "model", "best", "metrics.json")).read_text())
    assert last["step"] == 8 and best_info["step"] == best and best_info["eval_loss"] == evals[best]
    from jaxformer.checkpoint_io import load_model
    name, mcfg, model = load_model(os.path.join(wd, "model", "last"))
    assert name == "lm" and mcfg == cfg.model


def test_orbax_keeps_last_k_and_best_and_refuses_loudly(tmp_path):
    """LatestN(1) + BestN(1): of steps with eval losses 3, 1, 2, 4 the last (4) and the best (2)
    stay; saving a step at or below the newest is an error, not a silent skip."""
    from jaxformer.train.checkpoint import Checkpointer, CheckpointError
    ck = Checkpointer(str(tmp_path / "ck"), keep=1, async_save=False)
    state = {"w": np.zeros(3, np.float32)}
    for step, loss in zip([1, 2, 3, 4], [3.0, 1.0, 2.0, 4.0], strict=True):
        ck.save(step, state, {}, eval_loss=loss)
    assert ck.all_steps() == [2, 4] and ck.best_step() == 2
    with pytest.raises(CheckpointError, match="refused to save step 3"):
        ck.save(3, state, {}, eval_loss=0.5)
    ck.close()
    assert sorted(os.listdir(tmp_path / "ck")) == ["2", "4"]  # nothing partial left


def test_resume_appends_and_eval_cli(trained, tmp_path, capsys):
    cfg, wd, _, _ = trained
    wd2 = str(tmp_path / "w")
    shutil.copytree(wd, wd2)
    before = Path(os.path.join(wd2, "metrics.jsonl")).read_text()
    t = JaxTrainer(tiny_run_config(steps=10, checkpoint_every=2, eval_every=2, keep_checkpoints=1, log_every=3),
                   wd2, resume=True, progress=False)
    assert t.start_step == 8
    t.run()
    after = Path(os.path.join(wd2, "metrics.jsonl")).read_text()
    assert after.startswith(before)  # appended, never truncated
    assert [r["step"] for r in read_metrics(wd2)] == list(range(1, 11))
    from jaxformer import cli
    assert cli.main(["eval", wd2, "--step", "best", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    best = json.loads(Path(os.path.join(wd2, "model", "best", "metrics.json")).read_text())
    assert out["step"] == best["step"]
    assert abs(out["eval_loss"] - best["eval_loss"]) <= 1e-6 * abs(best["eval_loss"])
    assert cli.main(["eval", wd2, "--step", "10"]) == 0


def test_nonfinite_step_leaves_state_unchanged(trained):
    """A NaN parameter makes the loss NaN: the jitted step returns params and optimiser state
    as they were and flags the step, so train.on_nonfinite=skip can go on."""
    cfg, _, t, _ = trained
    state = jax.tree.map(jnp.copy, t.state)
    leaves, tree = jax.tree.flatten(state["params"])
    leaves[0] = leaves[0].at[..., 0].set(jnp.nan)
    state = {**state, "params": jax.tree.unflatten(tree, leaves)}
    before = jax.device_get({"params": state["params"], "opt_state": state["opt_state"]})
    from jaxformer.train import data as data_lib
    batch = t._train_batch(data_lib.batch_at(t.train_data, 0, cfg.train.batch_size, cfg.train.seed))
    new, out = t.train_step(state, batch)
    assert int(out["nonfinite"]) != 0 and not np.isfinite(float(out["loss"]))
    after = jax.device_get({"params": new["params"], "opt_state": new["opt_state"]})
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after), strict=True):
        np.testing.assert_array_equal(a, b)
    assert int(new["step"]) == 9


def test_train_dropout_sets_every_rate():
    from jaxformer.train.jax_trainer import model_config_for_training
    cfg = tiny_run_config(dropout=0.3)
    m = model_config_for_training(cfg)
    assert m.dropout == m.attention.attn_dropout == m.feedforward.ffn_dropout == m.embed_dropout == 0.3


def test_sigterm_saves_and_exits_75(tmp_path):
    """SIGTERM mid-run: a checkpoint (training state and model/last) at the step it stopped
    at, exit code 75, one line on stderr."""
    path = tmp_path / "cfg.yaml"
    # the suite's CLI child run: the programs of the other children (workdir_helpers.child_run_dict)
    path.write_text(yaml.safe_dump(child_run_dict(steps=100000, checkpoint_every=100000, eval_every=100000)))
    wd = tmp_path / "w"
    proc = subprocess.Popen([sys.executable, "-m", "jaxformer", "train", "--config", str(path), "--workdir",
                             str(wd), "--no-progress"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=cli_env())
    try:
        wait_for_logged_steps(proc, wd, 2)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 75, err[-2000:]
    assert len(err.strip().splitlines()) == 1 and "stopped by SIGTERM" in err, err
    last = read_metrics(str(wd))[-1]["step"]
    assert checkpoint_steps(str(wd / "checkpoints")) == [last]
    assert json.loads((wd / "model" / "last" / "metrics.json").read_text())["step"] == last


def test_torch_trainer_writes_flax_model(tmp_path):
    import torch

    from jaxformer.checkpoint_io import load_model
    from jaxformer.convert import to_torch_state_dict
    from jaxformer.train.torch.trainer import TorchTrainer
    cfg = tiny_run_config(steps=2, checkpoint_every=2, eval_every=2)
    t = TorchTrainer(cfg, str(tmp_path), progress=False)
    t.run()
    _, _, model = load_model(str(tmp_path / "model" / "last"))
    back = to_torch_state_dict(model)
    for k, v in t.module.state_dict().items():
        assert torch.equal(back[k], v), k
    assert json.loads((tmp_path / "model" / "best" / "metrics.json").read_text())["step"] == 2
    assert TINY_RUN["model"]["d_model"] == 32


@pytest.mark.parametrize("message", [
    # tensorstore's messages for one EFBIG by the write that hit the limit (the first two
    # captured under RLIMIT_FSIZE at 120 and 1000 bytes); the third has the opening of one the
    # full-disk test below printed once under load (its middle was cut off in the log) and an
    # OS error given by its code alone: the old pattern, which wanted "Failed to write ...:
    # <words> [os_error_code=...]", let such a message through as a page of paths
    'OUT_OF_RANGE: Error opening "zarr" driver: Error writing "a.b/.zarray" in OCDBT database at local file '
    '"/w/": Failed writing: "/w/d/51d3.__lock": Failed to write 182 bytes to file 3: File too large '
    "[os_error_code='27'] [tensorstore_spec='{\"create\":true}']",
    'OUT_OF_RANGE: Error writing "a.b/0.0" in OCDBT database at local file "/w/": Failed writing: '
    "\"/w/d/d2ca.__lock\": Failed to write 609 bytes to file 4: File too large [os_error_code='27']",
    'OUT_OF_RANGE: Error opening "zarr" driver: Error writing "rest.decoder.layers.1.x" in OCDBT database '
    "at local file \"/w/ocdbt.process_0/\": Failed writing: \"/w/d/0.__lock\" [os_error_code='27']",
])
def test_a_failed_checkpoint_write_is_named_by_its_os_error(message):
    from jaxformer.train.checkpoint import _concise
    err = _concise(ValueError(message), "checkpoint step 2 in /w")
    assert isinstance(err, OSError) and err.errno == 27
    assert str(err) == "cannot write checkpoint step 2 in /w: File too large (nothing partial is kept)"
    other = ValueError("NOT_FOUND: no such key")  # no OS error: passed on as it is
    assert _concise(other, "checkpoint step 2 in /w") is other


def test_full_disk_at_a_checkpoint_leaves_nothing_partial(tmp_path):
    """Files over 48 KiB fail with EFBIG (RLIMIT_FSIZE, SIGXFSZ ignored), as on a full disk: the
    config and metrics fit, the step-2 checkpoint does not. Exit 2, the error's line names the
    step and the cause, that line is all of stderr (the background writers' echoes of the same
    failure are dropped: jaxformer.cli._BackgroundTracebackFilter), and no partial step or orbax
    temporary folder is left."""
    import resource

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (48 * 1024, 48 * 1024))

    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(child_run_dict(steps=2)))
    wd = tmp_path / "w"
    # the suite's compilation cache read only (the programs this file's runs compiled are read,
    # not compiled again): a minimum compile time no program reaches, as its new entries would
    # hit the same file-size limit; the suite's CLI child run (workdir_helpers.child_run_dict)
    # and cli_env's matmul precision, as the other CLI children's, or every program is another
    # one and compiles again
    env = cli_env(JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="1e9")
    r = subprocess.run([sys.executable, "-m", "jaxformer", "train", "--config", str(path), "--workdir", str(wd),
                        "--no-progress"], cwd=ROOT, capture_output=True, text=True, preexec_fn=limit, timeout=600,
                       env=env)
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert lines[0].startswith("jaxformer train: error: cannot write checkpoint step 2") and "File too large" in lines[0]
    assert os.listdir(wd / "checkpoints") == []
    assert not (wd / "model").exists()
