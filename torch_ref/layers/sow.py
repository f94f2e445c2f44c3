"""Named intermediates as the JAX tree collects them: a module sows a value, and a caller that
wants the values runs the call under `capture`, which hands them back and leaves nothing on the
modules. Twin: jaxformer/layers/sow.py, which uses flax's Module.sow and nnx.capture. Torch has
neither, so this is the smallest hand-written mirror of their semantics, kept so that the two
trees' layers and stacks read alike and give the same names (parity with the JAX tree is why it
is hand-written, not a torch hook).

Names: as in the twin. A module sows under names that are none of its attributes'; capture
returns {"name": value} for what the called module sowed itself and {"sub.name": value} for
what its submodule `sub` sowed.
"""
from __future__ import annotations

from collections.abc import Callable

from torch import nn

_CAPTURES = "_sow_captures"  # the mark capture puts on every module it runs over


def capturing(module: nn.Module) -> bool:
    """Whether a capture runs over `module`."""
    return _CAPTURES in vars(module)


def sow(module: nn.Module, name: str, value):
    """-> value; while a capture runs over `module`, also keeps it as `name` (one value per
    name and call: the last one sown). Outside a capture nothing is kept."""
    if capturing(module):
        vars(module)[_CAPTURES][name] = value
    return value


def capture(fn: Callable) -> Callable:
    """fn(module, *args, **kw) -> a function of the same arguments returning (fn's result,
    {dotted name: value} of what `module` and its submodules sowed during the call). The
    modules keep no trace of it afterwards, also when fn raises."""
    def run(module: nn.Module, *args, **kw):
        modules = list(module.named_modules())
        for _, m in modules:
            vars(m)[_CAPTURES] = {}
        try:
            out = fn(module, *args, **kw)
            sown = {f"{path}.{k}" if path else k: v for path, m in modules for k, v in vars(m)[_CAPTURES].items()}
        finally:
            for _, m in modules:
                del vars(m)[_CAPTURES]
        return out, sown
    return run
