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
    outside it (non-persistent buffers, a port's `Constant`s) are copied by path from torch;
  - a torch.nn Transformer module (nn.MultiheadAttention, nn.TransformerEncoder[Layer],
    nn.TransformerDecoder[Layer], nn.Transformer) that the NNX module holds as a jaxformer class
    at the same path (`jaxformer port --layers jaxformer`) has its subtree under
    jaxformer.interop's names (in_proj_weight split into q/k/v_proj, linear1 -> ffn.up_proj,
    ...): torch -> NNX through interop.torch_state, NNX -> torch through its inverse (the
    mapping is slices and reshapes, so it is inverted exactly by mapping each element's index).
Every missing, unexpected or mis-shaped key is listed in one ConversionError.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from jaxformer import convert

_OWN_NAME = ("scale", "embedding", "kernel")  # leaves convert renames, kept where torch uses the name
# the torch.nn classes jaxformer.interop maps (its _KINDS): their weights go by interop's names
INTEROP = ("MultiheadAttention", "TransformerEncoderLayer", "TransformerDecoderLayer", "TransformerEncoder",
           "TransformerDecoder", "Transformer")


def _storage(x):
    return (x.data_ptr(), tuple(x.shape), tuple(x.stride())) if hasattr(x, "data_ptr") else None


def _submodule(model, path: str):
    obj = model
    for part in path.split(".") if path else ():
        try:
            obj = obj[int(part)] if part.isdigit() else getattr(obj, part)
        except (AttributeError, IndexError, KeyError, TypeError):
            return None
    return obj


def interop_twins(model, torch_module) -> list[tuple[str, Any]]:
    """[(path, torch.nn module)]: each outermost torch.nn Transformer module of `torch_module`
    (INTEROP) that `model` holds at the same path as a jaxformer class (its class defined in a
    `jaxformer.` module, not in the ported file), as `jaxformer port --layers jaxformer` writes
    them (or jaxformer.interop.from_torch builds them); their weights go by interop's names. The
    path of `torch_module` itself is ''."""
    import torch
    out: list[tuple[str, Any]] = []
    for path, module in torch_module.named_modules():
        if any(p == "" or path.startswith(p + ".") for p, _ in out):
            continue
        kind = type(module).__name__
        if kind not in INTEROP or type(module) is not getattr(torch.nn, kind):  # torch.nn's own, no subclass
            continue
        sub = _submodule(model, path)
        if sub is not None and type(sub).__module__.startswith("jaxformer."):
            out.append((path, module))
    return out


def _prefix(path: str) -> str:
    return f"{path}." if path else ""


def _interop_names(module, own: dict, prefix: str) -> tuple[dict[str, Any], list[tuple[str, tuple, int]]]:
    """Where jaxformer.interop.torch_state puts each element of `module`'s subtree of `own` (its
    keys under `prefix`): the map applied to element indices (int64, numbered over the subtree's
    keys in order), whose slices and reshapes carry each index to its place.
    -> ({interop key (prefixed): index tensor}, [(own key, shape, first index)])."""
    import torch

    from jaxformer import interop
    keys = [k for k in own if k.startswith(prefix)]
    tags, spans, start = {}, [], 0
    for k in keys:
        n = own[k].numel()
        tags[k[len(prefix):]] = torch.arange(start, start + n, dtype=torch.int64).reshape(own[k].shape)
        spans.append((k, tuple(own[k].shape), start))
        start += n
    try:
        mapped = interop.torch_state(module, tags)
    except ValueError as e:
        raise convert.ConversionError([f"{prefix[:-1] or type(module).__name__}: {e}"],
                                      header="the NNX module does not fit the torch module") from None
    return {prefix + k: v for k, v in mapped.items()}, spans


def _from_interop(arrays: dict, mapped: dict, spans: list, problems: list) -> tuple[dict[str, np.ndarray], set]:
    """The inverse of interop.torch_state: {own key: array} from `arrays` under the interop keys
    of `mapped` (their index tensors), which it pops from `arrays`; and the own keys it could not
    fill, each for a problem it has added (an interop key the NNX module lacks or misshapes)."""
    total = sum(int(np.prod(shape)) for _, shape, _ in spans)
    flat, seen, dtype = None, np.zeros(total, np.int64), None
    reported = np.zeros(total, bool)
    for key, index in mapped.items():
        if key not in arrays:
            problems.append(f"missing: {key} {tuple(index.shape)} (jaxformer.interop's name for part of the torch "
                            "module's weights; the NNX module has no leaf at that path)")
            reported[index.reshape(-1).numpy()] = True
            continue
        x = arrays.pop(key)
        if tuple(x.shape) != tuple(index.shape):
            problems.append(f"shape: {key} is {tuple(x.shape)} in the NNX module, {tuple(index.shape)} as "
                            "jaxformer.interop maps the torch module")
            reported[index.reshape(-1).numpy()] = True
            continue
        if flat is None:
            dtype = x.dtype
            flat = np.zeros(total, dtype)
        idx = index.reshape(-1).numpy()
        flat[idx] = np.asarray(x).reshape(-1)
        seen[idx] += 1
    out, unfilled = {}, set()
    for key, shape, start in spans:
        n = int(np.prod(shape))
        part = slice(start, start + n)
        if flat is None or (seen[part] != 1).any():
            unfilled.add(key)
            if not (reported[part] | (seen[part] == 1)).all():  # else its interop key's problem is above
                problems.append(f"unmapped: {key} {shape} (jaxformer.interop's map of the torch module gives "
                                f"{int((seen[part] == 0).sum())} of its {n} elements no place and "
                                f"{int((seen[part] > 1).sum())} more than one)")
            continue
        out[key] = flat[start:start + n].reshape(shape).astype(dtype)
    return out, unfilled


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
    twins = [(_interop_names(m, own, _prefix(path)), path) for path, m in interop_twins(model, torch_module)]
    names = set(own)
    for (mapped, spans), _ in twins:
        names = (names - {k for k, _, _ in spans}) | set(mapped)
    arrays = flax_arrays(model, names)
    problems: list[str] = []
    unfilled: set[str] = set()
    for (mapped, spans), _ in twins:
        filled, left = _from_interop(arrays, mapped, spans, problems)
        arrays.update(filled)
        unfilled |= left
    problems += [f"unexpected: {k} (the NNX module's, shape {tuple(v.shape)}; the torch module has no such key)"
                for k, v in arrays.items() if k not in own]
    out = {}
    for k, v in own.items():
        if k in arrays:
            if tuple(arrays[k].shape) != tuple(v.shape):
                problems.append(f"shape: {k} is {tuple(arrays[k].shape)} in the NNX module, {tuple(v.shape)} in torch")
                continue
            out[k] = torch.from_numpy(np.array(arrays[k])).to(v.dtype)
    for k, v in own.items():  # a tied weight: the key whose tensor it shares
        if k not in arrays and k not in unfilled:
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
    own = torch_module.state_dict()
    for path, module in interop_twins(model, torch_module):  # torch.nn's modules as jaxformer's classes
        from jaxformer import interop
        prefix = _prefix(path)
        sub = {k[len(prefix):]: own.pop(k) for k in [k for k in own if k.startswith(prefix)]}
        try:
            own.update({prefix + k: v for k, v in interop.torch_state(module, sub).items()})
        except ValueError as e:
            raise convert.ConversionError([f"{path or type(module).__name__}: {e}"]) from None
    state = {}
    for key, value in own.items():
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
