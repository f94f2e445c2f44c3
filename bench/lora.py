"""Memory of a LoRA train step against full fine-tuning on a Llama-3.2-1B-shaped model (random
weights; not a test). Issue 23's target: train-state memory at most 0.1x full fine-tuning's.

Llama-3.2-1B's shapes: vocab 128256, D 2048, 16 layers, GQA 32/8 heads, F 8192, tied
embeddings (1.24B params). Contenders, each in its own child process (peak RSS is per process):

    lora_fp32   train.lora r=16 on q/k/v/o/gate/up/down (PEFT alpha 8), fp32 base, 16 layers
    lora_int8   the same with the base stored int8 (QLoRA style), 16 layers
    full        full fine-tuning (AdamW over every param), at --full-layers layers (default 4):
                at 16 layers it needs ~20 GB (5 GB params, 10 GB Adam, 5 GB gradients), more
                than a shared 24 GB machine can give; the LoRA contenders are also run at that
                depth for a like-for-like peak.

Each child builds the train state the JAX trainer builds (train/init.py create_state, the same
StepFns, jitted with the state donated), runs --steps steps on a random batch [B, T], and
reports: train-state bytes by part (trainable params, optimiser state, frozen base; measured
from the arrays), peak RSS (VmHWM from /proc/self/status at exit) and the step time. Full
fine-tuning's 16-layer train-state bytes are exact from jax.eval_shape of its state (no
allocation). The last line is JSON.

    python bench/lora.py                    # seq 32, batch 1, 2 steps
    python bench/lora.py --full-layers 2 --seq 16
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LLAMA_1B = dict(vocab_size=128256, d_model=2048, num_heads=32, num_kv_heads=8, d_ff=8192, num_layers=16,
                max_len=2048, tie_embeddings=True, norm_eps=1e-5)
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def run_config(layers: int, lora: dict | None, seq: int, batch: int):
    from jaxformer.config import to_dict
    from jaxformer.config.models import LMConfig
    from jaxformer.train.config import config_from_dict
    model = {"name": "lm", **to_dict(LMConfig.llama(**{**LLAMA_1B, "num_layers": layers, "dropout": 0.0}))}
    train = {"steps": 10, "batch_size": batch, "lr": 1e-4, "warmup_steps": 0, "schedule": "constant"}
    if lora is not None:
        train["lora"] = lora
    return config_from_dict({"model": model, "data": {"name": "stdlib_docs", "seq_len": seq}, "train": train})


def tree_bytes(tree) -> int:
    import jax
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def peak_rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def child(args) -> dict:
    """One contender: build the state, run the steps, report bytes, peak RSS and time."""
    import jax
    import numpy as np
    from flax import nnx

    from jaxformer.convert import scan_prefixes
    from jaxformer.train import init as init_lib
    from jaxformer.train import lora as lora_lib
    from jaxformer.train.optim import make_optax
    from jaxformer.train.steps import StepFns
    lora = None if args.contender == "full" else {"r": 16, "target_modules": TARGETS,
                                                  "base_dtype": args.contender.split("_")[1]}
    cfg = run_config(args.layers, lora, args.seq, args.batch)
    tc = cfg.train
    model = init_lib.abstract_model("lm", cfg.model, tc.seed, tc.lora)
    _, params, _, _ = lora_lib.split(model)
    tx, schedule = make_optax(tc, params, scan_prefixes(model))
    t0 = time.perf_counter()
    state = init_lib.create_state("lm", cfg.model, "normal_0.02", tc.seed, tx, lora_cfg=tc.lora)
    jax.block_until_ready(state)
    t_init = time.perf_counter() - t0
    sizes = {"trainable_params": tree_bytes(state["params"]), "opt_state": tree_bytes(state["opt_state"]),
             "frozen_base": tree_bytes(state.get("frozen", {}))}
    fns = StepFns(cfg, model, tx, schedule)
    step = jax.jit(fns.train_step, donate_argnums=0)
    tokens = np.random.RandomState(0).randint(0, LLAMA_1B["vocab_size"], (1, args.batch, args.seq + 1)).astype(np.int32)
    times, losses = [], []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        state, out = step(state, {"tokens": tokens})
        losses.append(float(out["loss"]))
        times.append(time.perf_counter() - t0)
    n_params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    return {"contender": args.contender, "layers": args.layers, "params": n_params,
            "trainable": sum(x.size for x in jax.tree.leaves(state["params"])), **sizes,
            "train_state": sum(sizes.values()), "peak_rss": peak_rss(), "init_s": round(t_init, 1),
            "first_step_s": round(times[0], 1), "step_s": round(min(times[1:] or times), 2), "losses": losses}


def full_state_bytes(layers: int) -> dict:
    """Full fine-tuning's params and AdamW state at `layers`, exact from jax.eval_shape."""
    from jaxformer.convert import scan_prefixes
    from jaxformer.train import init as init_lib
    from jaxformer.train.optim import make_optax
    cfg = run_config(layers, None, 16, 1)
    model = init_lib.abstract_model("lm", cfg.model, 0)
    state = init_lib.abstract_state_of(model, make_optax(cfg.train, init_lib.lora.split(model)[1],
                                                         scan_prefixes(model))[0])
    return {"trainable_params": tree_bytes(state["params"]), "opt_state": tree_bytes(state["opt_state"])}


def spawn(contender: str, layers: int, args) -> dict:
    cmd = [sys.executable, __file__, "--child", contender, "--layers", str(layers), "--seq", str(args.seq),
           "--batch", str(args.batch), "--steps", str(args.steps)]
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    if p.returncode:
        return {"contender": contender, "layers": layers, "error": p.stderr.strip().splitlines()[-1:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--full-layers", type=int, default=4)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=2)
    args = ap.parse_args(argv)
    if args.child:
        args.contender = args.child
        print(json.dumps(child(args)))
        return 0
    runs = [spawn("lora_fp32", 16, args), spawn("lora_int8", 16, args)]
    runs += [spawn(c, args.full_layers, args) for c in ("full", "lora_fp32", "lora_int8")]
    full16 = full_state_bytes(16)
    full16["train_state"] = sum(full16.values())
    gib = 2 ** 30
    print(f"{'contender':<10} {'layers':>6} {'trainable':>12} {'opt GiB':>9} {'base GiB':>9} {'state GiB':>10} "
          f"{'peak RSS GiB':>13} {'step s':>7}")
    for r in runs:
        if "error" in r:
            print(f"{r['contender']:<10} {r['layers']:>6} failed: {r['error']}")
            continue
        print(f"{r['contender']:<10} {r['layers']:>6} {r['trainable']:>12,} {r['opt_state'] / gib:>9.3f} "
              f"{r['frozen_base'] / gib:>9.3f} {r['train_state'] / gib:>10.3f} {r['peak_rss'] / gib:>13.2f} "
              f"{r['step_s']:>7}")
    print(f"{'full':<10} {16:>6} (jax.eval_shape) opt {full16['opt_state'] / gib:.3f} GiB, params "
          f"{full16['trainable_params'] / gib:.3f} GiB, train state {full16['train_state'] / gib:.3f} GiB")
    ratios = {}
    for r in runs[:2]:
        if "error" not in r:
            ratios[r["contender"]] = {"opt_state": r["opt_state"] / full16["opt_state"],
                                      "train_state_with_base": r["train_state"] / full16["train_state"],
                                      "trainable_and_opt": (r["opt_state"] + r["trainable_params"]) / full16["train_state"]}
    for name, v in ratios.items():
        print(f"{name} at 16 layers vs full fine-tuning: optimiser state {v['opt_state']:.4f}x, adapters + "
              f"optimiser state {v['trainable_and_opt']:.4f}x, whole train state (with the frozen base) "
              f"{v['train_state_with_base']:.3f}x")
    print(json.dumps({"runs": runs, "full_16_layers_state_bytes": full16, "ratios_16_layers": ratios,
                      "seq": args.seq, "batch": args.batch}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
