"""Mesh sharding for `parallel.mode: mesh`: data, FSDP and tensor parallelism on one
`jax.sharding.Mesh` with axes ("data", "fsdp", "tensor"), driven by `jax.jit` + NamedSharding
and XLA's SPMD partitioner (no hand-written collectives).

Parameters get *logical* axes from one rule table on their attribute path (the same path that
is the checkpoint key), and one table maps logical axes to mesh axes:

    logical   mesh       meaning
    batch     data,fsdp  the global batch is split over data x fsdp
    embed     fsdp       the model-width dim of every weight: FSDP shards params + optimiser state
    heads     tensor     attention heads (q/k/v out, o in): Megatron column/row split
    mlp       tensor     FFN hidden width (gate/up out, down in)
    vocab     tensor     embedding rows
A dim whose size does not divide by its mesh axes stays replicated (e.g. a 259-byte vocab), and
1-D leaves (biases, norm scales) are replicated: they are the "small replicated leaves".
"""
from __future__ import annotations

import fnmatch
import math

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")
LOGICAL_TO_MESH = {"batch": ("data", "fsdp"), "embed": "fsdp", "heads": "tensor", "mlp": "tensor",
                   "vocab": "tensor", "layers": None}

# attribute-path pattern (flax key, dotted) -> logical axes of the flax array's dims
PARAM_RULES: list[tuple[str, tuple]] = [
    ("*.q_proj.kernel", ("embed", "heads")),
    ("*.k_proj.kernel", ("embed", "heads")),
    ("*.v_proj.kernel", ("embed", "heads")),
    ("*.o_proj.kernel", ("heads", "embed")),
    ("*.gate_proj.kernel", ("embed", "mlp")),
    ("*.up_proj.kernel", ("embed", "mlp")),
    ("*.down_proj.kernel", ("mlp", "embed")),
    ("*embed_tokens.embedding", ("vocab", "embed")),
    ("*embed_positions.embedding", (None, "embed")),
    ("*lm_head.kernel", ("embed", "vocab")),
    ("*.kernel", ("embed", None)),  # other 2-D projections (heads, patch embeddings, ...)
]


def make_mesh(data: int = -1, fsdp: int = 1, tensor: int = 1, devices=None) -> Mesh:
    devices = list(devices if devices is not None else jax.devices())
    sizes = [data, fsdp, tensor]
    if sizes.count(-1) > 1:
        raise ValueError("parallel.mesh: at most one axis may be -1")
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if len(devices) % known:
            raise ValueError(f"parallel.mesh: {len(devices)} devices do not divide by {known}")
        sizes[sizes.index(-1)] = len(devices) // known
    if math.prod(sizes) != len(devices):
        raise ValueError(f"parallel.mesh: data x fsdp x tensor = {math.prod(sizes)} but there are "
                         f"{len(devices)} devices")
    # Auto axes: XLA's SPMD partitioner propagates shardings from the annotated params/batch
    auto = (jax.sharding.AxisType.Auto,) * len(MESH_AXES)
    return jax.make_mesh(tuple(sizes), MESH_AXES, axis_types=auto, devices=devices)


def logical_axes(key: str, ndim: int, stacked: int = 0) -> tuple:
    """Logical axes of a param's dims (leading `stacked` layer axes get 'layers')."""
    lead = ("layers",) * stacked
    if ndim - stacked < 2:
        return lead + (None,) * (ndim - stacked)
    for pattern, axes in PARAM_RULES:
        if fnmatch.fnmatch(key, pattern) or fnmatch.fnmatch("." + key, pattern):
            axes = tuple(axes) + (None,) * (ndim - stacked - len(axes))
            return lead + axes[: ndim - stacked]
    return lead + (None,) * (ndim - stacked)


def spec_for(shape: tuple, axes: tuple, mesh: Mesh) -> P:
    out = []
    used: set[str] = set()
    for size, ax in zip(shape, axes):
        mesh_ax = LOGICAL_TO_MESH.get(ax) if ax else None
        names = (mesh_ax,) if isinstance(mesh_ax, str) else tuple(mesh_ax or ())
        names = tuple(n for n in names if mesh.shape[n] > 1 and n not in used)
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


def param_shardings(params, mesh: Mesh, stacked_fn=None):
    """NamedSharding per param leaf, from PARAM_RULES."""
    def f(path, x):
        key = _key_of(path)
        stacked = stacked_fn(key) if stacked_fn else 0
        return NamedSharding(mesh, spec_for(x.shape, logical_axes(key, x.ndim, stacked), mesh))
    return jax.tree_util.tree_map_with_path(f, params)


def state_shardings(state: dict, mesh: Mesh, stacked_fn=None):
    """Shardings for the whole train state: params by rule; optimiser leaves that mirror a param
    (Adam's mu/nu) like that param; everything else (counts, RNG, step) replicated."""
    p_sh = param_shardings(state["params"], mesh, stacked_fn)
    by_key = {}
    for path, sh in jax.tree_util.tree_flatten_with_path(p_sh)[0]:
        by_key[_key_of(path)] = sh
    replicated = NamedSharding(mesh, P())

    def opt(path, x):
        key = _key_of(path)
        for pk, sh in by_key.items():
            if key.endswith(pk) and len(sh.spec) <= x.ndim:
                return sh
        return replicated

    return {"params": p_sh, "opt_state": jax.tree_util.tree_map_with_path(opt, state["opt_state"]),
            "rest": jax.tree.map(lambda _: replicated, state["rest"]), "step": replicated}


def batch_sharding(mesh: Mesh, accum_axis: bool = True) -> NamedSharding:
    """Batch arrays are [A, micro, ...]: the micro-batch dim is split over data x fsdp."""
    return NamedSharding(mesh, P(None, ("data", "fsdp")) if accum_axis else P(("data", "fsdp")))


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


def global_batch(local: dict, sharding: NamedSharding, global_shape_fn) -> dict:
    """Assemble a global jax.Array per key from this process's slice (multi-host)."""
    return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v), global_shape_fn(k, v))
            for k, v in local.items()}


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
