"""The token cross-entropy of an output head in sequence chunks: the head's logits and their
loss computed chunk by chunk inside a scan, forward and backward, so the float32 [B, T, V]
logits, their log-softmax and their gradient never exist whole (docs/numerics.md §47).

At a 128k vocabulary those are the largest temporaries of a train step and its largest HBM
movers: Llama-3.1-8B's [3, 8192, 128256] float32 logits are 11.7 GiB per chip, twice that with
their gradient. Here one chunk's are: at most lowering.active().loss_chunk_bytes of float32
logits per device.

The function is layers/loss.py's cross_entropy_sum of the whole logits, summed in another
order:
  1) chunks: chunk j holds tokens j, j + n, j + 2n, ... of every row (strided, so a sequence
     split over a context axis keeps each chunk's tokens on their devices); T is padded to a
     multiple of n with weight-0 tokens, which add 0 to the loss, its gradient and `correct`;
  2) forward: a scan over the n chunks adds up each chunk's cross_entropy_sum (the same
     per-token maths) and keeps nothing but its inputs;
  3) backward (custom_vjp): a scan over the chunks again recomputes each chunk's logits and
     takes the chunk's gradients by jax.vjp (the head's own and layers/loss.py's backward); the
     head's gradient is summed over the chunks in a float32 carry (a bf16 head: each chunk's
     bf16 product summed in float32, rounded to bf16 once at the end, not a bf16 running sum);
  4) under a mesh whose batch axes split the rows, 1-3 run per device (jax.shard_map over those
     axes): the head is gathered once, not in every chunk, and its gradient is each device's
     float32 sum over its own chunks, reduced across the devices once.
Twin: none (the torch trainer computes the unchunked loss, the reference).
"""
from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from jaxformer import lowering
from jaxformer.layers.loss import cross_entropy_sum


def chunked_cross_entropy_sum(head, state, h, labels, weights, label_smoothing: float,
                              chunk_bytes: int | None = None):
    """cross_entropy_sum(head(state, h), labels, weights, label_smoothing) in sequence chunks
    -> (loss_sum, correct).

    Args:
        head: (state, h [B, c, D]) -> logits [B, c, V] float32, the model's output head as a
            pure function of its own state (LM.output_head, Seq2Seq.output_head).
        state: the head's state (a pytree; differentiated like any input).
        h: [B, T, D] the final hidden states.  labels [B, T] int, weights [B, T] of 0/1.
        chunk_bytes: the most bytes of float32 logits per device in one chunk; None =
            lowering.active().loss_chunk_bytes (itself None: unchunked).
    One chunk (the whole logits fit) computes exactly the unchunked ops."""
    b, t = labels.shape
    vocab = jax.eval_shape(head, state, h[:, :1]).shape[-1]
    budget = lowering.active().loss_chunk_bytes if chunk_bytes is None else chunk_bytes
    axes = _batch_axes(b)
    n = chunk_count(b // math.prod(jax.sharding.get_abstract_mesh().shape[a] for a in axes), t, vocab, budget)
    if n == 1:
        return cross_entropy_sum(head(state, h), labels, weights, label_smoothing)
    if not axes:
        return _chunked(head, state, h, labels, weights, label_smoothing, n)

    def local(state, h, labels, weights):  # one device's rows, the head whole
        # the head as a per-device value: its gradient is this device's sum over its chunks,
        # reduced over the devices where it leaves (the transpose of this cast is a psum)
        state = jax.tree.map(lambda x: jax.lax.pcast(x, axes, to="varying"), state)
        loss, correct = _chunked(head, state, h, labels, weights, label_smoothing, n, axes)
        return jax.lax.psum(loss, axes), jax.lax.psum(correct, axes)
    rows = P(axes)
    return jax.shard_map(local, mesh=jax.sharding.get_abstract_mesh(), axis_names=set(axes),
                         in_specs=(P(), rows, rows, rows), out_specs=(P(), P()))(state, h, labels, weights)


def _chunked(head, state, h, labels, weights, label_smoothing: float, n: int, axes: tuple[str, ...] = ()):
    """Steps 1-3 of the module docstring over n chunks (on one device's rows inside shard_map
    over `axes`, whose sums vary over them)."""
    b, t = labels.shape
    c = -(-t // n)  # tokens of each row in one chunk
    pad = n * c - t
    if pad:  # weight-0 tokens: nothing to the loss, its gradient or `correct`
        h = jnp.pad(h, ((0, 0), (0, pad), (0, 0)))
        labels, weights = (jnp.pad(a, ((0, 0), (0, pad))) for a in (labels, weights))
    return _chunked_sum(_Static(head, float(label_smoothing), n, axes), state, h, labels, weights)


@dataclasses.dataclass(frozen=True)
class _Static:
    """The trace-time constants of one chunked loss (custom_vjp's nondiff argument)."""

    head: object
    label_smoothing: float
    n: int
    axes: tuple[str, ...]

    def strided(self, a):
        """[B, n c, ...] -> [n, B, c, ...]: chunk j holds tokens j, j + n, j + 2n, ..."""
        b, t = a.shape[:2]
        return jnp.moveaxis(a.reshape((b, t // self.n, self.n) + a.shape[2:]), 2, 0)

    def zero(self, shape=()):
        """float32 zeros, varying over the shard_map axes (each device's own sum starts there)."""
        z = jnp.zeros(shape, jnp.float32)
        return jax.lax.pcast(z, self.axes, to="varying") if self.axes else z

    def chunk_loss(self, state, h_c, y_c, w_c):
        """(loss_sum, correct) of one chunk: h_c [B, c, D], y_c / w_c [B, c]."""
        return cross_entropy_sum(self.head(state, h_c), y_c, w_c, self.label_smoothing)


# 2) and 3) as one custom_vjp: the forward scan keeps nothing but its inputs, and the backward
# scan recomputes each chunk's logits, takes the chunk's gradients by jax.vjp (the head's and
# layers/loss.py's own backward) and sums the head's in float32 in its carry.
@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _chunked_sum(st: _Static, state, h, labels, weights):
    def body(carry, xs):
        loss, correct = st.chunk_loss(state, *xs)
        return (carry[0] + loss, carry[1] + correct), None
    (loss, correct), _ = jax.lax.scan(body, (st.zero(), st.zero()),
                                      (st.strided(h), st.strided(labels), st.strided(weights)))
    return loss, correct


def _chunked_sum_fwd(st: _Static, state, h, labels, weights):
    return _chunked_sum(st, state, h, labels, weights), (state, h, labels, weights)


def _chunked_sum_bwd(st: _Static, res, g):
    state, h, labels, weights = res
    g_loss = g[0]  # `correct` is a count: no gradient
    floating = lambda x: jnp.issubdtype(x.dtype, jnp.floating)

    def body(acc, xs):
        h_c, y_c, w_c = xs
        _, vjp = jax.vjp(lambda state, h_c: st.chunk_loss(state, h_c, y_c, w_c)[0], state, h_c)
        d_state, d_h = vjp(g_loss)
        acc = jax.tree.map(lambda a, d: a + d.astype(jnp.float32) if a is not None else None, acc, d_state,
                           is_leaf=lambda a: a is None)
        return acc, d_h

    acc0 = jax.tree.map(lambda x: st.zero(x.shape) if floating(x) else None, state)
    acc, d_h = jax.lax.scan(body, acc0, (st.strided(h), st.strided(labels), st.strided(weights)))
    d_h = jnp.moveaxis(d_h, 0, 2).reshape(h.shape)  # [n, B, c, D] -> [B, T, D]
    d_state = jax.tree.map(lambda x, a: a.astype(x.dtype) if floating(x) else np.zeros(x.shape, jax.dtypes.float0),
                           state, acc, is_leaf=lambda a: a is None)
    return d_state, d_h, np.zeros(labels.shape, jax.dtypes.float0), jnp.zeros_like(weights)


_chunked_sum.defvjp(_chunked_sum_fwd, _chunked_sum_bwd)


def chunk_count(rows: int, tokens: int, vocab: int, budget: int | None) -> int:
    """How many chunks the tokens of each row split into so that one chunk's float32 logits on
    a device, rows x tokens / n x vocab x 4 bytes, are at most `budget` (None: 1): the fewest,
    or up to twice that where a count that divides `tokens` saves the padding."""
    if not budget or rows * tokens * vocab * 4 <= budget:
        return 1
    per_chunk = max(1, budget // (rows * vocab * 4))  # tokens of a row in one chunk
    fewest = min(tokens, math.ceil(tokens / per_chunk))
    return next((n for n in range(fewest, min(tokens, 2 * fewest) + 1) if tokens % n == 0), fewest)


def _batch_axes(b: int) -> tuple[str, ...]:
    """The mesh axes (of the mesh in force, not yet manual) the batch rows are split over: the
    lowering's batch_axes of size > 1, where together they divide B; () off a mesh (one device,
    or a pmap body's own rows)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return ()
    axes = tuple(a for a in lowering.active().batch_axes
                 if a in mesh.shape and mesh.shape[a] > 1 and a not in mesh.manual_axes)
    return axes if axes and b % math.prod(mesh.shape[a] for a in axes) == 0 else ()
