"""`jaxformer port`: write a torch module as readable Flax NNX source, optionally proven.

    jaxformer port mypkg.models:make --out my_model.py [--class-name Net] [--layers jaxformer] [--no-check] [--json]

FACTORY takes no arguments and returns (torch module, inputs): inputs is a dict of numpy arrays
keyed by forward's argument names. MODULE is imported with the working directory on the path
(as `python -m` has it). The module is traced at those inputs (batch and sequence dims stay
free where the graph allows) and written to --out. Before it is written the port is loaded with
the torch weights and the parity harness compares outputs and every parameter's gradient (a
leaf past tolerance judged against float64, docs/numerics.md §32, §45); it prints the row, and
on a failure exits 1 with the report (where the two first part) and writes no file. --no-check
skips that comparison; every file, checked or not, is first shown to build and run at the
traced sizes and at other sizes of each free dimension, with torch's output shapes
(jaxformer/port/verify.py). A module with an op the port cannot translate is refused in one line naming
the aten op, the torch module path and the source line (exit 2); where torch.export itself
fails, the op it was tracing (or that no op was: a Python-level failure). The file is written
atomically: a failed command leaves no file.

--layers flax (the default) writes a self-contained file: it imports jax, flax and numpy only,
torch.nn's Linear, Embedding, LayerNorm, RMSNorm, Conv1d/2d and Dropout become flax layers and
everything else is written op by op. --layers jaxformer also writes the modules that have a
jaxformer twin as jaxformer's classes, and the file imports jaxformer: nn.MultiheadAttention,
nn.TransformerEncoderLayer / DecoderLayer and nn.TransformerEncoder / Decoder as
jaxformer.interop builds them, and torch_ref's modules (MoE, FeedForward, the layers, stacks and
models) as their jaxformer twins. A module whose twin cannot stand in for it (a configuration
interop refuses, a float mask on a stack, a non-tensor argument) is written op by op instead,
and the file's header says why.
"""
from __future__ import annotations

import json
import os
import sys


def add_arguments(p) -> None:
    p.add_argument("factory", metavar="MODULE:FACTORY",
                   help="FACTORY() returns (torch module, inputs dict of numpy arrays)")
    p.add_argument("--out", required=True, metavar="FILE.py", help="where to write the NNX source")
    p.add_argument("--class-name", default=None, help="the top-level class's name (default: torch's)")
    p.add_argument("--layers", choices=("flax", "jaxformer"), default="flax",
                   help="flax (default): a self-contained file (jax, flax, numpy; known torch.nn layers as flax "
                        "layers, the rest op by op); jaxformer: also write nn.MultiheadAttention, "
                        "nn.Transformer{Encoder,Decoder}[Layer] and torch_ref's modules as jaxformer's classes "
                        "(the file imports jaxformer; a module whose twin cannot stand in is written op by op)")
    check = p.add_mutually_exclusive_group()
    check.add_argument("--check", dest="check", action="store_true", default=True,
                       help="prove the port with the parity harness before writing it (outputs and gradients; "
                            "the default)")
    check.add_argument("--no-check", dest="check", action="store_false",
                       help="write without the parity check (the file is still shown to run at the traced and "
                            "the free sizes with torch's output shapes)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def _made(spec: str):
    from jaxformer.cli.parity import _factory
    try:
        factory = _factory(spec)
    except ValueError as e:
        raise ValueError(str(e).replace("--pair", "port")) from None
    made = factory()
    if not (isinstance(made, (tuple, list)) and len(made) == 2):
        raise ValueError(f"port {spec!r}: the factory must return (torch module, inputs dict)")
    return made


def run(args) -> int:
    from jaxformer.fileio import write_text
    from jaxformer.port import api
    if not args.out.endswith(".py"):
        raise ValueError(f"--out {args.out!r}: the port is Python source; give a .py path")
    if os.path.isdir(args.out):
        raise IsADirectoryError(f"--out {args.out} is a directory; give a .py file path")
    torch_module, inputs = _made(args.factory)
    result = api.port(torch_module, inputs, class_name=args.class_name, layers=args.layers)
    row = None
    if args.check:
        model = api._loaded(result, torch_module)
        report = api.check(torch_module, model, inputs, case=args.factory, result=result)
        row = report.row()
        if not report.ok:
            if args.json:
                print(json.dumps({"out": None, "class": result.class_name, "check": row}, default=str))
            print(f"jaxformer port: parity check failed; {args.out} not written\n  {report.message()}",
                  file=sys.stderr)
            return 1
    write_text(args.out, result.source)
    if args.json:
        print(json.dumps({"out": args.out, "class": result.class_name, "check": row, "notes": result.notes},
                         default=str))
        return 0
    print(f"wrote {args.out} (class {result.class_name}, {len(result.source.splitlines())} lines)")
    for note in result.notes:
        print(f"note: {note}")
    if row is not None:
        from jaxformer.cli.parity import HEADER, _print_row
        print(HEADER)
        _print_row(row)
    return 0
