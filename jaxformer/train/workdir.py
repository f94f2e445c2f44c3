"""The training workdir's lifecycle, shared by both trainers: one run at a time (a lock), a
fresh run never mixes with an old one, a resume continues the same run.

    WORKDIR/.lock            flock'ed by the running process; holds "pid host"
    WORKDIR/config.yaml      the resolved config of the run
    WORKDIR/metrics.jsonl    appended, strict JSON (logging_utils.MetricsWriter)
    WORKDIR/checkpoints/     orbax training state (JAX); torch_checkpoints/ for torch
    WORKDIR/model/last|best  standalone model checkpoints (jaxformer/checkpoint_io.py)
    WORKDIR/tb/              TensorBoard events

Rules (each refusal is a ValueError raised before anything in WORKDIR is written):
- a fresh run needs an empty (or missing) workdir; --overwrite removes the run files first;
- --resume needs a checkpoint, and the stored config's model and data sections must equal the
  new ones (train-section changes are allowed and reported); a tokens dataset's tokenizer must
  be the one the checkpoint was trained with (its hash, recorded in the checkpoint);
- a second run on a locked workdir fails at once, naming the holder. flock is released by the
  kernel when the process dies, so a SIGKILLed run leaves no lock that blocks.
"""
from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import shutil
import signal
import socket
import threading

from jaxformer import fileio
from jaxformer.fileio import yaml_load

RUN_FILES = ("config.yaml", "metrics.jsonl", "checkpoints", "torch_checkpoints", "model", "tb",
             "best.json")
LOCK = ".lock"


class WorkdirLock:
    """An exclusive flock on WORKDIR/.lock for the life of the run (or until release())."""
    made_dirs: tuple[str, ...] = ()  # the folders open_workdir created for the run, deepest first

    def __init__(self, workdir: str):
        self.path = os.path.join(workdir, LOCK)
        self.created = not os.path.exists(self.path)
        fd = fileio.open_nofollow(self.path, os.O_RDWR | os.O_CREAT, 0o644)  # a planted link is refused
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise ValueError(f"workdir {workdir} is in use by {holder} (lock {self.path}); "
                                 f"wait for that run to finish or use another --workdir") from None
            raise
        self.fd = fd

    def claim(self) -> None:
        """Write this process's pid and host into the lock file (once the run is accepted)."""
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)

    def release(self, *, remove: bool = False) -> None:
        if self.fd is None:
            return
        if remove and self.created:  # a refused run leaves the workdir as it found it
            os.remove(self.path)
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        self.fd = None
        if remove:
            remove_made_dirs(self.made_dirs)


def missing_dirs(path: str) -> tuple[str, ...]:
    """The folders os.makedirs(path) would create, deepest first."""
    out, p = [], os.path.abspath(path)
    while not os.path.lexists(p):
        out.append(p)
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    return tuple(out)


def remove_made_dirs(made: tuple[str, ...]) -> None:
    """Remove the folders a refused run created, deepest first, each only while empty: a
    refusal leaves no empty workdir behind, and never a file someone put there meanwhile."""
    for d in made:
        try:
            os.rmdir(d)
        except OSError:
            return


def entries(workdir: str) -> list[str]:
    """The workdir's entries other than the lock file ([] if it does not exist)."""
    if not os.path.isdir(workdir):
        return []
    return sorted(n for n in os.listdir(workdir) if n != LOCK)


def clear_run_files(workdir: str) -> None:
    """--overwrite: remove the previous run's files (only those; other files stay)."""
    for name in RUN_FILES:
        p = os.path.join(workdir, name)
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p)
        elif os.path.lexists(p):
            os.remove(p)


def stored_config(workdir: str) -> dict | None:
    p = os.path.join(workdir, "config.yaml")
    if not os.path.exists(p):
        return None
    with open(p) as f:
        data = yaml_load(f) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{p}: must be a YAML mapping of the run's config sections, not a "
                         f"{type(data).__name__}")
    return data


def open_workdir(workdir: str, cfg, *, resume: bool, overwrite: bool, has_checkpoint: bool,
                 primary: bool = True) -> tuple[WorkdirLock | None, list[str]]:
    """Check the run may use `workdir` and take its lock (process 0). Raises ValueError naming
    the problem, with the workdir as it was. `has_checkpoint`: the trainer's own checkpoint
    folder holds a step. Returns the lock (None on other processes); the caller claims it
    once its own checks (e.g. the resumed step) pass, or releases it with remove=True; and the
    allowed config changes of a resume ("key: old -> new"), for the caller to report."""
    from jaxformer.train.config import config_changes
    if resume and overwrite:
        raise ValueError("--resume and --overwrite exclude each other")
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        raise NotADirectoryError(errno.ENOTDIR, "workdir is not a directory", workdir)
    if resume and not has_checkpoint:  # before the lock, which would create a missing workdir
        raise ValueError(f"--resume: no checkpoint in workdir {workdir}; "
                         f"start a fresh run without --resume")
    lock, allowed = None, []
    if primary:
        made = missing_dirs(workdir)
        os.makedirs(workdir, exist_ok=True)
        try:
            lock = WorkdirLock(workdir)
        except BaseException:
            remove_made_dirs(made)
            raise
        lock.made_dirs = made
    try:
        if resume:
            old = stored_config(workdir)
            if old is None:
                raise ValueError(f"--resume: workdir {workdir} has checkpoints but no config.yaml")
            breaking, allowed = config_changes(old, cfg)
            if breaking:
                raise ValueError(f"--resume: the model/data config differs from the run in {workdir}: "
                                 + "; ".join(breaking))
        elif not overwrite and entries(workdir):
            raise ValueError(f"workdir {workdir} is not empty (holds {', '.join(entries(workdir)[:4])}); "
                             f"pass --resume to continue its run or --overwrite to replace it")
        elif overwrite and primary:
            clear_run_files(workdir)
    except BaseException:
        if lock is not None:
            lock.release(remove=True)
        raise
    return lock, allowed


def check_resumed_step(step: int, steps: int, workdir: str) -> None:
    if steps <= step:
        raise ValueError(f"--resume: train.steps={steps} is at or below the checkpoint's step {step} "
                         f"in {workdir}; nothing to train (raise train.steps, e.g. --set train.steps={step * 2})")


def check_tokenizer(trained: dict | None, current: dict | None, workdir: str) -> None:
    """--resume: the data's tokenizer (data/tokens_data.py `tokenizer_record`) must be the one the
    checkpoint was trained with (its record's `tokenizer`): the same ids must mean the same text."""
    def key(t):
        return None if t is None else (t.get("sha256") or t.get("spec"), t.get("vocab_size"))
    if key(trained) != key(current):
        def say(t):
            return "none (byte-level embedded data)" if t is None else \
                f"{t.get('spec')!r} sha256 {str(t.get('sha256'))[:12]}, vocab {t.get('vocab_size')}"
        raise ValueError(f"--resume: the data's tokenizer ({say(current)}) differs from the one the "
                         f"checkpoint in {workdir} was trained with ({say(trained)})")


def best_eval_loss(workdir: str) -> float:
    """The eval loss of WORKDIR/model/best (inf if there is none), so a resumed run replaces
    it only when it improves on it."""
    p = os.path.join(workdir, "model", "best", "metrics.json")
    try:
        with open(p) as f:
            v = json.load(f).get("eval_loss")
        return float(v) if v is not None else float("inf")
    except (OSError, ValueError):
        return float("inf")


def write_info(path: str, info: dict) -> None:
    """A small JSON file (strict: non-finite numbers as null), written atomically."""
    from jaxformer.fileio import write_text
    clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in info.items()}
    write_text(path, json.dumps(clean, indent=1, allow_nan=False) + "\n")


class NonFiniteError(ValueError):
    """A NaN/inf loss or gradient norm with train.on_nonfinite: stop."""

    def __init__(self, what: str, step: int, saved_steps):
        last = f"step {saved_steps[-1]}" if saved_steps else "none"
        super().__init__(f"non-finite {what} at step {step}; stopped (nothing saved after it; last good "
                         f"checkpoint: {last}). Lower train.lr or set train.on_nonfinite=skip")


def nonfinite_names(code: int) -> str:
    """The train step's `nonfinite` code (1: loss, 2: grad norm, 3: both) -> words."""
    return " and ".join(n for bit, n in ((1, "loss"), (2, "gradient norm")) if code & bit)


class StopSignal:
    """While active, SIGTERM (what schedulers send before preemption) sets a flag that the
    training loop checks once per step; the loop then saves a checkpoint at that step and ends
    cleanly. A flag rather than work in the handler: the handler may run in the middle of a
    step or of an orbax write. Only installable from the main thread; elsewhere it stays inert.
    A second SIGTERM while stopping gets the default action (terminate). `on_signal(name)`, if
    given, is called from the handler (the grace watchdog's start: jaxformer/train/faults.py).
    `signals=()`: inert (a multi-process run, where JAX's preemption sync manager owns SIGTERM)."""

    def __init__(self, signals=(signal.SIGTERM,), on_signal=None):
        self.signals = signals
        self.on_signal = on_signal
        self.name: str | None = None
        self._old: dict = {}

    @property
    def requested(self) -> bool:
        return self.name is not None

    def _handle(self, signum, frame) -> None:
        self.name = signal.Signals(signum).name
        signal.signal(signum, signal.SIG_DFL)
        if self.on_signal is not None:
            self.on_signal(self.name)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for s in self.signals:
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)
        self._old = {}
