"""Weight conversion between torch_ref `state_dict`s and jaxformer (Flax NNX) model state.

Paths already match (the attribute path is the checkpoint key), so one small rule table on
the *leaf name* does the rest (see STYLE.md):

    flax leaf   torch leaf   layout
    kernel      weight       Linear: [in, out] <-> [out, in]; Conv: [k..., I, O] <-> [O, I, k...]
    scale       weight       as is (norms)
    embedding   weight       as is
    anything    same name    as is (bias, cls_token, a ParamLoRA's lora_A / lora_B: torch layout in both, ...)

A tied weight, which torch's state_dict lists under every name, loads once (its other names are
the same tensor). Conversion is strict: one ConversionError lists every missing, unexpected and mis-shaped key,
every dtype problem and every non-finite tensor. Files are written atomically, so a failed
conversion leaves no output file. A torch -> flax -> torch round trip is bit-exact.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from jaxformer.fileio import atomic_file

RENAMES = {"kernel": "weight", "scale": "weight", "embedding": "weight"}


class ConversionError(ValueError):
    """Raised with every problem of a conversion listed, one per line.

    The first line names the first problem (the CLI prints only that line and a count of the
    rest); `header=""` for a problem that is a whole message of its own (a file that is refused)."""

    def __init__(self, problems: Iterable[str], header: str = "weight conversion failed"):
        self.problems = list(problems) or ["(no detail)"]
        first, rest = self.problems[0], self.problems[1:]
        lead = f"{header}: " if header else ""
        if rest:
            lead = f"{header or 'conversion failed'} ({len(self.problems)} problems): "
        super().__init__(lead + first + "".join(f"\n  {p}" for p in rest))


# ----------------------------------------------------------------------------- rule table
def torch_leaf(leaf: str) -> str:
    return RENAMES.get(leaf, leaf)


def flax_to_torch_layout(leaf: str, x: np.ndarray, stacked: int = 0) -> np.ndarray:
    """Re-layout one flax leaf as torch stores it. `stacked` leading axes are kept in place."""
    if leaf != "kernel":
        return x
    n = x.ndim - stacked
    lead = tuple(range(stacked))
    if n == 2:  # Linear [in, out] -> [out, in]
        return np.ascontiguousarray(np.transpose(x, lead + (stacked + 1, stacked)))
    # Conv [k..., I, O] -> [O, I, k...]
    return np.ascontiguousarray(np.transpose(
        x, lead + (stacked + n - 1, stacked + n - 2) + tuple(range(stacked, stacked + n - 2))))


def torch_to_flax_layout(leaf: str, x: np.ndarray, stacked: int = 0) -> np.ndarray:
    if leaf != "kernel":
        return x
    n = x.ndim - stacked
    lead = tuple(range(stacked))
    if n == 2:
        return np.ascontiguousarray(np.transpose(x, lead + (stacked + 1, stacked)))
    # Conv [O, I, k...] -> [k..., I, O]
    return np.ascontiguousarray(np.transpose(
        x, lead + tuple(range(stacked + 2, stacked + n)) + (stacked + 1, stacked)))


def torch_to_flax_axes(leaf: str, ndim: int) -> tuple:
    """The transpose that takes one (unstacked) torch-layout leaf of `ndim` dims to flax layout,
    for traced arrays (torch_to_flax_layout's permutation)."""
    if leaf != "kernel":
        return tuple(range(ndim))
    return (1, 0) if ndim == 2 else tuple(range(2, ndim)) + (1, 0)


def flax_shape_to_torch(leaf: str, shape: tuple, stacked: int = 0) -> tuple:
    return flax_to_torch_layout(leaf, np.empty(shape, np.bool_), stacked).shape if leaf == "kernel" else shape


# ----------------------------------------------------------------------------- arrays
def to_numpy(x: Any) -> np.ndarray:
    """torch.Tensor / jax.Array / numpy -> numpy, keeping bfloat16 (via ml_dtypes)."""
    if type(x).__module__.startswith("torch"):
        import torch
        x = x.detach().cpu()
        if x.dtype == torch.bfloat16:
            import ml_dtypes
            return x.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return x.numpy()
    return np.asarray(x)


def to_torch(x: np.ndarray):
    import torch
    if x.dtype.name == "bfloat16":
        return torch.from_numpy(np.array(x).view(np.int16)).view(torch.bfloat16)
    x = np.ascontiguousarray(x)
    return torch.from_numpy(x if x.flags.writeable else x.copy())


def _is_float(dtype) -> bool:
    return np.issubdtype(dtype, np.floating) or np.dtype(dtype).name == "bfloat16"


def _check_finite(key: str, x: np.ndarray, problems: list[str]) -> None:
    if _is_float(x.dtype):
        # float64 is checked as float32 (a value beyond float32's range is inf there); narrower
        # floats are exact in float32, so they are checked in place, without a copy
        finite = np.isfinite(x.astype(np.float32) if x.dtype.itemsize > 4 else x)
        if not finite.all():
            problems.append(f"non-finite: {key} has {finite.size - int(np.count_nonzero(finite))} "
                            "NaN/inf value(s)")


def check_tensor(key: str, x: np.ndarray, expected_shape: tuple, expected_dtype, *,
                 allow_downcast: bool = False, values: bool = True) -> list[str]:
    """Every problem of one torch-layout tensor bound for a param of `expected_dtype` whose
    torch shape is `expected_shape`: a non-float dtype, a cast that would lose precision
    (unless allow_downcast), non-finite values and a wrong shape; [] when it converts. `key`
    names the tensor in the messages. values=False checks dtype and shape only (planning
    from file headers, on a stand-in array)."""
    expected_dtype = np.dtype(expected_dtype)
    problems: list[str] = []
    if not _is_float(expected_dtype):  # an index or mask buffer: the same kind, values that fit
        return _check_integer(key, x, expected_shape, expected_dtype, values)
    if not _is_float(x.dtype):
        problems.append(f"dtype: {key} is {x.dtype}, expected a floating dtype ({expected_dtype})")
    elif x.dtype != expected_dtype and x.dtype.itemsize > expected_dtype.itemsize and not allow_downcast:
        problems.append(f"dtype: {key} is {x.dtype}; casting to {expected_dtype} would lose precision")
    if values:
        _check_finite(key, x, problems)
    if tuple(x.shape) != tuple(expected_shape):
        problems.append(f"shape: {key} has torch shape {tuple(x.shape)}, expected {tuple(expected_shape)}")
    return problems


def _check_integer(key: str, x: np.ndarray, expected_shape: tuple, expected_dtype: np.dtype,
                   values: bool) -> list[str]:
    """An integer or boolean buffer (torch int64 index tables held as JAX's int32): the same
    kind of dtype, and every value representable in the target dtype."""
    problems: list[str] = []
    if x.dtype.kind != expected_dtype.kind and not {x.dtype.kind, expected_dtype.kind} <= {"i", "u"}:
        problems.append(f"dtype: {key} is {x.dtype}, expected {expected_dtype}")
    elif values and x.size and expected_dtype.kind in "iu":
        info = np.iinfo(expected_dtype)
        if x.min() < info.min or x.max() > info.max:
            problems.append(f"dtype: {key} has values outside {expected_dtype}'s range")
    if tuple(x.shape) != tuple(expected_shape):
        problems.append(f"shape: {key} has torch shape {tuple(x.shape)}, expected {tuple(expected_shape)}")
    return problems


def _tied(state_dict: Mapping[str, Any], used: set[str]) -> set[str]:
    """Keys of `state_dict` that are another used key's very tensor (a tied weight: torch's
    state_dict lists it under every name, the NNX model holds it once)."""
    def storage(x):
        ptr = getattr(x, "data_ptr", None)
        return (ptr(), tuple(x.shape), tuple(x.stride())) if ptr is not None else None
    held = {storage(state_dict[k]) for k in used} - {None}
    return {k for k, v in state_dict.items() if k not in used and storage(v) in held}


# ----------------------------------------------------------------------------- model state
PORTED_SAVED = ("Buffer", "Frozen")  # the Variable classes a ported file declares for saved state


def _ported_buffer(path, value) -> bool:
    """A torch buffer or frozen parameter (requires_grad=False) in a file `jaxformer port` wrote:
    it imports only jax, flax and numpy, so it declares its own `Buffer(nnx.Variable)` and
    `Frozen(nnx.Variable)` classes."""
    from flax import nnx
    return isinstance(value, nnx.Variable) and type(value).__name__ in PORTED_SAVED


def param_leaves(model) -> dict[tuple, Any]:
    """Flattened nnx.Param leaves of `model` (concrete or abstract), and its saved untrained
    arrays (layers/moe.py Buffer, torch buffers such as the router's score_bias, a ported
    file's buffers, frozen parameters and BatchNorm statistics): path tuple -> Variable."""
    from flax import nnx

    from jaxformer.layers.moe import SAVED
    flat = nnx.to_flat_state(nnx.state(model, nnx.Any(SAVED, _ported_buffer, nnx.BatchStat)))
    return {tuple(path): var for path, var in flat}


def torch_key(path: tuple) -> str:
    return ".".join(str(p) for p in path[:-1]) + ("." if len(path) > 1 else "") + torch_leaf(str(path[-1]))


def flax_key(path: tuple) -> str:
    return ".".join(str(p) for p in path)


def scan_prefixes(model) -> tuple[tuple, ...]:
    """Paths of scanned layer stacks (model.scan_layers): their params carry a leading layer
    axis, while torch keeps `layers.{i}` modules. Found by the `scan_layers` flag on a stack."""
    from flax import nnx
    out = []
    for path, node in nnx.iter_graph(model):
        if isinstance(node, nnx.Module) and getattr(node, "scan_layers", False) is True:
            out.append(tuple(path) + ("layers",))
    return tuple(out)


def stacked_prefix(path: tuple, prefixes: tuple[tuple, ...]) -> tuple | None:
    for pre in prefixes:
        if tuple(path[: len(pre)]) == pre:
            return pre
    return None


def torch_keys_for(path: tuple, shape: tuple, prefixes: tuple[tuple, ...] = ()) -> list[str]:
    """Torch key(s) of one flax param: one, or one per layer for a scanned (stacked) leaf."""
    pre = stacked_prefix(path, prefixes)
    if pre is None:
        return [torch_key(path)]
    return [torch_key(pre + (i,) + tuple(path[len(pre):])) for i in range(shape[0])]


def flax_leaf_to_torch(path: tuple, x: np.ndarray, prefixes: tuple[tuple, ...] = ()) -> dict[str, np.ndarray]:
    """{torch key: array in torch layout} for one flax leaf (split per layer when stacked)."""
    leaf = str(path[-1])
    keys = torch_keys_for(path, x.shape, prefixes)
    if stacked_prefix(path, prefixes) is None:
        return {keys[0]: flax_to_torch_layout(leaf, x)}
    return {k: flax_to_torch_layout(leaf, x[i]) for i, k in enumerate(keys)}


def torch_shape_of(path: tuple, shape: tuple, prefixes: tuple[tuple, ...] = ()) -> tuple:
    """The torch shape of each torch key of a flax leaf."""
    leaf = str(path[-1])
    if stacked_prefix(path, prefixes) is not None:
        shape = shape[1:]
    return flax_shape_to_torch(leaf, tuple(shape))


def torch_to_flax_arrays(state_dict: Mapping[str, Any], model, *, allow_downcast: bool = False
                         ) -> dict[tuple, np.ndarray]:
    """Map a torch state_dict onto `model`'s Param paths. Raises ConversionError listing all
    problems. Returns {flax path tuple: array in flax layout and the param's dtype}."""
    leaves = param_leaves(model)
    prefixes = scan_prefixes(model)
    problems: list[str] = []
    out: dict[tuple, np.ndarray] = {}
    used: set[str] = set()
    for path, var in leaves.items():
        leaf = str(path[-1])
        target_shape = tuple(var.shape)
        target_dtype = np.dtype(var.dtype)
        want = torch_shape_of(path, target_shape, prefixes)
        parts, ok = [], True
        for tk in torch_keys_for(path, target_shape, prefixes):
            if tk not in state_dict:
                problems.append(f"missing: {tk} (flax {flax_key(path)}, shape {want})")
                ok = False
                continue
            used.add(tk)
            x = to_numpy(state_dict[tk])
            bad = check_tensor(tk, x, want, target_dtype, allow_downcast=allow_downcast)
            if bad:
                problems += bad
                ok = False
                continue
            parts.append(torch_to_flax_layout(leaf, x))
        if ok:
            y = parts[0] if stacked_prefix(path, prefixes) is None else np.stack(parts)
            out[path] = y.astype(target_dtype, copy=False)
    tied = _tied(state_dict, used)
    for k in state_dict:
        if k not in used and k not in tied:
            problems.append(f"unexpected: {k} (shape {tuple(getattr(state_dict[k], 'shape', ()))})")
    if problems:
        raise ConversionError(sorted(problems, key=lambda p: p.split(":")[0]))
    return out


def load_torch_state_dict(model, state_dict: Mapping[str, Any], **kw):
    """Copy a torch state_dict into `model`'s params in place (strict). Returns `model`."""
    import jax.numpy as jnp
    arrays = torch_to_flax_arrays(state_dict, model, **kw)
    leaves = param_leaves(model)
    for path, x in arrays.items():
        leaves[path].set_value(jnp.asarray(x))
    return model


def flax_to_torch_arrays(model) -> dict[str, np.ndarray]:
    """{torch key: numpy array in torch layout} for every Param of `model`."""
    out: dict[str, np.ndarray] = {}
    problems: list[str] = []
    prefixes = scan_prefixes(model)
    for path, var in param_leaves(model).items():
        x = to_numpy(var.get_value())
        _check_finite(flax_key(path), x, problems)
        for key, y in flax_leaf_to_torch(path, x, prefixes).items():
            if key in out:
                problems.append(f"duplicate: two flax leaves map to torch key {key}")
            out[key] = y
    if problems:
        raise ConversionError(problems)
    return out


def to_torch_state_dict(model) -> dict[str, Any]:
    """A torch state_dict (tensors) of `model`, loadable with strict=True into the torch twin."""
    return {k: to_torch(v) for k, v in flax_to_torch_arrays(model).items()}


def check_torch_load(module, state_dict: Mapping[str, Any]) -> None:
    """Load into a torch module strictly, reporting all problems in one ConversionError."""
    import torch
    own = module.state_dict()
    problems = [f"missing: {k}" for k in own if k not in state_dict]
    problems += [f"unexpected: {k}" for k in state_dict if k not in own]
    problems += [f"shape: {k} has shape {tuple(v.shape)}, expected {tuple(own[k].shape)}"
                 for k, v in state_dict.items() if k in own and tuple(v.shape) != tuple(own[k].shape)]
    if problems:
        raise ConversionError(problems)
    with torch.no_grad():
        module.load_state_dict({k: torch.as_tensor(v) for k, v in state_dict.items()}, strict=True)


# ----------------------------------------------------------------------------- files
def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0] if lines else type(e).__name__


def torch_load_weights_only(path: str) -> Any:
    """torch.load(weights_only=True) of a .pt/.bin file (docs/numerics.md §14): tensors and
    plain containers only. A pickle that would import or call anything else is refused, unrun,
    with a ConversionError naming the file and the refused global; so is a file torch cannot
    read. A missing or unreadable path is the OSError itself."""
    import pickle
    import warnings

    import torch
    try:
        with warnings.catch_warnings():  # its "Detected pickle protocol N" warning would print above our error
            warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
            try:
                return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as e:
                if "mmap" not in str(e):  # legacy (non-zip) files cannot be mmapped
                    raise
                return torch.load(path, map_location="cpu", weights_only=True)
    except OSError:
        raise
    except pickle.UnpicklingError as e:
        # torch's first line is a generic warning; the refused global is on a later line
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        reason = next((ln for ln in lines if "GLOBAL" in ln or "nsupported" in ln), _first_line(e))
        raise ConversionError([f"{path}: refused: not a plain tensor file (torch.load "
                               f"weights_only=True): {reason}"], header="") from None
    except Exception as e:  # a truncated zip, a file that is no torch checkpoint at all, ...
        raise ConversionError([f"{path}: not a readable torch checkpoint ({type(e).__name__}: "
                               f"{_first_line(e)})"], header="") from None


def read_weights(path: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """A weights file -> (tensors, metadata): .safetensors, else a torch .pt/.bin read with
    weights_only=True (a {"state_dict": {...}} wrapper is unwrapped). Every value must be a
    tensor. A directory is an error that says what file mode expects."""
    import os
    if os.path.isdir(path):
        raise ConversionError([f"{path} is a directory; file mode converts one .safetensors, "
                               ".pt or .bin file (a Hugging Face model directory: --from hf)"],
                              header="")
    if path.endswith(".safetensors"):
        return read_safetensors(path)
    sd = torch_load_weights_only(path)
    if isinstance(sd, dict) and isinstance(sd.get("state_dict"), dict):
        sd = sd["state_dict"]
    if not isinstance(sd, dict):
        raise ConversionError([f"{path} holds a {type(sd).__name__}, not a state_dict"], header="")
    bad = [k for k, v in sd.items() if not hasattr(v, "detach")]
    if bad:
        raise ConversionError([f"{path}: {k!r} is a {type(sd[k]).__name__}, not a tensor" for k in bad],
                              header="not a state_dict")
    return {str(k): to_numpy(v) for k, v in sd.items()}, {"format": "pt"}


def same_file(a: str, b: str) -> bool:
    """The same file or folder: the same path after symlinks, or (both existing) the same
    inode (a hard link)."""
    import os
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    return os.path.exists(a) and os.path.exists(b) and os.path.samefile(a, b)


def check_destination(src: str, dst: str, *, overwrite: bool = False) -> None:
    """File-mode output rules, checked before anything is read: the output is never the input
    (same_file), and an existing output is replaced only with `overwrite`."""
    import os
    if same_file(src, dst):
        raise ValueError(f"{dst} is the input file {src}; write the output to another path")
    if os.path.isdir(dst):
        raise IsADirectoryError(f"{dst} is a directory; file mode writes one .safetensors file")
    if os.path.lexists(dst) and not overwrite:
        raise FileExistsError(f"{dst} exists; choose another output or pass --overwrite")


def read_safetensors(path: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """-> (tensors, metadata). Raises ConversionError on a truncated or malformed file."""
    from safetensors import safe_open
    try:
        tensors = {}
        with safe_open(path, framework="numpy") as f:
            meta = f.metadata() or {}
            for k in f.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                tensors[k] = f.get_tensor(k)
    except FileNotFoundError:
        raise
    except Exception as e:  # safetensors raises its own error types for bad headers/sizes
        raise ConversionError([f"unreadable safetensors file {path}: {e}"]) from None
    return tensors, meta


def write_safetensors(path: str, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str]) -> None:
    from safetensors.numpy import save_file
    with atomic_file(path) as tmp:
        save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, tmp,
                  metadata=dict(metadata))


def model_metadata(name: str, cfg) -> dict[str, str]:
    from jaxformer.config import to_dict
    return {"jaxformer_model": name, "jaxformer_config": json.dumps(to_dict(cfg))}


def convert_file(src: str, dst: str, *, to: str, name: str | None = None, cfg=None,
                 overwrite: bool = False) -> dict:
    """Convert a weights file (safetensors; or a torch .pt/.bin read with weights_only=True)
    between torch layout (`to='torch'` target) and flax layout (`to='flax'` target), into a
    safetensors file. The model comes from `name`/`cfg` or the file's metadata. An existing
    `dst` is replaced only with `overwrite`, and never when it is `src`. Returns a small
    report. Writes nothing if anything is wrong."""
    from jaxformer.config import model_config_from_dict
    from jaxformer.models import abstract_model
    if to not in ("flax", "torch"):
        raise ValueError(f"--to must be flax or torch, got {to!r}")
    check_destination(src, dst, overwrite=overwrite)
    tensors, meta = read_weights(src)
    if cfg is None:
        if "jaxformer_config" not in meta or "jaxformer_model" not in meta:
            raise ConversionError([f"{src} carries no jaxformer_model/jaxformer_config metadata; "
                                   "pass --config"], header="")
        try:
            fields = json.loads(meta["jaxformer_config"])
        except json.JSONDecodeError as e:
            fields = e
        if not isinstance(fields, dict):
            raise ConversionError([f"{src}: metadata jaxformer_config is not a JSON object"], header="")
        name, cfg = model_config_from_dict({**fields, "name": meta["jaxformer_model"]})
    model = abstract_model(name, cfg)
    if to == "flax":
        arrays = torch_to_flax_arrays(tensors, model)
        out = {flax_key(p): x for p, x in arrays.items()}
        fmt = "flax"
    else:
        leaves = param_leaves(model)
        prefixes = scan_prefixes(model)
        by_key = {flax_key(p): p for p in leaves}
        problems = [f"unexpected: {k}" for k in tensors if k not in by_key]
        problems += [f"missing: {k}" for k in by_key if k not in tensors]
        for k, x in tensors.items():
            if k in by_key and tuple(x.shape) != tuple(leaves[by_key[k]].shape):
                problems.append(f"shape: {k} has shape {tuple(x.shape)}, expected {tuple(leaves[by_key[k]].shape)}")
            if k in by_key:
                _check_finite(k, x, problems)
        if problems:
            raise ConversionError(problems)
        out = {}
        for k, x in tensors.items():
            out.update(flax_leaf_to_torch(by_key[k], x, prefixes))
        fmt = "pt"
    write_safetensors(dst, out, {"format": fmt, **model_metadata(name, cfg)})
    return {"model": name, "tensors": len(out), "to": to, "dst": dst}
