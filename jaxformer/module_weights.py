"""A model.module's weights (any NNX module, jaxformer/models/module.py) and the torch module it
stands for, both ways, under the torch module's own `state_dict` keys.

    from jaxformer import module_weights
    module_weights.load_into_torch(flax_model, torch_model)   # strict load_state_dict; -> torch_model
    sd = module_weights.torch_state_dict(flax_model, torch_model)  # {its own keys: tensors}
    module_weights.load_from_torch(flax_model, torch_model)   # -> flax_model

The paths already match (a port's attribute paths are the torch keys), so jaxformer.convert's
leaf table does the layouts (kernel <-> weight transposed, scale / embedding <-> weight); what
this adds is what only the torch module knows:
  - a custom parameter torch itself calls `scale` or `embedding` (convert's table would name it
    `weight`) keeps its own name;
  - a tied weight, which the NNX module holds once, is written under every key torch's
    state_dict lists it (the keys that share one tensor in the torch module);
  - buffers in the state_dict (a port's `Buffer` variables) travel like parameters; tensors
    outside it (non-persistent buffers, a port's `Constant`s) are copied by path from torch.
Every missing, unexpected or mis-shaped key is listed in one ConversionError.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from jaxformer import convert

_OWN_NAME = ("scale", "embedding", "kernel")  # leaves convert renames, kept where torch uses the name


def _storage(x):
    return (x.data_ptr(), tuple(x.shape), tuple(x.stride())) if hasattr(x, "data_ptr") else None


def flax_arrays(model, keys=None) -> dict[str, np.ndarray]:
    """{torch key: array in torch layout} of `model`'s parameters and saved buffers; `keys` (the
    torch module's state_dict keys): a leaf convert would call `...weight` keeps its own leaf
    name where that is the key torch has."""
    keys = set(keys or ())
    prefixes = convert.scan_prefixes(model)
    out: dict[str, np.ndarray] = {}
    for path, var in convert.param_leaves(model).items():
        x = convert.to_numpy(var.get_value())
        own = convert.flax_key(path)
        if keys and str(path[-1]) in _OWN_NAME and own in keys and convert.torch_key(path) not in keys:
            out[own] = x
            continue
        out.update(convert.flax_leaf_to_torch(path, x, prefixes))
    return out


def torch_state_dict(model, torch_module) -> dict[str, Any]:
    """`model`'s weights as `torch_module.state_dict()` holds them: its keys (tied weights under
    each of their names, its persistent buffers), shapes and dtypes; ConversionError lists every
    problem."""
    import torch
    own = torch_module.state_dict()
    arrays = flax_arrays(model, own)
    problems = [f"unexpected: {k} (the NNX module's, shape {tuple(v.shape)}; the torch module has no such key)"
                for k, v in arrays.items() if k not in own]
    out = {}
    for k, v in own.items():
        if k in arrays:
            if tuple(arrays[k].shape) != tuple(v.shape):
                problems.append(f"shape: {k} is {tuple(arrays[k].shape)} in the NNX module, {tuple(v.shape)} in torch")
                continue
            out[k] = torch.from_numpy(np.array(arrays[k])).to(v.dtype)
    for k, v in own.items():  # a tied weight: the key whose tensor it shares
        if k not in arrays:
            twin = next((t for t in own if t in arrays and _storage(own[t]) == _storage(v)), None)
            if twin is None:
                problems.append(f"missing: {k} {tuple(v.shape)} (torch's; the NNX module has no leaf at that path)")
            elif twin in out:
                out[k] = out[twin]
    if problems:
        raise convert.ConversionError(sorted(problems), header="the NNX module does not fit the torch module")
    return out


def load_into_torch(model, torch_module):
    """Copy `model`'s weights into `torch_module` (load_state_dict, strict). -> torch_module."""
    import torch
    state = torch_state_dict(model, torch_module)
    with torch.no_grad():
        torch_module.load_state_dict(state, strict=True)
    return torch_module


def load_from_torch(model, torch_module):
    """Copy `torch_module`'s state_dict into `model` (strict: every parameter and saved buffer;
    a tied weight once), then its tensors outside the state_dict that `model` holds as a
    `Constant` (a port's non-persistent buffers), by path. -> model."""
    import jax.numpy as jnp
    from flax import nnx
    expected = {convert.torch_key(p) for p in convert.param_leaves(model)}
    state = {}
    for key, value in torch_module.state_dict().items():
        prefix, _, leaf = key.rpartition(".")
        renamed = f"{prefix}.weight" if prefix else "weight"
        state[renamed if leaf in _OWN_NAME and key not in expected and renamed in expected else key] = value
    convert.load_torch_state_dict(model, state)
    problems = []
    for path, var in nnx.to_flat_state(nnx.state(model, lambda _, v: type(v).__name__ == "Constant")):
        key = ".".join(str(p) for p in path)
        obj = torch_module
        try:
            for part in key.split("."):
                obj = obj[int(part)] if part.isdigit() and hasattr(obj, "__getitem__") else getattr(obj, part)
        except (AttributeError, IndexError, KeyError, TypeError):
            problems.append(f"missing: torch tensor {key}")
            continue
        value = convert.to_numpy(obj)
        if tuple(value.shape) != tuple(var.shape):
            problems.append(f"shape: {key} has torch shape {tuple(value.shape)}, expected {tuple(var.shape)}")
            continue
        var.set_value(jnp.asarray(value).astype(var.dtype))
    if problems:
        raise convert.ConversionError(problems)
    return model
