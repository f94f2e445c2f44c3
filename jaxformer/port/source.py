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
    """[(file, line, function, code)] outermost first, `code` the whole statement (a call written
    over several lines, joined into one); the port's own frames (a jaxformer twin traced as one
    op, jaxformer/port/twins.py) left out."""
    return [(f, int(n), fn, statement(f, int(n)) or code.strip())
            for f, n, fn, code in FRAME.findall(node.meta.get("stack_trace") or "") if not f.startswith(PORT_DIR)]


@functools.cache
def _torch_dir() -> str:
    import torch
    return os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


def user_frames(found: list) -> list:
    """The frames outside torch's own package (the model's code, transformers' included), or
    all of them when every frame is torch's: a refusal names the user's line, not nn.functional's."""
    mine = [f for f in found if not os.path.abspath(f[0]).startswith(_torch_dir())]
    return mine or found


STATEMENT_CHARS = 160  # a longer statement is shown cut, with "..."


@functools.lru_cache(maxsize=8192)
def statement(path: str, line: int) -> str | None:
    """The source of the innermost simple statement holding `line` of file `path`, on one line
    (a compound statement's header line alone), or None when the file cannot be read or parsed."""
    spans = _statements(path)
    if spans is None:
        return None
    best = None
    for first, last, text in spans:
        if first <= line <= last and (best is None or last - first < best[1] - best[0]):
            best = (first, last, text)
    if best is None:
        return None
    text = " ".join(best[2].split())
    text = re.sub(r",\s+([)\]}])", r"\1", text)  # a trailing comma before a closing bracket on its own line
    text = re.sub(r"([(\[{]) ", r"\1", re.sub(r" ([)\]}])", r"\1", text))
    return text if len(text) <= STATEMENT_CHARS else text[:STATEMENT_CHARS - 3].rstrip() + "..."


@functools.lru_cache(maxsize=64)
def _statements(path: str) -> list[tuple[int, int, str]] | None:
    """(first line, last line, source) of every simple statement of the file at `path`."""
    import linecache
    lines = linecache.getlines(path)
    if not lines:
        return None
    source = "".join(lines)
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt) and not hasattr(node, "body") and node.end_lineno is not None:
            out.append((node.lineno, node.end_lineno, _segment(lines, node)))
    return out


def _segment(lines: list[str], node) -> str:
    """The source of `node` (ast.get_source_segment without splitting the file for each node:
    that is quadratic in a long file such as torch's functional.py). Columns are UTF-8 byte offsets."""
    first, last = node.lineno - 1, node.end_lineno - 1
    if first == last:
        return lines[first].encode()[node.col_offset:node.end_col_offset].decode(errors="replace")
    head = lines[first].encode()[node.col_offset:].decode(errors="replace")
    tail = lines[last].encode()[:node.end_col_offset].decode(errors="replace")
    return head + "".join(lines[first + 1:last]) + tail


@functools.cache
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
    f = user_frames(kept)[-1]  # the line that called nn.functional, not its inside
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
