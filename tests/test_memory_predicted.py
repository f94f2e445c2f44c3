"""Issue 51 §4: before allocating, `convert --from hf` checks what it needs (the stream's peak
host memory and the output's disk space; an HF model read into memory, its weights) against
what is available: a request that cannot fit is one line with the numbers, exit 2, nothing
written. `generate`'s own check: tests/test_generation_cli.py."""
from __future__ import annotations

import collections
import os
import shutil

import pytest

from jaxformer import cli, hf, memory

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    import torch
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("hf") / "llama"
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, max_position_embeddings=16)
    transformers.LlamaForCausalLM(cfg).save_pretrained(str(path))
    return str(path)


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_convert_refuses_a_stream_the_host_cannot_hold(hf_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    monkeypatch.setattr(memory, "available_bytes", lambda host=False: (1 << 20, "this host"))  # 1 MiB < 256 MiB batch
    assert cli.main(["convert", "--from", "hf", hf_dir, "--to", "flax", str(out)]) == 2
    line = _one_line(capsys)
    assert "converting LlamaForCausalLM (its largest tensor" in line and "more than the 0.0 GiB available on this host" \
        in line and "lower the batch" in line, line
    assert not out.exists() and os.listdir(tmp_path) == []


def test_convert_refuses_an_output_the_disk_cannot_hold(hf_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "sub" / "out"  # OUT's parent does not exist yet: the free space of its first existing folder
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(1 << 30, 1 << 30, 1000))
    assert cli.main(["convert", "--from", "hf", hf_dir, "--to", "flax", str(out)]) == 2
    line = _one_line(capsys)
    assert "writes 0.0 GiB of weights, more than the 0.0 GiB free on " + str(tmp_path) in line, line
    assert not (tmp_path / "sub").exists()
    monkeypatch.undo()
    assert cli.main(["convert", "--from", "hf", hf_dir, "--to", "flax", str(out)]) == 0  # the same command fits


def test_from_pretrained_checks_the_weights_before_reading(hf_dir, monkeypatch):
    """The weights' bytes as they will be held (the param dtype's), counted on the abstract model."""
    seen = []

    def available(host=False):
        seen.append(host)
        return 1000, "this host"
    monkeypatch.setattr(memory, "available_bytes", available)
    with pytest.raises(ValueError, match=r"LlamaForCausalLM's weights \(float32\) needs [\d.,]+ GiB, more than the "
                                         r"0\.0 GiB available on this host"):
        hf.from_pretrained(hf_dir)
    assert seen == [False]
