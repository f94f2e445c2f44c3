"""Torch source lines for the written file: which line an op came from (for its comment and
for refusals) and which local name the torch code gave its value (for readable names).

An op's recorded stack trace runs from the model's forward down to the op, through every
module's forward. In the function written for module M, an op's line is the innermost frame
above the first frame inside a submodule's forward (a call to a submodule shows as the line of
M that calls it)."""
from __future__ import annotations

import ast
import functools
import inspect
import keyword
import os
import re

FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)')


PORT_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def frames(node) -> list[tuple[str, int, str, str]]:
    """[(file, line, function, code)] outermost first; the port's own frames (a jaxformer twin
    traced as one op, jaxformer/port/twins.py) left out."""
    return [(f, int(n), fn, code.strip()) for f, n, fn, code in FRAME.findall(node.meta.get("stack_trace") or "")
            if not f.startswith(PORT_DIR)]


@functools.lru_cache(maxsize=None)
def _forward_span(cls) -> tuple[str, int, int] | None:
    """(file, first line, last line) of a module class's forward."""
    fn = inspect.unwrap(getattr(cls, "forward", None) or (lambda: None))
    code = getattr(fn, "__code__", None)
    if code is None:
        return None
    lines = [line for _, _, line in code.co_lines() if line is not None]
    return code.co_filename, code.co_firstlineno, max(lines, default=code.co_firstlineno)


def _inside(frame, span) -> bool:
    return span is not None and frame[0] == span[0] and span[1] <= frame[1] <= span[2]


def line_for(node, below: list, own_file: str | None) -> tuple[str, int, str] | None:
    """(file name, line, code) of `node` as seen from a module whose submodules on the node's
    module chain are `below` (torch modules, outermost first); `own_file` is that module's
    source file, preferred over library wrappers between the module and a submodule."""
    fs = frames(node)
    cut = len(fs)
    for mod in below:
        span = _forward_span(type(mod))
        hit = next((i for i, f in enumerate(fs) if _inside(f, span)), None)
        if hit is not None:
            cut = min(cut, hit)
            break
    kept = fs[:cut]
    if not kept:
        return None
    if cut < len(fs) and own_file is not None:  # a submodule call: the module's own line
        mine = [f for f in kept if f[0] == own_file]
        kept = mine or kept
    f = kept[-1]
    return f[0].rsplit("/", 1)[-1], f[1], f[3]


def module_file(module) -> str | None:
    span = _forward_span(type(module))
    return span[0] if span else None


def assigned_names(code: str) -> list[str] | None:
    """The names a source line assigns: ['x'] for `x = ...` or `x += ...`, ['q', 'k', 'v']
    for `q, k, v = ...`; None for anything else (or a line that does not parse alone)."""
    try:
        tree = ast.parse(code.strip())
    except SyntaxError:
        return None
    if len(tree.body) != 1:
        return None
    stmt = tree.body[0]
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        target = stmt.targets[0]
    elif isinstance(stmt, (ast.AugAssign, ast.AnnAssign)):
        target = stmt.target
    else:
        return None
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)) and all(isinstance(e, ast.Name) for e in target.elts):
        return [e.id for e in target.elts]
    return None


def identifier(name: str, fallback: str = "x") -> str:
    """A valid, non-keyword Python identifier made from `name`."""
    name = re.sub(r"\W", "_", name).strip("_") or fallback
    if name[0].isdigit():
        name = f"{fallback}_{name}"
    return name + "_" if keyword.iskeyword(name) else name
