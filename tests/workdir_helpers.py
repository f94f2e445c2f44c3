"""A tiny training run for the workdir tests (tests/test_workdir.py, tests/test_bad_input.py),
imported by name: d_model 32, 2 layers, batch 4, byte-level LM on 16-byte windows."""
from __future__ import annotations

import contextlib
import os

import yaml

TINY_RUN = {
    "model": {"name": "lm", "vocab_size": 259, "max_len": 32, "d_model": 32, "num_heads": 4, "d_ff": 64,
              "num_layers": 2, "dropout": 0.0},
    "data": {"name": "stdlib_docs", "seq_len": 16},
    "train": {"steps": 4, "batch_size": 4, "eval_every": 2, "eval_batches": 1, "checkpoint_every": 2,
              "async_checkpoint": False, "warmup_steps": 2,
              # inverse_sqrt: the lr does not depend on train.steps, so runs of any length share
              # one compiled train step (the suite's compilation cache)
              "schedule": "inverse_sqrt"},
}


def tiny_run_dict(**train) -> dict:
    return {**TINY_RUN, "train": {**TINY_RUN["train"], **train}}


def tiny_run_config(**train):
    from jaxformer.train.config import config_from_dict
    return config_from_dict(tiny_run_dict(**train))


def write_tiny_config(path: str, **train) -> str:
    with open(path, "w") as f:
        yaml.safe_dump(tiny_run_dict(**train), f)
    return path


def child_run_dict(**train) -> dict:
    """The run of every `jaxformer train` child process of the suite (tests/test_train.py's
    SIGKILL, tests/test_workdir.py's SIGTERM and full-disk runs, tests/test_bad_input.py's
    train_full_disk): one model, schedule and batch, so whichever child comes later reads the
    first one's init, train and eval programs from the suite's compilation cache
    (tests/conftest.py) instead of compiling its own. The tiny run with dropout 0.1: the SIGKILL
    resume checks that the dropout RNG streams resume exactly."""
    run = tiny_run_dict(**train)
    return {**run, "model": {**run["model"], "dropout": 0.1}}


@contextlib.contextmanager
def writing_compilation_cache():
    """Inside, this process also writes what it compiles to the suite's compilation cache
    (tests/conftest.py; the test processes otherwise leave it to the CLI children), for a CLI
    child run next that compiles the same programs: it reads them instead. Restored on exit."""
    import jax
    from jax._src import compilation_cache
    path = os.environ.get("JAX_COMPILATION_CACHE_DIR")
    if not path or jax.config.jax_compilation_cache_dir:
        yield
        return
    before = jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    compilation_cache.reset_cache()
    try:
        yield
    finally:
        jax.config.update("jax_compilation_cache_dir", None)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", before)
        compilation_cache.reset_cache()


def wait_for_logged_steps(proc, workdir, n: int, timeout: float = 300.0) -> None:
    """Poll until the training child `proc` has logged `n` steps in workdir/metrics.jsonl
    (generous `timeout`: start-up and compiles on a loaded machine); fail with the child's
    stderr if it exits first."""
    import time
    path = os.path.join(str(workdir), "metrics.jsonl")
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError), open(path) as f:
            if sum(1 for _ in f) >= n:
                return
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert time.monotonic() < deadline, f"no step {n} logged after {timeout:g} s"
        time.sleep(0.05)
