"""No public function takes more than MAX_PARAMS parameters (issue 49 §9): past that, options
go in a record (train/data/prepare.py's PrepareOptions, parity/harness.py's ParityOptions,
config/attention.py's Projections, Dropouts, Rope, QKNorm and Scores, layers/scores.py's
ScoreMods, train/init.py's StartFrom, layers/kv_cache.py's Step). Read from the source (ast),
so it costs no import. Counted: every positional-only, positional and keyword-only parameter
but self / cls (*args and **kwargs not), of every function or method in jaxformer/ and
torch_ref/ whose name does not start with "_", and of every __init__ and __call__ (a module's
call is its API). OVER lists the functions allowed past the limit, with their reasons; it may
only shrink (empty now)."""
from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TREES = ("jaxformer", "torch_ref")
MAX_PARAMS = 10

# (file, qualified name): why it keeps more than MAX_PARAMS parameters
OVER: dict[tuple[str, str], str] = {}


def count(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    return sum(p.arg not in ("self", "cls") for p in (*a.posonlyargs, *a.args, *a.kwonlyargs))


def public_functions():
    """(file, qualified name, parameter count) of every counted function."""
    for tree in TREES:
        for folder, _, files in os.walk(os.path.join(ROOT, tree)):
            for name in sorted(files):
                if not name.endswith(".py"):
                    continue
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, ROOT).replace(os.sep, "/")
                with open(path, encoding="utf-8") as f:
                    module = ast.parse(f.read(), rel)
                yield from _walk(module, rel, "")


def _walk(node, rel: str, prefix: str):
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.ClassDef):
            yield from _walk(child, rel, f"{prefix}{child.name}.")
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if not child.name.startswith("_") or child.name in ("__init__", "__call__"):
                yield rel, prefix + child.name, count(child)
            yield from _walk(child, rel, f"{prefix}{child.name}.")
        else:
            yield from _walk(child, rel, prefix)


def test_no_public_function_takes_more_than_ten_parameters():
    over = {(rel, name): n for rel, name, n in public_functions() if n > MAX_PARAMS}
    new = {k: n for k, n in over.items() if k not in OVER}
    assert not new, (f"public functions with more than {MAX_PARAMS} parameters (group the options in a "
                     "record): " + ", ".join(f"{rel}:{name} ({n})" for (rel, name), n in sorted(new.items())))
    fixed = sorted(set(OVER) - set(over))
    assert not fixed, f"within {MAX_PARAMS} parameters now, drop them from OVER: {fixed}"


def test_the_count():
    fn = ast.parse("def f(self, a, /, b, *args, c, d=1, **kw): pass").body[0]
    assert count(fn) == 4
    over = {name for _, name, n in public_functions() if n > MAX_PARAMS}
    assert "prepare" not in over and "check_parity" not in over
