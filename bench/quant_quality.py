"""How far bf16 and int8 decode weights (GenerationConfig.weights_dtype) move an LM's output
from fp32: mean KL(p_fp32 || p_reduced) over positions and top-1 agreement, on the parity
registry's LMs (jaxformer/parity/cases_models.py) and on GPT-2 small with HF's random init
(bench/generate.py's weights); and, on GPT-2 small, how far apart the two frameworks' reduced
logits are (max |jax - torch| / max |torch|). Not a test (tests/test_quant.py holds the
registry LMs to the budgets); it prints figures.

    python bench/quant_quality.py [--batch 4] [--seq 128]

Budgets: KL <= 1e-3 (bf16), <= 1e-2 (int8). Last line: a JSON list of {model, weights_dtype,
kl, top1[, jax_vs_torch_rel]}.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def kl_top1(p_logits, q_logits):
    p, q = p_logits.astype(np.float64), q_logits.astype(np.float64)
    lp = p - np.logaddexp.reduce(p, axis=-1, keepdims=True)
    lq = q - np.logaddexp.reduce(q, axis=-1, keepdims=True)
    return float((np.exp(lp) * (lp - lq)).sum(-1).mean()), float((p.argmax(-1) == q.argmax(-1)).mean())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    args = ap.parse_args(argv)

    import jax
    import torch
    from flax import nnx

    from jaxformer import generation as jgen
    from jaxformer.parity import cases_models, setup_precision
    from torch_ref import generation as tgen
    setup_precision()

    def forward(model, ids):
        graphdef, state = nnx.split(model)
        return np.asarray(jax.jit(lambda s, x: nnx.merge(graphdef, s)(x))(state, ids))

    rows = []

    def report(name, model, ids, tmodel=None):
        fp32 = forward(model, ids)
        for wd in ("bf16", "int8"):
            logits = forward(jgen.decode_model(model, wd), ids)
            kl, top1 = kl_top1(fp32, logits)
            row = {"model": name, "weights_dtype": wd, "kl": kl, "top1": top1}
            if tmodel is not None:
                with torch.no_grad():
                    tl = tgen.decode_model(tmodel, wd)(torch.as_tensor(ids).long()).numpy()
                row["jax_vs_torch_rel"] = float(np.abs(logits - tl).max() / np.abs(tl).max())
            rows.append(row)
            print(json.dumps(row), flush=True)

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
    from helpers import converted_pair
    for tag, cfg in cases_models.LMS.items():
        _, j = converted_pair("lm", cfg)
        ids = np.random.RandomState(1).randint(1, cfg.vocab_size, (args.batch, min(args.seq, cfg.max_len)))
        report(f"lm_{tag}", j, ids.astype(np.int32))
    from generate import gpt2_small_models
    _, cfg, tmodel, jmodel = gpt2_small_models()
    ids = np.random.RandomState(0).randint(0, cfg.vocab_size, (args.batch, args.seq)).astype(np.int32)
    report("gpt2_small_hf_init", jmodel, ids, tmodel)
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
