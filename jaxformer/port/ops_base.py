"""What every part of the op table shares (jaxformer/port/ops.py and its ops_*.py parts): the
refusal an entry raises, the binding of an op's arguments by schema name, and small renderers."""
from __future__ import annotations

from typing import Any

INT64_MAX = 2 ** 63 - 1


class Unsupported(Exception):
    """Raised by a table entry for a case it cannot translate; the message says why."""


def bind(node) -> dict[str, Any]:
    """The op's arguments keyed by its schema names, defaults filled in."""
    schema = node.target._schema
    out: dict[str, Any] = {}
    positional = [a for a in schema.arguments if not a.kwarg_only]
    for arg in schema.arguments:
        if arg in positional and positional.index(arg) < len(node.args):
            out[arg.name] = node.args[positional.index(arg)]
        elif arg.name in node.kwargs:
            out[arg.name] = node.kwargs[arg.name]
        else:
            out[arg.name] = arg.default_value if arg.has_default_value() else None
    return out


def _axes(c, dims) -> str:
    if dims is None or dims == []:
        return "None"
    if isinstance(dims, (list, tuple)):
        return c.r(tuple(dims)) if len(dims) > 1 else c.r(dims[0])
    return c.r(dims)


def _keep(a) -> str:
    return ", keepdims=True" if a.get("keepdim") else ""


def _dtype_cast(c, expr: str, dtype) -> str:
    return expr if dtype is None else f"{expr}.astype({c.r(dtype)})"
