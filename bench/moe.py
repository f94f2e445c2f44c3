"""Mixture-of-experts speed and memory, side by side in one run (jaxformer issue 22):

1. The MoE layer's forward + backward (router included, gradients of every param and of x), at
   E=8/k=2 and E=64/k=8, for four contenders on the same params and the same tokens:
     layer        jaxformer's MoE as built: on CPU its block-padded dispatch (layers/moe.py
                  `blocked_dispatch`), elsewhere jax.lax.ragged_dot
     ragged_dot   the same layer with jax.lax.ragged_dot forced (the dispatch on TPU / GPU; on
                  CPU JAX lowers it to a masked dense product over all E groups)
     dense_einsum BENCHMARK CONTENDER, not a dispatch the layer uses: every token through every
                  expert (layers/moe.py `dense_experts`), weighted by the routing weights, zero
                  for the unchosen experts
     torch        the torch twin (torch_ref/layers/moe.py, HF's per-expert loop), eager, the
                  same params copied over
   Time: rounds, one fwd+bwd of every contender per round (the shared machine's speed drifts
   10-20% between runs); torch with --torch-threads intra-op threads (default 1: on the loaded
   2-core machine its OpenMP threads at 2 made the loop 15x slower). Memory, the peak bytes
   that one fwd+bwd allocates beyond the params and inputs (temporaries, saved activations,
   gradients): for JAX, XLA's memory analysis of the compiled call (temp + output bytes, what
   the runtime allocates for it); for torch, the peak of its live tensor storages during the
   call (`LiveBytes`). Not process RSS: the allocators keep freed memory, so the RSS peak of a
   call after its warm-up misses what it allocates (here it came out below the gradients' size).
2. Tokens/s of a tiny LM's training step (loss + grad + AdamW under one jit, fp32): MoE LMs
   against a dense LM with the same active FFN parameters per token (d_ff = top_k * d_expert),
   in rounds.

    python bench/moe.py [--rounds 4] [--tokens 1024] [--torch-threads 1] [--only-layer] [--only-lm]

Target (issue 22): the layer at E=64/k=8 at least 3x faster than the dense einsum. Not a test.
The last line is one JSON object with every figure, the sizes and the machine's load.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

D_MODEL, D_EXPERT = 128, 256
LAYER_CONFIGS = {"E8_k2": (8, 2), "E64_k8": (64, 8)}
CONTENDERS = ("layer", "ragged_dot", "dense_einsum", "torch")
LM = dict(vocab_size=256, d_model=128, num_heads=4, num_kv_heads=4, num_layers=4, max_len=128, pad_id=0)
LM_BATCH, LM_SEQ = 8, 128
LM_MOES = {"moe_E8_k2": (8, 2, 128), "moe_E64_k8": (64, 8, 32)}  # E, k, d_expert: active d_ff 256
LM_DENSE_D_FF = 256


def moe_cfg(e: int, k: int, d_expert: int = D_EXPERT):
    from jaxformer.config.moe import MoEConfig
    return MoEConfig(num_experts=e, top_k=k, router="softmax_topk", d_expert=d_expert, expert_ffn="swiglu")


@contextlib.contextmanager
def dispatch(blocked: bool | None):
    """While tracing: the layer's dispatch forced (None = as built)."""
    from jaxformer.layers import moe as jmoe
    saved = jmoe.blocked_dispatch
    if blocked is not None:
        jmoe.blocked_dispatch = lambda: blocked
    try:
        yield
    finally:
        jmoe.blocked_dispatch = saved


def layer_step(name: str, config: str, tokens: int):
    """-> (run: one fwd+bwd, blocking; xla_bytes: XLA's temp + output bytes or None)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from jaxformer.layers import moe as jmoe
    e, k = LAYER_CONFIGS[config]
    cfg = moe_cfg(e, k)
    model = jmoe.MoE(D_MODEL, cfg, rngs=nnx.Rngs(0))
    r = np.random.default_rng(1)
    x = r.standard_normal((1, tokens, D_MODEL)).astype(np.float32)
    cot = r.standard_normal((1, tokens, D_MODEL)).astype(np.float32)  # a fixed cotangent
    if name == "torch":
        return torch_step(model, cfg, x, cot), None
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss(params, x):
        m = nnx.merge(graphdef, params, rest)
        if name == "dense_einsum":
            h = x.reshape(-1, D_MODEL)
            _, w, idx = m.router(h)
            y = jmoe.dense_experts(m.experts, h, idx, w)
        else:
            y = m(x)
        return jnp.sum(y.reshape(cot.shape) * cot)

    xj, = jax.device_put((x,))
    with dispatch({"layer": None, "ragged_dot": False, "dense_einsum": None}[name]):
        compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(params, xj).compile()
    ma = compiled.memory_analysis()
    xla_bytes = None if ma is None else int(ma.temp_size_in_bytes + ma.output_size_in_bytes)

    def run():
        return jax.block_until_ready(compiled(params, xj))
    return run, xla_bytes


def torch_step(jax_model, cfg, x, cot):
    """The torch twin with the JAX layer's params (identical names and layouts in both trees)."""
    import numpy as np
    import torch

    from torch_ref.layers import moe as tmoe
    module = tmoe.MoE(D_MODEL, cfg)
    with torch.no_grad():
        module.router.weight.copy_(torch.from_numpy(np.asarray(jax_model.router.weight[...])))
        for name in ("gate_proj", "up_proj", "down_proj"):
            getattr(module.experts, name).copy_(torch.from_numpy(np.asarray(getattr(jax_model.experts, name)[...])))
    xt = torch.from_numpy(x).requires_grad_(True)
    ct = torch.from_numpy(cot)

    def run():
        module.zero_grad(set_to_none=True)
        xt.grad = None
        (module(xt) * ct).sum().backward()
        return [p.grad for p in module.parameters()] + [xt.grad]
    return run


class LiveBytes:
    """Peak bytes of the torch tensors alive at once during a call, counting only storages
    that the call creates (its temporaries, saved activations and gradients): a dispatch mode
    sees every op's outputs, forward and backward, and a finalizer on each new storage
    subtracts it when torch frees it. The counterpart of XLA's temp + output bytes."""

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        owner = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                owner.record(out)
                return out
        self.mode, self.live, self.current, self.peak = Mode(), {}, 0, 0

    def record(self, out) -> None:
        import weakref

        import torch
        from torch.utils._pytree import tree_leaves
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                key = storage.data_ptr()
                if key and key not in self.live:
                    self.live[key] = storage.nbytes()
                    self.current += storage.nbytes()
                    self.peak = max(self.peak, self.current)
                    weakref.finalize(storage, self.free, key)

    def free(self, key) -> None:
        self.current -= self.live.pop(key)


def peak_bytes(name: str, run, xla_bytes: int | None) -> int:
    """One more fwd+bwd measured (module docstring); JAX's figure comes from its compile."""
    if name != "torch":
        return xla_bytes
    tracker = LiveBytes()
    with tracker.mode:
        out = run()
    del out
    return tracker.peak


def time_rounds(runners: dict, rounds: int) -> dict:
    """runners: name -> callable. One warm-up call each, then `rounds` rounds of one call of
    each, in order, so a slow spell of the shared machine falls on all of them alike."""
    for fn in runners.values():
        fn()
    times = {name: [] for name in runners}
    for _ in range(rounds):
        for name, fn in runners.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    return times


# ----------------------------------------------------------------------------- LM train step
def lm_step(name: str):
    """One jitted train step (next-token cross-entropy, grad, AdamW) of a tiny llama-style LM."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax import nnx

    from jaxformer.config.models import LMConfig
    from jaxformer.models import build_model
    if name == "dense":
        cfg = LMConfig.llama(**LM, d_ff=LM_DENSE_D_FF)
    else:
        e, k, f = LM_MOES[name]
        cfg = LMConfig.llama(**LM, d_ff=LM_DENSE_D_FF, moe=moe_cfg(e, k, f))
    model = build_model("lm", cfg, seed=0)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = optax.adamw(1e-3, weight_decay=0.01)
    ids = jnp.asarray(np.random.default_rng(2).integers(1, LM["vocab_size"], (LM_BATCH, LM_SEQ + 1)), jnp.int32)

    def loss(params, ids):
        logits = nnx.merge(graphdef, params, rest)(ids[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), ids[:, 1:]).mean()

    @jax.jit
    def step(params, opt_state, ids):
        value, grads = jax.value_and_grad(loss)(params, ids)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    holder = {"state": (params, tx.init(params))}
    n_params = sum(x.size for x in jax.tree.leaves(params))

    def run():
        p, o, value = step(*holder["state"], ids)
        holder["state"] = (p, o)
        jax.block_until_ready(value)
    return run, n_params


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, StopIteration):
        return platform.processor()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=1024, help="tokens through the layer per call")
    ap.add_argument("--torch-threads", type=int, default=1,
                    help="torch's intra-op threads (2 threads on a loaded 2-core machine: ~15x slower)")
    ap.add_argument("--only-layer", action="store_true")
    ap.add_argument("--only-lm", action="store_true")
    args = ap.parse_args()
    import jax
    import torch
    torch.set_num_threads(args.torch_threads)
    result = {"jax": jax.__version__, "torch": torch.__version__, "backend": jax.default_backend(),
              "cpu": cpu_model(), "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
              "load_avg_start": load(), "rounds": args.rounds}
    print(f"jax {jax.__version__} ({jax.default_backend()}), torch {torch.__version__}, {result['cpu']}, "
          f"{os.cpu_count()} CPUs, load average {result['load_avg_start']}", flush=True)
    if not args.only_lm:
        result["layer_sizes"] = {"d_model": D_MODEL, "d_expert": D_EXPERT, "tokens": args.tokens,
                                 "expert_ffn": "swiglu", "router": "softmax_topk", "dtype": "float32"}
        built = {(c, n): layer_step(n, c, args.tokens) for c in LAYER_CONFIGS for n in CONTENDERS}
        times = time_rounds({key: b[0] for key, b in built.items()}, args.rounds)
        layer = {}
        for c in LAYER_CONFIGS:
            rows = layer[c] = {n: {"median_s": statistics.median(times[c, n]), "rounds_s": [round(t, 4) for t in times[c, n]]}
                               for n in CONTENDERS}
            for n in CONTENDERS:
                per_round = [d / t for d, t in zip(times[c, "dense_einsum"], times[c, n], strict=True)]
                rows[n]["speedup_vs_dense_einsum"] = round(rows["dense_einsum"]["median_s"] / rows[n]["median_s"], 3)
                rows[n]["speedup_vs_dense_per_round"] = [round(x, 2) for x in per_round]
                print(f"{c:7s} {n:13s} {rows[n]['median_s'] * 1e3:9.1f} ms fwd+bwd  "
                      f"{rows[n]['speedup_vs_dense_einsum']:6.2f}x the dense einsum (per round "
                      f"{rows[n]['speedup_vs_dense_per_round']})", flush=True)
        for c in LAYER_CONFIGS:
            for n in CONTENDERS:
                layer[c][n]["peak_bytes"] = peak_bytes(n, *built[c, n])
            for n in CONTENDERS:
                layer[c][n]["memory_vs_dense_einsum"] = round(layer[c][n]["peak_bytes"]
                                                              / layer[c]["dense_einsum"]["peak_bytes"], 3)
                print(f"{c:7s} {n:13s} peak memory of one fwd+bwd {layer[c][n]['peak_bytes'] / 2 ** 20:8.1f} MiB "
                      f"= {layer[c][n]['memory_vs_dense_einsum']:5.2f}x the dense einsum's", flush=True)
        result["layer"] = layer
        s = layer["E64_k8"]["layer"]["speedup_vs_dense_einsum"]
        result["target_E64_k8_layer_vs_dense_einsum"] = {"speedup": s, "target": 3.0, "met": s >= 3.0}
        result["load_avg_after_layer"] = load()
    if not args.only_layer:
        names = ["dense", *LM_MOES]
        built = {n: lm_step(n) for n in names}
        times = time_rounds({n: b[0] for n, b in built.items()}, args.rounds)
        tokens = LM_BATCH * LM_SEQ
        lm = {}
        for n in names:
            med = statistics.median(times[n])
            per_round = [d / t for d, t in zip(times["dense"], times[n], strict=True)]
            lm[n] = {"tokens_per_s": round(tokens / med, 1), "median_s": round(med, 4), "params": built[n][1],
                     "speed_vs_dense": round(statistics.median(times["dense"]) / med, 3),
                     "speed_vs_dense_per_round": [round(x, 2) for x in per_round]}
            print(f"LM {n:11s} {lm[n]['tokens_per_s']:9.1f} tokens/s  {lm[n]['params']:,} params  "
                  f"{lm[n]['speed_vs_dense']:5.2f}x the dense LM (per round {lm[n]['speed_vs_dense_per_round']})", flush=True)
        result["lm_sizes"] = {**LM, "batch": LM_BATCH, "seq": LM_SEQ, "dense_d_ff": LM_DENSE_D_FF, "ffn": "swiglu",
                              "moe": {n: dict(zip(("num_experts", "top_k", "d_expert"), v, strict=True)) for n, v in LM_MOES.items()},
                              "optimizer": "adamw", "dtype": "float32"}
        result["lm"] = lm
    result["load_avg_end"] = load()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
