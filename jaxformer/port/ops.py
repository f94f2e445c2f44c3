"""The aten -> jax.numpy / lax translation table.

Each entry takes the function being written (`c`: renders values, knows shapes and dims) and the
op's arguments bound by its schema names (`a`), and returns one Python expression. An op that is
not in the table, or a case of one that has no exact translation, is refused by name
(jaxformer/port/emit.py adds the module path and the torch source line). Numerical choices are
torch's: exact GELU unless `approximate='tanh'`, `var` with torch's correction, softmax in the
input dtype (docs/numerics.md §42)."""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from jaxformer.port import ops_math, ops_nn, ops_reduce, ops_scatter
from jaxformer.port.ops_base import INT64_MAX, Unsupported, _axes, _dtype_cast, _keep, bind

__all__ = ["INT64_MAX", "TABLE", "Unsupported", "bind", "float_repr", "is_identity", "translate"]


# ----------------------------------------------------------------------------- shapes
def _reshape(c, a):
    return f"{c.recv(a['self'])}.reshape({c.view_shape(c.out)})"


def _expand(c, a):
    return f"jnp.broadcast_to({c.r(a['self'])}, {c.shape_of(c.out)})"


def _squeeze(c, a):
    x, dims = a["self"], a.get("dim")
    shape = c.val(x).shape
    dims = range(len(shape)) if dims is None else ([dims] if isinstance(dims, int) else dims)
    ones = tuple(d % len(shape) for d in dims if shape[d] == 1) if shape else ()
    return f"jnp.squeeze({c.r(x)}, {c.r(ones if len(ones) != 1 else ones[0])})" if ones else c.r(x)


def _indexable(c, x) -> str:
    """A value to index: a weight is indexed as its Variable (`self.bias[:, :T]`)."""
    text = c.r(x)
    return text[:-5] if text.endswith("[...]") else text


def _slice(c, a):
    x, dim = a["self"], a["dim"] % c.ndim(a["self"])
    start = a["start"] if a["start"] not in (0, None) else None
    end = None if a["end"] is None or (isinstance(a["end"], int) and a["end"] >= INT64_MAX // 2) else a["end"]
    step = a["step"] if a["step"] not in (1, None) else None
    if start is None and end is None and step is None:
        return c.r(x)  # the whole axis (functionalization's view of a base): the value itself
    part = f"{c.r(start) if start is not None else ''}:{c.r(end) if end is not None else ''}"
    part += f":{c.r(step)}" if step is not None else ""
    return f"{_indexable(c, x)}[{', '.join([':'] * dim + [part])}]"


def _select(c, a):
    dim = a["dim"] % c.ndim(a["self"])
    return f"{_indexable(c, a['self'])}[{', '.join([':'] * dim + [c.r(a['index'])])}]"


def _index(c, a):
    parts = [":" if i is None else c.r(i) for i in a["indices"]]
    if any(i is not None and str(c.val(i).dtype) == "torch.bool" for i in a["indices"]):
        raise Unsupported("indexing with a boolean mask has a data-dependent shape")
    return f"{_indexable(c, a['self'])}[{', '.join(parts)}]"


def _t(c, a):
    """x.T; a weight read in torch's layout (`kernel[...].T`) transposed back is the leaf itself."""
    x = c.recv(a["self"])
    return x.removesuffix(".T") if x.endswith("[...].T") else f"{x}.T"


def _split(c, a, key: str = "dim"):
    x, dim = a["self"], a.get(key, 0) % c.ndim(a["self"])
    sizes = [v.shape[dim] for v in c.val(c.out)]
    if not all(isinstance(s, int) for s in sizes):
        raise Unsupported("a split along a dimension whose size stays symbolic")
    cuts = [sum(sizes[:i + 1]) for i in range(len(sizes) - 1)]
    return f"jnp.split({c.r(x)}, {c.r(cuts)}, axis={dim})"


def _cat(c, a, fn: str = "concatenate"):
    tensors = [t for t in a["tensors"] if fn == "stack" or c.val(t).numel() != 0 or c.ndim(t) != 1]
    return f"jnp.{fn}([{', '.join(c.r(t) for t in tensors)}], axis={a['dim']})"


def _pad(c, a):
    pad = list(a["pad"])
    ndim = c.ndim(a["self"])
    pairs = [(0, 0)] * ndim
    for i in range(len(pad) // 2):
        pairs[ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    value = a.get("value") or 0.0
    if all(isinstance(p, int) and p >= 0 for pair in pairs for p in pair):
        return f"jnp.pad({c.r(a['self'])}, {c.r(tuple(pairs))}, constant_values={c.r(value)})"
    # an amount computed from a size (torchvision's Swin pads to a multiple of its window), or a
    # negative one (torch crops there): lax.pad takes both
    x = c.r(a["self"])
    config = ", ".join(f"({c.r(lo)}, {c.r(hi)}, 0)" for lo, hi in pairs)
    return f"jax.lax.pad({x}, jnp.asarray({c.r(value)}, {x}.dtype), [{config}])"


def _flatten(c, a):
    return f"{c.recv(a['self'])}.reshape({c.view_shape(c.out)})"


# ----------------------------------------------------------------------------- maths
def _binary(op: str, scalar_first: bool = False):
    def emit(c, a):
        x, y = c.r(a["self"]), c.r(a["other"])
        alpha = a.get("alpha", 1)
        if alpha not in (1, None):
            y = f"{c.r(alpha)} * {c.paren(y)}"
        x, y = c.paren(x), c.paren(y)
        return f"{y} {op} {x}" if scalar_first else f"{x} {op} {y}"
    return emit


def _div_mode(c, a):
    x, y, mode = c.r(a["self"]), c.r(a["other"]), a.get("rounding_mode")
    if mode is None:
        return f"{c.paren(x)} / {c.paren(y)}"
    if mode == "floor":
        return f"jnp.floor_divide({x}, {y})"
    return f"jnp.trunc({c.paren(x)} / {c.paren(y)})" if c.is_float(c.out) else f"jax.lax.div({x}, {y})"


def _pow(c, a):
    base, exp = a["self"], a["exponent"]
    return f"{c.paren(c.r(base))} ** {c.paren(c.r(exp))}"


def _unary(fn: str):
    return lambda c, a: f"{fn}({c.r(a['self'])})"


def _clamp(c, a):
    lo, hi = a.get("min"), a.get("max")
    return f"jnp.clip({c.r(a['self'])}, {c.r(lo)}, {c.r(hi)})"


def _gelu(c, a):
    approx = a.get("approximate", "none") == "tanh"
    return f"jax.nn.gelu({c.r(a['self'])}, approximate={approx})"


def _softplus(c, a):
    beta, threshold = a.get("beta", 1), a.get("threshold", 20)
    x = c.r(a["self"])
    if beta == 1:
        # torch returns x itself past the threshold; the two agree there to float32 precision
        return f"jnp.where({x} > {c.r(threshold)}, {x}, jax.nn.softplus({x}))"
    return f"jnp.where({x} * {c.r(beta)} > {c.r(threshold)}, {x}, jax.nn.softplus({x} * {c.r(beta)}) / {c.r(beta)})"


def _softmax(fn: str):
    def emit(c, a):
        x = _dtype_cast(c, c.r(a["self"]), a.get("dtype"))
        return f"jax.nn.{fn}({x}, axis={a['dim']})"
    return emit


def _reduce(method: str):
    def emit(c, a):
        x = _dtype_cast(c, c.r(a["self"]), a.get("dtype"))
        dims = a.get("dim")
        axis = f"axis={_axes(c, dims)}" if dims not in (None, []) else ""
        args = ", ".join(p for p in (axis, _keep(a).lstrip(", ")) if p)
        return f"{c.paren(x)}.{method}({args})"
    return emit


def _max_dim(method: str, arg: str):
    def emit(c, a):
        x, dim = c.r(a["self"]), a["dim"]
        return f"({x}.{method}(axis={dim}{_keep(a)}), {x}.{arg}(axis={dim}{_keep(a)}))"
    return emit


def _extreme(c, a, method: str) -> str:
    """aten.max / aten.min: .dim gives (values, indices), .other is elementwise, .default all."""
    if "other" in a:
        return f"jnp.{method}imum({c.r(a['self'])}, {c.r(a['other'])})"
    if "dim" in a:
        return _max_dim(method, f"arg{method}")(c, a)
    return f"{c.r(a['self'])}.{method}()"


def _arg_reduce(method: str):
    def emit(c, a):
        dim = a.get("dim")
        if dim is None:
            return f"{c.r(a['self'])}.{method}()"
        return f"{c.r(a['self'])}.{method}(axis={dim}{_keep(a)})"
    return emit


def _where(c, a):
    return f"jnp.where({c.r(a['condition'])}, {c.r(a['self'])}, {c.r(a['other'])})"


def _masked_fill(c, a):
    return f"jnp.where({c.r(a['mask'])}, {c.r(a['value'])}, {c.r(a['self'])})"


def _linear(c, a):
    out = f"{c.paren(c.r(a['input']))} @ {c.paren(c.r(a['weight']))}.T"
    return out + (f" + {c.r(a['bias'])}" if a.get("bias") is not None else "")


def _einsum(c, a):
    return f"jnp.einsum({a['equation']!r}, {', '.join(c.r(t) for t in a['tensors'])})"


def _gather(c, a):
    """torch.gather reads input[..., index, ...] over the index's own extent in every other dim,
    which may be smaller than the input's (take_along_axis broadcasts instead): the input is cut
    to it wherever the two sizes are not the same expression."""
    x, index = a["self"], a["index"]
    n = c.ndim(x)
    dim = a["dim"] % n
    xs, ix = c.val(x).shape, c.val(index).shape
    cut = [i for i in range(n) if i != dim and str(xs[i]) != str(ix[i])]
    src = c.r(x)
    if cut:
        idx = c.paren(c.r(index))
        src = f"{c.paren(src)}[{', '.join(f':{idx}.shape[{i}]' if i in cut else ':' for i in range(n))}]"
    return f"jnp.take_along_axis({src}, {c.r(index)}, axis={dim})"


def _embedding(c, a):
    out = f"jnp.take({c.r(a['weight'])}, {c.r(a['indices'])}, axis=0)"
    pad = a.get("padding_idx")
    if pad is None or pad < 0:
        return out
    # torch's embedding backward leaves the padding row's gradient 0
    ids = c.paren(c.r(a["indices"]))
    return f"jnp.where(({ids} == {pad})[..., None], jax.lax.stop_gradient({out}), {out})"


def _weight_norm(c, a):
    """torch._weight_norm(v, g, dim): v * g / ||v|| over every dim but `dim` (nn.utils.weight_norm,
    wav2vec2's and HuBERT's positional conv)."""
    v, g, dim = c.r(a["v"]), c.r(a["g"]), a.get("dim", 0)
    n = c.ndim(a["v"])
    axes = tuple(i for i in range(n) if i != dim % n) if dim != -1 else tuple(range(n))
    return f"{c.paren(v)} * ({c.paren(g)} / jnp.sqrt(jnp.sum(jnp.square({v}), axis={axes}, keepdims=True)))"


# ----------------------------------------------------------------------------- creation
def _dtype_kw(c, a, default: str | None = None) -> str:
    dtype = a.get("dtype")
    return f", dtype={c.r(dtype)}" if dtype is not None else (f", dtype={default}" if default else "")


def _arange(c, a):
    start, end, step = a.get("start", 0), a["end"], a.get("step", 1)
    args = [c.r(end)] if start in (0, None) and step in (1, None) else [c.r(start), c.r(end)]
    if step not in (1, None):
        args.append(c.r(step))
    return f"jnp.arange({', '.join(args)}{_dtype_kw(c, a, c.dtype_of(c.out))})"


def _full(c, a, value=None):
    fill = a.get("fill_value") if value is None else value
    return f"jnp.full({c.shape_of(c.out)}, {c.r(fill)}, dtype={c.dtype_of(c.out)})"


def _full_like(value=None):
    return lambda c, a: f"jnp.full_like({c.r(a['self'])}, {c.r(a.get('fill_value') if value is None else value)}, dtype={c.dtype_of(c.out)})"


def _to(c, a):
    dtype = a.get("dtype")
    if dtype is None or c.dtype_of(a["self"]) == c.dtype_of(c.out):
        return c.r(a["self"])
    return f"{c.r(a['self'])}.astype({c.r(dtype)})"


def _type_as(c, a):
    return f"{c.r(a['self'])}.astype({c.r(a['other'])}.dtype)"


# ----------------------------------------------------------------------------- attention, norms
def _sdpa(c, a):
    c.helper("scaled_dot_product_attention")
    args = [c.r(a["query"]), c.r(a["key"]), c.r(a["value"])]
    if a.get("attn_mask") is not None:
        args.append(f"mask={c.r(a['attn_mask'])}")
    if a.get("is_causal"):
        args.append("causal=True")
    if a.get("scale") is not None:
        args.append(f"scale={c.r(a['scale'])}")
    if a.get("enable_gqa"):
        args.append("grouped=True")
    dropout = c.dropout(a.get("dropout_p") or 0.0)
    if dropout:
        args.append(f"dropout={dropout}")
    return f"scaled_dot_product_attention({', '.join(args)})"


def _layer_norm(c, a):
    c.helper("layer_norm")
    axes = len(a["normalized_shape"])
    return (f"layer_norm({c.r(a['input'])}, {c.r(a.get('weight'))}, {c.r(a.get('bias'))}, "
            f"eps={c.r(a['eps'])}, axes={axes})")


def _rms_norm(c, a):
    c.helper("rms_norm")
    eps = a.get("eps")
    eps = eps if eps is not None else float(c.finfo_eps(a["input"]))
    return f"rms_norm({c.r(a['input'])}, {c.r(a.get('weight'))}, eps={c.r(eps)}, axes={len(a['normalized_shape'])})"


def _dropout(c, a):
    module = c.dropout(a["p"])
    return f"{module}({c.r(a['input'])})" if module else c.r(a["input"])


# ----------------------------------------------------------------------------- complex numbers
def _view_as_complex(c, a):
    x = c.r(a["self"])
    return f"jax.lax.complex({x}[..., 0], {x}[..., 1])"


def _view_as_real(c, a):
    z = c.r(a["self"])
    return f"jnp.stack([{z}.real, {z}.imag], axis=-1)"


def _polar(c, a):
    r, theta = c.r(a["abs"]), c.r(a["angle"])
    return f"jax.lax.complex({r} * jnp.cos({theta}), {r} * jnp.sin({theta}))"


def _sort(c, a):
    x, dim = c.r(a["self"]), a.get("dim", -1)
    order = f"jnp.argsort({'-' if a.get('descending') else ''}{c.paren(x)}, axis={dim}, stable=True)"
    return f"(jnp.take_along_axis({x}, {order}, axis={dim}), {order})"


def _argsort(c, a):
    x = c.paren(c.r(a["self"]))
    return f"jnp.argsort({'-' if a.get('descending') else ''}{x}, axis={a.get('dim', -1)}, stable=True)"


def _topk(c, a):
    if not a.get("largest", True) or a.get("dim", -1) not in (-1, c.ndim(a["self"]) - 1):
        raise Unsupported("topk other than the largest along the last dimension")
    return f"jax.lax.top_k({c.r(a['self'])}, {c.r(a['k'])})"


def _diff(c, a):
    extra = "".join(f", {k}={c.r(a[k])}" for k in ("prepend", "append") if a.get(k) is not None)
    return f"jnp.diff({c.r(a['self'])}, n={a['n']}, axis={a['dim']}{extra})"


def _moveaxis(c, a):
    return f"jnp.moveaxis({c.r(a['self'])}, {c.r(a['source'])}, {c.r(a['destination'])})"


def _identity(c, a):
    return c.r(next(iter(a.values())))


TABLE: dict[str, Callable[[Any, dict], str]] = {
    # shapes and views
    "aten.view": _reshape, "aten.reshape": _reshape, "aten._unsafe_view": _reshape, "aten.view_copy": _reshape,
    "aten.reshape_as": _reshape, "aten.view_as": _reshape, "aten._weight_norm": _weight_norm,
    "aten.flatten": _flatten, "aten.unflatten": _reshape,
    "aten.permute": lambda c, a: f"{c.r(a['self'])}.transpose({c.r(tuple(d % c.ndim(a['self']) for d in a['dims']))[1:-1]})",
    "aten.transpose": lambda c, a: f"{c.r(a['self'])}.swapaxes({a['dim0']}, {a['dim1']})",
    "aten.t": _t, "aten.numpy_T": _t,
    "aten.movedim": _moveaxis, "aten.moveaxis": _moveaxis,
    "aten.contiguous": _identity, "aten.clone": _identity, "aten.alias": _identity,
    "aten.lift_fresh_copy": _identity,
    "aten.detach": lambda c, a: f"jax.lax.stop_gradient({c.r(a['self'])})",
    "aten.unsqueeze": lambda c, a: f"jnp.expand_dims({c.r(a['self'])}, {a['dim']})",
    "aten.squeeze": _squeeze, "aten.expand": _expand, "aten.expand_as": _expand,
    "aten.broadcast_to": _expand,
    "aten.slice": _slice, "aten.select": _select, "aten.index": _index,
    "aten.index_select": lambda c, a: f"jnp.take({c.r(a['self'])}, {c.r(a['index'])}, axis={a['dim']})",
    "aten.gather": _gather,
    "aten.split": _split, "aten.split_with_sizes": _split, "aten.chunk": _split,
    "aten.tensor_split": _split,
    "aten.unbind": lambda c, a: f"jnp.unstack({c.r(a['self'])}, axis={a['dim']})",
    "aten.cat": _cat, "aten.concat": _cat, "aten.stack": lambda c, a: _cat(c, a, "stack"),
    "aten.constant_pad_nd": _pad, "aten.pad": _pad,
    "aten.repeat": lambda c, a: f"jnp.tile({c.r(a['self'])}, {c.r(tuple(a['repeats']))})",
    "aten.repeat_interleave": lambda c, a: f"jnp.repeat({c.r(a['self'])}, {c.r(a['repeats'])}, axis={c.r(a['dim'])})",
    "aten.flip": lambda c, a: f"jnp.flip({c.r(a['self'])}, {c.r(tuple(a['dims']))})",
    "aten.roll": lambda c, a: f"jnp.roll({c.r(a['self'])}, {c.r(tuple(a['shifts']))}, {c.r(tuple(a['dims']))})",
    "aten.tril": lambda c, a: f"jnp.tril({c.r(a['self'])}, {a['diagonal']})",
    "aten.triu": lambda c, a: f"jnp.triu({c.r(a['self'])}, {a['diagonal']})",
    # arithmetic
    "aten.add": _binary("+"), "aten.sub": _binary("-"), "aten.mul": _binary("*"),
    "aten.rsub": _binary("-", scalar_first=True), "aten.div": _div_mode,
    "aten.floor_divide": lambda c, a: f"jnp.floor_divide({c.r(a['self'])}, {c.r(a['other'])})",
    "aten.remainder": lambda c, a: f"jnp.remainder({c.r(a['self'])}, {c.r(a['other'])})",
    "aten.fmod": lambda c, a: f"jnp.fmod({c.r(a['self'])}, {c.r(a['other'])})",
    "aten.pow": _pow, "aten.neg": lambda c, a: f"-{c.paren(c.r(a['self']))}",
    "aten.reciprocal": lambda c, a: f"1 / {c.paren(c.r(a['self']))}",
    "aten.square": lambda c, a: f"jnp.square({c.r(a['self'])})",
    "aten.matmul": lambda c, a: f"{c.paren(c.r(a['self']))} @ {c.paren(c.r(a['other']))}",
    "aten.bmm": lambda c, a: f"{c.paren(c.r(a['self']))} @ {c.paren(c.r(a['mat2']))}",
    "aten.mm": lambda c, a: f"{c.paren(c.r(a['self']))} @ {c.paren(c.r(a['mat2']))}",
    "aten.linear": _linear, "aten.einsum": _einsum,
    "aten.outer": lambda c, a: f"jnp.outer({c.r(a['self'])}, {c.r(a['vec2'])})",
    "aten.rsqrt": _unary("jax.lax.rsqrt"), "aten.sqrt": _unary("jnp.sqrt"), "aten.exp": _unary("jnp.exp"),
    "aten.log": _unary("jnp.log"), "aten.log1p": _unary("jnp.log1p"), "aten.expm1": _unary("jnp.expm1"),
    "aten.tanh": _unary("jnp.tanh"), "aten.sigmoid": _unary("jax.nn.sigmoid"), "aten.abs": _unary("jnp.abs"),
    "aten.sin": _unary("jnp.sin"), "aten.cos": _unary("jnp.cos"), "aten.erf": _unary("jax.lax.erf"),
    "aten.sign": _unary("jnp.sign"), "aten.floor": _unary("jnp.floor"), "aten.ceil": _unary("jnp.ceil"),
    "aten.round": _unary("jnp.round"), "aten.atan": _unary("jnp.arctan"), "aten.log2": _unary("jnp.log2"),
    "aten.clamp": _clamp, "aten.clip": _clamp,
    "aten.clamp_min": lambda c, a: f"jnp.maximum({c.r(a['self'])}, {c.r(a['min'])})",
    "aten.clamp_max": lambda c, a: f"jnp.minimum({c.r(a['self'])}, {c.r(a['max'])})",
    "aten.maximum": lambda c, a: f"jnp.maximum({c.r(a['self'])}, {c.r(a['other'])})",
    "aten.minimum": lambda c, a: f"jnp.minimum({c.r(a['self'])}, {c.r(a['other'])})",
    # activations
    "aten.relu": _unary("jax.nn.relu"), "aten.gelu": _gelu, "aten.silu": _unary("jax.nn.silu"),
    "aten.softplus": _softplus, "aten.mish": lambda c, a: f"jax.nn.mish({c.r(a['self'])})",
    "aten.leaky_relu": lambda c, a: f"jax.nn.leaky_relu({c.r(a['self'])}, {c.r(a['negative_slope'])})",
    "aten.elu": lambda c, a: f"jax.nn.elu({c.r(a['self'])}, {c.r(a['alpha'])})",
    "aten.hardtanh": lambda c, a: f"jnp.clip({c.r(a['self'])}, {c.r(a['min_val'])}, {c.r(a['max_val'])})",
    "aten.softmax": _softmax("softmax"), "aten._softmax": _softmax("softmax"),
    "aten.log_softmax": _softmax("log_softmax"), "aten._log_softmax": _softmax("log_softmax"),
    # reductions
    "aten.mean": _reduce("mean"), "aten.sum": _reduce("sum"), "aten.prod": _reduce("prod"),
    "aten.amax": _reduce("max"), "aten.amin": _reduce("min"),
    "aten.any": _reduce("any"), "aten.all": _reduce("all"),
    "aten.max": lambda c, a: _extreme(c, a, "max"), "aten.min": lambda c, a: _extreme(c, a, "min"),
    "aten.argmax": _arg_reduce("argmax"), "aten.argmin": _arg_reduce("argmin"),
    "aten.cumsum": lambda c, a: _dtype_cast(c, f"jnp.cumsum({c.r(a['self'])}, axis={a['dim']})", a.get("dtype")),
    "aten.topk": _topk, "aten.diff": _diff,
    "aten.sort": lambda c, a: _sort(c, a), "aten.argsort": lambda c, a: _argsort(c, a),
    # comparisons and logic
    "aten.eq": _binary("=="), "aten.ne": _binary("!="), "aten.lt": _binary("<"), "aten.le": _binary("<="),
    "aten.gt": _binary(">"), "aten.ge": _binary(">="),
    "aten.logical_not": _unary("jnp.logical_not"), "aten.bitwise_not": lambda c, a: f"~{c.paren(c.r(a['self']))}",
    "aten.logical_and": lambda c, a: f"jnp.logical_and({c.r(a['self'])}, {c.r(a['other'])})",
    "aten.logical_or": lambda c, a: f"jnp.logical_or({c.r(a['self'])}, {c.r(a['other'])})",
    "aten.bitwise_and": _binary("&"), "aten.bitwise_or": _binary("|"), "aten.__and__": _binary("&"),
    "aten.__or__": _binary("|"), "aten.bitwise_xor": _binary("^"),
    "aten.where": _where, "aten.masked_fill": _masked_fill,
    # creation and dtypes
    "aten.arange": _arange, "aten.full": _full, "aten.zeros": lambda c, a: _full(c, a, 0),
    "aten.ones": lambda c, a: _full(c, a, 1), "aten.empty": lambda c, a: _full(c, a, 0),
    "aten.new_zeros": lambda c, a: _full(c, a, 0), "aten.new_ones": lambda c, a: _full(c, a, 1),
    "aten.new_full": _full, "aten.new_empty": lambda c, a: _full(c, a, 0),
    "aten.zeros_like": _full_like(0), "aten.ones_like": _full_like(1), "aten.full_like": _full_like(),
    "aten.empty_like": _full_like(0),
    "aten.scalar_tensor": lambda c, a: f"jnp.asarray({c.r(a['s'])}, dtype={c.dtype_of(c.out)})",
    "aten._to_copy": _to, "aten.to": _to, "aten.type_as": _type_as,
    # layers written op by op
    "aten.embedding": _embedding, "aten.scaled_dot_product_attention": _sdpa,
    "aten.layer_norm": _layer_norm, "aten.rms_norm": _rms_norm, "aten.dropout": _dropout,
    "aten.view_as_complex": _view_as_complex, "aten.view_as_real": _view_as_real, "aten.polar": _polar,
}


for _part in (ops_math, ops_nn, ops_reduce, ops_scatter):  # the entries kept in their own modules
    TABLE.update(_part.TABLE)
# torch's other names for the same ops (torch.multiply reaches the graph as aten.multiply): the same
# schema, the same entry
ALIASES = {"multiply": "mul", "divide": "div", "subtract": "sub", "true_divide": "div", "greater": "gt",
           "greater_equal": "ge", "less": "lt", "less_equal": "le", "not_equal": "ne", "absolute": "abs",
           "arccos": "acos", "arcsin": "asin", "arccosh": "acosh", "arcsinh": "asinh", "arctanh": "atanh",
           "negative": "neg", "concatenate": "cat"}
for _alias, _op in ALIASES.items():
    if f"aten.{_op}" in TABLE:
        TABLE.setdefault(f"aten.{_alias}", TABLE[f"aten.{_op}"])


def is_identity(name: str) -> bool:
    return TABLE.get(name) is _identity


def translate(c, node, name: str) -> str:
    """One expression for `node` (aten op `name`), or Unsupported."""
    if name not in TABLE:
        raise Unsupported("no translation")
    return TABLE[name](c, bind(node))


def float_repr(x: float) -> str:
    if math.isinf(x):
        return "jnp.inf" if x > 0 else "-jnp.inf"
    if math.isnan(x):
        return "jnp.nan"
    return repr(x)
