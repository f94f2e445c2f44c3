"""Pipeline parallelism (parallel.mesh.pipeline; issue 50 §4): a scanned stack's layers split
into S stages over the mesh's `pipeline` axis, the batch into M microbatches, in GPipe's
schedule, in one jitted program (no per-stage programs, no hand-written collectives).

The stacked layer params [L, ...] are laid out over the pipeline axis in S contiguous blocks
(the logical rule "layers" -> "pipeline"), so [S, L/S, ...] is the same array seen by stage.
Each of M + S - 1 ticks:
  1. every stage takes its input: stage 0 microbatch t (while t < M), stage s > 0 what stage
     s - 1 gave at the last tick (a roll of the [S, mb, T, D] buffer along its stage axis,
     which XLA lowers to a collective-permute between neighbouring pipeline devices);
  2. every stage runs its L/S layers (vmap over the stage axis, whose blocks the devices of
     the pipeline axis hold: each device runs its own stage) on its microbatch, t - s;
  3. the last stage's result, microbatch t - S + 1 once t >= S - 1, is the tick's output.
A stage that holds no microbatch at a tick (the bubble: S - 1 of the M + S - 1 ticks for each
stage) computes on zeros and its result is dropped, so it adds nothing to the output or to any
gradient. Bubble fraction (S - 1) / (M + S - 1) (`bubble`; `jaxformer compile` reports it).
Autodiff runs the schedule backward (the scan's transpose), the same ticks in reverse. Under
remat (train.remat) each stage is also rematerialised as a whole per tick: a tick keeps only
its stages' inputs, not each layer's, for one more forward pass (Llama-3.1-8B shapes on
v5p:4x4x4, 2 stages, 2 microbatches: 9.55 -> 6.99 GiB of temporaries).

Each microbatch's rows of the layers' other batch inputs (mask record, positions) travel with
it: the leaves of `rows` with a batch dim are split like x, and a stage at tick t reads
microbatch t - s's rows; the other leaves stay as they are (a static causal pattern stays
static, so Pallas' splash kernel still takes the stages' attention: passed through the vmap
they became traced and the TPU fell back to the plain path). The result is
the unpipelined stack's, microbatch by microbatch: the same sums, over mb rows instead of B
(tests/test_pipeline.py: the one-device trajectory within 1e-5).

Not with: dropout (a stage's RNG counts are not carried across ticks), intermediates or MoE
aux outputs, a context axis, a KV cache (decoding runs the stack unpipelined); the config
check refuses them by name (train/config.py).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import PartitionSpec as P

from jaxformer import lowering

PIPELINE_AXIS = "pipeline"


def bubble(stages: int, microbatches: int) -> float:
    """The fraction of a stage's ticks it idles in GPipe's schedule."""
    return (stages - 1) / (microbatches + stages - 1)


def microbatches(a: jax.Array, m: int) -> jax.Array:
    """[B, ...] -> [m, B / m, ...], microbatch i = rows i, i + m, i + 2m, ...: strided, so the
    rows of each microbatch keep the batch's split over the data axes (B's blocks)."""
    return a.reshape(a.shape[0] // m, m, *a.shape[1:]).swapaxes(0, 1)


def run(stack, x: jax.Array, call, rows, flags, policy) -> jax.Array:
    """x [B, T, D] through `stack`'s scanned layers in S stages x M microbatches (the active
    lowering's pipeline_stages / pipeline_microbatches): call(layer, h, local, rows) runs one
    layer on a microbatch h [mb, T, D] with that microbatch's `rows`."""
    switches = lowering.active()
    s_n, m_n = switches.pipeline_stages, switches.pipeline_microbatches
    b = x.shape[0]
    if b % m_n:
        raise ValueError(f"pipeline: the batch of {b} rows does not split into {m_n} microbatches")
    n = stack.cfg.num_layers
    if n % s_n:
        raise ValueError(f"pipeline: {n} layers do not split into {s_n} stages")
    graphdef, state = nnx.split(stack.layers)
    staged = jax.tree.map(lambda a: a.reshape(s_n, n // s_n, *a.shape[1:]), state)
    uniform = isinstance(flags, tuple)
    local = flags[0] if uniform else jnp.reshape(flags, (s_n, n // s_n))
    xs = jax.lax.with_sharding_constraint(microbatches(x, m_n), P(None, switches.batch_axes or None))
    # only the leaves with a batch dim travel by microbatch (and through the vmaps); the others
    # stay as they are, so a static mask pattern (numpy slots) is still static inside the stage
    # (Pallas' splash takes only those)
    leaves, treedef = jax.tree.flatten(rows)
    split = [i for i, a in enumerate(leaves) if isinstance(a, jax.Array | np.ndarray) and a.ndim and a.shape[0] == b]
    split_mb = [microbatches(jnp.asarray(leaves[i]), m_n) for i in split]

    def rows_of(picked):
        out = list(leaves)
        for i, a in zip(split, picked, strict=True):
            out[i] = a
        return jax.tree.unflatten(treedef, out)
    batch_spec = P(PIPELINE_AXIS, switches.batch_axes or None)

    def layer_step(h, xs_layer, r):
        layer_state, flag = xs_layer if not uniform else (xs_layer, local)
        layer = nnx.merge(graphdef, jax.tree.map(lambda a: a, layer_state))
        return call(layer, h, flag, r)

    def stage(stage_state, stage_flags, h, picked):
        r = rows_of(picked)
        body = (lambda h, xs_layer: (layer_step(h, xs_layer, r), None))
        if policy:
            body = jax.checkpoint(body, policy=policy)
        h, _ = jax.lax.scan(body, h, stage_state if uniform else (stage_state, stage_flags))
        return h

    if policy:  # remat: a tick keeps only each stage's input; the stage reruns in the backward pass
        stage = jax.checkpoint(stage, policy=jax.checkpoint_policies.nothing_saveable)
    stage_ids = jnp.arange(s_n)

    def tick(buf, t):
        first = jax.lax.dynamic_index_in_dim(xs, jnp.minimum(t, m_n - 1), keepdims=False)
        inputs = jnp.roll(buf, 1, axis=0).at[0].set(first)
        inputs = jax.lax.with_sharding_constraint(inputs, batch_spec)
        mb = jnp.clip(t - stage_ids, 0, m_n - 1)  # the microbatch each stage holds
        picked = [a[mb] for a in split_mb]  # [S, mb, ...]: each stage's microbatch rows
        # spmd_axis_name: the layers' own sharding constraints inside get the stage dim on the pipeline
        # axis (without it they pin that dim unsplit and every device computes every stage)
        done = jax.vmap(stage, spmd_axis_name=PIPELINE_AXIS)(staged, local if not uniform else stage_ids, inputs, picked)
        done = jax.lax.with_sharding_constraint(done, batch_spec)
        # the last stage's result is this tick's output: microbatch t - S + 1 once t >= S - 1.
        # (Written into an [M, ...] carry instead, the backward pass's dynamic slice of that
        # carry's cotangent made XLA's TPU partitioner gather it whole on every chip.)
        return done, jax.lax.with_sharding_constraint(done[-1], P(switches.batch_axes or None))

    buf = jax.lax.with_sharding_constraint(jnp.zeros((s_n, *xs.shape[1:]), x.dtype), batch_spec)
    _, last = jax.lax.scan(tick, buf, jnp.arange(m_n + s_n - 1))
    out = last[s_n - 1:]  # [M, mb, ...]: the ticks before S - 1 finished no microbatch
    return out.swapaxes(0, 1).reshape(x.shape)  # microbatches' inverse
