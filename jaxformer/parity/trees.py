"""Nested outputs as flat {dotted name: leaf} dicts, the form the harness and the locator
compare (jaxformer/parity/harness.py, locate.py)."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Nested tuples/lists/dicts/dataclasses (LMOutput) -> {"0", "1.attn", "logits", ...: leaf}.
    A dataclass goes by its field names. None leaves are dropped."""
    if tree is None:
        return {}
    if dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        return flatten({f.name: getattr(tree, f.name) for f in dataclasses.fields(tree)}, prefix)
    if isinstance(tree, Mapping):
        out = {}
        for k in tree:
            out.update(flatten(tree[k], f"{prefix}{k}."))
        return out
    if isinstance(tree, (tuple, list)):
        out = {}
        for i, v in enumerate(tree):
            out.update(flatten(v, f"{prefix}{i}."))
        return out
    return {prefix.rstrip(".") or "out": tree}


def is_float(x: np.ndarray) -> bool:
    return np.issubdtype(x.dtype, np.floating)
