"""The input pipeline (jaxformer/train/data/pipeline.py) and `data.name: tokens`
(jaxformer/train/data/tokens_data.py): grain reads batch_at's order, per process and from any
step; a tokens directory trains an LM and evaluates; the tokenizer travels with the run and its
models, and a resume with another one is refused; SIGKILL -> resume is exact; a vocab too big, a
truncated or a missing shard fail at config load. (Two real processes, each reading its own rows
of every batch: tests/test_scale.py.)"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import cli_env

from jaxformer.config import ConfigError
from jaxformer.train import data as data_lib
from jaxformer.train.config import config_from_dict
from jaxformer.train.data import pipeline
from jaxformer.train.data.tokens import TokensWriter
from jaxformer.train.jax_trainer import JaxTrainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = 300  # above the byte vocab and below the model's: ids come from a "tokenizer" of 300
MODEL = {"name": "lm", "vocab_size": 320, "max_len": 32, "d_model": 32, "num_heads": 4, "d_ff": 64,
         "num_layers": 2, "dropout": 0.0}
# constant lr: a run given more steps follows a shorter one's trajectory step for step
TRAIN = {"steps": 4, "batch_size": 8, "grad_accum_steps": 2, "lr": 1e-2, "schedule": "constant",
         "warmup_steps": 0, "eval_every": 2, "eval_batches": 2, "checkpoint_every": 2,
         "async_checkpoint": False, "init": "normal_0.02"}


def write_tokens(path, *, seed=0, vocab=VOCAB, sha="a" * 64, shard_tokens=700, docs=60):
    """A tokens directory of `docs` documents (runs of consecutive ids in [3, vocab), from random
    starts) with a tokenizer file,
    written as `jaxformer data prepare` does, in shards of about `shard_tokens` ids."""
    rng = np.random.default_rng(seed)
    tok_file = os.path.join(os.path.dirname(str(path)), f"tokenizer-{seed}.json")
    with open(tok_file, "w") as f:
        json.dump({"model": {"type": "test", "seed": seed}}, f)
    record = {"spec": "test", "kind": "tokenizers", "file": "tokenizer.json", "sha256": sha}
    with TokensWriter(str(path), vocab_size=vocab, eos_id=2, tokenizer=record, overwrite=True,
                      shard_tokens=shard_tokens) as w:
        for i in range(docs):
            start, length = rng.integers(3, vocab), rng.integers(5, 60)  # counting: learnable
            w.add("eval" if i % 6 == 5 else "train", (start - 3 + np.arange(length)) % (vocab - 3) + 3)
        w.files["tokenizer.json"] = tok_file
    return str(path)


def tokens_cfg(path, parallel=None, **train):
    raw = {"model": dict(MODEL), "data": {"name": "tokens", "path": str(path), "seq_len": 16},
           "train": {**TRAIN, **train}}
    if parallel:
        raw["parallel"] = parallel
    return config_from_dict(raw)


# ------------------------------------------------------------------ order
def test_grain_order_is_batch_at_per_process_and_from_any_step():
    n, bs, accum, seed = 37, 8, 2, 5  # 37 examples: batches straddle epochs
    arrays = {"x": np.arange(n) * 10, "y": np.arange(n)[:, None] + np.zeros((1, 3), np.int64)}
    source = pipeline.ArraySource(arrays)
    expect = [data_lib.batch_at(arrays, s, bs, seed) for s in range(12)]

    def batches(rows, start=0, saved=None):
        it = iter(pipeline.train_dataset(source, batch_size=bs, seed=seed, steps=12, rows=rows))
        try:
            pipeline.start_at(it, start, saved)
            return [next(it) for _ in range(12 - start)], it.get_state()
        finally:
            it.close()

    one, state = batches(pipeline.process_rows(bs, accum))
    assert state == {"next_index": 12}
    for got, want in zip(one, expect, strict=False):
        assert all(np.array_equal(got[k], want[k]) for k in want)
    # two processes: disjoint rows that interleave, per micro-batch, into the one-process batch
    rows = [pipeline.process_rows(bs, accum, i, 2) for i in range(2)]
    assert sorted(np.concatenate(rows).tolist()) == list(range(bs))
    halves = [batches(r)[0] for r in rows]
    for s in range(12):
        for k in arrays:
            parts = [h[s][k].reshape((accum, -1) + h[s][k].shape[1:]) for h in halves]
            glued = np.concatenate(parts, axis=1).reshape(expect[s][k].shape)
            assert np.array_equal(glued, expect[s][k])
    # resume: from a saved state, or from the step alone, the same batches follow
    for saved in ({"next_index": 7}, None):
        later, _ = batches(pipeline.process_rows(bs, accum), 7, saved)
        assert all(np.array_equal(a["x"], b["x"]) for a, b in zip(later, expect[7:], strict=False))
    with pytest.raises(ValueError, match="inconsistent"):
        batches(pipeline.process_rows(bs, accum), 7, {"next_index": 6})


def test_token_windows_pack_documents_across_shards(tmp_path):
    path = write_tokens(tmp_path / "tok")
    meta = json.loads(Path(os.path.join(path, "meta.json")).read_text())
    assert len(meta["splits"]["train"]["shards"]) > 2
    stream = np.concatenate([np.load(os.path.join(path, s["file"])) for s in meta["splits"]["train"]["shards"]])
    train, evaluation = data_lib.load_sources("tokens", tokens_cfg(path).data, 0)
    assert len(train) == (len(stream) - 17) // 16 + 1
    for i in (0, 5, len(train) - 1):  # windows of 17 every 16 ids, across shard boundaries
        np.testing.assert_array_equal(train[i]["tokens"], stream[16 * i: 16 * i + 17])
    assert (stream == 2).sum() == meta["splits"]["train"]["documents"]  # one eos per document
    assert train[0]["tokens"].dtype == np.int32 and len(evaluation) >= 1
    with pytest.raises(IndexError):
        train[len(train)]


# ------------------------------------------------------------------ bad input at config load
def test_vocab_and_shard_errors_at_config_load(tmp_path, capsys):
    path = write_tokens(tmp_path / "tok", vocab=400)
    with pytest.raises(ConfigError, match=r"model.vocab_size=320 is below the vocab of the tokens .* \(400 ids"):
        tokens_cfg(path)
    path = write_tokens(tmp_path / "tok")
    shard = os.path.join(path, "train-00001.npy")
    with open(shard, "r+b") as f:
        f.truncate(os.path.getsize(shard) - 10)
    with pytest.raises(ConfigError, match="shard train-00001.npy is unreadable or truncated"):
        tokens_cfg(path)
    os.remove(shard)
    with pytest.raises(ConfigError, match="shard train-00001.npy is missing"):
        tokens_cfg(path)
    # the CLI: one line, exit 2, nothing written
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump({"model": MODEL, "data": {"name": "tokens", "path": path, "seq_len": 16},
                                        "train": TRAIN}))
    from jaxformer import cli
    assert cli.main(["train", "--config", str(cfg_path), "--workdir", str(tmp_path / "w"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [f"jaxformer train: error: tokens dataset {path}: shard train-00001.npy is missing"]
    assert not (tmp_path / "w").exists()


# ------------------------------------------------------------------ training
@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """What `jaxformer data prepare` makes of a text with a byte-level BPE of VOCAB ids trained
    on it (the issue's prepare -> train -> SIGKILL -> resume runs on this directory)."""
    from jaxformer.train.data import prepare, stdlib_docs, tokenizer
    d = tmp_path_factory.mktemp("data")
    text = stdlib_docs.corpus()[:80000]
    (d / "in.txt").write_text(text)
    bpe = tokenizer.train_bpe([p for p in text.split("\n\n") if p.strip()], VOCAB)
    meta = prepare.prepare([str(d / "in.txt")], bpe, str(d / "tok"),
                           prepare.PrepareOptions(eval_fraction=0.15, progress=False))
    assert meta["vocab_size"] == VOCAB and meta["tokenizer"]["file"] == "tokenizer.json"
    return str(d / "tok")


def _sha(data_dir) -> str:
    return json.load(open(os.path.join(data_dir, "meta.json")))["tokenizer"]["sha256"]


def _checkpoint_steps(wd) -> list[int]:
    d = os.path.join(wd, "checkpoints")
    return sorted(int(n) for n in os.listdir(d) if n.isdigit()) if os.path.isdir(d) else []


@pytest.fixture(scope="module")
def killed(data_dir, tmp_path_factory):
    """A `jaxformer train` process on tokens data SIGKILLed after its step-2 checkpoint ->
    (workdir, config path, its newest complete checkpoint step)."""
    d = tmp_path_factory.mktemp("killed")
    cfg_path = d / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump(tokens_cfg(data_dir).to_dict()))
    wd = str(d / "w")
    with open(d / "log", "w") as log:  # 100000 steps: still running whenever the kill lands
        proc = subprocess.Popen([sys.executable, "-m", "jaxformer", "train", "--config", str(cfg_path),
                                 "--workdir", wd, "--no-progress", "--set", "train.steps=100000"],
                                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=cli_env())
    try:
        deadline = time.monotonic() + 300  # generous: start-up and compiles on a loaded machine
        while not _checkpoint_steps(wd):
            assert proc.poll() is None, (d / "log").read_text()[-2000:]
            assert time.monotonic() < deadline, "no checkpoint after 300 s"
            time.sleep(0.02)
    finally:
        proc.kill()
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    return wd, cfg_path, _checkpoint_steps(wd)[-1]


@pytest.fixture(scope="module")
def reference(data_dir, killed, tmp_path_factory):
    """The uninterrupted run, in this process, 2 steps past the killed run's checkpoint."""
    steps = max(4, killed[2] + 2)
    wd = str(tmp_path_factory.mktemp("ref") / "w")
    return JaxTrainer(tokens_cfg(data_dir, steps=steps), wd, progress=False).run(), wd


def test_tokens_train_eval_tokenizer_and_refused_resume(data_dir, reference, tmp_path):
    """A tokens run trains and evaluates; its checkpoint record and model/{last,best} carry the
    tokenizer (model.yaml's `tokenizer:`, tokenizer.json); a resume on data tokenized by
    another tokenizer is refused before anything is written."""
    from jaxformer.checkpoint_io import tokenizer_entry
    history, wd = reference
    evals = [r["eval_loss"] for r in history if "eval_loss" in r]
    assert [r["step"] for r in history] == list(range(1, len(history) + 1))
    assert len(evals) >= 2 and evals[-1] < evals[0] and "eval_token_accuracy" in history[-1]
    for kind in ("last", "best"):
        d = os.path.join(wd, "model", kind)
        rec = tokenizer_entry(d)
        assert rec["sha256"] == _sha(data_dir) and rec["vocab_size"] == VOCAB and rec["eos_id"] == 2
        assert Path(os.path.join(d, "tokenizer.json")).read_text() == Path(os.path.join(data_dir, "tokenizer.json")).read_text()
    # the same run, trained on a directory that now holds data of another tokenizer
    import shutil
    moved = str(tmp_path / "w")
    shutil.copytree(wd, moved)
    other = write_tokens(tmp_path / "tok", sha="b" * 64)
    stored = yaml.safe_load(Path(os.path.join(moved, "config.yaml")).read_text())
    stored["data"]["path"] = other
    with open(os.path.join(moved, "config.yaml"), "w") as f:
        yaml.safe_dump(stored, f)
    before = sorted(os.listdir(moved))
    with pytest.raises(ValueError, match="tokenizer .*'test' sha256 bbbbbbbbbbbb.* differs from the one the "
                                         f"checkpoint .* trained with .*sha256 {_sha(data_dir)[:12]}"):
        JaxTrainer(tokens_cfg(other, steps=len(history) + 2), moved, resume=True, progress=False)
    assert sorted(os.listdir(moved)) == before


def test_sigkill_then_resume_gives_identical_losses(data_dir, killed, reference):
    wd, _, saved = killed
    data_file = os.path.join(wd, "checkpoints", str(saved), "data", "process_0-of-1.json")
    assert json.loads(Path(data_file).read_text()) == {"next_index": saved}  # the pipeline's state is in the checkpoint
    tr = JaxTrainer(tokens_cfg(data_dir, steps=saved + 2), wd, resume=True, progress=False)
    assert tr.start_step == saved and tr.data_state == {"next_index": saved}
    resumed = [r["loss"] for r in tr.run()]
    expect = [r["loss"] for r in reference[0][saved:saved + 2]]
    print(f"killed at checkpoint {saved}; resumed losses {resumed} vs {expect}")
    assert resumed == expect


def test_torch_trainer_reads_the_same_batches(data_dir, reference, tmp_path):
    """The torch trainer reads the same grain pipeline: from the same init, its first steps'
    losses are the JAX run's within the trajectory bound (jaxformer/train/trajectory.py RTOL),
    and its exported model carries the tokenizer."""
    from jaxformer.checkpoint_io import tokenizer_entry
    from jaxformer.train.torch.trainer import TorchTrainer
    from jaxformer.train.trajectory import RTOL
    history = TorchTrainer(tokens_cfg(data_dir, steps=2), str(tmp_path), progress=False).run()
    diffs = [abs(a["loss"] - b["loss"]) for a, b in zip(history, reference[0], strict=False)]
    print("torch vs jax on tokens data, per-step loss diffs:", [f"{d:.1e}" for d in diffs])
    assert len(diffs) == 2 and max(diffs) <= RTOL * max(1.0, reference[0][0]["loss"])
    assert tokenizer_entry(str(tmp_path / "model" / "last"))["sha256"] == _sha(data_dir)
