"""Tracing a torch module for the port: `torch.export` at the factory's inputs, eval and train.

Every dimension of every tensor input is exported as `Dim.AUTO`: it stays symbolic unless the
graph pins it (a weight's width, a size-1 axis), so batch and sequence length stay free
wherever the model allows. Python control flow is resolved at the traced inputs. The module is
exported twice, in eval mode (the graph that is written) and in train mode (where dropout's
rates come from); the two graphs are lined up op by op (jaxformer/port/graph.py)."""
from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Mapping

import numpy as np


class PortError(ValueError):
    """A module that cannot be ported, named: the aten op, the torch module path and the
    source line (one line)."""


@dataclasses.dataclass
class Traced:
    eval_program: Any  # torch.export.ExportedProgram, eval mode
    train_program: Any | None  # the same in train mode (None: the train graph failed to export)
    input_names: tuple[str, ...]  # forward's argument names, in the inputs' order
    values: dict[str, Any]  # the traced inputs (torch tensors, Python scalars or None)
    symbols: dict[str, str]  # symbol -> "idx.shape[1], 2..16": the dims that stay free
    notes: list[str]  # what the header should say (static fallback, train graph problems)
    call_signatures: bool  # module call signatures preserved (argument names of submodules)


def torch_inputs(module, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """{name: torch tensor (or a Python scalar)} from the factory's numpy inputs, checked
    against `forward`'s parameters."""
    import torch
    if not isinstance(inputs, Mapping):
        raise PortError("inputs must be a dict of numpy arrays keyed by forward's argument names, "
                        f"got {type(inputs).__name__}")
    params = inspect.signature(module.forward).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    unknown = [k for k in inputs if k not in params and not takes_any]
    if unknown:
        raise PortError(f"input {unknown[0]!r} is not an argument of {type(module).__name__}.forward "
                        f"(it takes {', '.join(params)})")
    out = {}
    for k, v in inputs.items():
        if v is None or isinstance(v, (bool, int, float)):
            out[k] = v
        else:
            out[k] = torch.from_numpy(np.ascontiguousarray(np.asarray(v)))
    return out


def _dynamic_shapes(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    from torch.export import Dim
    return {k: ({i: Dim.AUTO for i in range(v.dim())} if hasattr(v, "dim") else None)
            for k, v in kwargs.items() if v is not None}


def _export(module, kwargs, *, dynamic: bool, preserve: tuple[str, ...]):
    import torch
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    return torch.export.export(module, (), kwargs, strict=False,
                               dynamic_shapes=_dynamic_shapes(kwargs) if dynamic else None,
                               preserve_module_call_signature=preserve)


def _export_any(module, kwargs, notes: list[str]):
    """Export, trying in turn: dynamic dims with submodule call signatures, dynamic dims
    alone, static shapes. -> (program, call signatures kept)."""
    paths = tuple(n for n, _ in module.named_modules() if n)
    first = None
    for dynamic, preserve in ((True, paths), (True, ()), (False, ())):
        try:
            return _export(module, kwargs, dynamic=dynamic, preserve=preserve), bool(preserve)
        except Exception as e:  # torch.export raises many types; the first one is the reason
            first = first or e
            if not dynamic:
                break
            if preserve == ():
                notes.append(f"static shapes: the graph does not export with free dims "
                             f"({type(e).__name__}: {_first_line(e)})")
    raise PortError(f"torch.export failed for {type(module).__name__}: {type(first).__name__}: "
                    f"{_first_line(first)}")


def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return (lines[0] if lines else type(e).__name__)[:300]


def free_symbols(program, kwargs: Mapping[str, Any]) -> dict[str, str]:
    """{symbol: 'name.shape[i] in lo..hi'} for each input dim that stayed symbolic."""
    import torch
    ranges = {str(k): v for k, v in program.range_constraints.items()}
    out: dict[str, str] = {}
    user = [n for n in program.graph.nodes if n.op == "placeholder" and n.name in kwargs]
    for node in user:
        val = node.meta.get("val")
        for i, d in enumerate(getattr(val, "shape", ())):
            if isinstance(d, torch.SymInt) and str(d) not in out:
                r = ranges.get(str(d))
                hi = "" if r is None or str(r.upper) in ("int_oo", "oo") else str(r.upper)
                lo = "" if r is None else str(r.lower)
                bounds = f" in {lo}..{hi}" if hi else f" >= {lo}"
                out[str(d)] = f"{node.name}.shape[{i}]" + (bounds if r is not None else "")
    return out


def trace(module, inputs: Mapping[str, Any]) -> Traced:
    """Export `module` at `inputs` (numpy, keyed by forward's argument names) in eval and in
    train mode. The module's own mode is restored afterwards."""
    kwargs = torch_inputs(module, inputs)
    notes: list[str] = []
    was_training = module.training
    try:
        module.eval()
        program, signatures = _export_any(module, kwargs, notes)
        train = None
        try:
            module.train()
            train = _export(module, kwargs, dynamic=not notes, preserve=())
        except Exception as e:
            notes.append(f"train mode not ported: its graph does not export ({type(e).__name__}: "
                         f"{_first_line(e)}); dropout stays off")
    finally:
        module.train(was_training)
    return Traced(program, train, tuple(kwargs), kwargs, free_symbols(program, kwargs), notes, signatures)

