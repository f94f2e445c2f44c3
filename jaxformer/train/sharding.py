"""Mesh sharding for `parallel.mode: mesh`: data, FSDP, expert, context and tensor parallelism on
one `jax.sharding.Mesh` with axes ("data", "fsdp", "expert", "context", "tensor"), driven by
`jax.jit` + NamedSharding and XLA's SPMD partitioner; the hand-written exchanges are the MoE
dispatch and ring attention.

Context parallelism: the sequence is split over `context`. Parameters and the batch are
replicated over it (the batch arrays [A, micro, T + 1] are split over the batch axes only); the
LM permutes its sequence into the zigzag layout, and its activations are constrained to the
sequence split over `context` between layers (jaxformer/layers/kernels/ring.py shard_sequence), where
self-attention runs as ring attention (a shard_map passing key/value blocks around `context`).
Parameter gradients are summed over `context` by XLA like over the data axes.

Expert parallelism: the stacked expert weights are split over `expert`, and the batch over
data x fsdp x expert. Under the trainer's mesh (jax.set_mesh) each MoE layer runs its routing
and dispatch in a jax.shard_map (jaxformer/layers/kernels/moe_parallel.py): every device routes its
own tokens, all_to_all over `expert` sends each assignment to the device holding its expert,
that device runs its experts (ragged_dot), and the reverse all_to_all brings the rows back.
Compiled train step of the tiny MoE LM on data 2 x expert 4 (tests/test_moe_train.py): 6
all-to-alls per sparse layer (counts, rows, expert ids and results forward; rows and results
backward), no all-gather of token activations (only the [E, D] router weight, and the [B, T, E]
router logits for the aux loss). The buffers are fixed-size on CPU (the worst case, dropless)
and ragged_all_to_all elsewhere (jaxformer/lowering.py). The maths equals one device's
(docs/numerics.md §26).

Every parameter carries *logical* axes from its definition (flax NNX partitioning metadata,
jaxformer/layers/kernels/partitioning.py), and one table maps logical axes to mesh axes
(jaxformer/train/config.py LOGICAL_AXIS_RULES, overridden by `parallel.axis_rules`). A
parameter of ours without logical axes is an error here, never silently replicated. A model
given by model.module (jaxformer/models/module.py) is any NNX module: its parameters that carry
logical axes (a port's, or `model.axes`) are sharded by the same table, and the others are
replicated (`unannotated="replicate"`).

A dim whose size does not divide by its mesh axes stays replicated (e.g. a 259-byte vocab), and
a mesh axis already used by an earlier dim of the same array is not used again. flax's own
rule lookup (nnx.get_partition_spec under logical_axis_rules) has neither fallback, so the
table is applied here.
"""
from __future__ import annotations

import math

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxformer.layers.kernels.partitioning import logical_axes
from jaxformer.layers.kernels.quant import QuantizedWeight
from jaxformer.train.config import LOGICAL_AXIS_RULES, MESH_AXES

DEFAULT_RULES = {k: (() if v is None else (v,) if isinstance(v, str) else tuple(v))
                 for k, v in LOGICAL_AXIS_RULES.items()}


def make_mesh(data: int = -1, fsdp: int = 1, tensor: int = 1, expert: int = 1, devices=None,
              context: int = 1, slices: int = 1, dcn_axis: str = "data", pipeline: int = 1) -> Mesh:
    """The (pipeline, data, fsdp, expert, context, tensor) mesh over `devices`. slices > 1: a hybrid mesh
    for a multi-slice run (parallel.slices): `dcn_axis` (data or fsdp) is split across the
    slices, over the data-center network (DCN), and every other axis, with the rest of
    `dcn_axis`, stays inside one slice, on its ICI (`hybrid_devices`)."""
    devices = list(devices if devices is not None else jax.devices())
    sizes = [pipeline, data, fsdp, expert, context, tensor]  # MESH_AXES order
    if sizes.count(-1) > 1:
        raise ValueError("parallel.mesh: at most one axis may be -1")
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if len(devices) % known:
            raise ValueError(f"parallel.mesh: {len(devices)} devices do not divide by {known}")
        sizes[sizes.index(-1)] = len(devices) // known
    if math.prod(sizes) != len(devices):
        raise ValueError(f"parallel.mesh: pipeline x data x fsdp x expert x context x tensor = {math.prod(sizes)} but there are "
                         f"{len(devices)} devices")
    # Auto axes: XLA's SPMD partitioner propagates shardings from the annotated params/batch
    auto = (jax.sharding.AxisType.Auto,) * len(MESH_AXES)
    if slices == 1:
        try:
            return jax.make_mesh(tuple(sizes), MESH_AXES, axis_types=auto, devices=devices)
        except NotImplementedError:  # an axis that is no product of whole physical axes (32 of 4x4x4)
            from jax.experimental import mesh_utils
            grid = mesh_utils.create_device_mesh(tuple(sizes), devices, allow_split_physical_axes=True)
            return Mesh(grid, MESH_AXES, axis_types=auto)
    return Mesh(hybrid_devices(tuple(sizes), devices, slices, dcn_axis), MESH_AXES, axis_types=auto)


def hybrid_devices(sizes: tuple[int, ...], devices: list, slices: int, dcn_axis: str) -> np.ndarray:
    """The device array of a multi-slice mesh: `sizes` (MESH_AXES order) with `dcn_axis` made of
    `slices` blocks, block i all devices of slice i. A slice is the devices' `slice_index` (TPU
    slices), else their process (one process per slice), else a contiguous block of the device
    list (one process: a simulated multi-slice run, the same program over the same devices)."""
    i = MESH_AXES.index(dcn_axis)
    if sizes[i] % slices:
        raise ValueError(f"parallel.slices: the {dcn_axis} axis ({sizes[i]}) must divide by slices ({slices}): "
                         f"it is the one split across slices (parallel.dcn_axis)")
    ici = tuple(n // slices if k == i else n for k, n in enumerate(sizes))
    dcn = tuple(slices if k == i else 1 for k in range(len(sizes)))
    from jax.experimental import mesh_utils
    if all(hasattr(d, "slice_index") for d in devices):
        found = len({d.slice_index for d in devices})
        if found != slices:
            raise ValueError(f"parallel.slices is {slices} but the devices are on {found} slice(s)")
        return mesh_utils.create_hybrid_device_mesh(ici, dcn, devices, allow_split_physical_axes=True)
    if len({d.process_index for d in devices}) > 1:
        return mesh_utils.create_hybrid_device_mesh(ici, dcn, devices, process_is_granule=True,
                                                    allow_split_physical_axes=True)
    per = len(devices) // slices
    blocks = [np.array(devices[k * per:(k + 1) * per], dtype=object).reshape(ici) for k in range(slices)]
    return np.concatenate(blocks, axis=i)


def spec_for(shape: tuple, axes: tuple, mesh: Mesh, rules: dict | None = None) -> P:
    """PartitionSpec of an array whose dims have logical `axes`, by `rules` (logical -> tuple of
    mesh axes); non-dividing dims and mesh axes of size 1 or already used stay unsplit."""
    rules = DEFAULT_RULES if rules is None else rules
    out = []
    used: set[str] = set()
    for size, ax in zip(shape, axes, strict=False):
        if ax is not None and ax not in rules:
            raise ValueError(f"logical axis {ax!r} has no mesh rule; known: {sorted(rules)}")
        names = tuple(n for n in (rules[ax] if ax else ()) if mesh.shape[n] > 1 and n not in used)
        n = math.prod(mesh.shape[a] for a in names) if names else 1
        if not names or size % n:
            out.append(None)
            continue
        used.update(names)
        out.append(names[0] if len(names) == 1 else names)
    return P(*out)


def _key_of(path) -> str:
    """Dotted attribute path of a pytree key path (dropping NNX's trailing `.value`)."""
    parts = []
    if path and getattr(path[-1], "name", None) == "value":
        path = path[:-1]
    for k in path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
    return ".".join(parts)


def _is_var(x) -> bool:
    return isinstance(x, nnx.Variable)


def param_shardings(params, mesh: Mesh, rules: dict | None = None, unannotated: str = "error"):
    """NamedSharding per param (the same tree of nnx.Variables, concrete or abstract), from each
    param's logical axes. Raises ValueError naming every param without (or with mismatched)
    logical axes; with unannotated="replicate", a param without any is replicated."""
    problems = []

    def f(path, var):
        axes = logical_axes(var)
        if axes is None and unannotated == "replicate":
            return var.replace(NamedSharding(mesh, P()))
        if axes is None or len(axes) != len(var.shape):
            problems.append(f"{_key_of(path)} {tuple(var.shape)}: " +
                            ("no logical axes" if axes is None else f"logical axes {axes}"))
            return var.replace(NamedSharding(mesh, P()))
        value = var.get_value()
        if isinstance(value, QuantizedWeight):  # a LoRA base [out, in] (+ scale [out]) of an [in, out] kernel
            return var.replace(QuantizedWeight(
                NamedSharding(mesh, spec_for(value.data.shape, axes[::-1], mesh, rules)),
                None if value.scale is None else NamedSharding(mesh, spec_for(value.scale.shape, axes[1:], mesh, rules))))
        return var.replace(NamedSharding(mesh, spec_for(var.shape, axes, mesh, rules)))
    out = jax.tree_util.tree_map_with_path(f, params, is_leaf=_is_var)
    if problems:
        raise ValueError("parallel.mode=mesh needs logical axes on every parameter "
                         "(jaxformer/layers/kernels/partitioning.py); missing or wrong on:\n  " + "\n  ".join(problems))
    return out


def state_shardings(state: dict, mesh: Mesh, rules: dict | None = None, unannotated: str = "error"):
    """Shardings for the whole train state (concrete or abstract): params (and a LoRA run's
    frozen base) by their logical axes (`unannotated`: param_shardings'); optimiser leaves that mirror a param (Adam's mu/nu: their path ends with the param's
    path) like that param; everything else (counts, RNG, step) replicated."""
    p_sh = param_shardings(state["params"], mesh, rules, unannotated)
    by_key = {}
    for path, sh in jax.tree_util.tree_flatten_with_path(p_sh)[0]:
        by_key[_key_of(path)] = sh
    replicated = NamedSharding(mesh, P())

    def opt(path, x):
        parts = _key_of(path).split(".")
        for i in range(len(parts)):  # the longest dotted suffix that is a param's path
            sh = by_key.get(".".join(parts[i:]))
            if sh is not None:
                return sh if len(sh.spec) <= x.ndim else replicated
        return replicated

    out = {"params": p_sh, "opt_state": jax.tree_util.tree_map_with_path(opt, state["opt_state"]),
           "rest": jax.tree.map(lambda _: replicated, state["rest"]), "step": replicated}
    if "frozen" in state:  # a LoRA run's base (train/lora.py): sharded like the params it is
        out["frozen"] = param_shardings(state["frozen"], mesh, rules)
    return out


def batch_sharding(mesh: Mesh, accum_axis: bool = True, axes: tuple = ("data", "fsdp", "expert")) -> NamedSharding:
    """Batch arrays are [A, micro, ...]: the micro-batch dim is split over `axes` (the "batch"
    rule: data x fsdp x expert by default)."""
    return NamedSharding(mesh, P(None, tuple(axes) or None) if accum_axis else P(tuple(axes) or None))


def per_device_bytes(tree) -> dict[str, int]:
    """Bytes each device holds for a (sharded) pytree: {'device 0': n, ...} and the logical total."""
    per: dict = {}
    total = 0
    for x in jax.tree.leaves(tree):
        if not hasattr(x, "addressable_shards"):
            continue
        total += x.size * x.dtype.itemsize
        for s in x.addressable_shards:
            per[s.device.id] = per.get(s.device.id, 0) + s.data.size * s.data.dtype.itemsize
    return {"total": total, **{f"device {k}": v for k, v in sorted(per.items())}}


def place(tree, shardings):
    """Put a host-identical pytree onto (possibly multi-process) shardings. Each process builds
    only its addressable shards from its own copy (every process holds the same values, e.g.
    the same seeded init), so this works across hosts where jax.device_put cannot."""
    def put(x, sh):
        if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            data = put(jax.random.key_data(x), sh)
            return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
        host = np.asarray(jax.device_get(x))
        return jax.make_array_from_callback(host.shape, sh, lambda idx: host[idx])
    return jax.tree.map(put, tree, shardings)
