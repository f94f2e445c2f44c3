"""Helpers shared by the text models (classifier, seq2seq, lm): input checks at the model
boundary, positions from an attention mask, compute dtype. Twin: torch_ref/models/common.py."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer.layers.embedding import check_ids, check_length
from jaxformer.layers.moe import Experts

COMPUTE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def check_tokens(ids, vocab_size: int, max_len: int | None, what: str = "token id") -> None:
    """ValueError for a sequence longer than max_len, or an id outside [0, vocab_size): JAX
    would not raise (docs/numerics.md §10). Traced ids (inside jit) are not checked; the
    generation entry points check their inputs before tracing."""
    if ids.ndim != 2:
        raise ValueError(f"{what}s must be [batch, length], got shape {tuple(ids.shape)}")
    if max_len is not None:
        check_length(ids.shape[1], max_len, f"{what} sequence length")
    check_ids(ids, vocab_size, what, "vocab_size")


def positions_from_mask(mask: jax.Array) -> jax.Array:
    """mask [B, L] (1 = token) -> positions [B, L] int32 that count real tokens only, so a
    left-padded row gets the positions of the unpadded one; pad slots get 0."""
    return jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=1) - 1, 0)


def positions_from_segments(segment_ids: jax.Array) -> jax.Array:
    """segment_ids [B, T] (packed documents) -> positions [B, T] int32 that restart at 0 where
    the id changes, so each document gets the positions it would have alone (RoPE, learned
    and sinusoidal positions alike)."""
    t = segment_ids.shape[1]
    idx = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), segment_ids.shape)  # [B, T]
    starts = jnp.concatenate([jnp.ones_like(segment_ids[:, :1], bool),
                              segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1)  # [B, T]
    return idx - jax.lax.cummax(jnp.where(starts, idx, 0), axis=1)


def compute_dtype(name: str):
    return COMPUTE_DTYPES[name]


def set_compute_dtype(model: nnx.Module, name: str) -> None:
    """bf16 compute with fp32 params, as torch.autocast does it: every Linear casts its input,
    kernel and bias to the compute dtype (nnx.Linear's `dtype`), and so do the MoE experts
    (layers/moe.py Experts.dtype); embeddings, norms (which compute in fp32) and the residual
    stream stay fp32."""
    if name == "float32":
        return
    for _, module in nnx.iter_modules(model):
        if isinstance(module, (nnx.Linear, Experts)):
            module.dtype = COMPUTE_DTYPES[name]
