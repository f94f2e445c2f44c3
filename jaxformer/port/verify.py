"""What every written file is shown to do before the port hands it out: it imports, builds, and
runs at the traced sizes and at other sizes of every dimension its header calls free, with the
output structure, shapes and dtypes torch's exported graph gives at those sizes.

The runs are abstract (`jax.eval_shape`: traced, nothing computed), so they cost a trace each. The
sizes: the traced ones, and each free dimension moved by one inside the range torch.export
recorded for it (all at once); the shapes torch expects there are the exported graph's symbolic
output shapes evaluated at those sizes. Numbers are the parity check's business (api.check)."""
from __future__ import annotations

import linecache
from typing import Any

from jaxformer.port.trace import PortError, Traced


def load_source(source: str, class_name: str, label: str = "jaxformer port"):
    """The class `class_name` defined by `source` (kept in linecache, so tracebacks show it)."""
    filename = f"<{label}: {class_name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict[str, Any] = {"__name__": f"jaxformer_port_{class_name}"}
    exec(compile(source, filename, "exec"), namespace)
    return namespace[class_name]


def verify(source: str, class_name: str, traced: Traced) -> None:
    """Raise PortError naming the sizes at which the written file does not run, or does not give
    torch's output structure, shapes and dtypes."""
    for sizes in _sizes(traced):
        _run_at(source, class_name, traced, sizes)


def _free(traced: Traced) -> dict[Any, tuple[str, int, int, int | None, int | None]]:
    """{sympy symbol: (input name, axis, traced size, lowest, highest)} of the free dims."""
    import torch
    program = traced.eval_program
    ranges = dict(program.range_constraints)
    nodes = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    out = {}
    for name in traced.input_names:
        val = nodes[name].meta.get("val") if name in nodes else None
        for axis, d in enumerate(getattr(val, "shape", ())):
            if isinstance(d, torch.SymInt) and d.node.expr.is_Symbol and d.node.expr not in out:
                r = ranges.get(d.node.expr)
                lo = _bound(getattr(r, "lower", None))
                hi = _bound(getattr(r, "upper", None))
                out[d.node.expr] = (name, axis, int(traced.values[name].shape[axis]), lo, hi)
    return out


def _placed(program, traced: Traced, sizes: dict) -> dict[tuple[str, int], int]:
    """{(input name, axis): size} of every input dim whose exported size is a free symbol of
    `sizes` (one symbol may size several inputs: a batch dim shared by ids and mask)."""
    import torch
    nodes = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    out = {}
    for name in traced.input_names:
        val = nodes[name].meta.get("val") if name in nodes else None
        for axis, d in enumerate(getattr(val, "shape", ())):
            if isinstance(d, torch.SymInt) and d.node.expr in sizes:
                out[name, axis] = sizes[d.node.expr]
    return out


def _bound(x) -> int | None:
    if x is None or not getattr(x, "is_finite", True):  # int_oo, or no range recorded
        return None
    try:
        return int(x)
    except (TypeError, ValueError, OverflowError, AttributeError):
        return None


def _sizes(traced: Traced) -> list[dict]:
    """The traced sizes, and the free dims moved by one within their ranges, where torch's export
    accepts the sizes (its shape guards: a reshape to 8 ties two free dims' product to 8): all
    moved at once, else each that can move alone, at once if the guards accept that, else each
    alone (the first few)."""
    free = _free(traced)
    traced_sizes = {s: hint for s, (_, _, hint, _, _) in free.items()}
    single = []
    for s, (_, _, hint, lo, hi) in free.items():
        up, down = hint + 1, hint - 1
        v = up if hi is None or up <= hi else (down if lo is None or down >= lo else hint)
        if v != hint:
            single.append({**traced_sizes, s: v})
    if not single:
        return [traced_sizes]
    every = {k: v for one in single for k, v in one.items() if v != traced_sizes[k]}
    if _accepted(traced, {**traced_sizes, **every}) and _torch_runs(traced, {**traced_sizes, **every}):
        return [traced_sizes, {**traced_sizes, **every}]
    alone = [one for one in single if _accepted(traced, one)]
    together = {**traced_sizes, **{k: v for one in alone for k, v in one.items() if v != traced_sizes[k]}}
    if len(alone) > 1 and _accepted(traced, together) and _torch_runs(traced, together):
        return [traced_sizes, together]
    return [traced_sizes] + [one for one in alone if _torch_runs(traced, one)][:MOVES]


def _torch_runs(traced: Traced, sizes: dict) -> bool:
    """Whether torch's exported program itself runs at `sizes` (a check inside an op, such as an
    index_put's mask having the indexed tensor's shape, is no shape guard): on the traced inputs
    cut or extended along each moved dim (the last slice repeated, so every value stays one the
    model took), in eval mode, without gradients."""
    import numpy as np
    import torch
    placed = _placed(traced.eval_program, traced, sizes)
    kwargs = {}
    for name, value in traced.values.items():
        if isinstance(value, torch.Tensor):
            array = value.numpy()
            for (n, axis), size in placed.items():
                if n == name:
                    array = np.take(array, np.minimum(np.arange(size), array.shape[axis] - 1), axis=axis)
            kwargs[name] = torch.from_numpy(np.ascontiguousarray(array))
        elif value is not None:
            kwargs[name] = value
    program = traced.reference if traced.reference is not None else traced.eval_program  # no twin op in it
    try:
        runnable = program.module()
        for name, buffer in list(runnable.named_buffers()):  # its own copies: forward may update them
            owner, _, leaf = name.rpartition(".")
            (runnable.get_submodule(owner) if owner else runnable)._buffers[leaf] = buffer.clone()
        with torch.no_grad():
            runnable(**kwargs)
    except Exception:  # torch refuses these sizes itself: the file need not take them
        return False
    return True


MOVES = 3  # sizes tried one free dim at a time, at most (each an abstract run of the file)


def _accepted(traced: Traced, sizes: dict) -> bool:
    """Whether torch's exported program accepts inputs of these sizes: each of its shape guards
    (`ExportedProgram._guards_code`, Python over `L['x'].size()[i]`) holds. A guard that cannot be
    read counts as failing: those sizes are not tried."""
    import torch
    placed = _placed(traced.eval_program, traced, sizes)
    shapes = {name: tuple(placed.get((name, i), d) for i, d in enumerate(v.shape))
              for name, v in traced.values.items() if isinstance(v, torch.Tensor)}
    env = {"L": {name: _Sized(shape) for name, shape in shapes.items()}}
    for guard in getattr(traced.eval_program, "_guards_code", None) or []:
        try:
            if not eval(guard, {"__builtins__": {}}, env):  # torch's own guard text
                return False
        except Exception:
            return False
    return True


class _Sized:
    """An input as a shape guard reads it: `.size()`."""

    def __init__(self, shape: tuple):
        self.shape = shape

    def size(self):
        return self.shape


def _describe(traced: Traced, sizes: dict) -> str:
    free = _free(traced)
    moved = [f"{free[s][0]}.shape[{free[s][1]}] = {v}" for s, v in sizes.items() if v != free[s][2]]
    return ", ".join(moved) if moved else "the traced sizes"


def _run_at(source: str, class_name: str, traced: Traced, sizes: dict) -> None:
    import jax
    import numpy as np
    import torch
    from flax import nnx
    from torch.utils import _pytree as pytree

    from jaxformer.parity.trees import flatten

    placed = _placed(traced.eval_program, traced, sizes)
    kwargs = {}
    for name in traced.input_names:
        value = traced.values[name]
        if isinstance(value, torch.Tensor):
            shape = tuple(placed.get((name, i), d) for i, d in enumerate(value.shape))
            dtype = jax.numpy.asarray(np.zeros((), value.numpy().dtype)).dtype
            kwargs[name] = jax.ShapeDtypeStruct(shape, dtype)
        else:
            kwargs[name] = value
    cls = load_source(source, class_name)

    def run(**tensors):
        model = cls(rngs=nnx.Rngs(0))
        model.eval()
        return model(**{**kwargs, **tensors})
    at = _describe(traced, sizes)
    try:
        got = jax.eval_shape(run, **{k: v for k, v in kwargs.items() if isinstance(v, jax.ShapeDtypeStruct)})
    except Exception as e:  # the written file fails: a port bug, never handed out
        raise PortError(f"the written file does not run at {at}: {type(e).__name__}: {_first_line(e)}") from None
    got = {k: v for k, v in flatten(got).items() if hasattr(v, "shape")}
    want = _torch_outputs(traced, placed, pytree, flatten)
    if set(got) != set(want):
        raise PortError(f"the written file returns {sorted(got)} where torch returns {sorted(want)} (at {at})")
    for k, (shape, dtype) in want.items():
        g = got[k]
        if tuple(g.shape) != shape or f"jnp.{np.dtype(g.dtype).name}".replace("bool", "bool_") != dtype:
            raise PortError(f"the written file's output {k} is {np.dtype(g.dtype).name}{list(g.shape)} where torch's "
                            f"is {dtype.removeprefix('jnp.')}{list(shape)} (at {at})")


def _torch_outputs(traced: Traced, placed: dict, pytree, flatten) -> dict[str, tuple[tuple, str]]:
    """{output key: (shape, jnp dtype name)} of torch's exported graph with its inputs' dims at
    `placed` ({(input, axis): size}): the plain graph where the port has twins (whose opaque op
    guesses its output shapes; trace._pinned), else the written one."""
    import torch

    from jaxformer.port.body import dtype_name
    program = traced.reference if traced.reference is not None else traced.eval_program
    inputs = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    sizes = {}  # each symbolic input dim of `program`: its size in `placed`, else the traced one
    for name, node in inputs.items():
        if name not in traced.values or not isinstance(traced.values[name], torch.Tensor):
            continue
        for axis, d in enumerate(getattr(node.meta.get("val"), "shape", ())):
            if isinstance(d, torch.SymInt) and d.node.expr.is_Symbol:
                sizes[d.node.expr] = placed.get((name, axis), int(traced.values[name].shape[axis]))
    nodes = {n.name: n for n in program.graph.nodes}
    leaves = []
    for spec in program.graph_signature.output_specs:
        if spec.kind.name != "USER_OUTPUT":
            continue
        name = getattr(spec.arg, "name", None)
        leaves.append(nodes[name].meta.get("val") if name in nodes else getattr(spec.arg, "value", None))
    tree = pytree.tree_unflatten(leaves, program.call_spec.out_spec)
    out = {}
    for k, v in flatten(tree).items():
        if not isinstance(v, torch.Tensor):
            continue
        shape = tuple(int(d.node.expr.xreplace(sizes)) if isinstance(d, torch.SymInt) else int(d) for d in v.shape)
        out[k] = (shape, dtype_name(v.dtype))
    return out


def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return (lines[0] if lines else type(e).__name__)[:300]
