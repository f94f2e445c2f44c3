"""Will the published models fit, and how fast would they train? Each real-size config compiled
for the TPU slice MaxText published a training figure on, with no TPU: jaxformer's own train
step, compiled by XLA's TPU compiler on this CPU host (jaxformer/train/aot.py), beside
MaxText's published MFU (not a test).

Ours are ESTIMATES (nothing runs: the compiler's optimal_seconds where it covers the program,
else our loop-aware roofline, jaxformer/train/aot.py program_report); MaxText's are
MEASUREMENTS on real slices (docs/reference/models/tiering.md in AI-Hypercomputer/maxtext, read
2026-12). The ratio column compares the two kinds of figure and says so.

MFU counts alike on both sides: MaxText's model FLOPs (6 x active params per token, the
embedding lookup left out, plus attention). MaxText's published MFUs for the first three rows
were computed with attention NOT halved under the causal mask (its counter halves it since
2025-07); `maxtext_mfu_causal` is the same measurement recounted with the halving, the count
jaxformer uses, so compare against that column.

    python bench/tpu_plan.py                 # every row (tens of minutes on 2 cores)
    python bench/tpu_plan.py --rows llama3_8b mixtral_8x7b
    python bench/tpu_plan.py --set train.remat_policy=dots_saveable   # applied to every row

Settings that differ from MaxText's are named in each row (`differs`): jaxformer has no host
offload of activations but the layer inputs, keeps fp32 params and Adam state (MaxText's Mixtral run keeps bf16),
and its remat policies are jax.checkpoint_policies' (MaxText's runs use custom ones).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

ROWS = {
    # name: (config, topology, overrides, MaxText's published MFU, the same recounted with causal
    #        attention halved (jaxformer's count), what jaxformer runs differently)
    "llama3_8b": ("llama3_8b", "v6e:16x16", [], 0.4546, 0.404,
                  "nothing offloaded to host (MaxText offloads the layer inputs and q/k/v/o projections); "
                  "splash blocks 512 (MaxText 2048, fused backward kernel)"),
    "llama3_70b": ("llama3_70b", "v6e:16x16", [], 0.5033, 0.470,
                   "2 sequences per chip where MaxText runs 5 (both offload each layer's input to host)"),
    "mixtral_8x7b": ("mixtral_8x7b", "v5p:8x4x4", [], 0.5256, 0.505,
                     "fp32 params and Adam state (MaxText bf16); 8 sequences per chip (MaxText 36)"),
    "llama2_70b": ("llama3_70b", "v5p:8x8x4",
                   ["model.vocab_size=32000", "model.rope_base=10000.0", "model.rope_scaling=null",
                    "model.max_len=4096", "data.seq_len=4096", "train.batch_size=1024"], 0.654, 0.646,
                   "layer inputs offloaded to host (MaxText: remat save_dot_except_mlpwi, no offload)"),
    "qwen3_30b_a3b": ("qwen3_30b_a3b", "v5p:4x4x4", [], None, None, "MaxText publishes no figure"),
}


def run_row(name: str, extra: list[str]) -> dict:
    from jaxformer.train import aot
    from jaxformer.train.config import load_config
    config, topology, sets, mfu, mfu_causal, differs = ROWS[name]
    cfg = load_config(config, sets + extra)
    t0 = time.perf_counter()
    try:
        r = aot.compile_report(cfg, topology)
    except aot.DoesNotFit as e:
        return {"row": name, "topology": topology, "fits": False, "needed_temp_bytes": e.needed,
                "state_bytes": sum(e.state_bytes.values()), "wall_s": round(time.perf_counter() - t0, 1),
                "maxtext_mfu": mfu, "differs": differs, "error": str(e)}
    out = {"row": name, "topology": topology, "chips": r["chips"], "mesh": r["mesh"],
           "param_count": r["param_count"], "active_params": r["active_params"],
           "tokens_per_step": r["tokens_per_step"], "fits": r["fits"],
           "bytes_per_chip": r["bytes_per_chip"], "hbm_per_chip_bytes": r["hbm_per_chip_bytes"],
           "est_step_s": r["est_step_s"], "est_source": r["est_source"], "est_mfu": r["est_mfu"],
           "est_tokens_per_s_per_chip": r["est_tokens_per_s_per_chip"], "roofline": r["roofline"],
           "compiler_optimal_seconds": r["compiler_optimal_seconds"],
           "program_flops_per_chip": r["program_flops_per_chip"], "model_flops_per_step": r["model_flops_per_step"],
           "collectives": {k: v for k, v in r["collectives"].items() if v["count"]},
           "attention_kernel": r["attention_kernel"], "compile_s": r["compile_s"],
           "maxtext_mfu": mfu, "maxtext_mfu_causal": mfu_causal, "differs": differs}
    if mfu_causal and r["est_mfu"]:
        out["est_over_measured"] = r["est_mfu"] / mfu_causal
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", nargs="+", choices=list(ROWS), default=list(ROWS))
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    print(f"jax {jax.__version__}, host {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; "
          "ours: ESTIMATES from the TPU compiler (nothing runs); MaxText: MEASURED", flush=True)
    rows = []
    for name in args.rows:
        row = run_row(name, args.overrides)
        rows.append(row)
        if not row["fits"] and "error" in row:
            print(f"{name:14s} {row['topology']:10s} does not fit: {row['error']}", flush=True)
            continue
        gib = row["bytes_per_chip"]["total"] / 2**30
        mfu = row["est_mfu"]
        ref = row["maxtext_mfu_causal"]
        print(f"{name:14s} {row['topology']:10s} {gib:6.1f} of {row['hbm_per_chip_bytes'] / 2**30:.0f} GiB/chip "
              f"{'fits' if row['fits'] else 'DOES NOT FIT'}; est step {row['est_step_s']:.3f} s "
              f"({row['roofline']['bound_by']}-bound roofline), est MFU {100 * mfu:.1f}%"
              + (f" vs MaxText measured {100 * ref:.1f}% (causal count; {100 * row['maxtext_mfu']:.1f}% "
                 f"published): {mfu / ref:.2f}x" if ref else "")
              + f"; compiled in {row['compile_s']:.0f} s", flush=True)
    print(json.dumps(rows, default=float))


if __name__ == "__main__":
    sys.exit(main())
