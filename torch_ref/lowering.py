"""The torch twin of jaxformer/lowering.py's attention switch: how self-attention without a
cache is computed, set for the calls made inside `computing(...)`.

attention: "plain" (the dense masks and SDPA / the explicit path) or "blockwise" (the stacks
keep the mask as AttentionMask parts and torch_ref/layers/kernels/blockwise.py computes it: torch's SDPA
with is_causal, its flash CPU kernel, where the mask is plain causal, else the same online
softmax over key blocks as jaxformer's). "splash" is TPU-only in jaxformer and means blockwise
here. "auto": blockwise from AUTO_BLOCKWISE_MIN_KEYS keys on, plain below (jaxformer's rule where
the platform has no kernel of its own; torch_ref/layers/dispatch.py). The switch changes which
kernels compute the function, never the function.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from dataclasses import dataclass

from jaxformer.tables import AUTO_BLOCKWISE_MIN_KEYS  # noqa: F401  (attention "auto"'s length rule)

ATTENTION = ("plain", "blockwise", "splash", "auto")


@dataclass(frozen=True)
class Lowering:
    attention: str = "plain"
    attention_blocks: tuple[int, int] = (512, 512)

    def __post_init__(self) -> None:
        if self.attention not in ATTENTION:
            raise ValueError(f"attention must be one of {ATTENTION}, got {self.attention!r}")


_ACTIVE: contextvars.ContextVar[Lowering] = contextvars.ContextVar("torch_ref_lowering", default=Lowering())  # noqa: B039 (a frozen dataclass)


def active() -> Lowering:
    return _ACTIVE.get()


@contextlib.contextmanager
def computing(**switches):
    """Calls inside this context see the given `Lowering` fields (the others keep theirs)."""
    token = _ACTIVE.set(dataclasses.replace(_ACTIVE.get(), **switches))
    try:
        yield
    finally:
        _ACTIVE.reset(token)
