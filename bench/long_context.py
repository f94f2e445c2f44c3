"""Peak memory and time of one LM training step at long sequence lengths, three attention
implementations side by side (random weights; not a test). Issue 24's targets: jaxformer's
blockwise attention grows at most linearly in T in memory, is at most torch SDPA's at T = 16k,
and is within 1.3x of plain attention's time at T = 4k.

Contenders (`impl`), each (impl, T) in its own child process:

    plain       jaxformer's attention as before (lowering attention "plain"): [B, H, T, S] scores
    blockwise   jaxformer's blockwise attention (lowering attention "blockwise",
                jaxformer/layers/kernels/blockwise.py), the mask kept in parts
    torch_sdpa  the torch twin (torch_ref) with blockwise attention, which runs
                torch.nn.functional.scaled_dot_product_attention with is_causal (its flash CPU
                kernel) for a plain causal mask

The model is a small Llama-style LM (RoPE, GQA 4/2 heads of 64, SwiGLU, RMSNorm, D 256, 2 layers,
byte vocab), batch 1; the step is forward, backward and an AdamW update (jaxformer's train
step, jitted as the trainer does: the state donated, lowering.train_compiler_options();
torch: loss.backward() and torch.optim.AdamW).

peak_bytes is what one training step adds to the process's resident memory at its peak, measured
the same way for both frameworks: in a fresh child per (impl, T), everything resident before the
step (model, optimiser state with AdamW's moments already created, batch, the compiled program)
is excluded by resetting the kernel's high-water mark (VmHWM, via /proc/self/clear_refs) just
before the step, and peak_bytes = VmHWM after it - VmRSS before it. The measured step is the
first one (after the AOT compile in JAX; in torch after AdamW's state was created by a step at
lr 0 on zero gradients), so no memory freed by an earlier step can be reused unseen: an earlier
version reset the mark after a warm-up step, and memory the allocator kept from the warm-up hid
the step's own (plain attention at T = 4k showed 13 MB for 2 GB of compiled temporaries). The
child's glibc malloc also puts every block of 64 KiB or more in its own mmap, unmapped on free
(MALLOC_MMAP_THRESHOLD_ fixed, which also stops glibc raising it after frees), so the later
steps' figure (peak_bytes_repeat, with --steps > 1) is comparable too. What this counts: the
activations kept for the backward pass, the gradients, the backward's temporaries, the new
parameters and optimiser state before the old ones are freed (JAX: the outputs not aliased to
the donated state; torch updates in place), and first-run costs of each runtime (thread pools,
kernel scratch). JAX's peak exceeds its compiled_bytes by memory outside XLA's buffer
assignment that grows with T: YNNPACK's fusions' own buffers, ~110 MB at 16k when YNNPACK fused
reductions and elementwise ops with the dots, ~60 MB with the train steps' dots-only option
(lowering.CPU_COMPILER_OPTIONS; docs/numerics.md §38).

Cross-checks in each row: `compiled_bytes` (JAX) is XLA's own account of the step,
memory_analysis() temporaries (one preallocated buffer sized by the buffer assignment's heap
simulation, so the live peak of XLA's schedule) plus outputs not aliased to donated inputs;
`saved_bytes` (torch) sums the storages autograd saved for the backward pass
(torch.autograd.graph.saved_tensors_hooks, each storage once, parameters excluded), a lower
bound of torch's peak. Where plain attention would need more than --plain-limit GiB of
temporaries it is not run: the row has peak_bytes null, compiled_bytes and "skipped".
step_s is the best of --steps steps (the first included). Figures: bench/README.md, "Long
context".

The last line is JSON: a list of rows {impl, seq_len, peak_bytes, step_s}, each row with the
ratios to the other implementations at the same T where they ran.

    python bench/long_context.py                       # T = 1k, 4k, 16k, 32k
    python bench/long_context.py --lengths 1024 4096 --steps 2
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMPLS = ("plain", "blockwise", "torch_sdpa")
# glibc malloc in each child: every block of 64 KiB or more is its own mmap, unmapped when freed
# (a fixed threshold also turns off glibc's raising it after a free), so no memory a step frees
# stays resident and is reused unseen by the next step's high-water mark
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
MODEL = dict(vocab_size=259, d_model=256, num_heads=4, num_kv_heads=2, head_dim=64, d_ff=512, num_layers=2,
             tie_embeddings=False, norm_eps=1e-6, dropout=0.0)


def status_bytes(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    return 0


def reset_peak() -> int:
    """Reset VmHWM to the current RSS; -> the current RSS."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return status_bytes("VmRSS:")


def run_config(seq: int, attention: str = "plain"):
    from jaxformer.config import to_dict
    from jaxformer.config.models import LMConfig
    from jaxformer.train.config import config_from_dict
    model = {"name": "lm", **to_dict(LMConfig.llama(**MODEL, max_len=seq))}
    # train.attention: the train steps trace under it (StepFns.tracing), over any outer switch
    train = {"steps": 10, "batch_size": 1, "lr": 1e-4, "warmup_steps": 0, "schedule": "constant",
             "attention": attention}
    return config_from_dict({"model": model, "data": {"name": "stdlib_docs", "seq_len": seq}, "train": train})


def jax_child(impl: str, seq: int, steps: int, plain_limit: float) -> dict:
    import jax
    import numpy as np

    from jaxformer import lowering
    from jaxformer.convert import scan_prefixes
    from jaxformer.train import init as init_lib
    from jaxformer.train.optim import make_optax
    from jaxformer.train.steps import StepFns
    cfg = run_config(seq, impl)
    model = init_lib.abstract_model("lm", cfg.model, 0)
    tx, schedule = make_optax(cfg.train, init_lib.lora.split(model)[1], scan_prefixes(model))
    state = init_lib.create_state("lm", cfg.model, "normal_0.02", 0, tx)
    fns = StepFns(cfg, model, tx, schedule)
    tokens = np.random.RandomState(0).randint(3, MODEL["vocab_size"], (1, 1, seq + 1)).astype(np.int32)
    with lowering.tracing(attention=impl):
        # jitted as the trainer does (jax_trainer._wrap_steps), with the train steps' compiler options
        step = jax.jit(fns.train_step, donate_argnums=0, compiler_options=lowering.train_compiler_options()).lower(
            state, {"tokens": tokens}).compile()
    mem = step.memory_analysis()
    temp = int(mem.temp_size_in_bytes)
    # what the step allocates by XLA's own account: its temporaries (one preallocated buffer,
    # sized by the heap simulation of the buffer assignment) and the outputs not aliased to the
    # donated state
    compiled = temp + int(mem.output_size_in_bytes) - int(mem.alias_size_in_bytes)
    row = {"impl": impl, "seq_len": seq, "compiled_bytes": compiled}
    if impl == "plain" and temp > plain_limit * 2 ** 30:
        return {**row, "peak_bytes": None, "step_s": None,
                "skipped": f"compiled step needs {temp / 2 ** 30:.1f} GiB of temporaries (> --plain-limit)"}
    batch = {"tokens": tokens}
    peak, t, (state, out) = measured(lambda: jax.block_until_ready(step(state, batch)))
    times, repeat = [t], 0
    for _ in range(steps - 1):
        p, t, (state, out) = measured(lambda state=state: jax.block_until_ready(step(state, batch)))
        times.append(t)
        repeat = max(repeat, p)
    return {**row, "peak_bytes": peak, "step_s": round(min(times), 3), "peak_bytes_repeat": repeat or None,
            "loss": float(out["loss"])}


def measured(fn):
    """-> (peak bytes fn adds to the resident set, seconds, fn's result). VmHWM is reset to the
    current RSS just before (after a gc, so garbage of earlier steps is gone)."""
    gc.collect()
    before = reset_peak()
    t0 = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - t0
    return status_bytes("VmHWM:") - before, seconds, result


def torch_child(seq: int, steps: int) -> dict:
    import numpy as np
    import torch

    from torch_ref import lowering
    from torch_ref.models.lm import LM
    torch.manual_seed(0)
    cfg = run_config(seq)
    model = LM(cfg.model).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.from_numpy(np.random.RandomState(0).randint(3, MODEL["vocab_size"], (1, seq + 1)).astype(np.int64))

    # AdamW's state exists before the measured step, as the JAX state's opt_state does: one
    # step at lr 0 on zero gradients creates it and changes no weight
    for group in opt.param_groups:
        group["lr"] = 0.0
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    for group in opt.param_groups:
        group["lr"] = 1e-4
    saved = {}

    def pack(t):  # autograd's saved tensors, counted once per storage
        st = t.untyped_storage()
        saved[st.data_ptr()] = st.nbytes()
        return t

    def step():
        opt.zero_grad(set_to_none=True)
        with lowering.computing(attention="blockwise"), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            logits = model(tokens[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                     tokens[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        return float(loss)

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    peak, t, loss = measured(step)
    activations = sum(n for ptr, n in saved.items() if ptr not in params)
    times, repeat = [t], 0
    for _ in range(steps - 1):
        p, t, loss = measured(step)
        times.append(t)
        repeat = max(repeat, p)
    return {"impl": "torch_sdpa", "seq_len": seq, "saved_bytes": activations, "peak_bytes": peak,
            "step_s": round(min(times), 3), "peak_bytes_repeat": repeat or None, "loss": loss}


def layer_memory(seq: int) -> list[dict]:
    """Activation memory per layer of the packaged long-context recipe's model
    (jaxformer/configs/long_context.yaml) at T = seq with blockwise attention, for scan_layers
    and remat on and off: XLA's compiled temporaries of the train step at 2 and 4 layers, and
    their difference per layer (compile only, nothing runs)."""
    import jax
    import numpy as np

    from jaxformer import lowering
    from jaxformer.convert import scan_prefixes
    from jaxformer.train import init as init_lib
    from jaxformer.train.config import config_from_dict, load_config
    from jaxformer.train.optim import make_optax
    from jaxformer.train.steps import StepFns
    base = load_config("long_context").to_dict()
    rows = []
    for scan in (False, True):
        for remat in (False, True):
            temps = {}
            for layers in (2, 4):
                data = {**base, "model": {**base["model"], "num_layers": layers, "scan_layers": scan, "max_len": seq},
                        "data": {**base["data"], "seq_len": seq},
                        "train": {**base["train"], "batch_size": 1, "remat": remat, "init_from": None}}
                cfg = config_from_dict(data)
                model = init_lib.abstract_model("lm", cfg.model, 0)
                if remat:
                    from jaxformer.train.jax_trainer import set_remat
                    set_remat(model, cfg.train.remat_policy)
                tx, schedule = make_optax(cfg.train, init_lib.lora.split(model)[1], scan_prefixes(model))
                state = init_lib.abstract_state_of(model, tx)
                tokens = jax.ShapeDtypeStruct((1, 1, seq + 1), np.int32)
                with lowering.tracing(attention="blockwise"):
                    compiled = jax.jit(StepFns(cfg, model, tx, schedule).train_step,
                                       compiler_options=lowering.train_compiler_options()).lower(
                        state, {"tokens": tokens}).compile()
                temps[layers] = int(compiled.memory_analysis().temp_size_in_bytes)
            rows.append({"scan_layers": scan, "remat": remat, "seq_len": seq, "temp_bytes_2_layers": temps[2],
                         "temp_bytes_4_layers": temps[4], "per_layer_bytes": (temps[4] - temps[2]) // 2})
    return rows


def spawn(impl: str, seq: int, args) -> dict:
    cmd = [sys.executable, __file__, "--child", impl, "--lengths", str(seq), "--steps", str(args.steps),
           "--plain-limit", str(args.plain_limit)]
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **MALLOC_ENV}
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    if p.returncode:
        return {"impl": impl, "seq_len": seq, "peak_bytes": None, "step_s": None,
                "error": (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def add_ratios(rows: list[dict]) -> None:
    """Each row gains peak_vs_<impl> and step_vs_<impl> against the other rows at its T."""
    for r in rows:
        for o in rows:
            if o is r or o["seq_len"] != r["seq_len"]:
                continue
            for key, name in (("peak_bytes", "peak"), ("step_s", "step")):
                if r.get(key) and o.get(key) and not (key == "peak_bytes" and "skipped" in o):
                    r[f"{name}_vs_{o['impl']}"] = round(r[key] / o[key], 3)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384, 32768])
    ap.add_argument("--impls", nargs="+", default=list(IMPLS), choices=IMPLS)
    ap.add_argument("--steps", type=int, default=2, help="steps per contender (the first one measured for memory)")
    ap.add_argument("--plain-limit", type=float, default=8.0,
                    help="GiB of compiled temporaries above which plain attention is not run")
    ap.add_argument("--layer-memory", type=int, default=None, metavar="T",
                    help="instead: activation memory per layer of the long-context recipe at T, with "
                         "scan_layers and remat on and off (compile only; JSON rows)")
    args = ap.parse_args(argv)
    if args.layer_memory:
        rows = layer_memory(args.layer_memory)
        for r in rows:
            print(f"scan_layers={r['scan_layers']!s:<5} remat={r['remat']!s:<5} per layer "
                  f"{r['per_layer_bytes'] / 2 ** 20:8.1f} MiB  (2 layers {r['temp_bytes_2_layers'] / 2 ** 20:.0f} MiB, "
                  f"4 layers {r['temp_bytes_4_layers'] / 2 ** 20:.0f} MiB)")
        print(json.dumps(rows))
        return 0
    if args.child:
        seq = args.lengths[0]
        row = torch_child(seq, args.steps) if args.child == "torch_sdpa" else \
            jax_child(args.child, seq, args.steps, args.plain_limit)
        print(json.dumps(row))
        return 0
    rows = [spawn(impl, seq, args) for seq in args.lengths for impl in args.impls]
    add_ratios(rows)
    mib = 2 ** 20
    print(f"{'impl':<11} {'T':>6} {'peak MiB':>10} {'check MiB':>10} {'step s':>8}  note")
    for r in rows:
        peak = "-" if r.get("peak_bytes") is None else f"{r['peak_bytes'] / mib:.0f}"
        note = r.get("skipped") or r.get("error") or ""
        check = r.get("compiled_bytes") or r.get("saved_bytes")
        check = "-" if check is None else f"{check / mib:.0f}"
        print(f"{r['impl']:<11} {r['seq_len']:>6} {peak:>10} {check:>10} {r['step_s'] if r['step_s'] is not None else '-':>8}  {note}")
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
