"""The on-disk format of a tokenized text dataset (`jaxformer data prepare` writes it,
`data.name: tokens` trains from it).

    DIR/meta.json          what the directory holds (below); written last
    DIR/train-00000.npy    1-D uint16/uint32 token shards: documents back to back, each
    DIR/eval-00000.npy     followed by the eos id (a memory map reads them, no unpickling)
    DIR/tokenizer.json     the tokenizer the ids came from, when it is a `tokenizers` one
    DIR/train-00000.mask.npy   (version 2, "loss_mask": true) a uint8 loss mask per id, beside
                           its shard: 1 where the id counts as a target (the answers of
                           instruction/chat data, `data prepare --format chat`), 0 elsewhere

meta.json:

    {"format": "jaxformer.tokens", "version": 2, "dtype": "uint16", "vocab_size": 50257,
     "eos_id": 50256, "bos_id": null, "loss_mask": false,
     "tokenizer": {"spec": "gpt2/", "kind": "tokenizers", "file": "tokenizer.json", "sha256": "..."},
     "splits": {"train": {"tokens": N, "documents": D,
                          "shards": [{"file": "train-00000.npy", "tokens": n, "documents": d,
                                      "bytes": b, "sha256": "...",   # the .npy file's
                                      "mask": "train-00000.mask.npy",  # loss_mask only,
                                      "mask_bytes": b, "mask_sha256": "..."}]},  # with these
                "eval": {...}},
     "source": {...}}   # free-form: inputs, eval fraction, the command's options

Integrity. Each shard file's size and sha256 are in meta.json. The size is checked when the
directory opens; the hash, and that every id lies in [0, vocab_size), when a shard is first
read (once per shard and process: 0.12 s CPU for a full 128 MiB shard, which at open would be
seconds per GB of data each start). An altered shard is refused by name. Directories written
before the checksums existed still open, with a one-line warning that their shards cannot be
verified (the ids are still range-checked).

`TokensWriter` streams documents into shards of bounded size inside a temporary directory that
replaces DIR only when the whole dataset is written (jaxformer/fileio.py), so a failed prepare
leaves nothing behind. `TokensDir` opens and checks a directory: every error names the file.
Version 1 directories (no loss mask) read as version 2 ones with "loss_mask": false.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
from collections.abc import Iterable

import numpy as np

from jaxformer.config import ConfigError
from jaxformer.fileio import atomic_dir, inside, read_json, write_text

FORMAT, VERSION = "jaxformer.tokens", 2
READS = (1, 2)  # versions TokensDir opens
SPLITS = ("train", "eval")
SHARD_TOKENS = 1 << 26  # 64 Mi tokens per shard: 128 MiB as uint16, the writer's memory bound


def storage_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned dtype that holds every id of the vocab."""
    if vocab_size <= 0:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    if vocab_size <= 1 << 16:
        return np.dtype(np.uint16)
    if vocab_size <= 1 << 32:
        return np.dtype(np.uint32)
    raise ValueError(f"a vocab of {vocab_size} ids does not fit uint32 storage")


class TokensWriter:
    """Write a tokens directory, streaming:

        with TokensWriter(out, vocab_size=V, eos_id=E, tokenizer={...}) as w:
            for doc in docs: w.add("train", ids)    # loss_mask=True: w.add("train", ids, mask=m)
            w.files["tokenizer.json"] = path_of_a_file_to_copy   # optional extras
    On an exception nothing is written at `out`. `dtype` defaults to the smallest that fits."""

    def __init__(self, out: str, *, vocab_size: int, eos_id: int, tokenizer: dict,
                 bos_id: int | None = None, dtype: str | None = None, source: dict | None = None,
                 overwrite: bool = False, shard_tokens: int = SHARD_TOKENS, loss_mask: bool = False):
        need = storage_dtype(vocab_size)
        self.dtype = np.dtype(dtype) if dtype else need
        if self.dtype.kind != "u" or np.iinfo(self.dtype).max < vocab_size - 1:
            raise ValueError(f"dtype {self.dtype.name} cannot store ids up to {vocab_size - 1} "
                             f"(vocab {vocab_size}); use {need.name}")
        if not 0 <= eos_id < vocab_size:
            raise ValueError(f"eos id {eos_id} is outside the vocab [0, {vocab_size})")
        self.out, self.overwrite, self.shard_tokens = out, overwrite, shard_tokens
        self.meta = {"format": FORMAT, "version": VERSION, "dtype": self.dtype.name,
                     "vocab_size": int(vocab_size), "eos_id": int(eos_id),
                     "bos_id": None if bos_id is None else int(bos_id), "loss_mask": bool(loss_mask),
                     "tokenizer": tokenizer,
                     "splits": {s: {"tokens": 0, "documents": 0, "shards": []} for s in SPLITS},
                     "source": source or {}}
        self.files: dict[str, str] = {}  # extra files to copy in: name in DIR -> source path
        self._buf: dict[str, list[np.ndarray]] = {s: [] for s in SPLITS}
        self._mask: dict[str, list[np.ndarray]] = {s: [] for s in SPLITS}
        self._buf_tokens = {s: 0 for s in SPLITS}
        self._buf_docs = {s: 0 for s in SPLITS}
        self._eos = np.array([eos_id], self.dtype)

    def __enter__(self):
        self._ctx = atomic_dir(self.out, overwrite=self.overwrite)
        self.tmp = self._ctx.__enter__()
        return self

    def add(self, split: str, ids: Iterable[int] | np.ndarray, *, end: bool = True,
            mask: np.ndarray | None = None, end_mask: int = 0) -> None:
        """Append one document (its ids; the eos separator is added here). end=False appends
        a piece of a document whose remaining ids follow in the next calls (no eos yet).
        loss_mask writers take each id's `mask` (0/1) and the separator's `end_mask`."""
        ids = np.asarray(ids)
        if ids.size and (ids.min() < 0 or ids.max() >= self.meta["vocab_size"]):
            raise ValueError(f"token id {int(ids.max() if ids.max() >= 0 else ids.min())} is outside "
                             f"the vocab [0, {self.meta['vocab_size']})")
        if self.meta["loss_mask"]:
            if mask is None or np.shape(mask) != ids.shape:
                raise ValueError(f"a loss-mask dataset needs a mask of shape {ids.shape} per document, "
                                 f"got {None if mask is None else np.shape(mask)}")
            m = np.asarray(mask).astype(np.uint8)
            self._mask[split] += [m, np.array([end_mask], np.uint8)] if end else [m]
        elif mask is not None:
            raise ValueError("this tokens dataset has no loss mask (TokensWriter(loss_mask=True))")
        self._buf[split] += [ids.astype(self.dtype), self._eos] if end else [ids.astype(self.dtype)]
        self._buf_tokens[split] += ids.size + end
        self._buf_docs[split] += end
        if self._buf_tokens[split] >= self.shard_tokens:
            self._flush(split)

    def count(self, split: str) -> tuple[int, int]:
        """(tokens, documents) written to `split` so far."""
        s = self.meta["splits"][split]
        return s["tokens"] + self._buf_tokens[split], s["documents"] + self._buf_docs[split]

    def _flush(self, split: str) -> None:
        if not self._buf_tokens[split]:
            return
        s = self.meta["splits"][split]
        name = f"{split}-{len(s['shards']):05d}.npy"
        np.save(os.path.join(self.tmp, name), np.concatenate(self._buf[split]), allow_pickle=False)
        size, digest = file_digest(os.path.join(self.tmp, name))
        s["shards"].append({"file": name, "tokens": self._buf_tokens[split],
                            "documents": self._buf_docs[split], "bytes": size, "sha256": digest})
        if self.meta["loss_mask"]:
            s["shards"][-1]["mask"] = mask_name = name[:-len(".npy")] + ".mask.npy"
            mask = np.concatenate(self._mask[split])
            np.save(os.path.join(self.tmp, mask_name), mask, allow_pickle=False)
            size, digest = file_digest(os.path.join(self.tmp, mask_name))
            s["shards"][-1].update(mask_bytes=size, mask_sha256=digest)
            s["loss_tokens"] = s.get("loss_tokens", 0) + int(mask.sum())  # ids that count as targets
            self._mask[split] = []
        s["tokens"] += self._buf_tokens[split]
        s["documents"] += self._buf_docs[split]
        self._buf[split], self._buf_tokens[split], self._buf_docs[split] = [], 0, 0

    def __exit__(self, kind, value, tb):
        try:
            if kind is None:
                for split in SPLITS:
                    self._flush(split)
                import shutil
                for name, src in self.files.items():
                    shutil.copyfile(src, os.path.join(self.tmp, name))
                write_text(os.path.join(self.tmp, "meta.json"), json.dumps(self.meta, indent=1) + "\n")
        except BaseException as e:  # a failed last shard (a full disk): nothing at out, and raised
            if not self._ctx.__exit__(type(e), e, e.__traceback__):
                raise
            return False
        return self._ctx.__exit__(kind, value, tb)


def file_digest(path: str) -> tuple[int, str]:
    """(size in bytes, sha256 hex) of a file, read in 8 MiB pieces."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
        return f.tell(), h.hexdigest()


class TokenSplit:
    """One split's shards as memory maps, read as one long 1-D stream of ids. Each shard's size
    is checked here; its hash and id range on its first read (`_verify`; module docstring)."""

    def __init__(self, root: str, name: str, info: dict, dtype: np.dtype, loss_mask: bool = False,
                 vocab_size: int | None = None):
        self.name, self.root, self.vocab_size = name, root, vocab_size
        self.shards: list[np.ndarray] = []
        self.masks: list[np.ndarray] | None = [] if loss_mask else None  # uint8, one per shard
        self._checks: list[list[tuple]] = []  # per shard: (file, path, sha256 or None, kind) to verify
        for s in info["shards"]:
            arr, path = _open_shard(root, s["file"], s["tokens"], dtype, s.get("bytes"))
            self.shards.append(arr)
            checks = [(s["file"], path, s.get("sha256"), "ids")]
            if loss_mask:
                if "mask" not in s:
                    raise ConfigError(f"tokens dataset {root}: shard {s['file']} names no loss mask "
                                      "file, but meta.json says loss_mask: true")
                arr, path = _open_shard(root, s["mask"], s["tokens"], np.dtype(np.uint8), s.get("mask_bytes"))
                self.masks.append(arr)
                checks.append((s["mask"], path, s.get("mask_sha256"), "mask"))
            self._checks.append(checks)
        self._lock = threading.Lock()  # grain reads on several threads
        self.offsets = np.cumsum([0] + [len(a) for a in self.shards])
        self.num_tokens = int(self.offsets[-1])
        self.num_documents = int(info["documents"])

    def _verify(self, i: int) -> None:
        """Shard i's files against meta.json's sha256, and its ids in [0, vocab_size), before
        its first read; ConfigError naming the file. Once per shard (a failed one fails again)."""
        if not self._checks[i]:
            return
        with self._lock:
            for file, path, sha, kind in self._checks[i]:  # empty if another thread verified it
                if sha is not None and file_digest(path)[1] != sha:
                    raise ConfigError(f"tokens dataset {self.root}: shard {file} was altered (its sha256 "
                                      "differs from meta.json's); prepare the data again")
                arr = self.shards[i] if kind == "ids" else self.masks[i]
                if not arr.size:
                    continue
                top, limit = int(arr.max()), (self.vocab_size if kind == "ids" else 2)
                if limit is not None and top >= limit:
                    what = f"id {top}, outside the vocab [0, {limit}) of meta.json" if kind == "ids" else \
                        f"the value {top}; a loss mask holds 0 and 1"
                    raise ConfigError(f"tokens dataset {self.root}: shard {file} holds {what}")
            self._checks[i] = []

    def read(self, start: int, length: int) -> np.ndarray:
        """ids [start, start + length) of the stream, as int32, across shard boundaries."""
        return self._read(self.shards, start, length, np.int32)

    def read_mask(self, start: int, length: int) -> np.ndarray:
        """The loss mask of the same ids (uint8 0/1); the split must have one (`masks`)."""
        return self._read(self.masks, start, length, np.uint8)

    def _read(self, arrays: list[np.ndarray], start: int, length: int, dtype) -> np.ndarray:
        if start < 0 or start + length > self.num_tokens:
            raise IndexError(f"{self.name} split: tokens [{start}, {start + length}) outside "
                             f"[0, {self.num_tokens})")
        out = np.empty(length, dtype)
        i = int(np.searchsorted(self.offsets, start, side="right")) - 1
        filled = 0
        while filled < length:
            self._verify(i)
            lo = start + filled - self.offsets[i]
            take = min(length - filled, len(arrays[i]) - lo)
            out[filled:filled + take] = arrays[i][lo:lo + take]
            filled += take
            i += 1
        return out


def _open_shard(root: str, file: str, tokens: int, dtype: np.dtype,
                size: int | None) -> tuple[np.ndarray, str]:
    """One .npy shard as a memory map, checked against meta.json's length, dtype and size (in
    bytes, when meta.json has it). -> (the map, the file's resolved path)."""
    try:  # a name from meta.json: it must stay inside the tokens dir (links resolved)
        path = inside(root, file, source=os.path.join(root, "meta.json"), field="shard file")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if not os.path.isfile(path):
        raise ConfigError(f"tokens dataset {root}: shard {file} is missing")
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:  # truncated header or data
        raise ConfigError(f"tokens dataset {root}: shard {file} is unreadable or truncated ({e})") from None
    if arr.ndim != 1 or arr.dtype != dtype or len(arr) != tokens:
        raise ConfigError(f"tokens dataset {root}: shard {file} holds {arr.shape} "
                          f"{arr.dtype}, meta.json says ({tokens},) {dtype.name}")
    if size is not None and os.path.getsize(path) != size:  # bytes appended or changed in the header
        raise ConfigError(f"tokens dataset {root}: shard {file} is {os.path.getsize(path)} bytes, meta.json "
                          f"says {size}: it was altered; prepare the data again")
    return arr, path


def _check_meta(meta: dict, where: str) -> None:
    """meta.json's fields, typed, before any is used: ConfigError naming the file and the field."""
    def bad(field: str, want: str, value) -> ConfigError:
        return ConfigError(f"tokens dataset {where}: {field} must be {want}, got {value!r}"[:400])

    def count(v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    if not count(meta.get("vocab_size")) or meta["vocab_size"] == 0:
        raise bad("vocab_size", "a positive integer", meta.get("vocab_size"))
    if not count(meta.get("eos_id")) or meta["eos_id"] >= meta["vocab_size"]:
        raise bad("eos_id", f"an id in [0, {meta['vocab_size']})", meta.get("eos_id"))
    if meta.get("bos_id") is not None and (not count(meta["bos_id"]) or meta["bos_id"] >= meta["vocab_size"]):
        raise bad("bos_id", f"null or an id in [0, {meta['vocab_size']})", meta.get("bos_id"))
    if meta.get("dtype") not in ("uint16", "uint32"):
        raise bad("dtype", "uint16 or uint32", meta.get("dtype"))
    if not isinstance(meta.get("tokenizer"), dict):
        raise bad("tokenizer", "an object", meta.get("tokenizer"))
    splits = meta.get("splits")
    if not isinstance(splits, dict):
        raise bad("splits", "an object", splits)
    for name, info in splits.items():
        if not isinstance(info, dict) or not isinstance(info.get("shards"), list):
            raise bad(f"splits.{name}.shards", "a list", info.get("shards") if isinstance(info, dict) else info)
        if not count(info.get("documents")):
            raise bad(f"splits.{name}.documents", "a count", info.get("documents"))
        for i, s in enumerate(info["shards"]):
            if not isinstance(s, dict) or not isinstance(s.get("file"), str) or not count(s.get("tokens")):
                raise bad(f"splits.{name}.shards[{i}]", 'an object {"file": NAME, "tokens": N}', s)
            for key in ("bytes", "mask_bytes"):
                if key in s and not count(s[key]):
                    raise bad(f"splits.{name}.shards[{i}].{key}", "a count", s[key])
            for key in ("sha256", "mask_sha256"):
                if key in s and not (isinstance(s[key], str) and len(s[key]) == 64
                                     and all(c in "0123456789abcdef" for c in s[key])):
                    raise bad(f"splits.{name}.shards[{i}].{key}", "64 hex digits", s[key])
            if "mask" in s and not isinstance(s["mask"], str):
                raise bad(f"splits.{name}.shards[{i}].mask", "a file name", s["mask"])


_UNVERIFIED_WARNED: set[str] = set()


def _warn_unverified(meta: dict, where: str) -> None:
    """A directory written before shards had checksums: one line, once per directory and process."""
    shards = [s for info in meta["splits"].values() for s in info["shards"]]
    if any("sha256" not in s for s in shards) and where not in _UNVERIFIED_WARNED:
        _UNVERIFIED_WARNED.add(where)
        print(f"warning: tokens dataset {where}: meta.json holds no shard checksums (written by an older "
              "jaxformer); its shards cannot be checked for changes (prepare it again to add them)",
              file=sys.stderr)


class TokensDir:
    """A prepared tokens directory, checked on open: meta.json, then each split's shards."""

    def __init__(self, path: str):
        self.path = path
        meta_path = os.path.join(path, "meta.json")
        if not os.path.isdir(path):
            raise ConfigError(f"tokens dataset {path}: no such directory (make one with "
                              f"`jaxformer data prepare`)")
        if not os.path.isfile(meta_path):
            raise ConfigError(f"tokens dataset {path}: no meta.json; not a directory written by "
                              f"`jaxformer data prepare`, or an interrupted one")
        try:
            meta = read_json(meta_path, expect=dict)
        except OSError as e:
            raise ConfigError(f"tokens dataset {meta_path}: unreadable ({e})") from None
        except ValueError as e:
            raise ConfigError(f"tokens dataset {e}") from None
        if meta.get("format") != FORMAT or meta.get("version") not in READS:
            raise ConfigError(f"tokens dataset {meta_path}: format {meta.get('format')!r} version "
                              f"{meta.get('version')!r}; this jaxformer reads {FORMAT!r} versions "
                              f"{', '.join(map(str, READS))}")
        _check_meta(meta, meta_path)
        _warn_unverified(meta, os.path.abspath(path))
        self.meta = meta
        self.loss_mask = bool(meta.get("loss_mask", False))  # version 1: never
        self.vocab_size, self.eos_id = int(meta["vocab_size"]), int(meta["eos_id"])
        self.bos_id = meta.get("bos_id")
        self.tokenizer = meta["tokenizer"]
        self.dtype = np.dtype(meta["dtype"])
        self._splits: dict[str, TokenSplit] = {}

    def split(self, name: str) -> TokenSplit:
        if name not in self._splits:
            if name not in self.meta["splits"]:
                raise ConfigError(f"tokens dataset {self.path}: no {name!r} split")
            self._splits[name] = TokenSplit(self.path, name, self.meta["splits"][name], self.dtype,
                                            self.loss_mask, self.vocab_size)
        return self._splits[name]
