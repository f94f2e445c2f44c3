"""Trained weights as a product: `jaxformer.load` reads run dirs (model/last, model/best, step
N of JAX and torch runs), model checkpoint dirs and HF dirs; `jaxformer export` writes a run's
weights as a model checkpoint, torch safetensors or a Hugging Face dir; `generate --weights
RUN_DIR` works; a run with model.scan_layers: true trains, samples and exits 0; the end-of-run
sample never fails a run; and the HF fine-tune flow (README, docs/huggingface.md) exports the
fine-tuned weights, which transformers loads and runs to jaxformer's logits."""
from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import jit_call

import jaxformer
from jaxformer import checkpoint_io, cli, convert

TINY = ["model.d_model=32", "model.num_heads=4", "model.d_ff=64", "model.num_layers=2", "model.max_len=32",
        "data.seq_len=16", "train.batch_size=4", "train.eval_batches=1", "train.async_checkpoint=false"]


def train(workdir: str, *sets: str, config: str = "lm") -> tuple[int, str]:
    """`jaxformer train` in-process -> (exit code, stdout)."""
    argv = ["train", "--config", config, "--workdir", workdir, "--no-progress"]
    for s in sets:
        argv += ["--set", s]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(argv)
    return code, out.getvalue()


def params(model) -> dict:
    return {k: np.asarray(v) for k, v in convert.flax_to_torch_arrays(model).items()}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A GPT-2-flavoured LM run with model.scan_layers: true (checkpoints at steps 2 and 4),
    plus RUN/model/last as the trainer writes it (checkpoint_io.save_model of the last step)."""
    wd = str(tmp_path_factory.mktemp("run") / "lm")
    code, out = train(wd, *TINY, "model.scan_layers=true", "train.steps=4", "train.checkpoint_every=2",
                      "train.eval_every=2", "train.keep_checkpoints=2", "train.sample_tokens=4")
    assert code == 0, out
    assert "  greedy:  " in out and "  sampled: " in out, out  # the scanned stack decodes with its KV cache
    name, cfg, model = checkpoint_io.load_run(wd, 4)
    checkpoint_io.save_model(model, name, cfg, os.path.join(wd, "model", "last"))
    return wd


def test_load_reads_every_step_of_a_run(run_dir):
    model, cfg = jaxformer.load(run_dir)
    assert cfg.scan_layers and checkpoint_io.model_name(model) == "lm"
    assert model.decoder.layers.self_attn.dropout.deterministic  # eval mode
    last = params(model)
    step4 = params(jaxformer.load(run_dir, step=4)[0])
    step2 = params(jaxformer.load(run_dir, step="2")[0])
    best = params(jaxformer.load(run_dir, step="best")[0])  # checkpoints/best.json: step 4
    assert last.keys() == step2.keys()
    for k in last:
        np.testing.assert_array_equal(last[k], step4[k])
        np.testing.assert_array_equal(last[k], best[k])
    assert any(not np.array_equal(last[k], step2[k]) for k in last)  # step 2 is another point


def test_export_to_flax_torch_and_hf(run_dir, tmp_path, capsys):
    import safetensors.numpy
    trained = params(jaxformer.load(run_dir)[0])
    out = {"flax": str(tmp_path / "flax"), "torch": str(tmp_path / "lm.safetensors"), "hf": str(tmp_path / "hf")}
    for to, path in out.items():
        assert cli.main(["export", run_dir, "--to", to, path]) == 0
    # flax: a model checkpoint dir; torch: the torch_ref state dict with metadata convert reads
    for path in (out["flax"], out["hf"]):
        got = params(jaxformer.load(path)[0])
        assert got.keys() == trained.keys()
        for k in trained:
            np.testing.assert_array_equal(got[k], trained[k])
    # the byte tokenizer goes with the HF export, its special tokens named, pad the model's
    tok_config = json.loads(Path(os.path.join(out["hf"], "tokenizer_config.json")).read_text())
    assert (tok_config["pad_token"], tok_config["eos_token"], tok_config["bos_token"]) == ("<pad>", "<eos>", "<bos>")
    transformers = pytest.importorskip("transformers")
    hf_tok = transformers.AutoTokenizer.from_pretrained(out["hf"])
    assert hf_tok.pad_token_id == json.loads(Path(os.path.join(out["hf"], "config.json")).read_text())["pad_token_id"] == 0
    tensors = safetensors.numpy.load_file(out["torch"])
    assert tensors.keys() == trained.keys()
    for k in trained:
        np.testing.assert_array_equal(tensors[k], trained[k])
    assert cli.main(["convert", "--to", "flax", out["torch"], str(tmp_path / "back.safetensors")]) == 0
    # generate reads the run dir, the export and the torch file to the same ids
    capsys.readouterr()
    ids = []
    for weights in (run_dir, out["flax"], out["torch"]):
        assert cli.main(["generate", "--weights", weights, "--ids", "--prompt", "72 101 108", "--max-new-tokens", "6",
                         "--no-eos-stop", "--json"]) == 0
        ids.append(json.loads(capsys.readouterr().out)["tokens"])
    assert ids[0] == ids[1] == ids[2] and len(ids[0][0]) == 6


def test_hf_finetune_exports_the_finetuned_weights(tmp_path, monkeypatch):
    """The documented flow (README, docs/huggingface.md): convert --from hf, train from
    OUT/train.yaml (init_from), export --to hf; transformers loads the export and computes
    jaxformer's logits on the fine-tuned weights. The run's end-of-run sample is made to fail
    (generate raises): the run still exits 0 and says "sample skipped: <why>" in one line."""
    from jaxformer import generation

    def broken(*a, **k):
        raise RuntimeError("boom\nsecond line")
    monkeypatch.setattr(generation, "generate", broken)
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import safetensors.numpy
    torch.manual_seed(0)
    hf_cfg = transformers.LlamaConfig(vocab_size=260, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                      rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=1,
                                      eos_token_id=2, pad_token_id=0)
    src = str(tmp_path / "hf_in")
    transformers.LlamaForCausalLM(hf_cfg).save_pretrained(src, safe_serialization=True)
    ckpt, run, out = str(tmp_path / "ckpt"), str(tmp_path / "run"), str(tmp_path / "hf_out")
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(["convert", "--from", "hf", src, "--to", "flax", ckpt]) == 0
    code, log = train(run, "train.steps=3", "train.batch_size=4", "train.lr=1e-2", "train.warmup_steps=1",
                      "train.eval_every=3", "train.eval_batches=1", "train.checkpoint_every=3",
                      "train.sample_tokens=4", "data.seq_len=16", config=os.path.join(ckpt, "train.yaml"))
    assert code == 0, log
    assert "sample skipped: RuntimeError: boom\n" in log, log
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(["export", run, "--to", "hf", out]) == 0
    # (a) the export holds the fine-tuned weights, not the imported ones
    before = safetensors.numpy.load_file(os.path.join(src, "model.safetensors"))
    after = safetensors.numpy.load_file(os.path.join(out, "model.safetensors"))
    assert before.keys() == after.keys()
    changed = [k for k in before if not np.array_equal(before[k], after[k])]
    assert len(changed) == len(before), sorted(set(before) - set(changed))  # every tensor trained
    # (b) transformers on the export == jaxformer on the run's final weights
    model, cfg = jaxformer.load(run)
    ids = np.random.default_rng(0).integers(3, 259, size=(2, 12)).astype(np.int32)
    ours = np.asarray(jit_call(model, ids))  # one compiled forward, not hundreds of eager ops
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = hf(torch.as_tensor(ids, dtype=torch.long)).logits.numpy()
    diff = float(np.abs(ours - theirs).max())
    tol = 1e-5 * max(1.0, float(np.abs(ours).max()))
    print(f"[hf fine-tune export] max |logit diff| transformers vs jaxformer {diff:.3e} (tol {tol:.1e})")
    assert diff <= tol
    assert yaml.safe_load(Path(os.path.join(run, "config.yaml")).read_text())["train"]["init_from"] == ckpt


def test_load_reads_a_torch_run_step(tmp_path):
    """A torch run's step N (checkpoints/step_N/model.safetensors, a torch_ref state dict) is
    read with the model section of the run's config.yaml and converted strictly."""
    from jaxformer.config import to_dict
    from jaxformer.config.models import LMConfig
    from torch_ref.models import build_model
    cfg = LMConfig.tiny("llama")
    module = build_model("lm", cfg, seed=3)
    run = tmp_path / "run"
    (run / "checkpoints" / "step_3").mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({"model": {"name": "lm", **to_dict(cfg)},
                                                     "data": {"name": "stdlib_docs"}}))
    convert.write_safetensors(str(run / "checkpoints" / "step_3" / "model.safetensors"),
                              {k: v.detach().numpy() for k, v in module.state_dict().items()}, {"format": "pt"})
    model, got_cfg = jaxformer.load(str(run), step=3)
    assert got_cfg == cfg
    got = params(model)
    assert got.keys() == module.state_dict().keys()
    for k, v in module.state_dict().items():
        np.testing.assert_array_equal(got[k], v.numpy())
    assert params(jaxformer.load(str(run))[0]).keys() == got.keys()  # "last": the newest step, 3
