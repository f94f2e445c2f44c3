"""Expert parallelism for the MoE layer (jaxformer/layers/moe.py): the tokens go to their
experts' devices and back with all-to-alls, under jax.shard_map over the active mesh.

When the mesh in force (jax.set_mesh; the JAX trainer sets it for `parallel.mode: mesh`) has
an `expert` axis of size S > 1, `routed` replaces the layer's one-device routing and dispatch:
  1. the N tokens are split over the batch axes (data x fsdp x expert, as the trainer splits
     the batch); each device routes its own n = N/P tokens (the router weights replicated);
  2. each kept assignment is written, sorted by expert, into the block of the device that holds
     its expert (experts split over `expert` in contiguous blocks of E/S): a buffer [S, C, D];
  3. `lowering.expert_all_to_all` over `expert` moves block j to device j; that device runs its
     E/S experts on the rows it received (one ragged_dot per projection) and the reverse
     all-to-all brings the results back to their slots;
  4. each token sums its results times its routing weights, in expert order as on one device.
The maths is the one-device layer's: the same router, tie rule and weights; capacity is that
of the whole layer (ceil(capacity_factor * N * k / E) over all N tokens, not per device), and
the drop order is the global token order: an assignment's position within its expert counts
the assignments to that expert on the devices holding earlier tokens (an all-gather of the [E]
per-device counts). So the results equal one device's up to fp32 summation order
(docs/numerics.md §26). Per-device capacity (GShard's groups) would make the buffers smaller,
but drop other tokens than one device does.

Buffers: C rows per (source, destination) pair, the most one source can send one device:
dropless n * min(k, E/S) (every local assignment to one device); with capacity_factor
min(that, E/S * capacity). On the CPU backend the whole buffers travel (no traffic saving over
the all-reduce form when dropless); on GPU/TPU ragged_all_to_all sends only the filled rows
(lowering.py). Gradients: all_to_all transposes to the reverse all_to_all; the replicated
router weights' gradients are summed over the devices by shard_map's transpose.

Expert weights enter split over `expert` only: an `embed` dim sharded over fsdp or an `mlp`
dim over tensor is gathered first (FSDP's usual gather; no tensor-parallel experts here).
Without such a mesh, or when N does not divide by P, the layer runs its one-device form (under
jit on a mesh, XLA's SPMD partitioner then splits it as it can).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P

from jaxformer import lowering

EXPERT = "expert"
BATCH_AXES = ("data", "fsdp", "expert")  # the trainer's default "batch" rule (train/config.py)


def expert_mesh(num_tokens: int):
    """(mesh, token axes) when the active mesh has `expert` > 1 and num_tokens divides by the
    token axes' devices; else None (the one-device form).

    Also, on a TPU or GPU (lowering.platform()) under the trainer's mesh (lowering.active()
    .batch_axes set) whose batch axes split the tokens but which has no expert axis: each
    device then routes and runs its own tokens with every expert (the weights gathered, as FSDP
    gathers any weight), with no exchange. Left to XLA's partitioner, the one-device form's
    sort and gathers over all N tokens of the global batch are replicated on every chip:
    Mixtral-8x7B at 16 x 4096 tokens per chip on a v5p-256 needed 2.93 TB per chip that way
    (docs/numerics.md §40). On the CPU backend the one-device form stays (its blocked layout,
    moe.blocked_dispatch, is the fast one there)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return None
    local = mesh.shape.get(EXPERT, 1) <= 1
    if local and (lowering.on_cpu() or not lowering.active().batch_axes):
        return None
    axes = tuple(a for a in (lowering.active().batch_axes or BATCH_AXES) if mesh.shape.get(a, 1) > 1)
    if (local and not axes) or num_tokens % math.prod(mesh.shape[a] for a in axes):
        return None
    return mesh, axes


def routed(router, experts, h: jax.Array, mesh, axes: tuple):
    """The MoE layer's routed part on the mesh: h [N, D] -> (router logits [N, E] float32,
    routed output [N, D], expert load [E] float32), as Router then Experts on one device."""
    rdef, rstate = nnx.split(router)
    edef, estate = nnx.split(experts)

    def body(rstate, estate, h):  # this device's tokens h [n, D] and experts [E/S, ...]
        logits, weights, idx = nnx.merge(rdef, rstate)(h)
        out = dispatch(nnx.merge(edef, estate), h, idx, weights, axes)
        load = jax.lax.psum(jnp.bincount(idx.reshape(-1), length=router.cfg.num_experts), axes)
        return logits, out, load.astype(jnp.float32)

    experts_spec = P(EXPERT) if mesh.shape[EXPERT] > 1 else P()  # no expert axis: every device has all
    return jax.shard_map(body, mesh=mesh, in_specs=(P(), experts_spec, P(axes)),
                         out_specs=(P(axes), P(axes), P()))(rstate, estate, h)


def dispatch(experts, h: jax.Array, indices: jax.Array, weights: jax.Array, axes: tuple) -> jax.Array:
    """Inside shard_map: this device's tokens h [n, D], their indices / weights [n, k] ->
    sum_j w_j expert_{i_j}(h) [n, D], the experts living on the devices of axis `expert`."""
    cfg = experts.cfg
    n, k = indices.shape
    e = cfg.num_experts
    s = jax.lax.axis_size(EXPERT)
    flat = indices.reshape(-1)  # [n*k] assignment a = token * k + slot
    keep = kept(flat, e, cfg, n * math.prod(jax.lax.axis_size(a) for a in axes), axes)
    key = jnp.where(keep, flat, e)  # dropped assignments sort last and are not sent
    order = jnp.argsort(key, stable=True)  # by expert, token order within an expert
    expert_sorted = key[order]  # [n*k]
    token_sorted = order // k
    w_sorted = jnp.where(keep[order], weights.reshape(-1)[order], 0).astype(h.dtype)
    rows = experts.compute(h)[token_sorted]  # [n*k, D] sent and multiplied in the compute dtype
    if s == 1:  # every expert is on this device: no buffers, no exchange (dropped rows sort last)
        y_sorted = experts.grouped_ffn(rows, expert_sorted, jnp.bincount(key, length=e).astype(jnp.int32))
    else:
        y_sorted = exchanged_ffn(experts, rows, expert_sorted, n, axes)
    return jnp.zeros_like(h).at[token_sorted].add(y_sorted.astype(h.dtype) * w_sorted[:, None])  # [n, D]


def exchanged_ffn(experts, rows: jax.Array, expert_sorted: jax.Array, n: int, axes: tuple) -> jax.Array:
    """Inside shard_map: this device's kept rows [n*k, D] sorted by expert (expert_sorted; E =
    dropped, sorted last) -> their expert outputs [n*k, D] (0 for dropped rows), the rows sent
    to the devices of axis `expert` holding their experts and the results brought back."""
    cfg = experts.cfg
    s = jax.lax.axis_size(EXPERT)
    e_local = cfg.num_experts // s
    dest = expert_sorted // e_local  # [n*k] the device holding the expert; s = dropped
    send_sizes = jnp.bincount(dest, length=s).astype(jnp.int32)  # [S]
    starts = jnp.cumsum(send_sizes) - send_sizes
    cap = capacity_rows(cfg, n, e_local, axes)
    slot = jnp.where(dest < s, dest * cap + jnp.arange(rows.shape[0]) - starts[jnp.minimum(dest, s - 1)], s * cap)
    d = rows.shape[-1]
    send_x = jnp.zeros((s * cap, d), rows.dtype).at[slot].set(rows, mode="drop")
    send_e = jnp.zeros((s * cap,), jnp.int32).at[slot].set(expert_sorted % e_local, mode="drop")

    def exchange(x, sent, received):
        return lowering.expert_all_to_all(x, sent, received, EXPERT)
    recv_sizes = jax.lax.all_to_all(send_sizes, EXPERT, 0, 0, tiled=True)  # [S]
    recv_x = exchange(send_x.reshape(s, cap, d), send_sizes, recv_sizes)
    recv_e = exchange(send_e.reshape(s, cap), send_sizes, recv_sizes)
    filled = jnp.arange(cap)[None, :] < recv_sizes[:, None]  # [S, C]
    local = jnp.where(filled, recv_e, e_local).reshape(-1)  # [S*C] local expert; e_local = empty
    rank = jnp.argsort(local, stable=True)
    group_sizes = jnp.bincount(local, length=e_local).astype(jnp.int32)  # [E/S]
    y = experts.grouped_ffn(recv_x.reshape(s * cap, d)[rank], local[rank], group_sizes)
    y = jnp.zeros_like(y).at[rank].set(y)  # [S*C, D] back in received order
    back = exchange(y.reshape(s, cap, d), recv_sizes, send_sizes)
    return jnp.take(back.reshape(s * cap, d), slot, axis=0, mode="fill", fill_value=0)  # [n*k, D]


def capacity_rows(cfg, n: int, e_local: int, axes: tuple) -> int:
    """C: the most rows one device sends another: n * min(k, E/S) (each token picks distinct
    experts), and with a capacity at most E/S experts x capacity."""
    worst = n * min(cfg.top_k, e_local)
    if cfg.capacity_factor is None:
        return worst
    total = n * math.prod(jax.lax.axis_size(a) for a in axes)
    return min(worst, e_local * math.ceil(cfg.capacity_factor * total * cfg.top_k / cfg.num_experts))


def kept(flat: jax.Array, e: int, cfg, total_tokens: int, axes: tuple) -> jax.Array:
    """[n*k] bool: the assignments this device keeps under the layer's capacity, each one's
    position within its expert counted in the global token order (module docstring)."""
    if cfg.capacity_factor is None:
        return jnp.ones(flat.shape, bool)
    cap = math.ceil(cfg.capacity_factor * total_tokens * cfg.top_k / e)
    counts = jnp.bincount(flat, length=e)  # [E] this device's assignments per expert
    every = jax.lax.all_gather(counts, axes)  # [P, E] in token-block order
    me = jax.lax.axis_index(axes)
    before = jnp.sum(jnp.where(jnp.arange(every.shape[0])[:, None] < me, every, 0), axis=0)  # [E]
    order = jnp.argsort(flat, stable=True)
    starts = jnp.cumsum(counts) - counts
    rank = jnp.zeros_like(flat).at[order].set(jnp.arange(flat.shape[0]) - starts[flat[order]])
    return before[flat] + rank < cap
