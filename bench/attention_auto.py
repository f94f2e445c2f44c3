"""Where train.attention "auto" switches from plain to blockwise attention on CPU
(jaxformer/lowering.py AUTO_BLOCKWISE_MIN_KEYS): one causal self-attention call's forward and
backward (the gradients of q, k and v), plain vs blockwise, time and XLA's compiled temporaries
side by side, by sequence length. Not a test.

Each (impl, T) is jitted as the train steps are (lowering.train_compiler_options()), through
jaxformer's own dispatch (layers/dispatch.py dot_product_attention with the LM's causal
AttentionMask) traced under lowering.tracing(attention=impl), blocks at the default (512, 512).
step_s is the best of --rounds rounds, the two impls alternating within each round so both see
the same load; temp_bytes is memory_analysis()'s temporaries of the compiled gradient. Each row
gives blockwise / plain ratios at its T. The threshold is the first T from which blockwise is at
least as fast as plain at every longer T measured.

The last line is JSON: {"rows": [...], "threshold": T}.

    python bench/attention_auto.py                                   # T = 128 .. 4096
    python bench/attention_auto.py --lengths 512 1024 2048 --rounds 5
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the CPU's threshold (libtpu, where installed, is no backend here)

IMPLS = ("plain", "blockwise")


def compiled_grad(impl: str, b: int, t: int, h: int, g: int, k: int):
    """The jitted gradient of sum(attention(q, k, v) * ct) over q, k, v -> (compiled, inputs)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxformer import lowering
    from jaxformer.layers.dispatch import dot_product_attention
    from jaxformer.layers.masks import AttentionMask

    r = np.random.RandomState(0)
    q = jnp.asarray(r.standard_normal((b, t, h, k)), jnp.float32)
    kk, v = (jnp.asarray(r.standard_normal((b, t, g, k)), jnp.float32) for _ in range(2))
    ct = jnp.asarray(r.standard_normal((b, t, h, k)), jnp.float32)

    def loss(q, kk, v, ct):
        mask = AttentionMask.self_attention(1, t, causal=True)
        return jnp.sum(dot_product_attention(q, kk, v, mask=mask) * ct)

    fn = jax.jit(jax.grad(loss, argnums=(0, 1, 2)), compiler_options=lowering.train_compiler_options())
    with lowering.tracing(attention=impl):
        compiled = fn.lower(q, kk, v, ct).compile()
    return compiled, (q, kk, v, ct)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[128, 256, 512, 1024, 2048, 4096])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, nargs=3, default=[8, 4, 64], metavar=("H", "G", "K"),
                    help="query heads, key/value heads, head dim")
    args = ap.parse_args(argv)
    import jax

    h, g, k = args.heads
    print(f"jax {jax.__version__}, backend {jax.default_backend()}, {os.cpu_count()} CPUs, {platform.processor()}, "
          f"load {os.getloadavg()[0]:.1f}; B {args.batch}, H {h}, G {g}, K {k}, fp32, causal", flush=True)
    rows = []
    for t in args.lengths:
        progs = {impl: compiled_grad(impl, args.batch, t, h, g, k) for impl in IMPLS}
        times = {impl: [] for impl in IMPLS}
        for _ in range(args.rounds):
            for impl, (fn, inputs) in progs.items():
                jax.block_until_ready(fn(*inputs))  # warm
                t0 = time.perf_counter()
                jax.block_until_ready(fn(*inputs))
                times[impl].append(time.perf_counter() - t0)
        row = {"seq_len": t}
        for impl, (fn, _) in progs.items():
            row[impl] = {"step_s": round(min(times[impl]), 5), "rounds_s": [round(x, 5) for x in times[impl]],
                         "temp_bytes": int(fn.memory_analysis().temp_size_in_bytes)}
        row["time_ratio"] = round(row["blockwise"]["step_s"] / row["plain"]["step_s"], 3)
        row["temp_ratio"] = round(row["blockwise"]["temp_bytes"] / max(row["plain"]["temp_bytes"], 1), 4)
        rows.append(row)
        print(f"T {t:6d}: plain {row['plain']['step_s'] * 1e3:9.2f} ms {row['plain']['temp_bytes'] / 2**20:9.1f} MiB | "
              f"blockwise {row['blockwise']['step_s'] * 1e3:9.2f} ms {row['blockwise']['temp_bytes'] / 2**20:8.1f} MiB | "
              f"time x{row['time_ratio']:.2f}, temporaries x{row['temp_ratio']:.3f}", flush=True)
    threshold = None
    for i, row in enumerate(rows):  # the first T from which blockwise wins at every longer T measured
        if all(r["time_ratio"] <= 1.0 for r in rows[i:]):
            threshold = row["seq_len"]
            break
    print(f"blockwise at least as fast as plain from T = {threshold} on", flush=True)
    print(json.dumps({"rows": rows, "threshold": threshold}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
