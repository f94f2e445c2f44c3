"""Side-by-side greedy generation on CPU: new tokens per second for jaxformer, torch_ref and
Hugging Face transformers.GPT2LMHeadModel at GPT-2 small size (124M, random weights from
GPT2Config(), no download), batch 1 and batch 8, 128 new tokens after a 32-token prompt.

All three run the SAME weights: the HF model's state dict is mapped onto torch_ref's names
(c_attn split into q/k/v, Conv1D [in, out] transposed) and converted into jaxformer, so the
script also reports whether the three produce the same token ids. Not a test: it times.

    python bench/generate.py [--new 128] [--prompt 32] [--batches 1 8] [--repeats 3]

Targets: jaxformer >= 45 tok/s at batch 1, >= 2x HF at batch 8.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def first_mismatch(tmodel, ids, ref, other):
    """Where two greedy runs first part, and the reference's top-2 logit gap there: a gap at
    the float32 noise level (~1e-6) means a near-tie flipped, not a bug."""
    import torch
    rows, steps = np.nonzero(ref != other)
    if len(rows) == 0:
        return None
    k = int(np.argmin(steps))
    r, s = int(rows[k]), int(steps[k])
    with torch.no_grad():
        seq = torch.as_tensor(np.concatenate([ids[r], ref[r, :s]])[None]).long()
        logits = tmodel(seq)[0, -1].double()
    top2 = torch.topk(logits, 2).values
    return {"row": r, "step": s, "torch_ref_top2_gap": float(top2[0] - top2[1])}


def timed_rounds(runners: dict, repeats: int):
    """runners: name -> (timed run, warm-up). Warms every runner up (compilation; JAX: the same
    shapes, so the full run), then times them in rounds, one run of each per round, so a slow
    spell of this shared machine falls on all of them alike. -> (name -> seconds per round,
    name -> the result)."""
    import torch
    times, results = {name: [] for name in runners}, {}
    with torch.no_grad():
        for _, warm in runners.values():
            warm()
        for _ in range(repeats):
            for name, (fn, _) in runners.items():
                t = time.perf_counter()
                results[name] = fn()
                times[name].append(time.perf_counter() - t)
    return times, results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip", nargs="*", default=[], choices=["hf", "torch_ref", "jaxformer"])
    args = ap.parse_args(argv)

    import jax
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from jaxformer import convert
    from jaxformer import generation as jgen
    from jaxformer.config.models import GenerationConfig, LMConfig
    from jaxformer.hf import gpt2 as hf_gpt2
    from jaxformer.models import build_model as jbuild
    from torch_ref import generation as tgen
    from torch_ref.models import build_model as tbuild

    torch.manual_seed(0)
    hf_cfg = GPT2Config()
    hf = GPT2LMHeadModel(hf_cfg).eval()
    cfg = LMConfig.gpt2_small(max_len=hf_cfg.n_positions)
    # HF names -> torch_ref keys by the importer's own mapping (jaxformer.hf.gpt2)
    to_ours = hf_gpt2.tensor_fn("lm", cfg, "GPT2LMHeadModel")
    sd = {}
    for key, value in hf.state_dict().items():
        sd.update({k: torch.as_tensor(np.ascontiguousarray(v)) for k, v in
                   (to_ours(key, value.numpy()) or {}).items()})
    tmodel = tbuild("lm", cfg).eval()
    convert.check_torch_load(tmodel, sd)
    jmodel = jbuild("lm", cfg)
    convert.load_torch_state_dict(jmodel, sd)
    gen = GenerationConfig(max_new_tokens=args.new, strategy="greedy", stop_at_eos=False)

    print(f"jax {jax.__version__} ({jax.default_backend()}), torch {torch.__version__} "
          f"({torch.get_num_threads()} threads), {os.cpu_count()} CPUs; GPT-2 small "
          f"{sum(p.numel() for p in hf.parameters()) / 1e6:.0f}M params; prompt {args.prompt}, "
          f"{args.new} new tokens, greedy, {args.repeats} rounds (one run of each per round), best round", flush=True)
    # batch 1 is weight-streaming bound: every token reads all fp32 weights once (the tied
    # head included), so memory bandwidth / weight bytes caps tok/s whatever the framework
    big = jax.numpy.ones(64 * 2 ** 20, np.float32)  # 256 MB, read by a jitted sum on all cores
    total = jax.jit(lambda a: a.sum())
    total(big).block_until_ready()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        total(big).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    bandwidth = big.nbytes / best
    del big
    weight_bytes = 4 * sum(p.numel() for p in tmodel.parameters())
    print(f"read bandwidth ~{bandwidth / 1e9:.1f} GB/s, weights {weight_bytes / 1e6:.0f} MB -> batch-1 "
          f"ceiling ~{bandwidth / weight_bytes:.0f} tok/s", flush=True)
    rows = []
    for b in args.batches:
        ids = np.random.RandomState(b).randint(0, cfg.vocab_size, (b, args.prompt)).astype(np.int32)
        def hf_run(n):
            return hf.generate(torch.tensor(ids, dtype=torch.long), attention_mask=torch.ones(ids.shape, dtype=torch.long),
                               max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)[:, args.prompt:].numpy()
        short = dataclasses.replace(gen, max_new_tokens=4)
        runners = {  # name: (timed run, warm-up)
            "hf": (lambda: hf_run(args.new), lambda: hf_run(4)),
            "torch_ref": (lambda: tgen.lm_generate(tmodel, ids, None, gen), lambda: tgen.lm_generate(tmodel, ids, None, short)),
            "jaxformer": (lambda: jgen.lm_generate(jmodel, ids, None, gen), lambda: jgen.lm_generate(jmodel, ids, None, gen)),
        }
        runners = {name: r for name, r in runners.items() if name not in args.skip}
        times, tokens = timed_rounds(runners, args.repeats)
        speed = {name: b * args.new / min(ts) for name, ts in times.items()}  # best round
        for name, ts in times.items():
            rounds = " ".join(f"{b * args.new / t:.1f}" for t in ts)
            print(f"batch {b}  {name:10s} {speed[name]:8.1f} tok/s best ({min(ts):.2f} s); rounds: {rounds}", flush=True)
        ref = speed.get("hf")
        row = {"batch": b, **{f"{k}_tok_s": round(v, 2) for k, v in speed.items()}}
        if ref:
            row.update({f"{k}_vs_hf": round(v / ref, 2) for k, v in speed.items() if k != "hf"})
            # the ratio within each round, where both ran under the same machine load
            row.update({f"{k}_vs_hf_per_round": [round(times["hf"][i] / t, 2) for i, t in enumerate(ts)]
                        for k, ts in times.items() if k != "hf"})
        names = list(tokens)
        row["same_tokens"] = {f"{a}=={c}": bool(np.array_equal(tokens[a], tokens[c]))
                              for i, a in enumerate(names) for c in names[i + 1:]}
        if "torch_ref" in tokens and "jaxformer" in tokens:
            row["jax_vs_torch_first_mismatch"] = first_mismatch(tmodel, ids, tokens["torch_ref"], tokens["jaxformer"])
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
