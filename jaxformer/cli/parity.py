"""`jaxformer parity`: run the parity registry, a user's own module pair, or the self-test.

    jaxformer parity [-k SUBSTRING] [--json]            every registered case (or those matching)
    jaxformer parity --pair pkg.module:factory [--map 'torch_regex=flax_repl' ...]
    jaxformer parity --self-test [--mutation NAME ...]  inject each porting bug, require a failure

A factory takes no arguments and returns (torch module, flax module, inputs), inputs being a
dict of keyword arguments or a tuple of positional ones (numpy arrays). MODULE is imported with
the working directory on the path (as `python -m` has it); one that cannot be imported, or a
missing FACTORY, is a usage error (exit 2). The table prints, per
row, the leaf nearest its tolerance for outputs and for gradients, each with its own tolerance
(|d| <= atol + rtol * max |torch leaf|, docs/numerics.md §19). `--json` rows carry case,
max_abs_out, tol_out, max_abs_grad, tol_grad, worst_leaf, ratio, ok, "referee" for leaves
judged against torch rerun in float64 (docs/numerics.md §32) and, on a failure,
"first_parting": the first submodule whose output differs (jaxformer/parity/locate.py). Exits 1 if any row fails
(or, with --self-test, if any bug is not caught).
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys

HEADER = f"{'case':48s} {'max|dout|':>10s} {'tol_out':>9s} {'max|dgrad|':>10s} {'tol_grad':>9s} {'ratio':>7s}  result"


def add_arguments(p) -> None:
    p.add_argument("--json", action="store_true", help="print a JSON array instead of a table")
    p.add_argument("-k", dest="pattern", default=None, help="only cases whose name contains this")
    p.add_argument("--list", action="store_true", help="list case names (or, with --self-test, bugs) and exit")
    p.add_argument("--pair", action="append", default=[], metavar="MODULE:FACTORY",
                   help="check your own pair: FACTORY() returns (torch module, flax module, inputs); repeatable")
    p.add_argument("--map", action="append", default=[], metavar="TORCH_REGEX=FLAX_REPL",
                   help="rename torch keys before conversion (re.sub, applied in order); repeatable")
    p.add_argument("--self-test", action="store_true",
                   help="inject each catalogued porting bug into the JAX side and require the suite to fail")
    p.add_argument("--mutation", action="append", default=None, metavar="NAME",
                   help="with --self-test: only these bugs")
    p.add_argument("--report", metavar="DIR", default=None,
                   help="also write, per model case, divergence against depth (CSV, JSON, PNG) to DIR/<case>/")


def _origin(module: str) -> str:
    """The file of `module` (for errors), or its name where it has none."""
    try:
        return importlib.util.find_spec(module).origin or module
    except Exception:  # only for the message
        return module


def _first_line(e: BaseException) -> str:
    return ((str(e).strip().splitlines() or [type(e).__name__])[0])[:300]


def _factory(spec: str):
    """MODULE:FACTORY -> the factory. The working directory is importable, as under `python -m`
    (the `jaxformer` script's own folder is the one Python puts first). A module that cannot be
    found, or a missing attribute, is a usage error that says what to do."""
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"--pair {spec!r}: expected 'package.module:factory'")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        obj = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is not None and module != e.name and not module.startswith(e.name + "."):  # missing inside it
            raise ValueError(f"--pair {spec!r}: importing {module!r} failed: {e}") from None
        path = module.replace(".", "/")
        raise ValueError(f"--pair {spec!r}: no module {module!r} in {cwd} or on sys.path; run from the "
                         f"folder that holds {path}.py, or add that folder to PYTHONPATH") from None
    except ImportError as e:
        raise ValueError(f"--pair {spec!r}: importing {module!r} failed: {e}") from None
    except SyntaxError as e:  # the user's file: its place and the message, no traceback
        raise ValueError(f"--pair {spec!r}: {e.filename}:{e.lineno}: {type(e).__name__}: {e.msg}") from None
    except Exception as e:  # the module raised while it was imported
        raise ValueError(f"--pair {spec!r}: importing {_origin(module)} raised {type(e).__name__}: "
                         f"{_first_line(e)}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"--pair {spec!r}: {module!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"--pair {spec!r}: {attr!r} is not callable")
    return obj


def run_pair(spec: str, name_map=None):
    """check_parity on the (torch, flax, inputs) that spec's factory returns."""
    from jaxformer.parity.harness import ParityOptions, check_parity
    made = _factory(spec)()
    if not (isinstance(made, (tuple, list)) and len(made) == 3):
        raise ValueError(f"--pair {spec!r}: the factory must return (torch module, flax module, inputs)")
    torch_module, flax_module, inputs = made
    return check_parity(torch_module, flax_module, inputs, ParityOptions(case=spec, name_map=name_map or None))


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.2e}"


def _print_row(row: dict) -> None:
    ratio = row.get("ratio")
    extra = "" if row["ok"] else "  " + str(row.get("error") or row.get("problems") or row.get("worst_leaf"))
    judged = row.get("referee") or {}  # leaves judged against float64 (docs/numerics.md §32)
    if not row["ok"] and row.get("worst_leaf") in judged:
        r = judged[row["worst_leaf"]]
        extra += f" (float64: jax {r['jax_err']:.1e} off, torch {r['torch_err']:.1e}: {r['side']} off)"
    if not row["ok"] and row.get("first_parting"):
        extra += f"; outputs part first at {row['first_parting']}"
    excused = sum(r.get("excused", r["side"] == "torch") for r in judged.values())
    twin = sum(r.get("excused", False) and r["side"] == "both" for r in judged.values())
    if excused:
        extra += (f"  (float64 referee excused {excused} {'leaves' if excused > 1 else 'leaf'} past tol against torch"
                  + (f", {twin} by the float64 twin (docs/numerics.md §45)" if twin else "") + ")")
    print(f"{row['case']:48s} {_fmt(row['max_abs_out']):>10s} {_fmt(row['tol_out']):>9s} "
          f"{_fmt(row['max_abs_grad']):>10s} {_fmt(row['tol_grad']):>9s} "
          f"{'-' if ratio is None else f'{ratio:.3g}':>7s}  {'ok' if row['ok'] else 'FAIL'}{extra}", flush=True)


def _row(name: str, fn) -> dict:
    try:
        r = fn()
        row = r.row()
        if r.problems:
            row["problems"] = r.problems
    except Exception as e:  # a crashing case is a failing case, reported, not fatal
        row = {"case": name, "max_abs_out": None, "tol_out": None, "max_abs_grad": None, "tol_grad": None,
               "worst_leaf": None, "ratio": None, "ok": False, "error": f"{type(e).__name__}: {e}"}
    return row


def _self_test(args) -> int:
    from jaxformer.parity.mutations import MUTATIONS, self_test
    from jaxformer.train.shared_checks import SHARED_MUTATIONS, run_shared_mutation
    from jaxformer.train.trajectory import TRAIN_MUTATIONS, run_trajectory_mutation
    extra = {**TRAIN_MUTATIONS, **SHARED_MUTATIONS}
    if args.list:
        for m in {**MUTATIONS, **extra}.values():
            checks = ", ".join(m.cases) or ("shared code: " + m.reference.__name__ if m.reference else "trajectory")
            print(f"{m.name:34s} {checks}: {m.description}")
        return 0

    def show(o):
        if not args.json:
            print(f"{o.mutation:34s} {'caught' if o.caught else 'MISSED':7s} worst {o.worst_ratio:9.3g}x tol  "
                  + "; ".join(f"{k}: {v}" for k, v in o.detail.items()), flush=True)

    if not args.json:
        print(f"{'bug':34s} {'result':7s} worst |diff| / tolerance, per check")
    outcomes = self_test(args.mutation, trajectory=run_trajectory_mutation, extra=extra, progress=show,
                         reference=run_shared_mutation)
    killed = sum(o.caught for o in outcomes)
    if args.json:
        print(json.dumps([{"mutation": o.mutation, "caught": o.caught, "worst_ratio": o.worst_ratio,
                           "detail": o.detail} for o in outcomes], indent=1))
    else:
        print(f"kill rate: {killed}/{len(outcomes)}")
    return 0 if killed == len(outcomes) else 1


def run(args) -> int:
    if args.self_test:
        return _self_test(args)
    from jaxformer.parity.registry import load_all, run_case
    if args.map and not args.pair:
        raise ValueError("--map renames the keys of a --pair; give --pair too")
    if args.pair:
        from jaxformer.parity.harness import name_mapper
        name_mapper(args.map)  # malformed rules fail here, once, as a usage error
        for spec in args.pair:  # an unimportable pair is a usage error (exit 2), not a failed row
            _factory(spec)
        jobs = [(spec, lambda spec=spec: run_pair(spec, args.map)) for spec in args.pair]
    else:
        cases = load_all()
        names = [n for n in cases if args.pattern is None or args.pattern in n]
        if args.list:
            print("\n".join(names))
            return 0
        if not names:
            raise ValueError(f"no parity case matches {args.pattern!r}")
        jobs = [(n, lambda n=n: run_case(cases[n])) for n in names]
    if not args.json:
        print(HEADER, flush=True)
    rows = []
    for name, fn in jobs:
        row = _row(name, fn)
        rows.append(row)
        if not args.json:
            _print_row(row)
    if args.report and not args.pair:  # per-sub-layer divergence files (jaxformer/parity/report.py)
        from jaxformer.parity.report import report_cases
        report_cases([name for name, _ in jobs], args.report)
    failed = [r["case"] for r in rows if not r["ok"]]
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(f"{len(rows) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


