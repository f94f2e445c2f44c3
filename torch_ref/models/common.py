"""Helpers shared by the text models (classifier, seq2seq, lm): input checks at the model
boundary, positions from an attention mask, compute dtype. Twin: jaxformer/models/common.py."""
from __future__ import annotations

import contextlib
import dataclasses

import numpy as np
import torch

from jaxformer.config.inputs import check_finite, check_float_kind, check_int_kind, check_mask_values
from torch_ref.layers.embedding import check_ids, check_length

COMPUTE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclasses.dataclass(frozen=True)
class LMOutput:
    """What LM returns when a call asks for more than the logits (a cache, intermediates or
    aux); None where not asked (the JAX twin's fields).
    logits [B, T, V] float32; cache: the updated KV cache; intermediates {name: tensor} (with
    return_attention also "layers.i.attn_weights" [B, H, T, T]); aux {"router_logits",
    "expert_load"} (MoE)."""
    logits: torch.Tensor
    cache: list | None = None
    intermediates: dict | None = None
    aux: dict | None = None

    @property
    def attention(self) -> dict | None:
        """The attention weights among the intermediates {name: [B, H, T, S]}, or None."""
        if self.intermediates is None:
            return None
        return {k: v for k, v in self.intermediates.items() if k.endswith("attn_weights")} or None


def check_tokens(ids, vocab_size: int, max_len: int | None, what: str = "token id") -> None:
    """ValueError for ids that are not an integer [batch, length] tensor, a sequence longer than
    max_len, or an id outside [0, vocab_size) (the JAX tree's checks and messages)."""
    if not hasattr(ids, "dim"):
        raise ValueError(f"{what}s must be an array [batch, length], got {type(ids).__name__}")
    if ids.dim() != 2:
        raise ValueError(f"{what}s must be [batch, length], got shape {tuple(ids.shape)}")
    check_int_kind(_kind(ids), _dtype_name(ids), what)
    if max_len is not None:
        check_length(ids.shape[1], max_len, f"{what} sequence length")
    check_ids(ids, vocab_size, what, "vocab_size")


def check_mask(mask, shape: tuple | None, what: str = "attention_mask") -> None:
    """ValueError for a mask not of `shape` ([B, T]; None: the caller checks it), or holding
    anything but 0 and 1 (a NaN or an additive mask would read as tokens)."""
    if mask is None:
        return
    if not hasattr(mask, "shape") or (shape is not None and tuple(mask.shape) != tuple(shape)):
        got = tuple(mask.shape) if hasattr(mask, "shape") else type(mask).__name__
        raise ValueError(f"{what} must be [batch, length] = {tuple(shape)}, got {got}")
    values = _host(mask)
    if values is not None:
        check_mask_values(values, what)


def check_int_input(x, what: str) -> None:
    """ValueError for integer inputs given as floats or bools (segment ids, positions)."""
    if x is not None:
        check_int_kind(_kind(x), _dtype_name(x), what)


def check_values(x, what: str) -> None:
    """Images or series: ValueError unless floating point and finite."""
    check_float_kind(_kind(x), _dtype_name(x), what)
    values = _host(x)
    if values is not None:
        check_finite(values, what)


def _kind(x: torch.Tensor) -> str:
    """The numpy dtype kind of a tensor's dtype (bfloat16 included)."""
    if x.dtype == torch.bool:
        return "b"
    return "f" if x.dtype.is_floating_point else "c" if x.dtype.is_complex else "i"


def _dtype_name(x: torch.Tensor) -> str:
    return str(x.dtype).removeprefix("torch.")


def _host(x: torch.Tensor) -> np.ndarray | None:
    """A concrete tensor's values on the host; None while torch traces it (torch.export's fake
    and functional tensors are subclasses, and have no values): the checks on values then stay
    out of the traced program, as in the JAX twin, which checks values only on concrete arrays."""
    if torch.compiler.is_compiling() or type(x) not in (torch.Tensor, torch.nn.Parameter):
        return None
    x = x.detach().cpu()
    return (x.float() if x.dtype.is_floating_point else x).numpy()


def positions_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """mask [B, L] (1 = token) -> positions [B, L] that count real tokens only, so a
    left-padded row gets the positions of the unpadded one; pad slots get 0."""
    return (torch.cumsum(mask.long(), dim=1) - 1).clamp(min=0)


def positions_from_segments(segment_ids: torch.Tensor) -> torch.Tensor:
    """segment_ids [B, T] (packed documents) -> positions [B, T] that restart at 0 where
    the id changes, so each document gets the positions it would have alone (RoPE, learned
    and sinusoidal positions alike)."""
    t = segment_ids.shape[1]
    idx = torch.arange(t, device=segment_ids.device).expand(segment_ids.shape)  # [B, T]
    starts = torch.cat([torch.ones_like(segment_ids[:, :1], dtype=torch.bool),
                        segment_ids[:, 1:] != segment_ids[:, :-1]], dim=1)  # [B, T]
    return idx - torch.cummax(torch.where(starts, idx, 0), dim=1).values


def compute_dtype(name: str):
    return COMPUTE_DTYPES[name]


def autocast(name: str, device: torch.device):
    """bf16 compute with fp32 params: torch.autocast (Linear/matmul/SDPA in bf16; embeddings,
    norms and the residual stream stay fp32). The JAX twin sets nnx.Linear's dtype instead."""
    if name == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=COMPUTE_DTYPES[name])
