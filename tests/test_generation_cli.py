"""The `jaxformer generate` CLI: ids from converted weights (torch and flax layouts) and from a
model checkpoint directory equal jaxformer.generation's, in both frameworks; clear errors."""
from __future__ import annotations

import json

import pytest
from generation_helpers import LMS, S2S, SOURCES, pair

from jaxformer import cli, convert
from jaxformer import generation as jgen
from jaxformer.config.models import GenerationConfig


# ----------------------------------------------------------------------------- CLI
@pytest.mark.parametrize("layout", ["torch", "flax"])
@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_cli_generate_from_converted_weights(tmp_path, capsys, layout, framework):
    cfg = LMS["llama_gqa"]
    t, j = pair("lm", cfg)
    pt = tmp_path / "lm.safetensors"
    convert.write_safetensors(str(pt), {k: v.numpy() for k, v in t.state_dict().items()},
                              {"format": "pt", **convert.model_metadata("lm", cfg)})
    path = pt
    if layout == "flax":
        path = tmp_path / "lm_flax.safetensors"
        convert.convert_file(str(pt), str(path), to="flax")
    chunked = ["--prefill-chunk", "3"] if layout == "flax" else []  # the same ids (docs/numerics.md §31)
    rc = cli.main(["generate", "--weights", str(path), "--framework", framework, "--ids", "--prompt", "5 6 7 8 9",
                   "--prompt", "3 4", "--max-new-tokens", "10", "--no-eos-stop", "--json", *chunked])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    ids, mask = jgen.pad_prompts([[5, 6, 7, 8, 9], [3, 4]], 0)
    expected = jgen.lm_generate(j, ids, mask, GenerationConfig(max_new_tokens=10, stop_at_eos=False))
    assert out["tokens"] == expected.tolist()


@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_cli_generate_from_model_checkpoint_dir(tmp_path, capsys, framework):
    from jaxformer import checkpoint_io
    cfg = S2S["shared_tied"]
    _, j = pair("seq2seq", cfg)
    checkpoint_io.save_model(j, "seq2seq", cfg, str(tmp_path / "ckpt"))
    rc = cli.main(["generate", "--weights", str(tmp_path / "ckpt"), "--framework", framework, "--ids",
                   "--prompt", "5 6 7 8 9", "--prompt", "17 18", "--max-new-tokens", "8", "--no-eos-stop",
                   "--json"])
    assert rc == 0
    expected = jgen.seq2seq_generate(j, SOURCES[[0, 2], :5], gen=GenerationConfig(max_new_tokens=8, stop_at_eos=False))
    assert json.loads(capsys.readouterr().out)["tokens"] == expected.tolist()


def test_cli_generate_errors_clearly(tmp_path, capsys):
    rc = cli.main(["generate", "--weights", str(tmp_path), "--config", "configs/lm.yaml", "--prompt", "5"])
    assert rc == 2 and "not a run dir, model checkpoint or HF dir" in capsys.readouterr().err
    cfg = LMS["gpt2"]
    t, _ = pair("lm", cfg)
    p = tmp_path / "lm.safetensors"
    convert.write_safetensors(str(p), {k: v.numpy() for k, v in t.state_dict().items()},
                              {"format": "pt", **convert.model_metadata("lm", cfg)})
    rc = cli.main(["generate", "--weights", str(p), "--ids", "--prompt", f"5 {cfg.vocab_size}"])
    assert rc == 2 and "out of range" in capsys.readouterr().err
    rc = cli.main(["generate", "--weights", str(p), "--ids", "--prompt", "5 6", "--prefill-chunk", "0"])
    err = capsys.readouterr().err
    assert rc == 2 and "prefill_chunk: must be a positive int, got 0" in err and len(err.strip().splitlines()) == 1
