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


# ----------------------------------------------------------------------------- memory, predicted
@pytest.mark.parametrize("kind,key", [("lm", "llama_gqa"), ("lm", "t5bias_sliding_window"), ("seq2seq", "separate_untied_pre")])
def test_request_bytes_counts_the_cache_generate_builds(kind, key):
    """request_bytes' KV cache, from shapes alone, is the bytes of the cache the model builds
    (a sliding-window LM's ring layers hold their window, seq2seq its cross-attention keys)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    cfg = (LMS if kind == "lm" else S2S)[key]
    _, model = pair(kind, cfg)
    gen = GenerationConfig(max_new_tokens=9, strategy="beam", num_beams=3)
    parts = jgen.request_bytes(kind, cfg, 2, 7, gen)
    cache = model.init_cache(6, 7 + 9) if kind == "lm" else model.init_cache(jnp.zeros((6, 7, cfg.d_model)), 1 + 9)
    built = sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(cache) if hasattr(x, "shape"))
    assert parts["KV cache"] == built > 0, (parts, built)


def test_cli_generate_refuses_a_request_that_cannot_fit(tmp_path, capsys, monkeypatch):
    """Issue 51 §4: before the cache is allocated, the request's bytes against the memory
    available: one line with the numbers (exit 2) when it cannot fit, the run when it can."""
    from jaxformer import memory
    cfg = LMS["gpt2"]
    t, _ = pair("lm", cfg)
    p = tmp_path / "lm.safetensors"
    convert.write_safetensors(str(p), {k: v.numpy() for k, v in t.state_dict().items()},
                              {"format": "pt", **convert.model_metadata("lm", cfg)})
    argv = ["generate", "--weights", str(p), "--ids", "--prompt", "5 6 7", "--prompt", "8", "--max-new-tokens", "6",
            "--strategy", "beam", "--num-beams", "4"]
    need = sum(jgen.request_bytes("lm", cfg, 2, 3, GenerationConfig(max_new_tokens=6, strategy="beam",
                                                                   num_beams=4)).values())
    monkeypatch.setattr(memory, "available_bytes", lambda host=False: (need - 1, "this host"))
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "generating 6 tokens for 8 row(s) of up to 3 prompt tokens (KV cache" in err[0] \
        and "fewer prompts, beams or --max-new-tokens" in err[0], err
    monkeypatch.setattr(memory, "available_bytes", lambda host=False: (need, "this host"))
    assert cli.main(argv) == 0
