"""MXFP4 dequantization (jaxformer/hf/mxfp4.py) bit for bit against transformers' own
convert_moe_packed_tensors on random blocks and scales (every code, every scale byte), in
fp32 and bf16; the checkpoint view that pairs blocks with scales; refusals."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from jaxformer.convert import ConversionError, to_numpy
from jaxformer.hf import mxfp4
from jaxformer.hf.files import HFCheckpoint


def _random(e=3, r=5, g=20, seed=0, scales=(0, 256)):
    rng = np.random.RandomState(seed)
    sc = rng.randint(*scales, (e, r, g)).astype(np.uint8)
    if scales == (0, 256):  # every scale byte at least once, 0 and 255 included
        sc.reshape(-1)[:256] = rng.permutation(256)
    return rng.randint(0, 256, (e, r, g, 16)).astype(np.uint8), sc


def _bits(x: np.ndarray) -> np.ndarray:
    return x.view(np.uint16 if x.dtype.itemsize == 2 else np.uint32)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("scales", [(0, 256), (110, 140)], ids=["every_byte", "realistic"])
def test_dequantize_matches_transformers_bit_for_bit(dtype, scales):
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    blocks, sc = _random(scales=scales)
    ref = to_numpy(convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(sc),
                                              dtype=getattr(torch, dtype)))
    ours = mxfp4.dequantize(blocks, sc, dtype)
    assert ours.shape == ref.shape == (3, 20 * 32, 5) and ours.dtype == ref.dtype
    assert np.array_equal(_bits(ours), _bits(ref)), "not bit-identical"
    if scales == (0, 256):  # the edge bytes are in the draw: overflow to inf, and subnormals
        assert np.isinf(ref.astype(np.float32)).any() and (np.abs(ref.astype(np.float32)) < 2.0 ** -126).any()


def test_dequantize_orientation_by_hand():
    blocks = np.zeros((1, 2, 1, 16), np.uint8)
    blocks[0, 1, 0, 0] = 0x72  # row 1: element 0 = code 2 (1.0), element 1 = code 7 (6.0)
    scales = np.full((1, 2, 1), 128, np.uint8)  # x 2
    out = mxfp4.dequantize(blocks, scales)  # [E, G * 32, R]
    assert out.shape == (1, 32, 2) and out[0, 0, 1] == 2.0 and out[0, 1, 1] == 12.0
    assert np.count_nonzero(out) == 2


def test_refusals():
    blocks, sc = _random()
    with pytest.raises(ValueError, match="dtype"):
        mxfp4.dequantize(blocks, sc, "float16")
    with pytest.raises(ValueError, match="scales"):
        mxfp4.dequantize(blocks, sc[:, :, :2])
    with pytest.raises(ValueError, match="uint8"):
        mxfp4.dequantize(blocks.astype(np.int32), sc)


def _write(tmp_path, tensors):
    from safetensors.numpy import save_file
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GptOssForCausalLM"]}))
    return HFCheckpoint(str(tmp_path))


def test_checkpoint_view_pairs_blocks_with_scales(tmp_path):
    blocks, sc = _random()
    other = np.ones((2, 3), np.float32)
    ckpt = _write(tmp_path, {"e.gate_up_proj_blocks": blocks, "e.gate_up_proj_scales": sc, "w": other})
    view = mxfp4.unpacked(ckpt, "float32")
    assert sorted(view.tensors) == ["e.gate_up_proj", "w"]
    assert view.tensors["e.gate_up_proj"].shape == (3, 640, 5)
    assert view.shard_keys(view.shards[0]) == list(view.tensors)
    np.testing.assert_array_equal(view.read("e.gate_up_proj"), mxfp4.dequantize(blocks, sc, "float32"))
    np.testing.assert_array_equal(view.read("w"), other)
    assert mxfp4.unpacked(_write(tmp_path, {"w": other})).__class__ is HFCheckpoint  # nothing to unpack


def test_checkpoint_view_refuses_an_unpaired_tensor(tmp_path):
    blocks, _ = _random()
    with pytest.raises(ConversionError, match="has no e.down_proj_scales"):
        mxfp4.unpacked(_write(tmp_path, {"e.down_proj_blocks": blocks}))
