"""What the input checks (issue 35; jaxformer/config/inputs.py, models/common.py) cost inside jit:
nothing in the programs jaxformer compiles, and a few ops in a `checked` one. In one run:

1. The jaxprs of an LM forward under jax.jit, the greedy generate program and the eval step
   hold no checkify `check` and no host callback: the checks run at the Python boundary.
2. The same LM forward under jax.jit and under models.common.checked (checkify: a min, a max
   and a compare per id and mask array), timed side by side in alternating rounds; the ratio
   checked / jit is the price of keeping the value checks inside a user's own jit.

    python bench/input_checks.py [--rounds 5] [--calls 20] [--batch 8] [--seq 128]

The last line is JSON: {"programs_without_checks": [...], "jit_s", "checked_s", "ratio",
"extra_eqns"}. Not a test: it times things.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _eqns(jaxpr) -> list:
    """Every equation of a closed jaxpr, sub-jaxprs (jit, scan, while, cond) included."""
    from jax.extend import core
    out = []
    for eqn in jaxpr.jaxpr.eqns:
        out.append(eqn)
        for v in eqn.params.values():
            subs = v if isinstance(v, (tuple, list)) else (v,)
            for s in subs:
                if isinstance(s, core.ClosedJaxpr):
                    out += _eqns(s)
                elif isinstance(s, core.Jaxpr):
                    out += _eqns(core.ClosedJaxpr(s, ()))
    return out


def _has_checks(jaxpr) -> bool:
    return any(e.primitive.name in ("check", "debug_callback", "pure_callback", "io_callback") for e in _eqns(jaxpr))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    args = p.parse_args(argv)
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from jaxformer import generation as G
    from jaxformer.config.models import GenerationConfig, LMConfig
    from jaxformer.models import build_model
    from jaxformer.models.common import checked

    cfg = LMConfig.llama(vocab_size=8192, d_model=256, num_heads=4, num_kv_heads=2, d_ff=1024, num_layers=4,
                         max_len=args.seq)
    model = build_model("lm", cfg)
    model.eval()
    graphdef, state = nnx.split(model)
    forward = lambda s, ids, mask: nnx.merge(graphdef, s)(ids, mask)
    ids = jax.random.randint(jax.random.key(0), (args.batch, args.seq), 0, cfg.vocab_size)
    mask = jnp.ones_like(ids)
    # 1) the programs jaxformer compiles hold no check
    gen = GenerationConfig(max_new_tokens=4)
    programs = {
        "lm forward (jax.jit)": jax.make_jaxpr(forward)(state, ids, mask),
        "lm greedy generate": jax.make_jaxpr(
            lambda s, x, m, k: G._lm_generate(graphdef, s, None, x, m, k, gen=gen, cache_len=args.seq + 4,
                                              eos_ids=(2,), pad_id=0, transposed=False))(
            state, ids[:, :8], mask[:, :8], jax.random.key(0)),
    }
    clean = [name for name, jaxpr in programs.items() if not _has_checks(jaxpr)]
    assert len(clean) == len(programs), f"checks inside {set(programs) - set(clean)}"
    # 2) jit vs checked, side by side
    plain, kept = jax.jit(forward), checked(forward)
    jax.block_until_ready((plain(state, ids, mask), kept(state, ids, mask)))  # compile both
    times = {"jit": [], "checked": []}
    for _ in range(args.rounds):
        for name, fn in (("jit", plain), ("checked", kept)):
            t0 = time.perf_counter()
            for _ in range(args.calls):
                out = fn(state, ids, mask)
            jax.block_until_ready(out)
            times[name].append((time.perf_counter() - t0) / args.calls)
    jit_s, checked_s = min(times["jit"]), min(times["checked"])
    from jax.experimental import checkify
    extra = len(_eqns(jax.make_jaxpr(checkify.checkify(_traced(forward)))(state, ids, mask))) - len(
        _eqns(programs["lm forward (jax.jit)"]))
    print(f"programs without checks: {clean}")
    print(f"lm forward B={args.batch} T={args.seq}: jit {jit_s * 1e3:.2f} ms, checked {checked_s * 1e3:.2f} ms, "
          f"ratio {checked_s / jit_s:.3f}, {extra} extra equations")
    print(json.dumps({"programs_without_checks": clean, "jit_s": jit_s, "checked_s": checked_s,
                      "ratio": checked_s / jit_s, "extra_eqns": extra}))


def _traced(fn):
    """fn traced with the traced checks on, as models.common.checked traces it."""
    from jaxformer.layers.embedding import TRACED_CHECKS

    def body(*args):
        TRACED_CHECKS["on"] = True
        try:
            return fn(*args)
        finally:
            TRACED_CHECKS["on"] = False
    return body


if __name__ == "__main__":
    main()
