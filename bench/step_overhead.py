"""Host time per training step that is not device compute: the `lm` config's JAX trainer
(`JaxTrainer.run`, the real loop: batches, dispatch, metrics fetch, logging) at train.log_every
1 and 50, against the same jitted step run back to back on one device-resident batch with no
host work and one sync at the end (the device's compute per step), measured right before and
right after each trainer run (their mean; on a shared machine the load drifts). All in one run.

    python bench/step_overhead.py [--steps 51] [--log-every 1 50] [--set KEY=VALUE ...]

step_s: the trainer's own timing (JaxTrainer.timing: blocks of steps from the end of the
previous block's host work to the metrics fetch; the first, compiling step left out).
host_overhead_frac = (step_s - device_step_s) / step_s. Target (issue 18): at most 0.02 at
log_every 50. host_batch_s: the loop's per-step host work timed alone (see host_batch_s).
The last line is a JSON list of {log_every, step_s, device_step_s, host_overhead_frac,
host_batch_s, ...}. Not a test: it times things.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def device_step_s(trainer, steps: int) -> float:
    """Seconds per step of the trainer's jitted step alone: one batch already on the device,
    `steps` dispatches, one wait at the end."""
    import jax

    from jaxformer.train import data as data_lib
    tc = trainer.cfg.train
    batch = jax.device_put(trainer._train_batch(data_lib.batch_at(trainer.train_data, 0, tc.batch_size, tc.seed)))
    state = trainer._replicate(jax.tree.map(lambda x: x.copy(), trainer.state))  # the step donates it
    state, out = trainer.train_step(state, batch)  # compiled already; warm the buffers
    jax.block_until_ready((state, out))
    t0 = time.perf_counter()
    for _ in range(steps):
        state, out = trainer.train_step(state, batch)
    jax.block_until_ready((state, out))
    return (time.perf_counter() - t0) / steps


def host_batch_s(trainer, steps: int) -> float:
    """Seconds per step of the loop's own per-step host work without the step: the batch of
    the step (gather, reshape) and the item count. It bounds what the host adds per step
    when dispatch runs ahead of the device (log_every > 1) and does not drift with the load
    the way the step's own time does."""
    from jaxformer.train import data as data_lib
    from jaxformer.train import tasks
    tc = trainer.cfg.train
    t0 = time.perf_counter()
    for step in range(steps):
        host_batch = data_lib.batch_at(trainer.train_data, step, tc.batch_size, tc.seed)
        trainer._train_batch(host_batch)
        tasks.tokens_in(trainer.cfg.model_name, host_batch)
    return (time.perf_counter() - t0) / steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="lm")
    p.add_argument("--steps", type=int, default=51, help="trainer steps per log_every (the first compiles)")
    p.add_argument("--log-every", type=int, nargs="+", default=[1, 50])
    p.add_argument("--set", dest="overrides", action="append", default=[])
    args = p.parse_args()
    from jaxformer.train.config import load_config
    from jaxformer.train.jax_trainer import JaxTrainer

    rows = []
    for every in args.log_every:
        cfg = load_config(args.config, [*args.overrides, f"train.steps={args.steps}", f"train.log_every={every}",
                                        f"train.eval_every={args.steps}", f"train.checkpoint_every={args.steps}"])
        with tempfile.TemporaryDirectory() as wd:
            trainer = JaxTrainer(cfg, os.path.join(wd, "run"), progress=False)
            half = max(1, (args.steps - 1) // 2)
            before = device_step_s(trainer, half)  # also compiles the step
            trainer.run()
            t = trainer.timing
            step_s = t["seconds"] / t["steps"]
            after = device_step_s(trainer, half)
            dev = (before + after) / 2
            batch_s = host_batch_s(trainer, 200)
        frac = max(0.0, (step_s - dev) / step_s)
        rows.append({"log_every": every, "step_s": round(step_s, 5), "device_step_s": round(dev, 5),
                     "host_overhead_frac": round(frac, 4), "timed_steps": t["steps"],
                     "device_step_s_before_after": [round(before, 5), round(after, 5)],
                     "host_batch_s": round(batch_s, 6), "host_batch_frac": round(batch_s / step_s, 5)})
        print(f"log_every {every:3d}: loop {step_s * 1e3:8.2f} ms/step, step alone {dev * 1e3:8.2f} ms/step "
              f"(before {before * 1e3:.0f}, after {after * 1e3:.0f}), "
              f"host overhead {100 * frac:5.2f}% ({t['steps']} timed steps); per-step host batch work "
              f"{batch_s * 1e3:.3f} ms = {100 * batch_s / step_s:.3f}% of the step", flush=True)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
