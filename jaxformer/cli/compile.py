"""`jaxformer compile --config CFG --topology NAME [--slices N] [--set ...] [--step train|decode] [--json]`:
compile the trainer's own step (or generation's prefill and cached step) for a TPU slice or
NVIDIA GPUs on this host, with none of them, and report whether it fits and estimates of its
speed (jaxformer/train/aot.py). Needs libtpu (`pip install 'jaxformer[tpu]'`) for a TPU, jax's
CUDA plugin (`pip install 'jaxformer[cuda12]'`) for a GPU.

Exit codes: 0 it fits; 2 a user error, or it does not fit (one or two lines naming the bytes
per chip against HBM, the largest buffers and the settings that would help)."""
from __future__ import annotations

import json
import os
import sys


def add_arguments(p) -> None:
    p.add_argument("--config", required=True, help="a packaged config's name (llama, moe, llama3_8b, ...) or a YAML path")
    p.add_argument("--topology", required=True,
                   help="a TPU slice (v4:2x2x2, v5e:2x2, v5e:16x16, v5p:2x2x1, v5p:4x4x4, v6e:16x16, ...) or "
                        "NVIDIA GPUs (h100:8, h200:8, h200:2x8 = 2 hosts of 8)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override any nested key, e.g. --set parallel.mesh.fsdp=64 (repeatable)")
    p.add_argument("--slices", type=int, default=None, metavar="N",
                   help="TPU: N slices of --topology joined by the data-center network (parallel.slices; the "
                        "axis split across them: parallel.dcn_axis, data or fsdp)")
    p.add_argument("--step", choices=["train", "decode"], default="train",
                   help="train: the train step; decode: generation's prefill and one-token cached step")
    p.add_argument("--packed", action="store_true",
                   help="train on packed documents (the batch carries segment ids, as data.packing: segments)")
    p.add_argument("--prompt-len", type=int, default=None, help="decode: prompt length (default data.seq_len)")
    p.add_argument("--cache-len", type=int, default=None, help="decode: KV-cache slots (default model.max_len)")
    p.add_argument("--json", action="store_true", help="also print the report as one JSON object on the last line")
    p.add_argument("--no-check-tips", dest="check_tips", action="store_false",
                   help="when it does not fit, name the settings that would help without compiling each")


def _gib(n) -> str:
    return f"{n / (1 << 30):.2f} GiB"


def _ms(s) -> str:
    return "n/a" if s is None else f"{s * 1e3:.2f} ms"


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def text_report(r: dict) -> str:
    """The readable report (every figure of `r` that a person reads first)."""
    by = r["bytes_per_chip"]
    lines = [f"{r['step']} step of {r['param_count'] / 1e9:.3f} B params ({r['active_params'] / 1e9:.3f} B active) "
             f"on {r['topology']} ({r['chips']} x {r['device_kind']}), mesh "
             + " x ".join(f"{k} {v}" for k, v in r["mesh"].items() if v > 1) or "one chip",
             "per chip: " + ", ".join(f"{k} {_gib(v)}" for k, v in by.items() if k != "total")
             + f"; total {_gib(by['total'])} of {_gib(r['hbm_per_chip_bytes'])} HBM: "
             + ("fits" if r["fits"] else "DOES NOT FIT"),
             *(f"attention: {c['kernel']} x{c['calls']} ({c['why']})" for c in r.get("attention_choices")
               or [{"kernel": "none", "calls": 0, "why": "no attention call traced"}]),
             "ESTIMATES, not measurements (nothing ran):",
             f"  step {_ms(r['est_step_s'])}, MFU {_pct(r['est_mfu'])}, "
             f"{r['est_tokens_per_s_per_chip'] or 0:,.0f} tokens/s/chip, from the {r['est_source']}",
             f"  compiler: optimal_seconds {r['compiler_optimal_seconds']:.4g} s, FLOPs/chip "
             f"{r['compiler_flops_per_chip']:.3e} (loop bodies once)",
             f"  roofline: compute {_ms(r['roofline']['compute_s'])}, HBM {_ms(r['roofline']['hbm_s'])}, "
             f"collectives over the interconnect {_ms(r['roofline']['collective_s'])} -> {r['roofline']['bound_by']}-bound, "
             f"MFU {_pct(r['roofline_mfu'])}",
             f"  model FLOPs/step {r['model_flops_per_step']:.3e} ("
             + ("2N per token" if r["step"] != "train" else "6N per token" if r.get("model") == "module"
                else "6N per token + attention") + "), program FLOPs/chip "
             f"{r['program_flops_per_chip']:.3e} (remat and all)",
             "collectives per step: " + (", ".join(f"{k} {v['count']} ({_gib(v['bytes'])})"
                                                   for k, v in r["collectives"].items() if v["count"]) or "none")
             + ("" if r.get("slices", 1) == 1 else " inside a slice (ICI); between the "
                f"{r['slices']} slices (DCN, {r['dcn_axis']} axis): "
                + (", ".join(f"{k} {v['count']} ({_gib(v['bytes'])})" for k, v in r["dcn_transfers"].items())
                   or "none") + f", {_ms(r['roofline'].get('dcn_s'))} at the chip's DCN rate"),
             *([f"pipeline: {r['mesh']['pipeline']} stages x {r['pipeline_microbatches']} microbatches, "
                f"bubble {_pct(r['pipeline_bubble'])} of each stage's ticks (GPipe)"] if "pipeline_bubble" in r else []),
             f"compiled in {r['compile_s']:.1f} s"]
    return "\n".join(lines)


def run(args) -> int:
    # libtpu and the CUDA plugin are only compilers here; the process itself runs on the CPU
    # (set before jax starts: the CUDA plugin loads without a GPU only then)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from jaxformer.train import aot
    from jaxformer.train.config import load_config
    if args.slices is not None:  # as --set parallel.slices=N (the tips' compiles take it too)
        args.overrides = [*args.overrides, f"parallel.slices={args.slices}"]
    cfg = load_config(args.config, args.overrides)
    try:
        report = aot.compile_report(cfg, args.topology, args.step, packed=args.packed,
                                    prompt_len=args.prompt_len, cache_len=args.cache_len)
    except aot.DoesNotFit as e:  # the compiler itself refused: its temporaries alone exceed HBM
        hbm = aot.chip_of(args.topology).hbm_bytes
        state = sum(e.state_bytes.values())
        by = {**e.state_bytes, "temp": e.needed or 0}
        chips = len(aot.devices_for(args.topology, cfg.parallel.slices))
        return _does_not_fit(f"the compiler needs {_gib(e.needed) if e.needed else 'more than HBM'} for "
                             f"temporaries beside the state's {_gib(state)} per chip, > {_gib(hbm)} HBM",
                             args, e.largest, _tips(args, aot.tips(cfg, args.step, chips, by)))
    print(text_report(report), flush=True)
    if args.json:
        print(json.dumps({k: v for k, v in report.items() if k != "largest"}, default=float), flush=True)
    if not report["fits"]:
        by = report["bytes_per_chip"]
        return _does_not_fit(f"{_gib(by['total'])} per chip (temporaries {_gib(by['temp'])}) > "
                             f"{_gib(report['hbm_per_chip_bytes'])} HBM", args, report["largest"],
                             _tips(args, aot.tips(cfg, args.step, report["chips"], by)))
    return 0


def _tips(args, tips: list) -> str:
    """The tips' words, each that one setting expresses checked by compiling the config with it
    (issue 51 §4): "(checked: fits, X per chip)" or "(checked: X per chip, does not fit
    alone)"; where none fits alone, all of them together are compiled too. --no-check-tips:
    the words alone."""
    from jaxformer.train import aot
    from jaxformer.train.config import load_config
    if not args.check_tips:
        return ", ".join(label for label, _ in tips) or "more chips"

    def check(sets: list[str]) -> tuple[bool, str]:
        try:
            r = aot.compile_report(load_config(args.config, [*args.overrides, *sets]), args.topology, args.step,
                                   packed=args.packed, prompt_len=args.prompt_len, cache_len=args.cache_len)
        except aot.DoesNotFit as e:
            return False, f"the compiler needs {_gib(e.needed)} for temporaries" if e.needed else "over HBM"
        except ValueError as e:  # ConfigError included: the setting does not combine with the config
            return False, f"refused: {str(e).splitlines()[0]}"
        return r["fits"], f"{_gib(r['bytes_per_chip']['total'])} per chip"

    checkable = [(label, sets) for label, sets in tips if sets]
    print(f"does not fit; compiling with each of {len(checkable)} setting(s) that may help", flush=True)
    words, any_fits = [], False
    for label, sets in tips:
        if not sets:
            words.append(label)
            continue
        fits, what = check(sets)
        any_fits |= fits
        words.append(f"{label} (checked: fits, {what})" if fits else f"{label} (checked: {what}, does not fit alone)")
    if not any_fits and len(checkable) > 1:
        merged = list(dict.fromkeys(s for _, sets in checkable for s in sets))
        fits, what = check(merged)
        words.append(f"all of these together (checked: fits, {what})" if fits
                     else f"all of these together (checked: {what}, does not fit)")
    return ", ".join(words) or "more chips"


def _does_not_fit(why: str, args, largest, tips: str) -> int:
    """The two lines on stderr (exit 2): the bytes against HBM and the largest buffers, then the
    settings that would help."""
    rows = ", ".join(f"{name} {_gib(n)}" for name, n in largest[:2])
    print(f"jaxformer compile: does not fit on {args.topology}: {why}; largest state buffers per chip: {rows}\n"
          f"  try: {tips}", file=sys.stderr)
    return 2
