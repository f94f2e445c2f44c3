"""Token and learned position embeddings, with range checks JAX does not do (docs/numerics.md §10).
Twin: torch_ref/layers/embedding.py."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental import checkify

from jaxformer.layers import linear
from jaxformer.layers.kernels import partitioning, quant

# Set while models.common.checked traces a function: traced ids then get a checkify check.
# Everywhere else a traced program holds no check at all (docs/numerics.md §10).
TRACED_CHECKS = {"on": False}


def check_ids(ids, upper: int, what: str = "token id", field: str = "vocab_size") -> None:
    """Raise ValueError if a concrete id array has an entry outside [0, upper).

    JAX gathers never raise on an out-of-range index (indexing clamps, jnp.take fills NaN), so
    concrete inputs are checked here. Traced inputs (inside jit) cannot raise: the entry points
    check theirs before tracing (generation, the trainers' batches); under
    models.common.checked a traced id array gets a checkify check instead."""
    if isinstance(ids, jax.core.Tracer):
        if TRACED_CHECKS["on"]:
            lo, hi = jnp.min(ids), jnp.max(ids)
            checkify.check((lo >= 0) & (hi < upper), f"{what} {{}} is out of range [0, {upper}) ({field}={upper})",
                           jnp.where(lo < 0, lo, hi))
        return
    arr = np.asarray(ids)
    if arr.size == 0:
        return
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= upper:
        bad = lo if lo < 0 else hi
        raise ValueError(f"{what} {bad} is out of range [0, {upper}) ({field}={upper})")


def check_length(length: int, max_len: int, what: str = "sequence length") -> None:
    if length > max_len:
        raise ValueError(f"{what} {length} exceeds max_len={max_len}")


class Embedding(nnx.Module):
    """Lookup table with optional sqrt(D) scaling (Vaswani et al. 2017, section 3.4).

    Args:
        num_embeddings: V.  dim: D.  scale: multiply looked-up rows by sqrt(D).
        axes: the table's logical axes (layers/kernels/partitioning.py).
    Shapes: ids [B, T] int -> [B, T, D]; attend(x [B, T, D]) -> [B, T, V] (tied output).
    """

    def __init__(self, num_embeddings: int, dim: int, *, scale: bool = False,
                 init_std: float = 1.0, axes: tuple | None = ("vocab", "embed"), rngs: nnx.Rngs):
        self.num_embeddings = num_embeddings
        self.multiplier = math.sqrt(dim) if scale else None
        self.embedding = partitioning.param(
            jax.random.normal(rngs.params(), (num_embeddings, dim), jnp.float32) * init_std, axes)

    def __call__(self, ids: jax.Array) -> jax.Array:
        check_ids(ids, self.num_embeddings)
        table = self.embedding.get_value()
        if isinstance(table, quant.QuantizedWeight):  # a tied table's bf16/int8 decode copy
            x = table.lookup(ids)  # [B, T, D]
        else:
            # the residual stream is float32 whatever the table's storage dtype (a bfloat16
            # table, models.cast_params): a bfloat16 stream would make every later matmul bfloat16
            x = jnp.take(table, ids, axis=0).astype(jnp.float32)  # [B, T, D]
        if self.multiplier is not None:  # sqrt(D) in the stream's dtype (float32), as HF Gemma
            x = x * jnp.float32(self.multiplier)  # rounds it to its compute dtype (docs/numerics.md §21)
        return x

    def attend(self, x: jax.Array) -> jax.Array:
        return linear.attend(self.embedding.get_value(), x)  # [B, T, V]
