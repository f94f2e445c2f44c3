"""Per-device compiled temporaries of one ring-attention gradient (jaxformer/layers/kernels/ring.py) on 8
host CPU devices, the whole 8 on the context axis (not a test; docs/numerics.md §30).

The function is the gradient of sum(sin(ring attention)) with respect to q, k and v under a
causal mask in the zigzag layout, B 1, H 4, G 2, K 32 (§30's sizes). XLA's memory_analysis of the
compiled program gives temp_size_in_bytes: the temporaries of one device's program (the score
blocks, the blocks in flight, the buffers of the backward), not its inputs or outputs. With
--run, the compiled gradient also runs once to warm up and then --steps times; step_s is the
best (wall clock on the host's CPU, not comparable across loads).

    python bench/ring_memory.py                                  # T 2048, 4096; blocks 512, 128
    python bench/ring_memory.py --lengths 2048 --blocks 64 --run

The last line is JSON: a list of rows {seq_len, block, temp_bytes, step_s}.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

B, H, G, K, N = 1, 4, 2, 32, 8


def measure(seq_len: int, block: int, run: bool, steps: int) -> dict:
    import jax
    import jax.numpy as jnp

    from jaxformer import lowering
    from jaxformer.layers.attention import AttentionMask, dot_product_attention
    from jaxformer.layers.kernels import ring

    order = ring.zigzag_order(seq_len, N)
    mask = ring.permute_mask(AttentionMask.self_attention(1, seq_len, causal=True), order)
    ks = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(ks[0], (B, seq_len, H, K))
    k, v = (jax.random.normal(key, (B, seq_len, G, K)) for key in ks[1:])

    def loss(q, k, v):
        with lowering.tracing(context_axis="context", attention="blockwise", attention_blocks=(block, block)):
            return jnp.sum(jnp.sin(dot_product_attention(q, k, v, mask=mask)))

    mesh = jax.make_mesh((N,), ("context",), axis_types=(jax.sharding.AxisType.Auto,))
    with jax.set_mesh(mesh):
        grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
        compiled = grad.lower(q, k, v).compile()
        row = {"seq_len": seq_len, "block": block,
               "temp_bytes": int(compiled.memory_analysis().temp_size_in_bytes), "step_s": None}
        if run:
            jax.block_until_ready(compiled(q, k, v))
            best = float("inf")
            for _ in range(steps):
                start = time.perf_counter()
                jax.block_until_ready(compiled(q, k, v))
                best = min(best, time.perf_counter() - start)
            row["step_s"] = round(best, 4)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096])
    ap.add_argument("--blocks", type=int, nargs="+", default=[512, 128])
    ap.add_argument("--run", action="store_true", help="also run the gradient and time it")
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args(argv)
    import jax
    print(f"jax {jax.__version__}, {jax.default_backend()}, {jax.device_count()} devices, "
          f"{os.cpu_count()} CPUs", file=sys.stderr)
    rows = []
    for t in args.lengths:
        for blk in args.blocks:
            rows.append(measure(t, blk, args.run, args.steps))
            print(f"T {t} block {blk}: {rows[-1]['temp_bytes'] / 1e6:.1f} MB temporaries per device"
                  + (f", {rows[-1]['step_s']} s" if rows[-1]["step_s"] else ""), file=sys.stderr)
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
