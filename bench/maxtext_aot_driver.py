"""MaxText's side of bench/maxtext_aot.py, run with the MaxText venv's python (bench/README.md,
"MaxText venv"), never with jaxformer's:

    /tmp/maxtext-venv/bin/python bench/maxtext_aot_driver.py OUT_DIR REPO_ROOT key=value ...

Runs MaxText's own `train_compile.main` (maxtext.trainers.pre_train.train_compile) with the
key=value options after its base.yml, with one change: its `jit_and_compile` also keeps the
traced jaxpr and the compiled object. Then it writes what bench/maxtext_aot.py reads off every
compiled program, for jaxformer's the same way (maxtext_aot.read_compiled): OUT_DIR/hlo.txt
and OUT_DIR/compiled.json, plus jaxformer.train.costs.jaxpr_flops of the traced program (the
one file of jaxformer imported here: REPO_ROOT on sys.path). A compile error goes to
compiled.json as {"error": the compiler's message}.
"""
import json
import os
import sys
import time


def main() -> int:
    out_dir, repo, options = sys.argv[1], sys.argv[2], sys.argv[3:]
    sys.path[:0] = [repo, os.path.join(repo, "bench")]
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # beside another compile on this host
    import jax
    from maxtext.trainers.pre_train import train_compile as tc
    from maxtext_aot import read_compiled

    from jaxformer.train.costs import jaxpr_flops

    kept = {}

    def jit_and_compile(func, args, kwargs, mesh, in_shardings, out_shardings, static_argnums, donate_argnums,
                        config, logical_axis_rules):
        # MaxText's own jit_and_compile (train_compile.py), with the trace kept for its jaxpr
        from maxtext.utils import max_utils
        t0 = time.perf_counter()
        with jax.set_mesh(mesh), mesh, logical_axis_rules:
            jitted = jax.jit(func, in_shardings=in_shardings, out_shardings=out_shardings,
                             static_argnums=static_argnums, donate_argnums=donate_argnums)
            traced = jitted.trace(*args, **kwargs)
            lowered = traced.lower()
        compiled = lowered.compile(compiler_options=max_utils.parse_libtpu_flags_to_dict(config.compile_xla_flags))
        kept.update(compiled=compiled, compile_s=time.perf_counter() - t0,
                    jaxpr_flops=jaxpr_flops(traced.jaxpr.jaxpr))
        return compiled

    tc.jit_and_compile = jit_and_compile
    base = os.path.join(os.path.dirname(tc.__file__), "..", "..", "configs", "base.yml")
    os.makedirs(out_dir, exist_ok=True)
    try:
        tc.main(["train_compile", os.path.normpath(base), *options])
    except Exception as e:  # the compiler's own words go back to the bench
        with open(os.path.join(out_dir, "compiled.json"), "w") as f:
            json.dump({"error": f"{type(e).__name__}: {e}"}, f)
        return 1
    report = read_compiled(kept["compiled"], os.path.join(out_dir, "hlo.txt"))
    report.update(compile_s=kept["compile_s"], jaxpr_flops=kept["jaxpr_flops"])
    with open(os.path.join(out_dir, "compiled.json"), "w") as f:
        json.dump(report, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
