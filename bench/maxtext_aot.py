"""jaxformer's train step and MaxText's, side by side on one compiler: each row compiles both
for the same TPU slice with XLA's TPU compiler on this CPU host (libtpu, no TPU), and reads
both compiled programs the same way (issue 50 §2; not a test).

MaxText's compiles in a child process with the MaxText venv's python (bench/README.md, "MaxText
venv"; MaxText is never a dependency of jaxformer): bench/maxtext_aot_driver.py runs MaxText's
own `train_compile` with the row's key=value options and writes its compiled program's HLO
text, memory_analysis, cost_analysis and the FLOPs of its jaxpr. Ours compiles in this process
through `jaxformer compile`'s code (jaxformer/train/aot.py compile_train). Then, for both:

  * bytes per chip (memory_analysis): arguments, outputs (less what aliases the arguments),
    temporaries, generated code, their total in HBM; host memory (offloaded activations) apart;
  * program FLOPs per chip: the traced program's matmul FLOPs (jaxformer/train/costs.py
    jaxpr_flops, loop trip counts applied) plus the splash kernels' (costs.splash_flops: the
    kernels declare none), the same formula on both sides; and the compiler's own FLOPs
    (cost_analysis, loop bodies once);
  * HBM bytes accessed (costs.hlo_hbm_bytes of the HLO, trip counts applied) and the
    compiler's `bytes accessed` (loop bodies once);
  * collectives from the HLO text (costs.collectives): count and bytes of all-gather,
    all-reduce, reduce-scatter, all-to-all, collective-permute per step;
  * the compiler's optimal_seconds, taken as the estimate only where it covers the whole
    program (no while loop), else the loop-aware roofline (aot.roofline_of: FLOPs, HBM bytes
    and collective bytes each over the chip's peak rate, the largest) -- identical for both.

Every time is an ESTIMATE (nothing runs). Nothing is cached: each run compiles every row it
is asked for, unless --maxtext-from DIR names an earlier `--keep DIR` run to read MaxText's
program of a row from (its output then says so for that row).

    python bench/maxtext_aot.py --rows llama3_8b          # one row (~5-15 min on 2 cores)
    python bench/maxtext_aot.py --maxtext-python /tmp/maxtext-venv/bin/python

Prints a table, the ratios ours / MaxText, and one JSON value on the last line.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# MaxText's benchmarks/xla_flags_library.py: the scoped-VMEM limits its 2048-block splash runs
# with (dense models, MoE models)
DENSE_VMEM = "--xla_tpu_scoped_vmem_limit_kib=98304"
MOE_VMEM = "--xla_tpu_scoped_vmem_limit_kib=81920"
SPLASH_2048 = ["attention=flash", "sa_block_q=2048", "sa_block_kv=2048", "sa_block_kv_compute=2048",
               "sa_block_q_dkv=2048", "sa_block_kv_dkv=2048", "sa_block_kv_dkv_compute=2048",
               "sa_block_q_dq=2048", "sa_block_kv_dq=2048", "sa_use_fused_bwd_kernel=true"]
COMMON = ["dataset_type=synthetic", "enable_checkpointing=false", "use_iota_embed=true", "ici_fsdp_parallelism=-1",
          "compile_topology_num_slices=1"]


@dataclasses.dataclass(frozen=True)
class Row:
    """One side-by-side compile: jaxformer's config + overrides and MaxText's options for the
    same shapes, batch per chip, sequence and slice; `differs`: what could not be matched."""

    topology: str  # jaxformer's name of the slice
    maxtext_topology: str  # MaxText's name of the same slice (v5p counts TensorCores: v5p-256 = 128 chips)
    config: str
    sets: tuple[str, ...]
    maxtext: tuple[str, ...]
    vmem_flag: str
    differs: str


ROWS = {
    # MaxText's settings: benchmarks/maxtext_trillium_model_configs.py llama3_1_8b_8192 (v6e-256)
    "llama3_8b": Row(
        "v6e:16x16", "v6e-256", "llama3_8b",
        ("train.batch_size=1024", "train.remat_policy=offload_layer_inputs"),
        ("model_name=llama3.1-8b", "per_device_batch_size=4", "max_target_length=8192", "remat_policy=custom",
         "decoder_layer_input=offload", "out_proj=offload", "query_proj=offload", "key_proj=offload",
         "value_proj=offload", *SPLASH_2048),
        DENSE_VMEM,
        "remat: both offload each layer's input to host; MaxText also offloads the q/k/v/o projections' "
        "outputs (jaxformer recomputes them). splash blocks: MaxText 2048 with the fused backward kernel, "
        "jaxformer its own (512). MaxText's other published XLA flags (collective fusion, host-offload, "
        "sparse-core) left out: only the scoped-VMEM flag its kernels need"),
    # llama3_1_70b_8192 (v6e-256): 5 sequences per chip
    "llama3_70b": Row(
        "v6e:16x16", "v6e-256", "llama3_70b",
        ("train.batch_size=1280", "train.remat_policy=offload_layer_inputs"),
        ("model_name=llama3.1-70b", "per_device_batch_size=5", "max_target_length=8192", "remat_policy=custom",
         "decoder_layer_input=offload", "query_proj=offload", "key_proj=offload", "value_proj=offload",
         *SPLASH_2048),
        DENSE_VMEM,
        "remat: both offload each layer's input; MaxText also the q/k/v projections. splash blocks 2048 "
        "fused backward (MaxText) vs 512 (jaxformer); only the scoped-VMEM flag of MaxText's XLA flags"),
    # v5p_model_configs.py mixtral_8x7b_dropless_v5p_512 (36 sequences per chip, bf16 weights) on
    # v5p-256 = 128 chips (the slice tpu_plan.py compiles), at jaxformer's config's 8 per chip
    "mixtral_8x7b": Row(
        "v5p:8x4x4", "v5p-256", "mixtral_8x7b",
        ("train.batch_size=1024",),
        ("model_name=mixtral-8x7b", "per_device_batch_size=8", "max_target_length=4096", "remat_policy=full",
         "megablox=true", "sparse_matmul=true", "weight_dtype=float32", "dtype=bfloat16", *SPLASH_2048),
        MOE_VMEM,
        "8 sequences per chip for both (MaxText publishes 36 on v5p-512; jaxformer's dropless buffers do not "
        "fit 36); fp32 weights for both (MaxText published bf16); splash 2048 fused (MaxText) vs 512"),
    # configs/tpu/v5p/llama2_70b.sh and v5p_model_configs.py llama2_70b_v5p_128 settings, on
    # v5p-512 = 256 chips
    "llama2_70b": Row(
        "v5p:8x8x4", "v5p-512", "llama3_70b",
        ("model.vocab_size=32000", "model.rope_base=10000.0", "model.rope_scaling=null", "model.max_len=4096",
         "data.seq_len=4096", "train.batch_size=1024", "train.remat_policy=offload_layer_inputs"),
        ("model_name=llama2-70b", "per_device_batch_size=4", "max_target_length=4096",
         "remat_policy=save_dot_except_mlpwi"),
        DENSE_VMEM,
        "remat: MaxText saves every dot but the MLP's input projections (no offload); jaxformer offloads the "
        "layer inputs and recomputes the rest (it has no save-dots-except policy that fits). MaxText's "
        "attention as its config leaves it (attention=autoselected)"),
}


# ----------------------------------------------------------------------------- reading a program
def read_compiled(compiled, hlo_path: str) -> dict:
    """What the bench reads off a compiled program, the same for MaxText's (in its venv,
    maxtext_aot_driver.py) and ours: memory_analysis, cost_analysis; the HLO text to hlo_path."""
    mem = compiled.memory_analysis()
    fields = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes", "temp_size_in_bytes",
              "generated_code_size_in_bytes", "host_argument_size_in_bytes", "host_output_size_in_bytes",
              "host_alias_size_in_bytes", "host_temp_size_in_bytes")
    ca = compiled.cost_analysis()
    ca = (ca[0] if ca else {}) if isinstance(ca, (list, tuple)) else (ca or {})
    with open(hlo_path, "w") as f:
        f.write(compiled.as_text())
    return {"memory": {k: int(getattr(mem, k)) for k in fields},
            "cost": {"flops": float(ca.get("flops", 0.0)), "bytes_accessed": float(ca.get("bytes accessed", 0.0)),
                     "optimal_seconds": float(ca.get("optimal_seconds", 0.0))}}


def _kernels(hlo: str) -> dict:
    """The Pallas kernels the program calls, by name, with how many call sites (not runs)."""
    names = [re.sub(r"\.\d+$", "", n) for n in
             re.findall(r'^\s*(?:ROOT )?%([\w.\-]+) = [^\n]*custom_call_target="tpu_custom_call"', hlo, re.M)]
    out: dict = {}
    for n in names:
        out[n] = out.get(n, 0) + 1
    return out


def summarize(dump: dict, hlo: str, chip, chips: int, extra_flops: float, model_flops: float) -> dict:
    """One program's figures per chip, read from `dump` (read_compiled's, plus jaxpr_flops) and
    its HLO text -- the same code for MaxText's program and ours."""
    from jaxformer.train import aot, costs
    mem = dump["memory"]
    parsed = costs.parse(hlo)
    coll = {k: v for k, v in costs.collectives(parsed).items() if k != "ragged-all-to-all" or v["count"]}
    hbm, unknown = costs.hlo_hbm_bytes(parsed)
    flops = (dump["jaxpr_flops"] + extra_flops) / chips
    roofline = aot.roofline_of(flops, hbm, sum(v["bytes"] for v in coll.values()), chip)
    loops = len(re.findall(r" while\(", hlo))
    opt = dump["cost"]["optimal_seconds"]
    whole = opt > 0 and loops == 0
    est = opt if whole else roofline["bound_s"]
    by = {"arguments": mem["argument_size_in_bytes"],
          "outputs": mem["output_size_in_bytes"] - mem["alias_size_in_bytes"],
          "temp": mem["temp_size_in_bytes"], "code": mem["generated_code_size_in_bytes"]}
    by["total"] = sum(by.values())
    by["host"] = (mem["host_argument_size_in_bytes"] + mem["host_output_size_in_bytes"]
                  - mem["host_alias_size_in_bytes"] + mem["host_temp_size_in_bytes"])
    return {"bytes_per_chip": by, "fits": by["total"] <= chip.hbm_bytes,
            "program_flops_per_chip": flops, "kernel_flops_per_chip": extra_flops / chips,
            "compiler_flops_per_chip": dump["cost"]["flops"],
            "hbm_bytes_per_chip": hbm, "compiler_bytes_accessed": dump["cost"]["bytes_accessed"],
            "collectives": coll, "compiler_optimal_seconds": opt, "optimal_seconds_whole": whole,
            "while_loops": loops, "unknown_trip_loops": unknown, "roofline": roofline,
            "est_step_s": est, "est_mfu": model_flops / (chips * chip.peak_flops * est) if est > 0 else None,
            "pallas_kernels": _kernels(hlo), "compile_s": round(dump.get("compile_s", 0.0), 1)}


# ----------------------------------------------------------------------------- the two compiles
def compile_maxtext(row: Row, python: str, work: str, timeout: float) -> tuple[dict | None, str, str]:
    """MaxText's train step compiled in a child (its venv) -> (dump or None, HLO text, error)."""
    out = os.path.join(work, "maxtext")
    opts = [*COMMON, f"compile_topology={row.maxtext_topology}", f"compile_xla_flags={row.vmem_flag}",
            f"base_output_directory={os.path.join(work, 'maxtext_out')}", "run_name=maxtext_aot", *row.maxtext]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": "", "TF_CPP_MIN_LOG_LEVEL": "3"}
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([python, os.path.join(REPO, "bench", "maxtext_aot_driver.py"), out, REPO, *opts],
                              env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "", f"MaxText's compile ran past {timeout:.0f} s"
    path = os.path.join(out, "compiled.json")
    if not os.path.exists(path):
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        return None, "", f"MaxText's driver exited {proc.returncode}: " + " | ".join(tail)
    with open(path) as f:
        dump = json.load(f)
    if "error" in dump:
        return None, "", dump["error"]
    with open(os.path.join(out, "hlo.txt")) as f:
        hlo = f.read()
    dump["wall_s"] = time.perf_counter() - t0
    return dump, hlo, ""


def compile_ours(row: Row, work: str, extra: list[str]):
    """jaxformer's train step through `jaxformer compile`'s code -> (dump or None, HLO, error,
    cfg, facts, kernels)."""
    from jaxformer.train import aot
    from jaxformer.train.config import load_config
    cfg = aot.as_mesh_run(load_config(row.config, [*row.sets, *extra]))
    mesh = aot.mesh_for(cfg, aot.devices_for(row.topology))
    try:
        prog, facts = aot.compile_train(cfg, mesh)
    except (aot.DoesNotFit, ValueError) as e:
        return None, "", str(e), cfg, None, []
    path = os.path.join(work, "ours_hlo.txt")
    dump = read_compiled(prog.compiled, path)
    dump.update(jaxpr_flops=prog.program_flops, compile_s=prog.compile_s)
    with open(path) as f:
        hlo = f.read()
    return dump, hlo, "", cfg, facts, prog.kernels


def moe_expert_flops(cfg) -> float:
    """The expert matmuls' FLOPs of a train step, every chip's together, counted as jaxpr_flops
    counts jaxformer's ragged_dot (dropless: each token's top_k experts): for MaxText's megablox
    kernels (gmm, tgmm), which show its jaxpr no FLOPs. Forward 2, backward 4, and 2 more for
    the forward recomputed under remat, per weight and routed token."""
    m = cfg.model
    moe = getattr(getattr(m, "feedforward", None), "moe", None) or m.moe
    mats = 3 if moe.expert_ffn in ("swiglu", "geglu") else 2
    per_token = moe.top_k * mats * m.d_model * moe.d_expert * m.num_layers
    tokens = cfg.train.batch_size * cfg.data.seq_len
    return (2 + 4 + (2 if cfg.train.remat else 0)) * per_token * tokens


def _keep(keep: str | None, name: str, side: str, dump: dict | None, hlo: str) -> None:
    if keep and dump:
        os.makedirs(keep, exist_ok=True)
        with open(os.path.join(keep, f"{name}_{side}.hlo.txt"), "w") as f:
            f.write(hlo)
        with open(os.path.join(keep, f"{name}_{side}.json"), "w") as f:
            json.dump(dump, f)


def _kept(keep_from: str | None, name: str) -> tuple[dict | None, str, str]:
    """MaxText's program as an earlier --keep run wrote it (--maxtext-from), or (None, "", "")."""
    base = os.path.join(keep_from or "", f"{name}_maxtext")
    if not keep_from or not os.path.exists(base + ".json"):
        return None, "", ""
    with open(base + ".json") as f, open(base + ".hlo.txt") as g:
        return json.load(f), g.read(), ""


def run_row(name: str, python: str, extra: list[str], timeout: float, keep: str | None = None,
            maxtext_from: str | None = None) -> dict:
    from jaxformer.train import aot, costs
    row = ROWS[name]
    chip = aot.chip_of(row.topology)
    out = {"row": name, "topology": row.topology, "maxtext_topology": row.maxtext_topology,
           "maxtext_options": list(row.maxtext) + [f"compile_xla_flags={row.vmem_flag}"],
           "jaxformer_sets": list(row.sets) + extra, "differs": row.differs}
    with tempfile.TemporaryDirectory(prefix=f"maxtext_aot_{name}_") as work:
        m_dump, m_hlo, m_err = _kept(maxtext_from, name)
        out["maxtext_read_from"] = maxtext_from if m_dump else None
        if m_dump is None:
            m_dump, m_hlo, m_err = compile_maxtext(row, python, work, timeout)
        _keep(keep, name, "maxtext", m_dump, m_hlo)
        o_dump, o_hlo, o_err, cfg, facts, kernels = compile_ours(row, work, extra)
        _keep(keep, name, "jaxformer", o_dump, o_hlo)
        chips = len(aot.devices_for(row.topology))
        out["chips"] = chips
        if facts is None:  # ours refused: the model's FLOPs from its abstract params
            from jaxformer.train import init as init_lib
            from jaxformer.train import lora as lora_lib
            from jaxformer.train.jax_trainer import model_config_for_training
            model = init_lib.abstract_model(cfg.model_name, model_config_for_training(cfg), 0, cfg.train.lora)
            facts = costs.model_facts(cfg, lora_lib.split(model)[1])
        model_flops = costs.model_flops_per_step(cfg, facts)
        out["model_flops_per_step"] = model_flops
        out["tokens_per_step"] = facts["tokens_per_step"]
        # the splash kernels' FLOPs, one formula for both (every layer's attention a splash call)
        ours_kernel = costs.splash_flops(cfg, kernels) if kernels else 0.0
        theirs_kernel = costs.splash_flops(cfg, ["splash"])
        if m_dump and re.search(r"%gmm[.\d]* = ", m_hlo):  # megablox's expert matmuls: Pallas, no FLOPs declared
            theirs_kernel += moe_expert_flops(cfg)
        out["jaxformer"] = summarize(o_dump, o_hlo, chip, chips, ours_kernel, model_flops) if o_dump else {"error": o_err}
        out["maxtext"] = summarize(m_dump, m_hlo, chip, chips, theirs_kernel, model_flops) if m_dump else {"error": m_err}
    if o_dump and m_dump:
        j, m = out["jaxformer"], out["maxtext"]
        out["ratio"] = {"est_step_s": j["est_step_s"] / m["est_step_s"],
                        "hbm_total": j["bytes_per_chip"]["total"] / m["bytes_per_chip"]["total"],
                        "temp": j["bytes_per_chip"]["temp"] / max(m["bytes_per_chip"]["temp"], 1),
                        "program_flops": j["program_flops_per_chip"] / m["program_flops_per_chip"],
                        "hbm_bytes": j["hbm_bytes_per_chip"] / m["hbm_bytes_per_chip"],
                        "collective_bytes": (sum(v["bytes"] for v in j["collectives"].values())
                                             / max(sum(v["bytes"] for v in m["collectives"].values()), 1))}
    return out


# ----------------------------------------------------------------------------- the table
def _gib(n) -> str:
    return f"{n / 2**30:.2f}"


def _side(s: dict) -> list[str]:
    if "error" in s:
        return [f"refused: {s['error'][:300]}"]
    by, r = s["bytes_per_chip"], s["roofline"]
    coll = ", ".join(f"{k} {v['count']} ({_gib(v['bytes'])} GiB)" for k, v in s["collectives"].items() if v["count"])
    return [f"HBM/chip GiB: args {_gib(by['arguments'])} + out {_gib(by['outputs'])} + temp {_gib(by['temp'])} "
            f"+ code {_gib(by['code'])} = {_gib(by['total'])} ({'fits' if s['fits'] else 'DOES NOT FIT'}); "
            f"host {_gib(by['host'])}",
            f"FLOPs/chip {s['program_flops_per_chip']:.3e} (kernels {s['kernel_flops_per_chip']:.3e}; compiler, "
            f"loop bodies once, {s['compiler_flops_per_chip']:.3e}); HBM bytes/chip {s['hbm_bytes_per_chip']:.3e} "
            f"(compiler {s['compiler_bytes_accessed']:.3e})",
            f"collectives: {coll or 'none'}",
            f"est step {s['est_step_s']:.3f} s ({'optimal_seconds' if s['optimal_seconds_whole'] else 'roofline'}): "
            f"compute {r['compute_s']:.3f} / HBM {r['hbm_s']:.3f} / collectives {r['collective_s']:.3f} s -> "
            f"{r['bound_by']}-bound, est MFU {100 * (s['est_mfu'] or 0):.1f}%; compiler optimal_seconds "
            f"{s['compiler_optimal_seconds']:.4g} ({s['while_loops']} while loops)",
            "Pallas kernels: " + (", ".join(f"{k} x{n}" for k, n in s["pallas_kernels"].items()) or "none")
            + f"; compiled in {s['compile_s']:.0f} s"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", nargs="+", choices=list(ROWS), default=list(ROWS))
    p.add_argument("--maxtext-python", default=os.environ.get("MAXTEXT_PYTHON", "/tmp/maxtext-venv/bin/python"),
                   help="the MaxText venv's python (bench/README.md)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="applied to jaxformer's side of every row")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds for one MaxText compile")
    p.add_argument("--keep", metavar="DIR", default=None,
                   help="also write each program's HLO text and compiled.json to DIR/ROW_{jaxformer,maxtext}.* "
                        "(for reading the HLO afterwards)")
    p.add_argument("--maxtext-from", metavar="DIR", default=None,
                   help="read MaxText's program of a row from DIR/ROW_maxtext.* (an earlier --keep run) instead of "
                        "compiling it; the output names DIR for each row read so")
    args = p.parse_args()
    if not os.path.exists(args.maxtext_python):
        p.error(f"no MaxText python at {args.maxtext_python}: build the venv (bench/README.md, 'MaxText venv')")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    with open("/proc/cpuinfo") as f:
        cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), platform.processor())
    print(f"jax {jax.__version__}, host {cpu}, {os.cpu_count()} CPUs; every time an ESTIMATE from the TPU "
          "compiler's programs (nothing runs)", flush=True)
    rows = []
    for name in args.rows:
        r = run_row(name, args.maxtext_python, args.overrides, args.timeout, args.keep, args.maxtext_from)
        rows.append(r)
        print(f"\n== {name}: {r['topology']} ({r['maxtext_topology']}, {r['chips']} chips), "
              f"{r['tokens_per_step'] / 1e6:.2f} M tokens/step", flush=True)
        if r["maxtext_read_from"]:
            print(f"  (MaxText's program read from {r['maxtext_read_from']}, compiled by an earlier --keep run)")
        for side in ("jaxformer", "maxtext"):
            lines = _side(r[side])
            print(f"  {side:9s} " + lines[0] + "".join(f"\n            {ln}" for ln in lines[1:]), flush=True)
        if "ratio" in r:
            print("  ours/MaxText: " + ", ".join(f"{k} {v:.2f}x" for k, v in r["ratio"].items()), flush=True)
        print(f"  differs: {r['differs']}", flush=True)
    print(json.dumps(rows, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
