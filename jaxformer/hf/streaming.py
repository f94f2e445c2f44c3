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

Sinks: `ModelSink` sets the values into a built nnx model; `ParamsWriter` writes an orbax
checkpoint incrementally (orbax partial saves, one per batch) that
`jaxformer.checkpoint_io.load_params_into` restores like one written by `save_model`.
"""
from __future__ import annotations

import math
import os
import shutil
from typing import Any, Callable, Mapping

import numpy as np

from jaxformer.convert import (ConversionError, check_tensor, flax_key, param_leaves, scan_prefixes,
                               stacked_prefix, to_numpy, torch_keys_for, torch_shape_of,
                               torch_to_flax_layout)
from jaxformer.hf.common import MappingError
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
    must only slice/transpose/reshape, so it also runs on fake_array inputs for planning.
    Returns a report {tensors, params, skipped, bytes_in}. check_only: stop after the plan
    (no data is read)."""
    leaves = param_leaves(model)
    prefixes = scan_prefixes(model)
    targets: dict[str, tuple] = {}  # torch key -> (flax path, stack index or None, torch shape, dtype)
    for path, var in leaves.items():
        stacked = stacked_prefix(path, prefixes) is not None
        want = torch_shape_of(path, tuple(var.shape), prefixes)
        for i, tk in enumerate(torch_keys_for(path, tuple(var.shape), prefixes)):
            targets[tk] = (path, i if stacked else None, want, np.dtype(var.dtype))

    # 1) plan from headers only: every problem of the whole checkpoint in one error
    problems: list[str] = []
    produced: dict[str, str] = {}
    skipped: set[str] = set()
    out_bytes: dict[str, int] = {}  # HF key -> bytes of its converted arrays (batch budget)
    for key, info in ckpt.tensors.items():
        try:
            out = tensor_from_hf(key, fake_array(info.shape, info.dtype))
        except MappingError as e:
            problems.append(str(e))
            continue
        if out is None:
            skipped.add(key)
            continue
        for tk, y in out.items():
            if tk not in targets:
                problems.append(f"unexpected: {tk} (from HF {key}, shape {tuple(y.shape)})")
                continue
            if tk in produced:
                problems.append(f"duplicate: {tk} comes from both HF {produced[tk]} and {key}")
                continue
            produced[tk] = key
            path, _, want, dtype = targets[tk]
            out_bytes[key] = out_bytes.get(key, 0) + math.prod(want) * dtype.itemsize
            problems += check_tensor(f"{tk} (from HF {key})", y, want, dtype,
                                     allow_downcast=allow_downcast, values=False)
    for tk, (path, _, want, _) in targets.items():
        if tk not in produced:
            problems.append(f"missing: {tk} (flax {flax_key(path)}, shape {want})")
    if problems:
        raise ConversionError(sorted(problems, key=lambda p: p.split(":")[0]))
    if check_only:
        return {"tensors": len(ckpt.tensors), "params": len(produced), "skipped": sorted(skipped),
                "bytes_in": 0}

    # 2) convert, shard by shard, one tensor at a time
    stacks: dict[tuple, dict[int, np.ndarray]] = {}
    batch: dict[tuple, np.ndarray] = {}
    batch_bytes = bytes_in = n_params = 0
    for shard in ckpt.shards:
        for key in ckpt.shard_keys(shard):
            if key in skipped:
                continue
            if batch and batch_bytes + out_bytes.get(key, 0) > flush_bytes:
                sink.write(batch)  # hand over what we have before the next tensor would overflow
                batch, batch_bytes = {}, 0
            x = ckpt.read(key)
            bytes_in += x.nbytes
            for tk, y in tensor_from_hf(key, x).items():
                path, idx, want, dtype = targets[tk]
                y = to_numpy(y)
                problems += check_tensor(f"{tk} (from HF {key})", y, want, dtype,
                                         allow_downcast=allow_downcast)  # planned: only values left
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
    return {"tensors": len(ckpt.tensors), "params": n_params, "skipped": sorted(skipped),
            "bytes_in": bytes_in}


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
    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
