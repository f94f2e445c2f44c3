"""Train-step time: jaxformer (jax.jit) vs torch_ref eager vs torch_ref under torch.compile, side
by side in one run, on the classifier config's model (vocab 30000, d_model 256, 8 heads,
d_ff 1024, 6 layers, batch 32, seq 128, AdamW, clipping 1.0). Reported as ratios to torch eager.

    python bench/train_step.py [--steps 10] [--warmup 3] [--no-compile] [--profile DIR]

Not a test: it times things. The implementations run in rounds, one step of each per round.
fp32, dropout 0.1 in both (the classifier config's value; BENCH_DROPOUT=0 in the environment turns it off
in both).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SEED_CLASSIFIER = dict(name="classifier", vocab_size=30000, d_model=256, num_heads=8, d_ff=1024, num_layers=6,
                       max_len=128, num_classes=2, dropout=float(os.environ.get("BENCH_DROPOUT", 0.1)), norm_position="post", pad_id=0)
TRAIN = dict(steps=1000, batch_size=32, lr=1e-4, weight_decay=0.01, grad_clip=1.0, warmup_steps=0,
             schedule="constant", eval_every=1000, checkpoint_every=1000)


def make_cfg():
    from jaxformer.train.config import config_from_dict
    return config_from_dict({"model": SEED_CLASSIFIER, "data": {"name": "text_source", "seq_len": 128},
                             "train": TRAIN})


def batch(seed=0):
    import numpy as np
    r = np.random.default_rng(seed)
    ids = r.integers(1, 30000, size=(32, 128)).astype(np.int32)
    ids[:, 100:] = np.where(r.random((32, 28)) < 0.5, 0, ids[:, 100:])  # some padding
    return {"ids": ids, "labels": r.integers(0, 2, size=32).astype(np.int32)}


def time_rounds(runners: dict, steps: int, warmup: int) -> dict:
    """runners: name -> one train step. Warms each up, then times them in rounds, one step of
    each per round, so a slow spell of this shared machine falls on all of them alike.
    -> name -> [seconds per round]."""
    for fn in runners.values():
        for _ in range(warmup):
            fn()
    times = {name: [] for name in runners}
    for _ in range(steps):
        for name, fn in runners.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    return times


def bench_jax(cfg, b):
    import jax
    from flax import nnx

    from jaxformer.train.jax_trainer import StepFns, build_jax_model, init_state, shape_batch
    from jaxformer.train.optim import make_optax
    model = build_jax_model(cfg)
    _, params, _ = nnx.split(model, nnx.Param, ...)
    tx, sched = make_optax(cfg.train, params)
    fns = StepFns(cfg, model, tx, sched)
    step = jax.jit(fns.train_step, donate_argnums=0)
    holder = {"state": init_state(cfg, model, tx)}
    db = jax.device_put(shape_batch(b, 1))

    def run():
        holder["state"], out = step(holder["state"], db)
        jax.block_until_ready(out["loss"])
    return run


def profile_jax(run, directory):
    import jax
    jax.profiler.start_trace(directory)
    for _ in range(3):
        run()
    jax.profiler.stop_trace()


def bench_torch(cfg, b, compile_=False):
    import torch

    from jaxformer.train.optim import make_torch_optimizer
    from jaxformer.train.torch.tasks import forward_loss
    from jaxformer.train.torch.trainer import build_torch_model
    module = build_torch_model(cfg)
    module.train()
    opt, sched = make_torch_optimizer(cfg.train, module)
    tb = {k: torch.from_numpy(v) for k, v in b.items()}
    fwd = torch.compile(module) if compile_ else module

    def run():
        opt.zero_grad(set_to_none=True)
        loss, count, _ = forward_loss("classifier", fwd, tb, 0.0)
        (loss / count).backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
        opt.step()
        sched.step()
    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--profile", default=None, help="write a JAX trace here")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import jax
    import torch
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, torch {torch.__version__} "
          f"threads {torch.get_num_threads()}", flush=True)
    cfg, b = make_cfg(), batch()
    runners = {"torch_eager": bench_torch(cfg, b), "jaxformer_jit": bench_jax(cfg, b)}
    if not args.no_compile:
        try:
            runners["torch_compile"] = bench_torch(cfg, b, compile_=True)
            runners["torch_compile"]()  # compiles here, so a failure is reported, not fatal
        except Exception as e:  # inductor needs a C++ toolchain; report instead of dying
            runners.pop("torch_compile", None)
            print(f"torch.compile failed: {type(e).__name__}: {e}", flush=True)
    results = time_rounds(runners, args.steps, args.warmup)
    if args.profile:
        profile_jax(runners["jaxformer_jit"], args.profile)
    base = statistics.median(results["torch_eager"])
    rows = []
    for name, ts in results.items():
        med = statistics.median(ts)
        per_round = statistics.median(t / e for t, e in zip(ts, results["torch_eager"], strict=True))
        rows.append({"impl": name, "median_s_per_step": med, "ratio_to_torch_eager": med / base,
                     "median_per_round_ratio": per_round})
        print(f"{name:15s} {med:7.3f} s/step   ratio to torch eager {med / base:5.2f}   "
              f"(median of per-round ratios {per_round:4.2f}; min {min(ts):.3f} s)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
