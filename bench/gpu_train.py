"""GPT-2 small (124M) bf16 training throughput and MFU on one GPU: jaxformer (jax.jit, cuDNN
flash attention via jax.nn.dot_product_attention(implementation='cudnn'); --attention adds rows
for other fused kernels of jaxformer.lowering.fused_attention, e.g. tokamax) side by side with
torch_ref under torch.compile (SDPA picks flash attention on its own).

MFU by nanoGPT's formula: FLOPs per token = 6 N + 12 L H Q T (N params, L layers, H heads,
Q head dim, T sequence length), against the chip's dense bf16 peak (--peak-tflops; 989 for
H100/H200 SXM). Run through bench/gpu.sh. Not a test.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

GPT2_SMALL = dict(name="lm", vocab_size=50304, d_model=768, num_heads=12, d_ff=3072, num_layers=12,
                  max_len=1024, norm_position="pre", position="learned", ffn="gelu_tanh", bias=True,
                  tie_embeddings=True, dropout=0.0, norm_eps=1e-5)


def cfg_for(batch: int, seq: int):
    from jaxformer.train.config import config_from_dict
    return config_from_dict({"model": GPT2_SMALL, "data": {"name": "stdlib_docs", "seq_len": seq},
                             "train": {"steps": 1000, "batch_size": batch, "precision": "bf16", "lr": 6e-4,
                                       "grad_clip": 1.0, "init": "normal_0.02", "warmup_steps": 0,
                                       "schedule": "constant"}})


def flops_per_token(n_params: int, seq: int) -> float:
    m = GPT2_SMALL
    return 6 * n_params + 12 * m["num_layers"] * m["num_heads"] * (m["d_model"] // m["num_heads"]) * seq


def timed(fn, steps, warmup):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(steps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def bench_jax(cfg, seq, steps, warmup, attention="cudnn"):
    import jax
    import numpy as np
    from flax import nnx

    from jaxformer import lowering
    from jaxformer.train.jax_trainer import StepFns, build_jax_model, init_state, shape_batch
    from jaxformer.train.optim import make_optax
    model = build_jax_model(cfg)
    _, params, _ = nnx.split(model, nnx.Param, ...)
    n = sum(x.size for x in jax.tree.leaves(params))
    tx, sched = make_optax(cfg.train, params)
    fns = StepFns(cfg, model, tx, sched)
    step = jax.jit(fns.train_step, donate_argnums=0)
    st = {"s": init_state(cfg, model, tx)}
    tokens = np.random.default_rng(0).integers(0, 50257, (cfg.train.batch_size, seq + 1)).astype(np.int32)
    batch = jax.device_put(shape_batch({"tokens": tokens}, 1))

    def run():
        st["s"], out = step(st["s"], batch)
        out["loss"].block_until_ready()
    with lowering.tracing(fused_attention=attention):  # read when the first call traces the step
        return n, timed(run, steps, warmup)


def bench_torch(cfg, seq, steps, warmup):
    import numpy as np
    import torch

    from jaxformer.train.optim import make_torch_optimizer
    from jaxformer.train.torch.tasks import forward_loss
    from jaxformer.train.torch.trainer import build_torch_model
    torch.backends.cuda.matmul.allow_tf32 = True
    module = build_torch_model(cfg).cuda()
    n = sum(p.numel() for p in module.parameters())
    opt, _ = make_torch_optimizer(cfg.train, module)
    fwd = torch.compile(module)
    tokens = torch.from_numpy(np.random.default_rng(0).integers(0, 50257, (cfg.train.batch_size, seq + 1))).cuda()

    def run():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss, count, _ = forward_loss("lm", fwd, {"tokens": tokens}, 0.0)
        (loss / count).backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
        opt.step()
        torch.cuda.synchronize()
    return n, timed(run, steps, warmup)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--attention", nargs="+", default=["cudnn"], choices=["auto", "xla", "cudnn", "tokamax"],
                    help="fused attention kernels of the jaxformer rows (jaxformer.lowering.fused_attention)")
    args = ap.parse_args()
    cfg = cfg_for(args.batch, args.seq)
    rows = []
    impls = [(f"jaxformer_jit_{a}", lambda *x, a=a: bench_jax(*x, attention=a)) for a in args.attention]
    impls += [] if args.skip_torch else [("torch_ref_compile", bench_torch)]
    for name, fn in impls:
        try:
            n, sec = fn(cfg, args.seq, args.steps, args.warmup)
        except Exception as e:
            print(f"{name}: failed: {type(e).__name__}: {e}", flush=True)
            continue
        tok_s = args.batch * args.seq / sec
        mfu = flops_per_token(n, args.seq) * tok_s / (args.peak_tflops * 1e12)
        rows.append({"impl": name, "params": n, "s_per_step": sec, "tokens_per_s": tok_s, "mfu": mfu})
        print(f"{name:22s} {sec * 1e3:8.1f} ms/step {tok_s:12,.0f} tok/s  MFU {mfu:6.1%}", flush=True)
    torch_rows = [r for r in rows if r["impl"] == "torch_ref_compile"]
    for r in rows:
        if torch_rows and r is not torch_rows[0]:
            print(f"{r['impl']} / torch.compile throughput ratio: {r['tokens_per_s'] / torch_rows[0]['tokens_per_s']:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
