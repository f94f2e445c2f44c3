"""The JAX trainer's step loop (train/jax_trainer.py run): metrics stay on the device and are
fetched every train.log_every steps (and at eval/checkpoint/last steps), in one transfer per
block; throughput leaves the compiling first step out."""
from __future__ import annotations

import jax
import numpy as np
from workdir_helpers import tiny_run_config

from jaxformer.train.jax_trainer import JaxTrainer

FETCH = JaxTrainer._fetch


def _run(tmp_path, monkeypatch, log_every: int):
    fetched = []

    def counting(self, outs):
        # what reaches the fetch is still on the device: no step synced it before
        assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(outs))
        fetched.append(len(outs))
        return FETCH(self, outs)
    monkeypatch.setattr(JaxTrainer, "_fetch", counting)
    cfg = tiny_run_config(steps=10, log_every=log_every, eval_every=10, checkpoint_every=10)
    trainer = JaxTrainer(cfg, str(tmp_path / f"log{log_every}"), progress=False)
    history = trainer.run()
    return fetched, history, trainer.timing


def test_log_every_controls_when_metrics_are_fetched(tmp_path, monkeypatch):
    every_step, h1, t1 = _run(tmp_path, monkeypatch, 1)
    blocks, h5, t5 = _run(tmp_path, monkeypatch, 5)
    assert every_step == [1] * 10
    assert blocks == [5, 5]
    # the same steps and metrics either way: one record per step
    assert [r["step"] for r in h5] == list(range(1, 11))
    np.testing.assert_array_equal([r["loss"] for r in h1], [r["loss"] for r in h5])
    # throughput: the first (compiling) step is left out, every other step counted once
    assert t1["steps"] == t5["steps"] == 9 and t5["items"] == 9 * 4 * 16  # batch 4 x 16 target tokens


def test_log_every_is_overridden_by_eval_and_checkpoint_steps(tmp_path, monkeypatch):
    fetched = []
    monkeypatch.setattr(JaxTrainer, "_fetch", lambda self, outs: fetched.append(len(outs)) or FETCH(self, outs))
    cfg = tiny_run_config(steps=10, log_every=50, eval_every=3, checkpoint_every=5)
    JaxTrainer(cfg, str(tmp_path / "w"), progress=False).run()
    assert fetched == [3, 2, 1, 3, 1]  # steps 3 (eval), 5 (checkpoint), 6 (eval), 9 (eval), 10 (last)
