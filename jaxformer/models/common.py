"""Helpers shared by the text models (classifier, seq2seq, lm): input checks at the model
boundary, positions from an attention mask, compute dtype. Twin: torch_ref/models/common.py."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct
from jax.experimental import checkify

from jaxformer.config.inputs import check_finite, check_float_kind, check_int_kind, check_mask_values
from jaxformer.layers.embedding import TRACED_CHECKS, check_ids, check_length
from jaxformer.layers.moe import Experts

COMPUTE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


@struct.dataclass
class LMOutput:
    """What LM returns when a call asks for more than the logits (a cache, intermediates or
    aux); None where not asked. A frozen JAX pytree, so a jitted call can return it.
    logits [B, T, V] float32; cache: the updated KV cache; intermediates {name: array} (with
    return_attention also "layers.i.attn_weights" [B, H, T, T]); aux {"router_logits",
    "expert_load"} (MoE); hidden (return_hidden: the final hidden states [B, T, D] the output
    head would take, logits None; jax only, for the chunked loss)."""
    logits: jax.Array | None
    cache: list | dict | None = None
    intermediates: dict | None = None
    aux: dict | None = None
    hidden: jax.Array | None = None

    @property
    def attention(self) -> dict | None:
        """The attention weights among the intermediates {name: [B, H, T, S]}, or None."""
        if self.intermediates is None:
            return None
        return {k: v for k, v in self.intermediates.items() if k.endswith("attn_weights")} or None


def check_tokens(ids, vocab_size: int, max_len: int | None, what: str = "token id") -> None:
    """ValueError for ids that are not an integer [batch, length] array, a sequence longer than
    max_len, or an id outside [0, vocab_size): JAX would not raise (docs/numerics.md §10). The
    dtype and rank are checked traced too (they cost nothing); the values only when concrete:
    inside jit the caller checks them before tracing (generation, the trainers' batches)."""
    if not hasattr(ids, "ndim"):
        raise ValueError(f"{what}s must be an array [batch, length], got {type(ids).__name__}")
    if ids.ndim != 2:
        raise ValueError(f"{what}s must be [batch, length], got shape {tuple(ids.shape)}")
    check_int_kind(_kind(ids.dtype), str(ids.dtype), what)
    if max_len is not None:
        check_length(ids.shape[1], max_len, f"{what} sequence length")
    check_ids(ids, vocab_size, what, "vocab_size")


def check_mask(mask, shape: tuple | None, what: str = "attention_mask") -> None:
    """ValueError for a mask not of `shape` ([B, T]; None: the caller checks it), or (concrete
    only, at no cost inside jit) holding anything but 0 and 1: a NaN or an additive (0 / -inf)
    mask would read as tokens."""
    if mask is None:
        return
    if not hasattr(mask, "shape") or (shape is not None and tuple(mask.shape) != tuple(shape)):
        got = tuple(mask.shape) if hasattr(mask, "shape") else type(mask).__name__
        raise ValueError(f"{what} must be [batch, length] = {tuple(shape)}, got {got}")
    if isinstance(mask, jax.core.Tracer):
        if TRACED_CHECKS["on"]:  # inside checked(): the same check, through checkify
            checkify.check(jnp.all((mask == 0) | (mask == 1)), f"{what} holds a value other than 0 and 1 "
                           "(a mask is 1 = token, 0 = padding; never additive or NaN)")
    else:
        values = np.asarray(mask)
        check_mask_values(values.astype(np.float32) if _kind(mask.dtype) == "f" else values, what)


def check_int_input(x, what: str) -> None:
    """ValueError for integer inputs given as floats or bools (segment ids, positions): a
    dtype check, traced too."""
    if x is not None:
        check_int_kind(_kind(x.dtype), str(x.dtype), what)


def check_values(x, what: str) -> None:
    """Images or series: ValueError unless floating point (traced too), and (concrete only)
    finite: a NaN pixel cannot be meant, and spreads to the whole row's output."""
    check_float_kind(_kind(x.dtype), str(x.dtype), what)
    if not isinstance(x, jax.core.Tracer):
        check_finite(np.asarray(x).astype(np.float32, copy=False), what)


def _kind(dtype) -> str:
    """The numpy dtype kind, with bfloat16 (an ml_dtypes kind 'V') as the float it is."""
    return "f" if jnp.issubdtype(dtype, jnp.floating) else np.dtype(dtype).kind


def checked(fn):
    """jax.jit(fn) that keeps the model-boundary value checks inside the program, through
    jax.experimental.checkify: an id outside the vocabulary (or a position outside max_len) and
    a mask entry other than 0/1 raise one-line ValueErrors instead of computing with clamped
    or NaN rows. fn: a plain function of arrays that calls a model (not itself jitted, whose
    traced program would be reused without the checks), e.g.
    `checked(lambda state, ids: nnx.merge(graphdef, state)(ids))`. The checks are extra ops
    (a min, a max and a compare per input) in this program only: jax.jit(fn) and every
    program jaxformer compiles (generate, the train and eval steps) hold none."""
    def body(*args, **kwargs):
        TRACED_CHECKS["on"] = True
        try:
            return fn(*args, **kwargs)
        finally:
            TRACED_CHECKS["on"] = False

    run = jax.jit(checkify.checkify(body, errors=checkify.user_checks))

    def call(*args, **kwargs):
        err, out = run(*args, **kwargs)
        message = err.get()
        if message is not None:
            raise ValueError(message.splitlines()[0].removesuffix(" (`check` failed)"))
        return out

    return call


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
