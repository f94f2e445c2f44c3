"""Named intermediates by flax's own mechanism: a module sows a value (Module.sow into
nnx.Intermediate), and a caller that wants the values runs the call under `capture`
(nnx.capture), which hands them back as explicit outputs and leaves nothing on the modules.
The stacks (stack.py) capture each layer's call this way: its sub-layer outputs, attention
weights and an MoE's router logits and expert load. Twin: torch_ref/layers/sow.py.

Names: a module sows under names that are none of its attributes' (nnx.capture nests what a
submodule sows under the submodule's attribute name, and a value sown under that same name
would replace it). capture returns {"name": value} for what the called module sowed itself and
{"sub.name": value} for what its submodule `sub` sowed.
"""
from __future__ import annotations

from collections.abc import Callable

from flax import nnx


def capturing(module: nnx.Module) -> bool:
    """Whether a capture runs over `module` (nnx.capture marks every module it runs over with
    the attribute Module.sow itself tests)."""
    return hasattr(module, "__captures__")


def sow(module: nnx.Module, name: str, value):
    """-> value; while a capture runs over `module`, also module.sow(nnx.Intermediate, name,
    value) (one value per name and call: the last one sown). Outside a capture nothing is kept:
    flax 0.12's Module.sow would set an attribute on the module there (deprecated), so it is
    only called inside one."""
    if capturing(module):
        module.sow(nnx.Intermediate, name, value, reduce_fn=_last)
    return value


def _last(_, value):
    return value


def capture(fn: Callable) -> Callable:
    """fn(module, *args, **kw) -> a function of the same arguments returning (fn's result,
    {dotted name: value} of what `module` and its submodules sowed during the call). The
    modules keep no trace of it afterwards (nnx.capture removes its marks; if fn raises, they
    are removed here)."""
    captured = nnx.capture(fn, nnx.Intermediate)

    def run(module: nnx.Module, *args, **kw):
        try:
            out, state = captured(module, *args, **kw)
        except BaseException:
            for _, m in nnx.iter_modules(module):  # nnx.capture leaves its marks when fn raises
                if capturing(m):
                    delattr(m, "__captures__")
            raise
        return out, {".".join(map(str, path)): v.get_value() for path, v in nnx.to_flat_state(state)}
    return run
