"""How far jaxformer's fp32 lands from float64 against torch's fp32, leaf by leaf, on one parity
registry case over many seeds (issue 36 point 4, docs/numerics.md §44). No timing.

Each seed runs `run_case(case, seed, reference=True)`: torch_ref's fp32 twin, jaxformer's, and
torch_ref in float64 (the parity harness's referee, docs/numerics.md §32), on that seed's
weights and inputs. Per leaf the distance is max |x - float64| / max |float64|. Reported per
seed for the chosen leaves (--leaf: an output's name, or a substring of the gradients' names;
the worst matching leaf counts) and for the worst over all outputs and all gradients; over seeds the
geometric mean of jaxformer / torch, the standard error of the mean log and a 95% interval.

    JAX_PLATFORMS=cpu python bench/rounding_case.py lm_rmsnorm_offset_scale2_qkv_bias_window \
        --leaf k_proj.weight --seeds 40

The last line printed is JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _distances(x: dict, ref: dict) -> dict[str, float]:
    out = {}
    for k in set(x) & set(ref):
        r = np.asarray(ref[k], np.float64)
        if not np.issubdtype(r.dtype, np.floating) or r.size == 0:
            continue
        out[k] = float(np.abs(np.asarray(x[k], np.float64) - r).max() / max(float(np.abs(r).max()), 1e-30))
    return out


def measure(case, seed: int, leaf: str) -> dict:
    """One seed: per side, the worst distance over outputs, over gradients and over the leaves
    whose name holds `leaf`; with each kind's ratio jax / torch."""
    from jaxformer.parity import harness
    from jaxformer.parity.cases import run_case
    seen = []
    original = harness._spread

    def record(x, ref):  # called for torch out, jax out, torch grad, jax grad, in that order
        seen.append(_distances(x, ref))
        return original(x, ref)
    harness._spread = record
    try:
        run_case(case, seed, reference=True, locate=False)
    finally:
        harness._spread = original
    t_out, j_out, t_grad, j_grad = seen
    row = {"seed": seed}
    for kind, (t, j) in {"out": (t_out, j_out), "grad": (t_grad, j_grad)}.items():
        row[f"torch_{kind}"], row[f"jax_{kind}"] = max(t.values()), max(j.values())
    names = [k for k in j_out if k == leaf]  # an output by its name, else gradients by substring
    src_t, src_j = (t_out, j_out) if names else (t_grad, j_grad)
    names = names or [k for k in j_grad if leaf in k]
    if not names:
        raise SystemExit(f"--leaf {leaf!r}: no output named so and no gradient holding it")
    row["leaves"] = sorted(names)
    row["torch_leaf"], row["jax_leaf"] = max(src_t[k] for k in names), max(src_j[k] for k in names)
    return row


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("case")
    p.add_argument("--leaf", default="k_proj.weight")
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--first", type=int, default=0)
    p.add_argument("--xla-kernels", action="store_true",
                   help="jaxformer.layers.special's tanh falls back to XLA's (jnp.tanh)")
    a = p.parse_args(argv)
    if a.xla_kernels:
        import jax.numpy as jnp

        from jaxformer.layers import special
        special._tanh32 = jnp.tanh
    from bench.rounding_gemma3 import summarize
    from jaxformer.parity import setup_precision
    from jaxformer.parity.registry import load_all
    setup_precision()
    case = load_all()[a.case]
    rows = []
    for s in range(a.first, a.first + a.seeds):
        rows.append(measure(case, s, a.leaf))
        r = rows[-1]
        print(f"seed {s}: {a.leaf} jax {r['jax_leaf']:.2e} torch {r['torch_leaf']:.2e}; worst grad jax "
              f"{r['jax_grad']:.2e} torch {r['torch_grad']:.2e}; worst out jax {r['jax_out']:.2e} "
              f"torch {r['torch_out']:.2e}", flush=True)
    out = {"case": a.case, "leaf": a.leaf, "leaves": rows[0]["leaves"], "xla_kernels": a.xla_kernels}
    for kind in ("leaf", "grad", "out"):
        out[kind] = {**summarize([r[f"jax_{kind}"] / r[f"torch_{kind}"] for r in rows]),
                     "jax_median": float(np.median([r[f"jax_{kind}"] for r in rows])),
                     "torch_median": float(np.median([r[f"torch_{kind}"] for r in rows]))}
    out["per_seed"] = rows
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
