"""`jaxformer parity [--json] [-k SUBSTRING]`: run every registered parity case and print a
table (or a JSON array) of case, max_abs_out, max_abs_grad, tol, ok. Exits 1 if any fails."""
from __future__ import annotations

import json
import sys


def add_arguments(p) -> None:
    p.add_argument("--json", action="store_true", help="print a JSON array instead of a table")
    p.add_argument("-k", dest="pattern", default=None, help="only cases whose name contains this")
    p.add_argument("--list", action="store_true", help="list case names and exit")
    p.add_argument("--report", metavar="DIR", default=None,
                   help="also write, per model case, divergence against depth (CSV, JSON, PNG) to DIR/<case>/")


def run(args) -> int:
    from jaxformer.parity.registry import load_all, run_case
    cases = load_all()
    names = [n for n in cases if args.pattern is None or args.pattern in n]
    if args.list:
        print("\n".join(names))
        return 0
    if not names:
        print(f"no parity case matches {args.pattern!r}", file=sys.stderr)
        return 2
    rows = []
    for n in names:
        try:
            r = run_case(cases[n])
            row = r.row()
            if r.problems:
                row["problems"] = r.problems
        except Exception as e:  # a crashing case is a failing case, reported, not fatal
            row = {"case": n, "max_abs_out": None, "max_abs_grad": None, "tol": cases[n].tol,
                   "ok": False, "error": f"{type(e).__name__}: {e}"}
        rows.append(row)
        if not args.json:
            fmt = lambda v: "-" if v is None else f"{v:.2e}"
            print(f"{n:48s} {fmt(row['max_abs_out']):>10s} {fmt(row['max_abs_grad']):>10s} "
                  f"{row['tol']:>8.0e} {'ok' if row['ok'] else 'FAIL'}"
                  + (f"  {row.get('error') or row.get('problems')}" if not row["ok"] else ""), flush=True)
    if args.report:  # per-sub-layer divergence files (jaxformer/parity/report.py)
        from jaxformer.parity.report import report_cases
        report_cases(names, args.report)
    failed = [r["case"] for r in rows if not r["ok"]]
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(f"{len(rows) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0
