"""The shard-by-shard conversion engine behind `jaxformer.hf`: an `HFCheckpoint`
(jaxformer.hf.files) in, a built model or an orbax checkpoint out.

HF tensor -> torch_ref key(s) and layout (the family's `tensor_fn`) -> flax layout by
jaxformer.convert's rule table -> a sink. Before any data is read, the whole plan is checked
against the abstract model from shard headers alone, with jaxformer.convert's own per-tensor
check (`check_tensor`: non-float and precision-losing dtypes, shapes) plus missing,
unexpected and duplicate keys, all listed in one ConversionError; non-finite values are
checked (the same function) as each tensor is read. The data then flows shard by shard: one
input tensor at a time, and converted arrays are handed to the sink in batches of at most
`flush_bytes` (a single larger tensor is a batch of its own). Peak memory above the runtime
is therefore about one batch or twice the largest tensor (read + re-laid-out copy), whatever
the model's size (bench/hf_streaming.py measures it).

A param may also come in axis-0 slices (one HF tensor per expert of a stacked [E, ...] expert
weight, common.expert_slice): the plan checks that each slice comes exactly once with the
slice's shape, and the slices of one param are read one after another into one buffer, so
at most one such param is being assembled at a time (plus any a shard boundary splits).

Sinks: `ModelSink` sets the values into a built nnx model; `ParamsWriter` writes an orbax
checkpoint incrementally (orbax partial saves, one per batch) that
`jaxformer.checkpoint_io.load_params_into` restores like one written by `save_model`.
"""
from __future__ import annotations

import contextlib
import math
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from jaxformer.convert import (
    ConversionError,
    check_tensor,
    flax_key,
    param_leaves,
    scan_prefixes,
    stacked_prefix,
    to_numpy,
    torch_keys_for,
    torch_shape_of,
    torch_to_flax_layout,
)
from jaxformer.hf.common import MappingError, expert_slice, split_slice
from jaxformer.hf.files import HFCheckpoint


def fake_array(shape: tuple, dtype) -> np.ndarray:
    """A zero-stride array of any shape: planning runs the families' (view-only) transforms
    on these to learn each output's shape and dtype without allocating."""
    return np.broadcast_to(np.zeros((), dtype), shape)


# ----------------------------------------------------------------------------- conversion
TensorFn = Callable[[str, np.ndarray], "dict[str, np.ndarray] | None"]


def convert_stream(ckpt: HFCheckpoint, tensor_from_hf: TensorFn, model, sink=None, *,
                   flush_bytes: int = 256 << 20, allow_downcast: bool = False,
                   check_only: bool = False) -> dict:
    """Convert every tensor of `ckpt` into `model`'s params (model may be abstract) and hand
    them to `sink.write({flax path tuple: array})` in batches. `tensor_from_hf(key, x)` returns
    {torch_ref key: array in torch layout} (or None to skip a known non-parameter buffer); it
    must only slice/transpose/reshape, so it also runs on fake_array inputs for planning. A
    key common.expert_slice(torch key, e) is slice e of axis 0 of that param (one expert of a
    stacked [E, ...] weight): every slice must come exactly once, and never with the whole key.
    Returns a report {tensors, params, skipped, bytes_in}. check_only: stop after the plan
    (no data is read)."""
    leaves = param_leaves(model)
    plan = _plan(ckpt, tensor_from_hf, _targets(leaves, scan_prefixes(model)), allow_downcast)
    if check_only:
        return {"tensors": len(ckpt.tensors), "params": len(plan.produced) + len(plan.sliced),
                "skipped": sorted(plan.skipped), "bytes_in": 0}
    return _stream(ckpt, tensor_from_hf, plan, leaves, sink, flush_bytes, allow_downcast)


def _targets(leaves: Mapping[tuple, Any], prefixes) -> dict[str, tuple]:
    """torch key -> (flax path, stack index or None, torch shape, dtype) of every param."""
    targets = {}
    for path, var in leaves.items():
        stacked = stacked_prefix(path, prefixes) is not None
        want = torch_shape_of(path, tuple(var.shape), prefixes)
        for i, tk in enumerate(torch_keys_for(path, tuple(var.shape), prefixes)):
            targets[tk] = (path, i if stacked else None, want, np.dtype(var.dtype))
    return targets


@dataclass
class _Plan:
    """What the headers say, before any data is read (_plan)."""

    targets: dict[str, tuple]  # torch key -> (flax path, stack index or None, torch shape, dtype)
    produced: dict[str, str] = field(default_factory=dict)  # whole torch key -> its HF key
    sliced: dict[str, dict[int, str]] = field(default_factory=dict)  # torch key in axis-0 slices -> {slice: HF key}
    slice_base: dict[str, str] = field(default_factory=dict)  # HF key -> the sliced torch key it feeds (read order)
    skipped: set[str] = field(default_factory=set)
    out_bytes: dict[str, int] = field(default_factory=dict)  # HF key -> bytes it adds to a batch (a slice: its param)


def _plan(ckpt: HFCheckpoint, tensor_from_hf: TensorFn, targets: dict[str, tuple], allow_downcast: bool) -> _Plan:
    """Map every tensor from its header only (fake arrays): every problem of the whole
    checkpoint in one ConversionError."""
    plan, problems = _Plan(targets), []
    for key, info in ckpt.tensors.items():
        try:
            out = tensor_from_hf(key, fake_array(info.shape, info.dtype))
        except MappingError as e:
            problems.append(str(e))
            continue
        if out is None:
            plan.skipped.add(key)
            continue
        for tk, y in out.items():
            problems += _plan_tensor(plan, key, tk, y, allow_downcast)
    for base, parts in plan.sliced.items():
        if base in plan.produced:
            problems.append(f"duplicate: {base} comes whole from HF {plan.produced[base]} and in slices "
                            f"from HF {parts[min(parts)]}, ...")
            continue
        n = targets[base][2][0]
        for e in range(n):
            if e not in parts:
                problems.append(f"missing: {expert_slice(base, e)} (slice {e} of {n}, shape "
                                f"{targets[base][2][1:]}{_sibling_hint(parts, e)})")
    for tk, (path, _, want, _) in targets.items():
        if tk not in plan.produced and tk not in plan.sliced:
            problems.append(f"missing: {tk} (flax {flax_key(path)}, shape {want})")
    if problems:
        raise ConversionError(sorted(problems, key=lambda p: p.split(":")[0]))
    return plan


def _plan_tensor(plan: _Plan, key: str, tk: str, y, allow_downcast: bool) -> list[str]:
    """Record that HF `key` gives torch key `tk` (whole, or one axis-0 slice); its problems."""
    targets = plan.targets
    base, e = split_slice(tk)
    if base not in targets or (e is not None and not (targets[base][2] and e < targets[base][2][0])):
        why = "" if base not in targets else f"; {base} has {targets[base][2][:1]} slices"
        return [f"unexpected: {tk} (from HF {key}, shape {tuple(y.shape)}{why})"]
    path, _, want, dtype = targets[base]
    if e is None:
        if tk in plan.produced:
            return [f"duplicate: {tk} comes from both HF {plan.produced[tk]} and {key}"]
        plan.produced[tk] = key
    else:
        if e in plan.sliced.get(base, {}):
            return [f"duplicate: {tk} comes from both HF {plan.sliced[base][e]} and {key}"]
        plan.sliced.setdefault(base, {})[e] = key
        plan.slice_base.setdefault(key, base)
        want = want[1:]
    plan.out_bytes[key] = plan.out_bytes.get(key, 0) + math.prod(targets[base][2]) * dtype.itemsize
    return check_tensor(f"{tk} (from HF {key})", y, want, dtype, allow_downcast=allow_downcast, values=False)


def _stream(ckpt: HFCheckpoint, tensor_from_hf: TensorFn, plan: _Plan, leaves, sink, flush_bytes: int,
            allow_downcast: bool) -> dict:
    """Convert, shard by shard, one tensor at a time, handing batches of at most flush_bytes to
    the sink; a param given in slices is assembled in one buffer of its final dtype, its slices
    read one after another (_read_order), a scanned stack's layers into one [L, ...] array."""
    stacks: dict[tuple, dict[int, np.ndarray]] = {}
    pending: dict[str, tuple[np.ndarray, set]] = {}  # sliced torch key -> (buffer, slices in)
    batch: dict[tuple, np.ndarray] = {}
    batch_bytes = bytes_in = n_params = 0
    problems: list[str] = []
    for shard in ckpt.shards:
        for key in _read_order(ckpt.shard_keys(shard), plan.slice_base):
            if key in plan.skipped:
                continue
            if batch and batch_bytes + plan.out_bytes.get(key, 0) > flush_bytes:
                sink.write(batch)  # hand over what we have before the next tensor would overflow
                batch, batch_bytes = {}, 0
            x = ckpt.read(key)
            bytes_in += x.nbytes
            for tk, y in tensor_from_hf(key, x).items():
                base, e = split_slice(tk)
                path, idx, want, dtype = plan.targets[base]
                y = to_numpy(y)
                problems += check_tensor(f"{tk} (from HF {key})", y, want if e is None else want[1:], dtype,
                                         allow_downcast=allow_downcast)  # planned: only values left
                if e is not None:  # one slice (expert) of a stacked param
                    buf, have = pending.setdefault(base, (np.empty(want, dtype), set()))
                    buf[e] = y.astype(dtype, copy=False)
                    have.add(e)
                    if len(have) < want[0]:
                        continue
                    del pending[base]
                    y = buf
                y = torch_to_flax_layout(str(path[-1]), y).astype(dtype, copy=False)
                if idx is not None:  # a scanned stack: complete once every layer arrived
                    parts = stacks.setdefault(path, {})
                    parts[idx] = y
                    if len(parts) < leaves[path].shape[0]:
                        continue
                    y = np.stack([parts[i] for i in range(len(parts))])
                    del stacks[path]
                if not y.flags.owndata:
                    y = y.copy()  # never keep a view that pins a whole input tensor
                batch[path] = y
                batch_bytes += y.nbytes
                n_params += 1
            del x
        ckpt.release()
    if batch:
        sink.write(batch)
    if problems:
        raise ConversionError(problems)
    return {"tensors": len(ckpt.tensors), "params": n_params, "skipped": sorted(plan.skipped),
            "bytes_in": bytes_in}


def _read_order(keys: list[str], slice_base: Mapping[str, str]) -> list[str]:
    """A shard's keys with the slices of one param next to each other (at its first slice's
    place), so only one sliced param is assembled at a time: published MoE shards list
    experts.0.w1, experts.0.w2, experts.0.w3, experts.1.w1, ... (three params interleaved)."""
    first: dict[str, int] = {}
    for i, k in enumerate(keys):
        if k in slice_base:
            first.setdefault(slice_base[k], i)
    order = sorted(enumerate(keys), key=lambda ik: first[slice_base[ik[1]]] if ik[1] in slice_base else ik[0])
    return [k for _, k in order]


def _sibling_hint(parts: Mapping[int, str], e: int) -> str:
    """", expected from HF <key>": a present slice's HF key with its slice index replaced by e
    (experts.2.w1 -> experts.3.w1). The index is the dotted part where two present slices'
    keys differ, else the last part that equals the slice's index."""
    (a, key_a), *rest = sorted(parts.items())
    words = key_a.split(".")
    if rest:
        other = rest[0][1].split(".")
        where = [j for j, w in enumerate(words) if len(other) == len(words) and other[j] != w]
    else:
        where = [j for j, w in enumerate(words) if w == str(a)][-1:]
    if len(where) != 1 or words[where[0]] != str(a):
        return ""
    words[where[0]] = str(e)
    return f", expected from HF {'.'.join(words)}"


# ----------------------------------------------------------------------------- sinks
class ModelSink:
    """Sets converted arrays into a built (concrete) nnx model."""

    def __init__(self, model):
        self.leaves = param_leaves(model)

    def write(self, batch: Mapping[tuple, np.ndarray]) -> None:
        import jax.numpy as jnp
        for path, x in batch.items():
            self.leaves[path].set_value(jnp.asarray(x))


def nest(batch: Mapping[tuple, Any]) -> dict:
    """{(a, b, 0, c): x} -> {a: {b: {0: {c: x}}}}: the pure-dict layout of nnx.to_pure_dict."""
    out: dict = {}
    for path, x in batch.items():
        node = out
        for p in path[:-1]:
            node = node.setdefault(p, {})
        node[path[-1]] = x
    return out


class ParamsWriter:
    """Writes `directory/params` (the orbax layout of checkpoint_io.save_model) incrementally:
    one orbax partial save per batch, so only one batch is ever in memory. `close()` finalizes
    it; nothing is readable at `directory/params` before that."""

    def __init__(self, directory: str):
        self.directory = os.path.abspath(directory)
        self.staging = os.path.join(self.directory, "params-partial")  # orbax globs it: no leading dot
        self.batches = 0
        self.options: dict = {}  # extra orbax v1 context options, dotted names

    def write(self, batch: Mapping[tuple, np.ndarray]) -> None:
        from orbax.checkpoint.experimental import v1
        from orbax.checkpoint.experimental.v1 import partial
        if not batch:
            return
        # the batch is ours and the save is synchronous: orbax need not deep-copy host arrays
        # (its default), which would double the memory of every batch
        ctx = v1.Context()
        ctx.memory.deepcopy_host_arrays = False
        for path, value in self.options.items():  # e.g. {"array.saving.use_compression": False}
            node = ctx
            for part in path.split(".")[:-1]:
                node = getattr(node, part)
            setattr(node, path.rsplit(".", 1)[-1], value)
        with ctx:
            partial.save(self.staging, nest(batch))
        self.batches += 1
        release_free_memory()

    def close(self) -> None:
        from orbax.checkpoint.experimental.v1 import partial
        partial.finalize(self.staging)
        # the finalized checkpoint keeps the pytree under "state/", a complete orbax pytree
        # checkpoint (metadata, manifest and data) that StandardCheckpointer restores
        os.replace(os.path.join(self.staging, "state"), os.path.join(self.directory, "params"))
        shutil.rmtree(self.staging)


def release_free_memory() -> None:
    """Return freed heap memory to the OS (glibc malloc_trim). tensorstore's worker threads
    allocate from their own malloc arenas, which otherwise keep freed chunk buffers and let
    the resident set creep up batch after batch. A no-op elsewhere."""
    import ctypes
    import ctypes.util
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
