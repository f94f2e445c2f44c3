"""Side-by-side greedy generation on CPU: new tokens per second for jaxformer, torch_ref and
Hugging Face transformers.GPT2LMHeadModel at GPT-2 small size (124M, random weights from
GPT2Config(), no download), batch 1 and batch 8, 128 new tokens after a 32-token prompt, with
the matmul weights in fp32, bf16 or int8 (GenerationConfig.weights_dtype).

All three run the SAME weights: the HF model's state dict is mapped onto torch_ref's names
(c_attn split into q/k/v, Conv1D [in, out] transposed) and converted into jaxformer, so the
script also reports whether the three produce the same token ids (fp32) and how often the
reduced-weight runs pick the fp32 run's tokens. HF's own int8 (`hf`, weights_dtype int8) is
`torch.ao.quantization.quantize_dynamic` (per-tensor int8 weights and dynamically quantized
activations, int32 accumulation: a different scheme, for speed reference) applied after the
model's Conv1D blocks are swapped for the equivalent nn.Linear (quantize_dynamic only converts
nn.Linear; on the stock GPT-2 it would quantize the output head alone). Not a test: it times.

    python bench/generate.py [--weights-dtype fp32 bf16 int8] [--new 128] [--prompt 32]
        [--batches 1 8] [--repeats 3] [--skip hf torch_ref jaxformer]

Last line: a JSON list of {impl, batch, weights_dtype, tok_s} (jaxformer's rows carry impl
"jaxformer"). Targets: jaxformer >= 45 tok/s at batch 1 and >= 2x HF at batch 8 (fp32); at
batch 1 int8 >= 1.8x and bf16 >= 1.5x jaxformer fp32, at batch 8 no slower than fp32.
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


def gpt2_small_models():
    """HF GPT2LMHeadModel(GPT2Config()) with its own random init (seed 0), and the same weights
    in torch_ref and jaxformer (LMConfig.gpt2_small) -> (hf, cfg, torch_ref model, jax model)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from jaxformer import convert
    from jaxformer.config.models import LMConfig
    from jaxformer.hf import gpt2 as hf_gpt2
    from jaxformer.models import build_model as jbuild
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
    return hf, cfg, tmodel, jmodel


def hf_int8(hf):
    """HF's own dynamic int8 of a copy of `hf`: its Conv1D blocks ([in, out] weight) become the
    equivalent nn.Linear, then torch.ao.quantization.quantize_dynamic converts every nn.Linear."""
    import copy
    import warnings

    import torch
    from transformers.pytorch_utils import Conv1D
    model = copy.deepcopy(hf)
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, Conv1D):
                lin = torch.nn.Linear(child.weight.shape[0], child.weight.shape[1])
                with torch.no_grad():
                    lin.weight.copy_(child.weight.T)
                    lin.bias.copy_(child.bias)
                setattr(module, name, lin)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notices
        return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8).eval()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--weights-dtype", nargs="+", default=["fp32"], choices=["fp32", "bf16", "int8"])
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip", nargs="*", default=[], choices=["hf", "torch_ref", "jaxformer"])
    args = ap.parse_args(argv)
    dtypes = list(dict.fromkeys(["fp32", *args.weights_dtype]))  # fp32 is the reference of the ratios

    import jax
    import torch
    from flax import nnx

    from jaxformer import generation as jgen
    from jaxformer.config.models import GenerationConfig
    from torch_ref import generation as tgen

    hf, cfg, tmodel, jmodel = gpt2_small_models()
    # one model object per weights dtype (the same arrays): each keeps its own decode copies
    jmodels = {wd: jmodel if wd == "fp32" else nnx.merge(*nnx.split(jmodel), copy=True) for wd in dtypes}
    hf_models = {"fp32": hf, **({"int8": hf_int8(hf)} if "int8" in dtypes and "hf" not in args.skip else {})}
    gen = GenerationConfig(max_new_tokens=args.new, strategy="greedy", stop_at_eos=False)

    print(f"jax {jax.__version__} ({jax.default_backend()}), torch {torch.__version__} "
          f"({torch.get_num_threads()} threads), {os.cpu_count()} CPUs; GPT-2 small "
          f"{sum(p.numel() for p in hf.parameters()) / 1e6:.0f}M params; prompt {args.prompt}, "
          f"{args.new} new tokens, greedy, weights {' '.join(dtypes)}; {args.repeats} rounds "
          f"(one run of each per round), best round", flush=True)
    # batch 1 is weight-streaming bound: every token reads all matmul weights once (the tied
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
    n_params = sum(p.numel() for p in tmodel.parameters())
    ceilings = {wd: bandwidth / (n_params * {"fp32": 4, "bf16": 2, "int8": 1}[wd]) for wd in dtypes}
    print(f"read bandwidth ~{bandwidth / 1e9:.1f} GB/s -> batch-1 ceiling from the weight bytes: "
          + ", ".join(f"{wd} ~{c:.0f} tok/s" for wd, c in ceilings.items()), flush=True)
    rows, details = [], []
    for b in args.batches:
        ids = np.random.RandomState(b).randint(0, cfg.vocab_size, (b, args.prompt)).astype(np.int32)

        def hf_run(model, n, ids=ids):
            return model.generate(torch.tensor(ids, dtype=torch.long), attention_mask=torch.ones(ids.shape, dtype=torch.long),
                                  max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)[:, args.prompt:].numpy()
        short = dataclasses.replace(gen, max_new_tokens=4)
        runners = {}  # (impl, weights dtype): (timed run, warm-up)
        for wd, model in hf_models.items():
            runners["hf", wd] = (lambda m=model: hf_run(m, args.new), lambda m=model: hf_run(m, 4))
        runners["torch_ref", "fp32"] = (lambda ids=ids: tgen.lm_generate(tmodel, ids, None, gen),
                                        lambda ids=ids, short=short: tgen.lm_generate(tmodel, ids, None, short))
        for wd in dtypes:
            g = dataclasses.replace(gen, weights_dtype=wd)
            runners["jaxformer", wd] = (lambda m=jmodels[wd], g=g, ids=ids: jgen.lm_generate(m, ids, None, g),) * 2
        runners = {k: r for k, r in runners.items() if k[0] not in args.skip}
        times, tokens = timed_rounds(runners, args.repeats)
        speed = {k: b * args.new / min(ts) for k, ts in times.items()}  # best round
        for (impl, wd), ts in times.items():
            rounds = " ".join(f"{b * args.new / t:.1f}" for t in ts)
            print(f"batch {b}  {impl:10s} {wd:5s} {speed[impl, wd]:8.1f} tok/s best ({min(ts):.2f} s); rounds: {rounds}",
                  flush=True)
            rows.append({"impl": impl, "batch": b, "weights_dtype": wd, "tok_s": round(speed[impl, wd], 2)})
        detail = {"batch": b}
        ref = ("jaxformer", "fp32")
        if ref in times:
            # the ratio within each round, where both ran under the same machine load
            detail["jaxformer_vs_fp32_per_round"] = {
                wd: [round(times[ref][i] / t, 2) for i, t in enumerate(times["jaxformer", wd])]
                for wd in dtypes if wd != "fp32" and ("jaxformer", wd) in times}
            detail["jaxformer_same_tokens_as_fp32"] = {
                wd: float(np.mean(tokens["jaxformer", wd] == tokens[ref])) for wd in dtypes if ("jaxformer", wd) in tokens}
        if ("hf", "fp32") in times:
            detail["vs_hf_fp32_per_round"] = {
                f"{impl}_{wd}": [round(times["hf", "fp32"][i] / t, 2) for i, t in enumerate(ts)]
                for (impl, wd), ts in times.items() if (impl, wd) != ("hf", "fp32")}
        fp32_names = [k for k in tokens if k[1] == "fp32"]
        detail["same_tokens_fp32"] = {f"{a[0]}=={c[0]}": bool(np.array_equal(tokens[a], tokens[c]))
                                      for i, a in enumerate(fp32_names) for c in fp32_names[i + 1:]}
        if ("torch_ref", "fp32") in tokens and ref in tokens:
            detail["jax_vs_torch_first_mismatch"] = first_mismatch(tmodel, ids, tokens["torch_ref", "fp32"], tokens[ref])
        details.append(detail)
        print(json.dumps(detail), flush=True)
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
