"""Byte-level tokenizer shared by the text datasets: id = byte + 3; 0 pad, 1 bos/[CLS], 2 eos."""
from __future__ import annotations

import numpy as np

PAD, BOS, EOS, OFFSET = 0, 1, 2, 3
VOCAB_SIZE = 256 + OFFSET


def encode(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32) + OFFSET


def decode(ids) -> str:
    out = bytes(int(i) - OFFSET for i in ids if int(i) >= OFFSET)
    return out.decode("utf-8", errors="replace")


def pad_to(ids: np.ndarray, length: int, pad: int = PAD) -> np.ndarray:
    if len(ids) > length:
        raise ValueError(f"sequence of {len(ids)} tokens exceeds {length}")
    return np.concatenate([ids, np.full(length - len(ids), pad, np.int32)]).astype(np.int32)
