"""`jaxformer plot RUN_DIR [RUN_DIR ...] [--out FILE.png]`: overlay the loss, learning rate,
grad norm and eval loss curves of training runs (their metrics.jsonl), each labelled by its
folder name and framework. A JAX run beside its torch twin (`--framework torch` on the same
config) shows the trajectory parity."""
from __future__ import annotations

import os


def add_arguments(p) -> None:
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="workdirs of `jaxformer train`")
    p.add_argument("--out", default=None, help="PNG to write (default: FIRST_RUN_DIR/curves.png)")
    p.add_argument("--title", default="", help="figure title")


def run(args) -> int:
    from jaxformer.train.plots import plot_runs
    out = args.out or os.path.join(args.run_dirs[0], "curves.png")
    print(plot_runs(args.run_dirs, out, title=args.title))
    return 0
