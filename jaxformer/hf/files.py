"""Safe reading of Hugging Face checkpoint directories (`HFCheckpoint`).

  * `config.json` is parsed as JSON: never executed, no `trust_remote_code`.
  * Weights: `model.safetensors.index.json` (sharded) > `model.safetensors` >
    `pytorch_model.bin.index.json` > `pytorch_model.bin`. Safetensors headers are read and
    validated up front (dtype, shape, offsets, file size), so a truncated or malformed shard,
    a shard missing from the index, or a tensor listed in the index but absent from its shard
    is an error before anything is written. Tensors are then read one at a time with plain
    file reads (no mmap, so file pages never count against the process's memory).
  * `.bin` files are read ONLY with `torch.load(weights_only=True)` (docs/numerics.md §14):
    a pickle that would run code is refused, and the code does not run.
  * Every file name a checkpoint gives (index weight_map entries) must stay inside the
    directory: no absolute path, no `..`, no symlink that resolves outside (the one exception:
    a Hugging Face hub cache snapshot, whose files link into the same repo's `blobs/`). All
    entries are checked before any shard is opened.
  * JSON is type-checked: config.json and the index are objects, weight_map maps str -> str,
    and safetensors headers hold dtype names, shapes of non-negative ints and in-range
    offsets; each message names the file and the key.
"""
from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from jaxformer.convert import ConversionError, to_numpy, torch_load_weights_only
from jaxformer.fileio import MAX_JSON_BYTES, json_loads

SAFE_INDEX, SAFE_FILE = "model.safetensors.index.json", "model.safetensors"
BIN_INDEX, BIN_FILE = "pytorch_model.bin.index.json", "pytorch_model.bin"

# safetensors dtype tags -> numpy dtypes (bfloat16 / float8 via ml_dtypes)
_ST_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
              "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
              "U16": "uint16", "U32": "uint32", "U64": "uint64", "BOOL": "bool",
              "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}


def np_dtype(name: str) -> np.dtype:
    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes
        return np.dtype(getattr(ml_dtypes, name))


# ----------------------------------------------------------------------------- safetensors
@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a checkpoint shard: enough to plan a conversion without reading data."""

    key: str
    shape: tuple
    dtype: np.dtype
    shard: str  # file name inside the checkpoint directory
    start: int = 0  # absolute byte offsets in a safetensors file
    end: int = 0


MAX_HEADER_BYTES = 100_000_000  # the safetensors library's own limit


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def read_safetensors_header(path: str) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """Parse and validate a safetensors header: -> ({key: TensorInfo}, metadata).

    Raises ConversionError for a truncated or malformed file: the header length must fit the
    file, every entry needs a known dtype, a shape of non-negative ints and two int offsets
    whose span is dtype x shape bytes, the offsets must tile the data buffer exactly, and the
    buffer must end where the file ends."""
    name = os.path.basename(path)
    size = os.path.getsize(path)

    def bad(msg: str):
        return ConversionError([f"truncated or malformed safetensors file {path}: {msg}"], header="")

    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise bad(f"{size} bytes, too short for a header")
        n = int.from_bytes(head, "little")
        if n <= 0 or 8 + n > size or n > MAX_HEADER_BYTES:
            raise bad(f"header length {n} does not fit in the file ({size} bytes)"
                      if n <= MAX_HEADER_BYTES else f"header length {n} exceeds {MAX_HEADER_BYTES}")
        try:  # depth-limited: a deeply nested header is refused, not a RecursionError
            header = json_loads(f.read(n), "header")
        except ValueError as e:
            raise bad(f"header is not JSON ({str(e).removeprefix('header: ')})") from None
    if not isinstance(header, dict):
        raise bad("header is not a JSON object")
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict):
        raise bad(f"__metadata__ is a {type(meta).__name__}, not an object of strings")
    base = 8 + n
    infos, spans = {}, []
    for key, entry in header.items():
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            raise bad(f"{key}: entry {entry!r} is not {{dtype, shape, data_offsets}}")
        if not isinstance(entry["dtype"], str) or entry["dtype"] not in _ST_DTYPES:
            raise bad(f"{key}: unknown dtype {entry['dtype']!r} (known: {sorted(_ST_DTYPES)})")
        shape, offsets = entry["shape"], entry["data_offsets"]
        if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
            raise bad(f"{key}: shape {shape!r} is not a list of non-negative integers")
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(map(_is_int, offsets))
                or not 0 <= offsets[0] <= offsets[1] <= size - base):
            raise bad(f"{key}: data_offsets {offsets!r} are not [begin, end] within the "
                      f"{size - base}-byte data buffer")
        dtype, shape = np_dtype(_ST_DTYPES[entry["dtype"]]), tuple(shape)
        begin, end = offsets
        if end - begin != math.prod(shape) * dtype.itemsize:
            raise bad(f"{key}: {end - begin} bytes for shape {shape} {dtype}")
        infos[key] = TensorInfo(key, shape, dtype, name, base + begin, base + end)
        spans.append((begin, end))
    spans.sort()
    pos = 0
    for begin, end in spans:
        if begin != pos:
            raise bad(f"tensor data is not contiguous at byte {base + pos}")
        pos = end
    if base + pos != size:
        raise bad(f"the header describes {base + pos} bytes of data but the file has {size}"
                  + (" (truncated)" if base + pos > size else ""))
    return infos, {str(k): str(v) for k, v in meta.items()}


def read_tensor(path: str, info: TensorInfo) -> np.ndarray:
    """One tensor, read with a plain file read into a fresh array (no mmap)."""
    out = np.empty(info.shape, info.dtype)
    with open(path, "rb") as f:
        f.seek(info.start)
        got = f.readinto(memoryview(out.reshape(-1).view(np.uint8)))
    if got != info.end - info.start:
        raise ConversionError([f"truncated safetensors file {path}: {info.key} ends early"])
    return out


# ----------------------------------------------------------------------------- torch .bin
def torch_load_safely(path: str) -> dict[str, Any]:
    """torch.load(weights_only=True) (jaxformer.convert.torch_load_weights_only) of a state
    dict: a dict of tensors. A pickle that would import or call code is refused, unrun."""
    import torch
    sd = torch_load_weights_only(path)
    if not isinstance(sd, dict):
        raise ConversionError([f"{path} holds a {type(sd).__name__}, not a state_dict"], header="")
    bad = [k for k, v in sd.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise ConversionError([f"{path}: {k} is not a tensor" for k in bad], header="not a state_dict")
    return sd


# ----------------------------------------------------------------------------- JSON and paths
def read_json_object(path: str, what: str) -> dict:
    """A JSON file that must hold an object; ConversionError naming the file otherwise."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > MAX_JSON_BYTES:
            raise ConversionError([f"{path} ({what}): {size} bytes; at most {MAX_JSON_BYTES} are read"], header="")
        raw = f.read()
    try:  # size- and depth-limited (jaxformer/fileio.py)
        data = json_loads(raw, path)
    except ValueError as e:
        raise ConversionError([f"{e} ({what})"], header="") from None
    if not isinstance(data, dict):
        raise ConversionError([f"{path}: {what} must be a JSON object, not a {type(data).__name__}"],
                              header="")
    return data


def _hub_blobs(root: str) -> str | None:
    """`.../models--org--name/blobs` when `root` is a hub cache snapshot
    (`.../models--org--name/snapshots/<revision>`), whose files are links into it."""
    snapshots = os.path.dirname(root)
    if os.path.basename(snapshots) == "snapshots":
        blobs = os.path.join(os.path.dirname(snapshots), "blobs")
        return blobs if os.path.isdir(blobs) else None
    return None


def _within(path: str, root: str) -> bool:
    return os.path.commonpath([path, root]) == root


def outside_problem(root: str, name: Any, source: str) -> str | None:
    """Why checkpoint file `name` (as `source` gives it) may not be opened, or None: it must
    be a relative path that stays inside `root` after resolving symlinks."""
    if not isinstance(name, str) or not name:
        return f"{source}: file name {name!r} is not a non-empty string"
    if os.path.isabs(name) or name.startswith("~"):
        return f"{source}: {name!r} is an absolute path; checkpoint files must be inside {root}"
    if ".." in name.replace("\\", "/").split("/"):
        return f"{source}: {name!r} leaves the checkpoint directory {root} ('..')"
    real_root = os.path.realpath(root)
    real = os.path.realpath(os.path.join(root, name))
    blobs = _hub_blobs(real_root)
    if not _within(real, real_root) and not (blobs and _within(real, os.path.realpath(blobs))):
        return f"{source}: {name!r} resolves to {real}, outside the checkpoint directory {root} (symlink)"
    return None


# ----------------------------------------------------------------------------- directories
class HFCheckpoint:
    """A Hugging Face model directory: its config and its weight shards, validated.

    Attributes: config (the config.json dict), shards ([file name], in index order),
    tensors ({key: TensorInfo}), format ("safetensors" | "bin")."""

    def __init__(self, path: str):
        self.path = os.path.abspath(path)
        if not os.path.isdir(self.path):
            raise FileNotFoundError(f"{path} is not a directory (expected a Hugging Face model dir)")
        cfg_path = os.path.join(self.path, "config.json")
        if not os.path.lexists(cfg_path):
            raise ConversionError([f"{path} has no config.json; not a Hugging Face model directory"],
                                  header="")
        self.config = read_json_object(self._file("config.json"), "config.json")
        self.shards, self.tensors, self.format = self._find_weights()
        self._bin_cache: tuple[str, dict] | None = None

    def _file(self, name: str, source: str = "checkpoint") -> str:
        """The path of a file of the checkpoint, refused (ConversionError) when it would be
        outside the directory."""
        why = outside_problem(self.path, name, source)
        if why:
            raise ConversionError([why], header="")
        return os.path.join(self.path, name)

    def _find_weights(self):
        has = lambda n: os.path.lexists(os.path.join(self.path, n))
        if has(SAFE_INDEX):
            return self._from_index(SAFE_INDEX, "safetensors")
        if has(SAFE_FILE):
            infos, _ = read_safetensors_header(self._file(SAFE_FILE))
            return [SAFE_FILE], infos, "safetensors"
        if has(BIN_INDEX):
            return self._from_index(BIN_INDEX, "bin")
        if has(BIN_FILE):
            sd = torch_load_safely(self._file(BIN_FILE))
            return [BIN_FILE], self._bin_infos(BIN_FILE, sd), "bin"
        raise ConversionError([f"{self.path} has no weights: expected {SAFE_FILE}, {SAFE_INDEX}, "
                               f"{BIN_FILE} or {BIN_INDEX}"])

    def _from_index(self, index_name: str, fmt: str):
        index_path = self._file(index_name)
        weight_map = read_json_object(index_path, "a weight index").get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise ConversionError([f"{index_path}: weight_map must be an object of tensor name -> "
                                   f"shard file name, not {type(weight_map).__name__}"], header="")
        shards = list(dict.fromkeys(weight_map.values()))
        # every name is checked before any shard is opened
        problems = [p for s in shards if (p := outside_problem(
            self.path, s, f"{index_path} weight_map[{next(k for k, v in weight_map.items() if v == s)!r}]"))]
        if problems:
            raise ConversionError(problems, header="unsafe checkpoint index")
        problems = [f"missing shard: {s} (listed in {index_name}) does not exist"
                    for s in shards if not os.path.isfile(self._file(s))]
        if problems:
            raise ConversionError(problems)
        tensors: dict[str, TensorInfo] = {}
        for s in shards:
            if fmt == "safetensors":
                infos, _ = read_safetensors_header(self._file(s))
            else:
                infos = self._bin_infos(s, torch_load_safely(self._file(s)))
            for k, info in infos.items():
                if weight_map.get(k) != s:
                    problems.append(f"index mismatch: {k} is in {s} but {index_name} maps it to "
                                    f"{weight_map.get(k)}")
                tensors[k] = info
        problems += [f"missing tensor: {k} (listed in {index_name} for {s}) is not in the shard"
                     for k, s in weight_map.items() if k not in tensors]
        if problems:
            raise ConversionError(problems)
        return shards, tensors, fmt

    @staticmethod
    def _bin_infos(shard: str, sd: Mapping[str, Any]) -> dict[str, TensorInfo]:
        import torch
        dtype = lambda t: to_numpy(torch.empty(0, dtype=t)).dtype
        return {k: TensorInfo(k, tuple(v.shape), dtype(v.dtype), shard) for k, v in sd.items()}

    def shard_keys(self, shard: str) -> list[str]:
        return [k for k, info in self.tensors.items() if info.shard == shard]

    def read(self, key: str) -> np.ndarray:
        """One tensor as numpy (its own dtype)."""
        info = self.tensors[key]
        if self.format == "safetensors":
            return read_tensor(self._file(info.shard), info)
        if self._bin_cache is None or self._bin_cache[0] != info.shard:
            self._bin_cache = None  # drop the previous shard before loading the next
            self._bin_cache = (info.shard, torch_load_safely(self._file(info.shard)))
        return to_numpy(self._bin_cache[1][key])

    def release(self) -> None:
        self._bin_cache = None

    @property
    def nbytes(self) -> int:
        return sum(math.prod(i.shape) * i.dtype.itemsize for i in self.tensors.values())
