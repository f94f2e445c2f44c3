"""Checks of model and generation inputs that the frameworks do not make: framework-free
(numpy), shared by jaxformer and torch_ref so that both trees refuse the same inputs with the
same one-line ValueError.

Each check runs at a Python boundary, on concrete values (numpy arrays, or a framework's
arrays brought to the host by the caller), before anything is traced: a model's __call__ /
forward when its inputs are concrete, and the generate functions before their one jitted
program. Nothing here enters a traced program, so a jitted step computes exactly what it
computed without the checks. Dtype and rank checks need no values and also hold inside jit.
"""
from __future__ import annotations

import numpy as np

# numpy dtype kinds: signed and unsigned integers are ids; b bool, f float, c complex, U/S text, O objects
_INT_KINDS = "iu"


def check_int_kind(kind: str, dtype_name: str, what: str) -> None:
    """ValueError unless `kind` (a numpy dtype kind, or the caller's equivalent for torch) is
    an integer kind: float ids would be truncated by a cast (3.7 -> 3), bool ids read as 0/1."""
    if kind not in _INT_KINDS:
        raise ValueError(f"{what}s must be integers, got dtype {dtype_name}")


def as_host_array(x, what: str) -> np.ndarray:
    """A list / numpy array / framework array on the host -> numpy, or one ValueError for
    ragged rows (lists of different lengths) and non-numeric values."""
    try:
        arr = np.asarray(x)
    except ValueError as e:  # ragged nested lists
        raise ValueError(f"{what}s: rows of different lengths ({str(e).splitlines()[0][:80]}); "
                         f"pad them to one array (pad_prompts left-pads prompts)") from None
    if arr.dtype.kind not in "iubfc":
        raise ValueError(f"{what}s must be numbers, got dtype {arr.dtype}")
    return arr


def _where(arr: np.ndarray, bad: np.ndarray) -> str:
    """'[b, t]' of the first True entry of bad."""
    return "[" + ", ".join(str(int(i)) for i in np.argwhere(bad)[0]) + "]"


def check_mask_values(mask: np.ndarray, what: str = "attention_mask") -> None:
    """ValueError unless every entry of a concrete mask is 0 (padding) or 1 (token): a NaN, an
    additive mask (0 / -inf), 0.5 or 2 would be read as "token" by a cast to bool or int; and
    for a row of padding only (check_rows_have_tokens)."""
    mask = np.asarray(mask)
    if mask.size == 0:
        return
    if mask.dtype.kind == "b":
        check_rows_have_tokens(mask, what)
        return
    if mask.dtype.kind not in "iuf":
        raise ValueError(f"{what} must be 0/1 (or bool), got dtype {mask.dtype}")
    bad = (mask != 0) & (mask != 1)  # NaN compares unequal to both
    if bad.any():
        value = mask[tuple(np.argwhere(bad)[0])]
        raise ValueError(f"{what} holds {value} at {_where(mask, bad)}: a mask is 1 (token) or 0 "
                         f"(padding), bool or int, never additive (0 / -inf) or NaN")
    check_rows_have_tokens(mask, what)


def check_rows_have_tokens(mask: np.ndarray, what: str = "attention_mask") -> None:
    """ValueError for a concrete [batch, length] mask with a row of padding only: its queries
    see no key, so attention gives them exactly 0 (docs/numerics.md §4) and the row's outputs
    (logits, a pooled vector) are finite numbers that mean nothing."""
    mask = np.asarray(mask)
    if mask.ndim != 2 or mask.shape[1] == 0:
        return
    empty = ~(mask != 0).any(axis=1)
    if empty.any():
        raise ValueError(f"{what} row {int(np.argmax(empty))} is all padding: every row needs at least one "
                         f"token (a row with no key to attend to computes outputs that mean nothing)")


def check_finite(x: np.ndarray, what: str) -> None:
    """ValueError for a NaN or inf in a concrete float input (images, series), where the model
    would spread it to every output of the row."""
    x = np.asarray(x)
    if x.dtype.kind != "f" or x.size == 0:
        return
    bad = ~np.isfinite(x)
    if bad.any():
        value = x[tuple(np.argwhere(bad)[0])]
        raise ValueError(f"{what} hold {value} at {_where(x, bad)}: inputs must be finite "
                         f"(fill missing values before calling the model)")


def check_float_kind(kind: str, dtype_name: str, what: str) -> None:
    """ValueError unless a pixel/value input is floating point: an integer image (uint8 0-255)
    would enter the patch conv as integers."""
    if kind != "f":
        raise ValueError(f"{what} must be floating point, got dtype {dtype_name}; convert them "
                         f"as the model was trained (e.g. uint8 pixels: x.astype(float32) / 255, "
                         f"then normalize)")


def check_left_padded(mask: np.ndarray) -> None:
    """ValueError for a prompt mask row that ends in padding (right padding): an LM generates
    after the last slot of every row, so a right-padded row would continue from a pad token."""
    mask = np.asarray(mask)
    if mask.shape[1] == 0:
        raise ValueError("every prompt needs at least one token (the prompts have length 0)")
    ends = mask[:, -1] == 0
    if ends.any():
        row = int(np.argmax(ends))
        raise ValueError(f"attention_mask row {row} ends in padding (a right-padded prompt): generation "
                         f"continues after each row's last slot, so prompts must be left-padded "
                         f"(pad_prompts, or a tokenizer with padding_side='left')")


def check_generation_mask(mask: np.ndarray, shape: tuple, what: str = "attention_mask") -> np.ndarray:
    """A concrete generation mask (given by the caller) -> int32 [B, P], or ValueError for a
    shape other than the ids', entries other than 0/1, or a row without a token."""
    mask = as_host_array(mask, what)
    if mask.shape != tuple(shape):
        raise ValueError(f"{what} shape {mask.shape} != ids shape {tuple(shape)}")
    check_mask_values(mask, what)
    mask = mask.astype(np.int32)
    if (mask.sum(axis=1) == 0).any():
        raise ValueError(f"every prompt needs at least one token (row {int(np.argmax(mask.sum(axis=1) == 0))} "
                         f"of {what} is all 0)")
    return mask


def check_eos_in_vocab(eos: tuple[int, ...], vocab_size: int) -> None:
    """ValueError for a caller's eos id (GenerationConfig.eos_id) outside [0, vocab_size): it
    can never be generated, so generation would never stop at it. (A model config's own eos may
    lie outside: HF checkpoints carry such metadata, noted at import.)"""
    outside = [e for e in eos if e >= vocab_size]
    if outside:
        raise ValueError(f"eos_id {outside[0]} is out of range [0, {vocab_size}) (vocab_size={vocab_size}): "
                         f"the model can never generate it")
