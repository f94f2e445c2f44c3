"""Compile time of the jitted train step, scanned vs unrolled layers, for 2 and 24 layers.
Target: a 24-layer scanned model compiles in <= 2x the time of a 2-layer one (an unrolled
24-layer model grows roughly linearly). Not a test: it times compilation.

    python bench/scan_compile.py
"""
from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def compile_seconds(layers: int, scan: bool) -> float:
    import jax
    import numpy as np
    from flax import nnx

    from jaxformer.convert import scan_prefixes
    from jaxformer.train.config import config_from_dict
    from jaxformer.train.jax_trainer import StepFns, build_jax_model, init_state, shape_batch
    from jaxformer.train.optim import make_optax
    cfg = config_from_dict({
        "model": {"name": "lm", "vocab_size": 259, "d_model": 128, "num_heads": 4, "d_ff": 512,
                  "num_layers": layers, "max_len": 128, "norm_position": "pre", "position": "rope",
                  "norm": "rmsnorm", "ffn": "swiglu", "bias": False, "scan_layers": scan},
        "data": {"name": "stdlib_docs", "seq_len": 64},
        "train": {"steps": 10, "batch_size": 8, "remat": True}})
    model = build_jax_model(cfg)
    _, params, _ = nnx.split(model, nnx.Param, ...)
    tx, sched = make_optax(cfg.train, params, scan_prefixes(model))
    fns = StepFns(cfg, model, tx, sched)
    state = init_state(cfg, model, tx)
    batch = shape_batch({"tokens": np.zeros((8, 65), np.int32)}, 1)
    t = time.perf_counter()
    jax.jit(fns.train_step).lower(state, batch).compile()
    return time.perf_counter() - t


def main() -> None:
    rows = {}
    for scan in (True, False):
        for layers in (2, 24):
            rows[(scan, layers)] = compile_seconds(layers, scan)
            print(f"{'scan' if scan else 'loop':4s} {layers:2d} layers: compile {rows[(scan, layers)]:6.2f} s",
                  flush=True)
    print(f"scanned 24 / 2 layers: {rows[(True, 24)] / rows[(True, 2)]:.2f}x (target <= 2x); "
          f"unrolled 24 / 2 layers: {rows[(False, 24)] / rows[(False, 2)]:.2f}x")
    print(json.dumps({"compile_s": {f"{'scan' if s else 'loop'}_{n}": round(t, 3) for (s, n), t in rows.items()},
                      "scanned_24_over_2": rows[(True, 24)] / rows[(True, 2)],
                      "unrolled_24_over_2": rows[(False, 24)] / rows[(False, 2)]}))


if __name__ == "__main__":
    main()
