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
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from jaxformer.convert import ConversionError, to_numpy

SAFE_INDEX, SAFE_FILE = "model.safetensors.index.json", "model.safetensors"
BIN_INDEX, BIN_FILE = "pytorch_model.bin.index.json", "pytorch_model.bin"

# safetensors dtype tags -> numpy dtypes (bfloat16 / float8 via ml_dtypes)
_ST_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
              "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
              "U16": "uint16", "U32": "uint32", "U64": "uint64", "BOOL": "bool",
              "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}


def _np_dtype(name: str) -> np.dtype:
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


def read_safetensors_header(path: str) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """Parse and validate a safetensors header: -> ({key: TensorInfo}, metadata).

    Raises ConversionError for a truncated or malformed file (the header's offsets must tile
    the data buffer exactly, and the buffer must end where the file ends)."""
    name = os.path.basename(path)
    size = os.path.getsize(path)

    def bad(msg: str):
        return ConversionError([f"truncated or malformed safetensors file {path}: {msg}"])

    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise bad(f"{size} bytes, too short for a header")
        n = int.from_bytes(head, "little")
        if n <= 0 or 8 + n > size:
            raise bad(f"header length {n} does not fit in the file ({size} bytes)")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise bad(f"header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise bad("header is not a JSON object")
    meta = header.pop("__metadata__", None) or {}
    base = 8 + n
    infos, spans = {}, []
    for key, entry in header.items():
        try:
            dtype = _np_dtype(_ST_DTYPES[entry["dtype"]])
            shape = tuple(int(s) for s in entry["shape"])
            begin, end = (int(o) for o in entry["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise bad(f"bad header entry for {key!r}: {entry!r}") from None
        if end - begin != math.prod(shape) * dtype.itemsize or begin < 0:
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
    """torch.load(weights_only=True): tensors and plain containers only. Anything else (a
    pickle that would import or call code) is refused with a ConversionError, unrun."""
    import torch
    try:
        try:
            sd = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as e:
            if "mmap" not in str(e):  # legacy (non-zip) files cannot be mmapped
                raise
            sd = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as e:  # UnpicklingError, RuntimeError for a truncated zip, ...
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConversionError([f"refused to load {path}: torch.load(weights_only=True) rejected it "
                               f"({type(e).__name__}: {msg}); jaxformer never unpickles "
                               "arbitrary objects"]) from None
    if not isinstance(sd, dict):
        raise ConversionError([f"{path} holds a {type(sd).__name__}, not a state_dict"])
    bad = [k for k, v in sd.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise ConversionError([f"{path}: {k} is not a tensor" for k in bad])
    return sd


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
        if not os.path.exists(cfg_path):
            raise ConversionError([f"{path} has no config.json; not a Hugging Face model directory"])
        with open(cfg_path) as f:
            try:
                self.config = json.load(f)
            except json.JSONDecodeError as e:
                raise ConversionError([f"{cfg_path} is not valid JSON: {e}"]) from None
        self.shards, self.tensors, self.format = self._find_weights()
        self._bin_cache: tuple[str, dict] | None = None

    def _file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def _find_weights(self):
        has = lambda n: os.path.exists(self._file(n))  # noqa: E731
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
        with open(self._file(index_name)) as f:
            try:
                weight_map = json.load(f)["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise ConversionError([f"{index_name}: not a valid index ({e})"]) from None
        shards = list(dict.fromkeys(weight_map.values()))
        problems = [f"missing shard: {s} (listed in {index_name}) does not exist"
                    for s in shards if not os.path.exists(self._file(s))]
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
        dtype = lambda t: to_numpy(torch.empty(0, dtype=t)).dtype  # noqa: E731
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

    def shard_nbytes(self, shard: str) -> int:
        return sum(math.prod(i.shape) * i.dtype.itemsize for i in self.tensors.values() if i.shard == shard)
