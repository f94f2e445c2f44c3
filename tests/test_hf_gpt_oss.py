"""gpt-oss (jaxformer/hf/gpt_oss.py) against transformers 5.x GptOssForCausalLM, on odd tiny
random configs (no download; rows of tests/hf_rows.py, whose fp32 logits, greedy and beam ids
and export round trip tests/test_hf_table.py checks): the fused, interleaved gate_up_proj split
into gate and up, an MXFP4 checkpoint (blocks + scales, quantization_config mxfp4) imports as
transformers dequantizes it, and unimplemented options are refused by name."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from helpers import check_hf_logits, hf_lm_logits, randomize
from hf_helpers import built, lm_logits
from hf_rows import row

from jaxformer import hf
from jaxformer.config import ConfigError
from jaxformer.parity import setup_precision

T = pytest.importorskip("transformers")
ROW = row("gpt_oss/default_layers_yarn_limit")
IDS, MASK = ROW.inputs()


@pytest.fixture(autouse=True)
def _precision():
    setup_precision()


def test_interleaved_gate_up_maps_to_gate_and_up(tmp_path_factory):
    hf_model, _, (model, _, _) = built(ROW, tmp_path_factory)
    fused = hf_model.model.layers[1].mlp.experts.gate_up_proj.detach().numpy()  # [E, D, 2F]
    experts = model.decoder.layers[1].ffn.experts
    np.testing.assert_array_equal(np.asarray(experts.gate_proj[...]), np.swapaxes(fused[:, :, 0::2], 1, 2))
    np.testing.assert_array_equal(np.asarray(experts.up_proj[...]), np.swapaxes(fused[:, :, 1::2], 1, 2))


def test_mxfp4_checkpoint_imports_as_transformers_dequantizes(tmp_path):
    """Expert weights stored as MXFP4 blocks + scales (what published gpt-oss checkpoints hold):
    the import equals an HF model holding transformers' own dequantization of the same bytes."""
    from safetensors.numpy import load_file, save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    kw = dict(ROW.config, intermediate_size=32)  # F and D multiples of 32
    torch.manual_seed(1)
    ref = randomize(T.GptOssForCausalLM(T.GptOssConfig(**kw)))
    ref.save_pretrained(tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    rng = np.random.RandomState(0)
    for key in [k for k in tensors if k.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        e, cols, rows = tensors.pop(key).shape  # [E, G * 32, R]
        blocks = rng.randint(0, 256, (e, rows, cols // 32, 16)).astype(np.uint8)
        scales = rng.randint(120, 126, (e, rows, cols // 32)).astype(np.uint8)
        tensors[f"{key}_blocks"], tensors[f"{key}_scales"] = blocks, scales
        weight = convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales), dtype=torch.float32)
        with torch.no_grad():
            ref.get_parameter(key).copy_(weight)
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    raw = json.loads((tmp_path / "config.json").read_text())
    raw["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    model, _, _, report = hf.from_pretrained(str(tmp_path), return_report=True)
    assert any("MXFP4" in n for n in report["notes"])
    check_hf_logits("mxfp4", hf_lm_logits(ref, IDS, MASK), lm_logits(model, IDS, MASK), MASK)


REFUSED = {  # config.json changes -> the option the error names
    "quant": (dict(quantization_config={"quant_method": "fp8"}), "quantization_config"),
    "act": (dict(hidden_act="gelu"), "hidden_act"),
    "experts_per_token": (dict(experts_per_token=3), "experts_per_token"),
    "layer_types": (dict(layer_types=["chunked_attention"] * 3), "layer_types"),
    "unknown": (dict(router_jitter_noise=0.1), "router_jitter_noise"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unimplemented_options_are_refused_by_name(case, tmp_path_factory):
    changes, word = REFUSED[case]
    with open(os.path.join(built(ROW, tmp_path_factory)[1], "config.json")) as f:
        raw = {**json.load(f), **changes}
    fam, arch = hf.family_for_architecture(raw)
    with pytest.raises(ConfigError, match=word):
        fam.config_from_hf(raw, arch)
