"""Faults on a two-process run (jax.distributed on localhost, gloo CPU collectives; issue 51,
docs/scale.md "Faults on a multi-process run"): a peer SIGKILLed (process 0, which started the
coordination service) or SIGSTOPped mid-run makes the survivor exit 69 within the heartbeat
bound with one line naming the lost process, writing no partial checkpoint; SIGTERM to both
processes at different moments saves one agreed step on both and exits 0 within the grace
period. Every restart of both processes with --resume continues bit for bit as the
uninterrupted run (its metrics and its final weights)."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import yaml
from helpers import host_devices_env

sys.path.insert(0, os.path.dirname(__file__))
from test_train import FAMILIES, ROOT, TRAIN

from jaxformer.train.checkpoint import committed_steps
from jaxformer.train.faults import SERVICE_LINGER
from jaxformer.train.logging_utils import read_metrics

STEPS = 16  # the uninterrupted run, and where every resume ends
# --heartbeat-timeout for these runs, seconds: short, but far above any pause of a healthy
# process's beat thread on a loaded 2-core machine (the faulted runs and every resume use it)
HEARTBEAT = 10
# the survivor's exit, from the fault: the heartbeat timeout and about a second (a beat and the
# judge's check; 5.2-5.8 s measured at 5 s), with a wide margin for a loaded machine
BOUND = HEARTBEAT + 15
GRACE = 40  # --preemption-grace, seconds


def _run_dict(steps: int) -> dict:
    """A tiny GPT-2 on a 2 process x 2 device data mesh; inverse_sqrt, whose lr does not read
    train.steps, so a run of 100000 steps cut short resumes into the STEPS-step run."""
    model, data = FAMILIES["lm_gpt2"]
    return {"model": dict(model), "data": dict(data),
            "train": {**TRAIN, "steps": steps, "batch_size": 16, "grad_accum_steps": 2, "init": "normal_0.02",
                      "schedule": "inverse_sqrt", "checkpoint_every": 4, "eval_every": 4, "sample_tokens": 0},
            "parallel": {"mode": "mesh", "mesh": {"data": -1}}}


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(tmp_path, wd, steps: int, *extra, resume: bool = False) -> list[subprocess.Popen]:
    """Both processes of a run, stderr of each to its own file."""
    path = tmp_path / f"cfg{steps}.yaml"
    path.write_text(yaml.safe_dump(_run_dict(steps)))
    port, env = _free_port(), host_devices_env(2)
    procs = []
    run = len(list(tmp_path.glob("*.p0.err")))  # this test's runs so far: each keeps its own files
    for i in range(2):
        with open(f"{wd}.{run}.p{i}.err", "w") as err:  # the child keeps its own descriptor
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "jaxformer", "train", "--config", str(path), "--workdir", str(wd),
                 "--no-progress", "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2", "--process-id",
                 str(i), "--heartbeat-timeout", str(HEARTBEAT), *extra, *(["--resume"] if resume else [])],
                cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err))
        procs[-1].err_path = err.name
        procs[-1].port = port
    return procs


def _services(port: int) -> list[int]:
    """The pids of coordination-service processes (jaxformer/train/coordinator.py) on `port`."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if b"jaxformer.train.coordinator" in args and any(a.endswith(f":{port}".encode()) for a in args):
            pids.append(int(pid))
    return pids


def _stderr(p) -> str:
    with open(p.err_path) as f:
        return f.read()


def _finish(procs, timeout=300) -> list[int]:
    try:
        return [p.wait(timeout=timeout) for p in procs]
    finally:
        _kill(procs)


def _kill(procs) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def _logged(wd) -> list[int]:
    try:
        return [r["step"] for r in read_metrics(str(wd))]
    except OSError:
        return []


def _wait_mid_run(procs, wd) -> None:
    """Until step 6 is logged with the step-4 checkpoint committed (between checkpoints)."""
    deadline = time.monotonic() + 300  # start-up and compiles on a loaded machine
    while len(_logged(wd)) < 6 or 4 not in committed_steps(str(wd / "checkpoints")):
        for p in procs:
            assert p.poll() is None, f"exited with {p.returncode}: {_stderr(p)[-2000:]}"
        assert time.monotonic() < deadline, "no step 6 after 300 s"
        time.sleep(0.05)


def _params(wd) -> dict:
    import jax
    from flax import nnx

    import jaxformer
    model, _ = jaxformer.load(str(wd))
    return {"/".join(map(str, k)): np.asarray(v) for k, v in
            jax.tree_util.tree_leaves_with_path(nnx.to_pure_dict(nnx.state(model, nnx.Param)))}


class _Reference:
    """The STEPS-step two-process run, started in the background when the module's first test
    asks for it (its processes mostly wait on each other and on start-up, so it overlaps the
    faulted run the test starts next); `result()` waits for it -> (metrics records, final weights)."""

    def __init__(self, d):
        self.wd = d / "ref"
        self.procs = _start(d, self.wd, STEPS)
        self._result = None

    def result(self):
        if self._result is None:
            codes = _finish(self.procs)
            assert codes == [0, 0], [_stderr(p)[-2000:] for p in self.procs]
            self._result = read_metrics(str(self.wd)), _params(self.wd)
        return self._result


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    ref = _Reference(tmp_path_factory.mktemp("faults_ref"))
    yield ref
    _kill(ref.procs)


def _resume_matches(tmp_path, wd, uninterrupted, stopped_at=None) -> None:
    """Restart both processes with --resume to STEPS: the uninterrupted run's metrics (every
    step, evals included) and final weights, bit for bit. `stopped_at`: a preemption's step,
    whose record also holds the eval every checkpoint is saved with."""
    procs = _start(tmp_path, wd, STEPS, resume=True)
    codes = _finish(procs)
    assert codes == [0, 0], [_stderr(p)[-2000:] for p in procs]
    assert not _services(procs[0].port)  # a run that ends well stops its service as it ends
    records, params = uninterrupted.result()
    got = read_metrics(str(wd))
    if stopped_at is not None and stopped_at % 4:  # an eval the uninterrupted run did not do there
        assert {k for k in got[stopped_at - 1] if k.startswith("eval_")} == {"eval_loss", "eval_token_accuracy",
                                                                              "eval_perplexity"}
        got[stopped_at - 1] = {k: v for k, v in got[stopped_at - 1].items() if not k.startswith("eval_")}
    assert got == records
    weights = _params(wd)
    assert weights.keys() == params.keys()
    for k in params:
        assert np.array_equal(weights[k], params[k]), k


def _no_partial_step(wd) -> None:
    """Every step-named entry of the checkpoints is a committed step (a write cut short stays
    under orbax's temporary name, which no restore reads)."""
    ckpt = wd / "checkpoints"
    steps = sorted(int(n) for n in os.listdir(ckpt) if n.isdigit())
    assert steps == committed_steps(str(ckpt)), os.listdir(ckpt)


@pytest.mark.parametrize(("sig", "victim"), [("SIGKILL", 0), ("SIGSTOP", 1)])
def test_lost_peer_ends_the_survivor(sig, victim, tmp_path, request):
    """Process 0 SIGKILLed (dead: the coordination service outlives it, coordinator.py) or
    process 1 SIGSTOPped (hung) mid-run: the other exits 69 within BOUND seconds with one line
    naming the lost process and no traceback; no partial checkpoint; both restarted with
    --resume continue as the uninterrupted run. (A dead process 1 ends process 0 the same way:
    its beat stops, as a hung one's does, and its collective fails as process 0's does here.)"""
    # the reference run starts now, beside this one (the SIGSTOP case resumes nothing: none)
    uninterrupted = request.getfixturevalue("uninterrupted") if sig == "SIGKILL" else None
    wd = tmp_path / "w"
    procs = _start(tmp_path, wd, 100000)
    survivor = procs[1 - victim]
    try:
        _wait_mid_run(procs, wd)
        t0 = time.monotonic()
        os.kill(procs[victim].pid, getattr(signal, sig))
        try:
            code = survivor.wait(timeout=BOUND + 60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"process {1 - victim} still running {BOUND + 60} s after its peer's {sig}")
        took = time.monotonic() - t0
    finally:
        _kill(procs)  # the stopped process too
    err = _stderr(survivor)
    lines = [ln for ln in err.splitlines() if ln.startswith("jaxformer train")]
    print(f"{sig} of process {victim}: process {1 - victim} exited {code} after {took:.1f} s: {lines}")
    assert code == 69, err[-3000:]
    assert took < BOUND, took
    assert len(lines) == 1 and f"error: process {victim} of 2 stopped responding" in lines[0], err[-3000:]
    assert "Traceback" not in err and "Check failure" not in err, err[-3000:]
    _no_partial_step(wd)
    assert committed_steps(str(wd / "checkpoints"))[-1] >= 4
    if sig == "SIGKILL":  # (the hung peer leaves the same checkpoints: its resume is not run again)
        _resume_matches(tmp_path, wd, uninterrupted)
        # the crashed process 0's service ends on its own, HEARTBEAT + SERVICE_LINGER s after it
        deadline = time.monotonic() + HEARTBEAT + SERVICE_LINGER + 60
        while _services(procs[0].port) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _services(procs[0].port)


def test_preemption_saves_one_agreed_step(tmp_path, uninterrupted):
    """SIGTERM to process 0 mid-run, to process 1 a moment later (at another step): both exit 0
    within the grace period, having saved the same step (each its data position in it), and
    the resume continues as the uninterrupted run."""
    wd = tmp_path / "w"
    procs = _start(tmp_path, wd, 100000, "--preemption-grace", str(GRACE))
    try:
        _wait_mid_run(procs, wd)
        t0 = time.monotonic()
        procs[0].send_signal(signal.SIGTERM)
        at = _logged(wd)[-1]
        while _logged(wd)[-1] == at and procs[1].poll() is None and time.monotonic() - t0 < 5:
            time.sleep(0.01)  # process 1's signal at a later step than process 0's
        procs[1].send_signal(signal.SIGTERM)
        codes = [p.wait(timeout=GRACE + 60) for p in procs]
        took = time.monotonic() - t0
    finally:
        _kill(procs)
    errs = [_stderr(p) for p in procs]
    print(f"SIGTERM at step {at} (process 0) and later (process 1): exits {codes} after {took:.1f} s; "
          f"{[ln for e in errs for ln in e.splitlines() if ln.startswith('jaxformer')]}")
    assert codes == [0, 0], [e[-2000:] for e in errs]
    assert took < GRACE
    saved = committed_steps(str(wd / "checkpoints"))
    last = _logged(wd)[-1]
    assert saved[-1] == last > at, (saved, last, at)
    for i in range(2):  # both processes wrote the agreed step
        assert (wd / "checkpoints" / str(last) / "data" / f"process_{i}-of-2.json").exists()
    assert json.loads((wd / "model" / "last" / "metrics.json").read_text())["step"] == last
    assert f"stopped at step {last}, checkpoint saved" in errs[0], errs[0][-2000:]
    _no_partial_step(wd)
    # JAX's notifier polls once a second: a few steps pass before the agreed one (8-10 measured
    # on a loaded 2-core machine); a faster machine may run past STEPS in that second, and then
    # the run itself is compared with the uninterrupted one's first STEPS steps (the resume from
    # a preempted step is also checked by the SIGKILL test)
    if last < STEPS:
        _resume_matches(tmp_path, wd, uninterrupted, stopped_at=last)
    else:
        records, _ = uninterrupted.result()
        losses = [r["loss"] for r in read_metrics(str(wd)) if "loss" in r and r["step"] <= STEPS]
        assert losses == [r["loss"] for r in records if "loss" in r], (losses, records)


def test_grace_bounds_a_preemption_stop(tmp_path):
    """A stop that cannot finish within --preemption-grace (here 1 ms: the step's eval and
    checkpoint take longer) ends the process with exit 124 and one line, and leaves no partial
    step (one process: the same watchdog as several)."""
    from helpers import cli_env
    from workdir_helpers import child_run_dict, wait_for_logged_steps
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(child_run_dict(steps=100000, checkpoint_every=100000, eval_every=100000)))
    wd = tmp_path / "w"
    proc = subprocess.Popen([sys.executable, "-m", "jaxformer", "train", "--config", str(path), "--workdir", str(wd),
                             "--no-progress", "--preemption-grace", "0.001"], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=cli_env())
    try:
        wait_for_logged_steps(proc, wd, 2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        _kill([proc])
    assert proc.returncode == 124, err[-2000:]
    lines = [ln for ln in err.splitlines() if ln.startswith("jaxformer train")]
    assert len(lines) == 1 and "not stopped within the grace period (--preemption-grace 0.001 s)" in lines[0], err
    if (wd / "checkpoints").exists():
        _no_partial_step(wd)
