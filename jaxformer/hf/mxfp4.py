"""MXFP4 expert weights of published gpt-oss checkpoints, dequantized with numpy
(docs/numerics.md §28).

A checkpoint stores each expert projection `X` (`mlp.experts.gate_up_proj`, `...down_proj`) as
a pair (OCP microscaling MXFP4, blocks of 32 values sharing one power-of-two scale):

    X_blocks  uint8 [E, R, G, 16]   32 E2M1 values per block, two per byte: the low nibble
                                    is the even element, the high nibble the odd one
    X_scales  uint8 [E, R, G]       the block's exponent, biased by 127: value = fp4 * 2^(s - 127)

and dequantizes to [E, G * 32, R]: each expert's [R, G * 32] rows transposed, which is the
orientation of transformers' GptOssExperts parameters (gate_up_proj [E, D, 2F] from R = 2F,
G * 32 = D; down_proj [E, F, D] from R = D, G * 32 = F), as transformers'
integrations/mxfp4.py convert_moe_packed_tensors returns them. The arithmetic follows it so
the bits agree (tests/test_mxfp4.py checks bf16 and fp32 outputs against it): the E2M1
value in fp32, then an exact ldexp by s - 127 (as torch.ldexp: scale byte 255 gives
0.5 * 2^128 = 2^127, finite, and 1 * 2^128 = inf; 0 stays 0), rounded once to the output dtype.

`dequantize` works one expert at a time into the output, so its scratch memory is about one
expert's fp32 values, whatever E. `unpacked(ckpt)` presents a checkpoint's blocks/scales
pairs as the plain tensors `X` to the streaming converter (jaxformer/hf/streaming.py), which
then reads and converts them one tensor at a time like any other.
"""
from __future__ import annotations

import numpy as np

from jaxformer.convert import ConversionError
from jaxformer.hf.files import TensorInfo, np_dtype

# the 16 E2M1 codes: sign bit 3, then exponent 2 bits and mantissa 1 bit (OCP MX spec, table 5)
FP4_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                       -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32)
BLOCK = 32  # values per scale
SCALE_BIAS = 127
DTYPES = ("float32", "bfloat16")


def _check(blocks_shape: tuple, scales_shape: tuple, what: str = "") -> list[str]:
    tag = f"{what}: " if what else ""
    if len(blocks_shape) != 4 or blocks_shape[-1] != BLOCK // 2:
        return [f"{tag}MXFP4 blocks must be uint8 [E, R, G, {BLOCK // 2}], got shape {blocks_shape}"]
    if tuple(scales_shape) != tuple(blocks_shape[:-1]):
        return [f"{tag}MXFP4 scales {tuple(scales_shape)} must be the blocks' {tuple(blocks_shape[:-1])}"]
    return []


def dequantize_expert(blocks: np.ndarray, scales: np.ndarray, dtype: str = "float32") -> np.ndarray:
    """One expert: blocks uint8 [R, G, 16], scales uint8 [R, G] -> [G * 32, R] in dtype."""
    r, g, _ = blocks.shape
    blocks = np.asarray(blocks, np.uint8)
    values = np.empty((r, g, BLOCK), np.float32)  # [R, G, 32]
    values[..., 0::2] = FP4_VALUES[blocks & 0x0F]
    values[..., 1::2] = FP4_VALUES[blocks >> 4]
    exponents = np.asarray(scales, np.int32)[..., None] - SCALE_BIAS
    with np.errstate(over="ignore"):  # an exact ldexp, as torch's: 0.5 * 2^128 is finite, 1 * 2^128 inf
        values = np.ldexp(values, exponents)
    return values.reshape(r, g * BLOCK).T.astype(np_dtype(dtype))  # [G * 32, R]


def dequantize(blocks: np.ndarray, scales: np.ndarray, dtype: str = "float32") -> np.ndarray:
    """blocks uint8 [E, R, G, 16], scales uint8 [E, R, G] -> [E, G * 32, R] in dtype
    (float32 or bfloat16), one expert at a time."""
    if dtype not in DTYPES:
        raise ValueError(f"MXFP4 dequantization dtype must be one of {DTYPES}, got {dtype!r}")
    problems = _check(tuple(blocks.shape), tuple(scales.shape))
    if problems:
        raise ValueError(problems[0])
    if blocks.dtype != np.uint8 or scales.dtype != np.uint8:
        raise ValueError(f"MXFP4 blocks and scales must be uint8, got {blocks.dtype} and {scales.dtype}")
    e, r, g, _ = blocks.shape
    out = np.empty((e, g * BLOCK, r), np_dtype(dtype))
    for i in range(e):
        out[i] = dequantize_expert(blocks[i], scales[i], dtype)
    return out


class Unpacked:
    """An HFCheckpoint (jaxformer.hf.files) whose MXFP4 pairs `X_blocks` + `X_scales` read as
    one dequantized tensor `X` [E, G * 32, R] in `dtype`, listed in the blocks' shard; every
    other tensor and attribute is the checkpoint's own."""

    def __init__(self, ckpt, pairs: dict[str, tuple[str, str]], dtype: str):
        self._ckpt, self.pairs, self.dtype = ckpt, pairs, dtype
        self.tensors = {k: v for k, v in ckpt.tensors.items()
                        if not any(k in pair for pair in pairs.values())}
        for name, (b, _) in pairs.items():
            e, r, g, _ = ckpt.tensors[b].shape
            self.tensors[name] = TensorInfo(name, (e, g * BLOCK, r), np_dtype(dtype), ckpt.tensors[b].shard)

    def __getattr__(self, name):  # config, path, shards, format, release, nbytes, ...
        return getattr(self._ckpt, name)

    def shard_keys(self, shard: str) -> list[str]:
        return [k for k, info in self.tensors.items() if info.shard == shard]

    def read(self, key: str) -> np.ndarray:
        if key not in self.pairs:
            return self._ckpt.read(key)
        b, s = self.pairs[key]
        return dequantize(self._ckpt.read(b), self._ckpt.read(s), self.dtype)


def unpacked(ckpt, dtype: str = "bfloat16"):
    """ckpt itself when it holds no `*_blocks` / `*_scales` tensors, else an `Unpacked` view.
    bfloat16 holds every E2M1 value times a normal power of two exactly (2 significant bits);
    the converter then casts to the model's param dtype. A blocks tensor without its scales
    (or the reverse), a non-uint8 one or mismatched shapes: one ConversionError naming each."""
    keys = [k for k in ckpt.tensors if k.endswith(("_blocks", "_scales"))]
    if not keys:
        return ckpt
    pairs, problems = {}, []
    for k in keys:
        base = k.rsplit("_", 1)[0]
        b, s = f"{base}_blocks", f"{base}_scales"
        if b not in ckpt.tensors or s not in ckpt.tensors:
            problems.append(f"MXFP4: {k} has no {s if k == b else b} beside it")
            continue
        if base in pairs:
            continue
        if base in ckpt.tensors:
            problems.append(f"MXFP4: {base} is stored both plain and as {b} + {s}")
        bi, si = ckpt.tensors[b], ckpt.tensors[s]
        if bi.dtype != np.uint8 or si.dtype != np.uint8:
            problems.append(f"MXFP4: {b} and {s} must be uint8, got {bi.dtype} and {si.dtype}")
        problems += _check(bi.shape, si.shape, base)
        pairs[base] = (b, s)
    if problems:
        raise ConversionError(sorted(set(problems)))
    return Unpacked(ckpt, pairs, dtype)

