"""Table entries for the functional forms of torch's mutation ops (`x[i] = v` once the graph is
functional: select_scatter, slice_scatter, index_put, ...; scatter and its reductions; copy,
fill, zero): written as JAX's `x.at[...]` updates and `jnp.where`, shapes static."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jaxformer.port.ops_base import INT64_MAX, Unsupported


def _at(c, dim: int, ndim: int, index: str) -> str:
    """`[:, :, index]`: `index` at axis `dim` of an `ndim`-axis value."""
    return "[" + ", ".join([":"] * (dim % ndim) + [index]) + "]"


def _select_scatter(c, a):
    x = a["self"]
    return f"{c.recv(x)}.at{_at(c, a['dim'], c.ndim(x), c.r(a['index']))}.set({c.arg(a['src'])})"


def _slice_scatter(c, a):
    x = a["self"]
    start = a.get("start")
    end = a.get("end")
    step = a.get("step")
    part = (c.r(start) if start not in (None, 0) else "") + ":"
    part += c.r(end) if end is not None and not (isinstance(end, int) and end >= INT64_MAX // 2) else ""
    part += f":{c.r(step)}" if step not in (None, 1) else ""
    src = a["src"]
    if part == ":" and str(c.val(src).shape) == str(c.val(x).shape) and c.val(src).dtype == c.val(x).dtype:
        return c.r(src)  # the whole of `x` replaced (functionalization's write through a full view)
    return f"{c.recv(x)}.at{_at(c, a['dim'], c.ndim(x), part)}.set({c.arg(src)})"


def _index_put(c, a):
    x, indices, values = a["self"], list(a["indices"]), a["values"]
    accumulate = bool(a.get("accumulate"))
    masks = [i for i in indices if i is not None and str(c.val(i).dtype) == "torch.bool"]
    if masks:
        given = [i for i in indices if i is not None]
        if len(given) != 1:
            raise Unsupported("index_put with a boolean mask beside other indices")
        at = indices.index(given[0])
        rest = tuple(c.val(x).shape[at + c.ndim(given[0]):])
        shape = tuple(c.val(values).shape)
        if len(shape) > len(rest) or any(v not in (1, r) for v, r in zip(shape[::-1], rest[::-1], strict=False)):
            raise Unsupported("index_put of one value per True entry of a boolean mask: a data-dependent count")
        c.helper("torch_mask_put")
        extra = ", accumulate=True" if accumulate else ""
        return f"torch_mask_put({c.r(x)}, {c.r(given[0])}, {at}, {c.r(values)}{extra})"
    parts = [":" if i is None else c.r(i) for i in indices]
    return f"{c.recv(x)}.at[{', '.join(parts)}].{'add' if accumulate else 'set'}({c.arg(values)})"


def _index_update(method: str):
    def emit(c, a):
        x = a["self"]
        at = _at(c, a["dim"], c.ndim(x), c.r(a["index"]))
        if method == "fill":
            return f"{c.recv(x)}.at{at}.set({c.arg(a['value'])})"
        src = c.r(a["source"])
        if a.get("alpha", 1) != 1:
            src = f"{c.r(a['alpha'])} * {c.paren(src)}"
        return f"{c.recv(x)}.at{at}.{method}({src})"
    return emit


_REDUCE = {"add": "sum", "multiply": "prod", "sum": "sum", "prod": "prod", "mean": "mean", "amax": "amax",
           "amin": "amin"}


def _scatter(c, a, reduce: str | None = None):
    c.helper("torch_scatter")
    reduce = reduce or a.get("reduce")
    src = a["src"] if "src" in a else a["value"]
    args = [c.r(a["self"]), c.r(a["dim"]), c.r(a["index"]), c.r(src)]
    if reduce is not None:
        if reduce not in _REDUCE:
            raise Unsupported(f"scatter reduce={reduce!r}")
        args.append(repr(_REDUCE[reduce]))
    if a.get("include_self", True) is False:
        args.append("include_self=False")
    return f"torch_scatter({', '.join(args)})"


def _masked_scatter(c, a):
    c.helper("torch_masked_scatter")
    return f"torch_masked_scatter({c.r(a['self'])}, {c.r(a['mask'])}, {c.r(a['source'])})"


def _diagonal_scatter(c, a):
    c.helper("torch_diagonal_scatter")
    nd = c.ndim(a["self"])
    return (f"torch_diagonal_scatter({c.r(a['self'])}, {c.r(a['src'])}, {c.r(a.get('offset', 0))}, "
            f"{a.get('dim1', 0) % nd}, {a.get('dim2', 1) % nd})")


def _copy(c, a):
    """copy(self, src): src broadcast to self's shape, in self's dtype (self's values unread)."""
    src = c.r(a["src"])
    if tuple(c.val(a["src"]).shape) != tuple(c.val(a["self"]).shape):
        src = f"jnp.broadcast_to({src}, {c.shape_of(a['self'])})"
    if c.val(a["src"]).dtype != c.val(a["self"]).dtype:
        src = f"{c.paren(src)}.astype({c.dtype_of(a['self'])})"
    return src


def _fill(c, a):
    value = a["value"]
    if hasattr(value, "meta"):  # fill.Tensor: a 0-d tensor, broadcast (its gradient sums)
        return f"jnp.broadcast_to({c.paren(c.r(value))}.astype({c.dtype_of(a['self'])}), {c.shape_of(a['self'])})"
    return f"jnp.full_like({c.r(a['self'])}, {c.r(value)})"


def _refuse(why: str):
    def emit(c, a):
        raise Unsupported(why)
    return emit


TABLE: dict[str, Callable[[Any, dict], str]] = {
    "aten.select_scatter": _select_scatter, "aten.slice_scatter": _slice_scatter,
    "aten.diagonal_scatter": _diagonal_scatter, "aten.index_put": _index_put,
    "aten._unsafe_index_put": _index_put,
    "aten.index_copy": _index_update("set"), "aten.index_add": _index_update("add"),
    "aten.index_fill": _index_update("fill"),
    "aten.scatter": _scatter, "aten.scatter_add": lambda c, a: _scatter(c, a, "sum"),
    "aten.scatter_reduce": _scatter, "aten.masked_scatter": _masked_scatter,
    "aten.copy": _copy, "aten.fill": _fill, "aten.zero": lambda c, a: f"jnp.zeros_like({c.r(a['self'])})",
    "aten.as_strided_scatter": _refuse("as_strided_scatter writes through torch's memory strides, which JAX "
                                       "arrays do not have"),
    "aten.as_strided": _refuse("as_strided reads through torch's memory strides, which JAX arrays do not have"),
}
