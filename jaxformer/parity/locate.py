"""Where two module trees part first: every submodule's inputs and output, torch against its
flax twin, in the order torch calls and finishes them.

    from jaxformer.parity.locate import first_parting
    parting = first_parting(torch_module, flax_module, args, kwargs, OUT_TOL)

A gradient check names leaves downstream of a bug (a LayerNorm eps bug shows first as
`dense.weight`, whose gradient sees the norm's output, never as `norm`), so on a failure
`check_parity` runs both trees once more, eagerly, recording each submodule's inputs and output:
torch with forward pre-hooks and hooks, flax with the classes' `__call__` wrapped for the
duration. Walking torch's calls in time order, and matching submodules by name (the torch name,
renamed as its parameters are), the first mismatch beyond the output tolerance is where the two
part: a submodule whose inputs agree and whose output does not (the bug is in it), or one whose
input already differs when its parent calls it (the bug is in the parent's own code before
that call: an attention core between q_proj and o_proj, an activation function). When every
matched submodule agrees and the top-level outputs do not, the bug is in the top-level module's
own code. Models with `return_intermediates` also have `first_divergence`; this needs no
cooperation from the modules.
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator

import numpy as np

from jaxformer.parity.trees import flatten


@dataclasses.dataclass(frozen=True)
class Parting:
    """Where outputs part first: in `module`'s own code ('' = the top-level module's), either in
    its output (`before` empty) or before it calls its child `before`, whose input differs."""
    module: str  # torch name, '' for the top level
    kind: str  # its torch class name
    diff: float  # max |jax - torch| of the first differing value
    tol: float  # the output tolerance at that value's scale
    compared: int  # inputs and outputs of submodules compared up to there
    before: str = ""  # the child whose input differs when `module` calls it
    after: str = ""  # the last submodule whose output agreed (for a parting in own code)
    inputs_agree: bool = False  # for a parting at `module`'s output: its inputs were compared and agree

    @property
    def ratio(self) -> float:
        return self.diff / self.tol if self.tol > 0 else float("inf")

    def describe(self) -> str:
        where = f"`{self.module}` ({self.kind})" if self.module else f"the top-level module ({self.kind})"
        size = f"max |diff| {self.diff:.2e}, {self.ratio:.3g}x its tolerance {self.tol:.1e}"
        if self.before:
            return f"outputs part first inside {where}'s own code, before it calls `{self.before}`: its input {size}"
        if self.module:
            inputs = "whose inputs agree" if self.inputs_agree else "its inputs not compared"
            return f"outputs part first at {where}, {inputs}: its output {size}"
        after = f" after `{self.after}`" if self.after else ""
        return f"outputs part first in {where}'s own code{after} ({self.compared} submodule values agree): {size}"


@contextlib.contextmanager
def _flax_calls(flax_module) -> Iterator[tuple[dict[str, list], dict[str, list]]]:
    """({dotted flax path: [inputs per call]}, {path: [output per call]}) for every submodule
    called inside the block, as `_snapshot`s. Each class's __call__ (the one its MRO resolves) is
    wrapped, and restored on exit. Hand-written: nnx.capture(method_outputs=...) records only
    methods a class defines itself (an inherited __call__ goes unrecorded), and no inputs."""
    from flax import nnx
    paths = {id(m): ".".join(str(p) for p in path) for path, m in nnx.iter_modules(flax_module) if path}
    owners = {}
    for _, m in nnx.iter_modules(flax_module):
        owner = next((c for c in type(m).__mro__ if "__call__" in c.__dict__), None)
        if owner is not None and owner is not object:
            owners[owner] = owner.__dict__["__call__"]
    inputs: dict[str, list] = {}
    outputs: dict[str, list] = {}
    active: set[int] = set()

    def wrap(original):
        def call(self, *a, **k):
            if id(self) not in paths or id(self) in active:  # super().__call__: record once
                return original(self, *a, **k)
            active.add(id(self))
            layout = _channels_first if isinstance(self, (nnx.Conv, nnx.ConvTranspose)) else None
            inputs.setdefault(paths[id(self)], []).append(_snapshot(_as_inputs(a, k), layout))
            try:
                out = original(self, *a, **k)
            finally:
                active.discard(id(self))
            outputs.setdefault(paths[id(self)], []).append(_snapshot(out, layout))
            return out
        return call

    for cls, original in owners.items():
        cls.__call__ = wrap(original)
    try:
        yield inputs, outputs
    finally:
        for cls, original in owners.items():
            cls.__call__ = original


def _torch_calls(module) -> tuple[list[tuple], Callable[[], None]]:
    """Hooks on every submodule: [("in", name, parent, inputs) | ("out", name, None, output)]
    in time order (parent: the submodule calling it, '' for the top level; values as
    `_snapshot`s), and the remover."""
    events: list[tuple] = []
    stack: list[str] = []

    def pre(mod, args, kwargs, name):
        events.append(("in", name, stack[-1] if stack else "", _snapshot(_as_inputs(args, kwargs))))
        stack.append(name)

    def post(mod, args, kwargs, out, name):
        stack.pop()
        events.append(("out", name, None, _snapshot(out)))

    handles = []
    for name, m in module.named_modules():
        if name:
            handles.append(m.register_forward_pre_hook(lambda mod, a, k, name=name: pre(mod, a, k, name),
                                                       with_kwargs=True))
            handles.append(m.register_forward_hook(lambda mod, a, k, o, name=name: post(mod, a, k, o, name),
                                                   with_kwargs=True))
    return events, lambda: [h.remove() for h in handles]


def _flax_name(torch_module, name: str, rename) -> str:
    """The flax path of torch submodule `name`: where its own parameters land after renaming,
    else the renamed name itself."""
    sub = torch_module.get_submodule(name)
    for p, _ in sub.named_parameters(recurse=False):
        return rename(f"{name}.{p}").rsplit(".", 1)[0]
    return rename(name + ".").rstrip(".")


def _as_inputs(args, kwargs) -> dict:
    return {**{str(i): a for i, a in enumerate(args)}, **{f"{k}=": v for k, v in kwargs.items()}}


def _snapshot(tree, layout: Callable | None = None) -> dict[str, np.ndarray]:
    """{leaf: a numpy copy} of the arrays in a call's inputs or output, taken when the call
    happens: a dict passed down to collect results (MoE's aux) fills up later. `layout` turns a
    flax array into torch's layout (_channels_first), so that torch's value is what it meets."""
    out = {}
    for k, v in flatten(tree).items():
        if hasattr(v, "detach"):
            out[k] = v.detach().cpu().numpy().copy()
        elif hasattr(v, "shape") and hasattr(v, "dtype"):
            try:
                out[k] = np.array(v)
            except Exception:  # a tracer (a layer inside a scan over stacked layers): not comparable
                continue
            if layout is not None:
                out[k] = layout(out[k])
    return out


def _channels_first(a: np.ndarray) -> np.ndarray:
    """A flax conv's [B, *spatial, C] value as torch's conv holds it, [B, C, *spatial]: compared
    in the layout torch's module sees, never by shape alone (a [B, L, C] value with L == C has
    torch's shape and other contents)."""
    return np.moveaxis(a, -1, 1) if a.ndim >= 3 else a


def first_parting(torch_module, flax_module, args: tuple, kwargs: dict, tol, rename=lambda k: k
                  ) -> Parting | None:
    """Run both trees once (eager, no gradients) on numpy inputs and find where they part; None
    when nothing differs beyond tolerance, submodules and top level alike."""
    import jax.numpy as jnp
    import torch

    events, remove = _torch_calls(torch_module)
    try:
        with torch.no_grad():
            top_t = torch_module(*[torch.as_tensor(a) for a in args],
                                 **{k: None if v is None else torch.as_tensor(v) for k, v in kwargs.items()})
    finally:
        remove()
    with _flax_calls(flax_module) as (ins_j, outs_j):
        top_j = flax_module(*[jnp.asarray(a) for a in args],
                            **{k: None if v is None else v.item() if v.ndim == 0 else jnp.asarray(v)
                               for k, v in kwargs.items()})

    kind = lambda name: type(torch_module.get_submodule(name)).__name__
    calls: dict[tuple[str, str], int] = {}
    compared, last, agreed = 0, "", set()
    for what, name, parent, value in events:
        i = calls[what, name] = calls.get((what, name), -1) + 1
        seen_j = (ins_j if what == "in" else outs_j).get(_flax_name(torch_module, name, rename), [])
        if i >= len(seen_j):
            continue
        t, j = value, seen_j[i]
        if what == "in":  # the inputs both sides pass under the same position or keyword
            t, j = ({k: x[k] for k in set(t) & set(j)} for x in (t, j))
        d = _differs(t, j, tol)
        if d is None:  # no float value of the same structure and shape: not comparable
            continue
        compared += 1
        if d[0] > d[1]:
            if what == "in":
                return Parting(parent, kind(parent) if parent else type(torch_module).__name__, d[0], d[1],
                               compared, before=name)
            return Parting(name, kind(name), d[0], d[1], compared, inputs_agree=(name, i) in agreed)
        if what == "out":
            last = name
        else:
            agreed.add((name, i))
    d = _differs(_snapshot(top_t), _snapshot(top_j), tol)
    if d is not None and d[0] > d[1]:
        return Parting("", type(torch_module).__name__, d[0], d[1], compared, after=last)
    return None


def _differs(t: dict[str, np.ndarray], j: dict[str, np.ndarray], tol) -> tuple[float, float] | None:
    """(max |diff|, bound) of the float leaf furthest past its bound; None when the two sides'
    leaves do not line up (names, shapes) or hold no float leaf."""
    if set(t) != set(j):
        return None
    worst = None
    for k in t:
        a, b = t[k], j[k]
        if a.shape != b.shape or not np.issubdtype(a.dtype, np.floating):
            continue
        a64 = a.astype(np.float64)
        d = float(np.abs(a64 - b.astype(np.float64)).max(initial=0))
        bound = tol.bound(float(np.abs(a64).max(initial=0)))
        if worst is None or d / max(bound, 1e-300) > worst[0] / max(worst[1], 1e-300):
            worst = (d, bound)
    return worst
