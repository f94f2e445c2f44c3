"""Host memory and time of creating a train state under fsdp=8 on 8 host CPU devices: the host
init then `place` (the earlier code path, rebuilt here) against the sharded init
(jaxformer/train/init.py create_state), each in a fresh process, side by side in one run.

    python bench/init_memory.py [--layers 8] [--only new] [--tiny]

--tiny: d_model 256, d_ff 704, vocab 4096 (a check of the script, not a measurement).

The model: a Llama-style LM of d_model 2048, d_ff 5632 (SwiGLU), vocab 32768 and 8 layers,
2.2 GB of fp32 params; with AdamW's two moments the state is 6.5 GB. Each child reports its
resident set before the init (the process baseline: Python, JAX, the 8 devices) and its peak
(VmHWM, from the kernel), the bytes each device holds and the init's wall time, compiles
included. On CPU devices "device memory" is host memory, so the peak RSS counts every shard.

Targets (jaxformer issue 18): new peak <= 1.2 x state + baseline; per device <= state / 8 +
the replicated leaves (the 1-D params and their Adam moments: `replicated_state_bytes`). Not a test. On a shared machine a child aborts (its figures then
say why) when the machine's available memory falls under 1.5 GB. The last line is one JSON
object: the new path's figures, and the old path's under `old_*` keys.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

MODEL = dict(name="lm", vocab_size=32768, d_model=2048, num_heads=16, num_kv_heads=16, d_ff=5632,
             num_layers=8, max_len=2048, norm_position="pre", position="rope", norm="rmsnorm",
             ffn="swiglu", bias=False, tie_embeddings=False, dropout=0.0)
LOW_MEMORY = 1.5 * 2 ** 30


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def _available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 1 << 62


def _watchdog() -> None:
    """Leave the machine usable for others: stop this child when memory runs low."""
    while True:
        if _available() < LOW_MEMORY:
            print(json.dumps({"aborted": "machine memory available fell under 1.5 GB",
                              "peak_rss_bytes": _status("VmHWM")}), flush=True)
            os._exit(3)
        time.sleep(0.1)


def _old_numpy_init(model, scheme: str, seed: int) -> None:
    """The earlier init: every full tensor drawn in numpy on the host (seeded by the torch key),
    then set into the eagerly built model."""
    import zlib

    import jax.numpy as jnp
    import numpy as np

    from jaxformer import convert
    prefixes = convert.scan_prefixes(model)
    for path, var in convert.param_leaves(model).items():
        leaf = str(path[-1])
        shape = tuple(var.shape)
        torch_shape = convert.torch_shape_of(path, shape, prefixes)
        key = convert.torch_keys_for(path, shape, prefixes)[0]
        if leaf == "scale":
            x = np.ones(torch_shape, np.float32)
        else:
            rng = np.random.default_rng([seed, zlib.crc32(key.encode())])
            x = (rng.standard_normal(torch_shape) * 0.02).astype(np.float32)
        var.set_value(jnp.asarray(convert.torch_to_flax_layout(leaf, x)))


TINY = dict(d_model=256, d_ff=704, vocab_size=4096, num_heads=4, num_kv_heads=4)


def child(variant: str, layers: int, tiny: bool = False) -> dict:
    threading.Thread(target=_watchdog, daemon=True).start()
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from jaxformer.convert import scan_prefixes
    from jaxformer.train import init as init_lib
    from jaxformer.train import sharding
    from jaxformer.train.config import config_from_dict
    from jaxformer.train.optim import make_optax
    assert jax.device_count() == 8, jax.devices()
    cfg = config_from_dict({"model": {**MODEL, "num_layers": layers, **(TINY if tiny else {})}, "data": {"name": "stdlib_docs"},
                            "train": {"init": "normal_0.02"}})
    name, mcfg, seed = cfg.model_name, cfg.model, cfg.train.seed
    mesh = sharding.make_mesh(1, 8, 1)
    abstract_model = init_lib.abstract_model(name, mcfg, seed)
    tx, _ = make_optax(cfg.train, nnx.split(abstract_model, nnx.Param, ...)[1], scan_prefixes(abstract_model))
    abstract = init_lib.abstract_state_of(abstract_model, tx)
    shardings = sharding.state_shardings(abstract, mesh)
    state_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(abstract)
                      if not jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key))
    replicated_1d = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(abstract["params"]) if x.ndim < 2)
    # every replicated leaf of the state: the 1-D params, their Adam moments, counters
    replicated = sum(x.size * x.dtype.itemsize for x, sh in zip(jax.tree.leaves(abstract), jax.tree.leaves(shardings), strict=True)
                     if sh.is_fully_replicated and not jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key))
    baseline = _status("VmRSS")
    t = time.perf_counter()
    if variant == "new":
        state = init_lib.create_state(name, mcfg, "normal_0.02", seed, tx, shardings)
    else:  # the earlier path: the whole model and optimiser state on the host, then placed
        model = init_lib.build_model(name, mcfg, seed=seed)
        _old_numpy_init(model, "normal_0.02", seed)
        _, params, rest = nnx.split(model, nnx.Param, ...)
        host = {"params": params, "opt_state": tx.init(params), "rest": rest, "step": jnp.zeros((), jnp.int32)}
        state = sharding.place(host, shardings)
        del host, params, rest
    jax.block_until_ready(state)
    init_s = time.perf_counter() - t
    per = sharding.per_device_bytes(state)
    devices = [v for k, v in per.items() if k.startswith("device")]
    return {"variant": variant, "state_bytes": state_bytes, "replicated_1d_param_bytes": replicated_1d,
            "replicated_state_bytes": replicated,
            "baseline_rss_bytes": baseline, "peak_rss_bytes": _status("VmHWM"),
            "per_device_bytes_max": max(devices), "init_s": round(init_s, 2)}


def run_child(variant: str, layers: int, tiny: bool) -> dict:
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", variant, "--layers", str(layers)] + (["--tiny"] if tiny else []),
                         env=env, capture_output=True, text=True)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"variant": variant, "error": (out.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(lines[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=MODEL["num_layers"])
    ap.add_argument("--only", choices=["new", "old"])
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--child", choices=["new", "old"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.layers, args.tiny)), flush=True)
        return
    # the new path first: should the old one run the machine out of memory, the new figures stand
    results = {v: run_child(v, args.layers, args.tiny) for v in (["new", "old"] if not args.only else [args.only])}
    for v, r in results.items():
        if "state_bytes" in r:
            gb = 2 ** 30
            over = (r["peak_rss_bytes"] - r["baseline_rss_bytes"]) / r["state_bytes"]
            print(f"{v}: state {r['state_bytes'] / gb:.2f} GiB, baseline {r['baseline_rss_bytes'] / gb:.2f} GiB, "
                  f"peak {r['peak_rss_bytes'] / gb:.2f} GiB = baseline + {over:.2f} x state, "
                  f"per device max {r['per_device_bytes_max'] / gb:.3f} GiB "
                  f"({r['per_device_bytes_max'] / r['state_bytes']:.4f} of the state), init {r['init_s']} s")
        else:
            print(f"{v}: {r}")
    new = results.get("new", {})
    summary = {k: new.get(k) for k in ("state_bytes", "baseline_rss_bytes", "peak_rss_bytes",
                                       "per_device_bytes_max", "init_s", "replicated_1d_param_bytes",
                                       "replicated_state_bytes")}
    if "state_bytes" in new:
        summary["peak_over_baseline_per_state"] = round((new["peak_rss_bytes"] - new["baseline_rss_bytes"])
                                                        / new["state_bytes"], 3)
    old = results.get("old", {})
    for k, v in old.items():
        if k != "variant":
            summary[f"old_{k}"] = v
    if "state_bytes" in old:
        summary["old_peak_over_baseline_per_state"] = round((old["peak_rss_bytes"] - old["baseline_rss_bytes"])
                                                            / old["state_bytes"], 3)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
