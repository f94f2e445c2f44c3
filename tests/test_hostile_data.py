"""Hostile files, data, bombs and kills (issue 35): token shards altered in place or holding ids
outside the vocab, wrong types in the files a run writes for itself (meta.json, a checkpoint's
data position, config.yaml, metrics.json, metrics.jsonl), resource bombs (configs of sizes no
model has, chat templates that never end, PNG and xz decompression bombs), unclear errors
(torch's pickle warning, a --pair module that does not import, one-class image data, a chat
template that writes no answer) and `data prepare` killed by SIGKILL or SIGTERM.

Each case runs through tests/hostile_helpers.py's run_case (a one-line error, or a correct
result), except the kills: a real `jaxformer data prepare` subprocess held inside its write
(its input is a FIFO the test feeds, so it is mid-write when killed, on any machine load),
then a rerun that must leave a complete output and no temporary folder.
"""
from __future__ import annotations

import hashlib
import json
import lzma
import os
import signal
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from hostile_helpers import Case, _no_stale, _open_split, _tokens, run_case
from test_bad_input import GOOD_CHAT, HF_ARGV, TINY_LLAMA, _hf_dir, _put, _put_bytes, _tiny


# ----------------------------------------------------------------------------- token shards
def _digest(path: str) -> tuple[int, str]:
    data = Path(path).read_bytes()
    return len(data), hashlib.sha256(data).hexdigest()


def _rewrite_shard(tmp: str, change, name: str = "train-00000.npy", rel: str = "tok", fix_meta: bool = False):
    """Change shard `name` of {tmp}/rel in place (`change(array) -> array`); fix_meta: update
    meta.json's size and sha256 to the new file (a shard whose checksum agrees but whose ids do
    not fit, as a meta.json written for other data)."""
    path = os.path.join(tmp, rel, name)
    a = change(np.load(path))
    np.save(path, a, allow_pickle=False)
    if fix_meta:
        meta_path = os.path.join(tmp, rel, "meta.json")
        meta = json.loads(Path(meta_path).read_text())
        s = meta["splits"]["train"]["shards"][0]
        size, sha = _digest(path)
        if name.endswith(".mask.npy"):
            s["mask_bytes"], s["mask_sha256"] = size, sha
        else:
            s["bytes"], s["sha256"] = size, sha
        with open(meta_path, "w") as f:
            json.dump(meta, f)


def _pad_header(tmp: str) -> None:
    """The shard rewritten with a 64-byte longer .npy header: the same ids, another file."""
    path = os.path.join(tmp, "tok", "train-00000.npy")
    a = np.load(path)
    header = b"{'descr': '<u2', 'fortran_order': False, 'shape': (8,), }"
    header = header + b" " * (64 * 3 - 10 - len(header) - 1) + b"\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + a.tobytes())


def _append_byte(tmp: str) -> None:
    """One byte appended to the shard."""
    with open(os.path.join(tmp, "tok", "train-00000.npy"), "ab") as f:
        f.write(b"\0")


def _set(a: np.ndarray, i: int, v: int) -> np.ndarray:
    a = a.copy()
    a[i] = v
    return a


def _masked_tokens(tmp: str) -> None:
    """{tmp}/tok: a loss-mask tokens dir (8 ids, the last 4 in the loss)."""
    from jaxformer.train.data.tokens import TokensWriter
    with TokensWriter(os.path.join(tmp, "tok"), vocab_size=259, eos_id=258, loss_mask=True,
                      tokenizer={"spec": "bytes", "kind": "bytes"}) as w:
        w.add("train", [1, 2, 3, 4, 5, 6, 7], mask=np.array([0, 0, 0, 1, 1, 1, 1]), end_mask=1)


def _shard_field(key: str, value):
    def setup(tmp: str) -> None:
        _tokens(tmp)
        path = os.path.join(tmp, "tok", "meta.json")
        meta = json.loads(Path(path).read_text())
        shard = meta["splits"]["train"]["shards"][0]
        if value is None and key != "bytes":
            shard.pop(key)
        else:
            shard[key] = value
        with open(path, "w") as f:
            json.dump(meta, f)
    return setup


def _read_all(tmp: str):
    return _open_split(tmp).read(0, 8).tolist()


def _read_twice(tmp: str):
    split = _open_split(tmp)
    with pytest.raises(ValueError):
        split.read(0, 8)
    return split.read(0, 8)  # a refused shard stays refused


def _unwarned(monkeypatch, tmp: str) -> None:
    from jaxformer.train.data import tokens
    monkeypatch.setattr(tokens, "_UNVERIFIED_WARNED", set(), raising=False)


def _prepared_checksums(tmp: str, _) -> None:
    meta = json.loads(Path(os.path.join(tmp, "out", "meta.json")).read_text())
    shards = meta["splits"]["train"]["shards"]
    assert shards and all((s.get("bytes"), s.get("sha256")) == _digest(os.path.join(tmp, "out", s["file"]))
                          for s in shards), shards


PREP = ["data", "prepare", "--no-progress", "--eval-fraction", "0", "--tokenizer", "bytes"]
GOOD = [1, 2, 3, 4, 5, 6, 7, 258]
SHARD_CASES = [
    Case("shard_altered_same_size", call=_read_all, error=r"shard train-00000\.npy was altered",
         setup=lambda t: (_tokens(t), _rewrite_shard(t, lambda a: _set(a, 2, 9)))),
    Case("shard_altered_stays_refused", call=_read_twice, error=r"shard train-00000\.npy was altered",
         setup=lambda t: (_tokens(t), _rewrite_shard(t, lambda a: a[::-1].copy()))),
    Case("shard_header_padded", call=_read_all, error=r"shard train-00000\.npy is 208 bytes, meta\.json says 144",
         setup=lambda t: (_tokens(t), _pad_header(t))),
    Case("shard_appended_bytes", call=_read_all, error=r"shard train-00000\.npy is 145 bytes, meta\.json says 144",
         setup=lambda t: (_tokens(t), _append_byte(t))),
    Case("mask_shard_altered", call=_read_all, error=r"shard train-00000\.mask\.npy was altered",
         setup=lambda t: (_masked_tokens(t), _rewrite_shard(t, lambda a: _set(a, 0, 1), "train-00000.mask.npy"))),
    Case("shard_sha_not_hex", call=_open_split, error=r"shards\[0\]\.sha256 must be 64 hex digits",
         setup=_shard_field("sha256", "xyz")),
    Case("shard_bytes_null", call=_open_split, error=r"shards\[0\]\.bytes must be a count, got None",
         setup=_shard_field("bytes", None)),
    Case("shard_bytes_string", call=_open_split, error=r"shards\[0\]\.bytes must be a count, got '144'",
         setup=_shard_field("bytes", "144")),
    Case("shard_mask_name_number", call=_open_split, error=r"shards\[0\]\.mask must be a file name",
         setup=_shard_field("mask", 5)),
    Case("shard_old_dir_warns_once", call=lambda t: (_read_all(t), _read_all(t))[0],
         setup=lambda t: (_tokens(t), _strip_checksums(t)), patch=_unwarned,
         check=lambda t, r: r == GOOD, stderr=r"^warning: tokens dataset .*tok: meta\.json holds no shard "
                                                r"checksums [^\n]*\n$"),
    Case("shard_good_verifies", call=_read_all, setup=_tokens, patch=_unwarned, check=lambda t, r: r == GOOD,
         stderr=r"^$"),
    Case("prepare_writes_checksums", argv=[*PREP, "--input", "{tmp}/in.txt", "--out", "{tmp}/out"],
         setup=lambda t: _put(t, "in.txt", "hello world\n\nsecond document\n"), check=_prepared_checksums),
    # ids outside the vocab: the checksum agrees (a meta.json written for other data)
    Case("shard_id_outside_vocab", call=_read_all, error=r"shard train-00000\.npy holds id 300, outside the "
                                                        r"vocab \[0, 259\) of meta\.json",
         setup=lambda t: (_tokens(t), _rewrite_shard(t, lambda a: _set(a, 3, 300), fix_meta=True))),
    Case("shard_id_max_uint16", call=_read_all, error=r"holds id 65535, outside the vocab",
         setup=lambda t: (_tokens(t), _rewrite_shard(t, lambda a: _set(a, 0, 65535), fix_meta=True))),
    Case("shard_id_outside_old_dir", call=_read_all, error=r"holds id 259, outside the vocab \[0, 259\)",
         setup=lambda t: (_tokens(t), _rewrite_shard(t, lambda a: _set(a, 6, 259)), _strip_checksums(t)),
         patch=_unwarned),
    Case("shard_id_last_of_vocab_ok", call=_read_all, check=lambda t, r: r == [1, 2, 3, 4, 5, 6, 7, 258],
         setup=_tokens),
    Case("mask_value_two", call=_read_all, error=r"train-00000\.mask\.npy holds the value 2; a loss mask holds 0 and 1",
         setup=lambda t: (_masked_tokens(t), _rewrite_shard(t, lambda a: _set(a, 5, 2), "train-00000.mask.npy",
                                                           fix_meta=True))),
]


def _strip_checksums(tmp: str) -> None:
    path = os.path.join(tmp, "tok", "meta.json")
    meta = json.loads(Path(path).read_text())
    for s in meta["splits"]["train"]["shards"]:
        s.pop("bytes", None)
        s.pop("sha256", None)
    with open(path, "w") as f:
        json.dump(meta, f)


# ----------------------------------------------------------------------------- our own files, wrong types
def _data_state(text: str):
    """A checkpoint (tiny state) whose data position file is then replaced by `text`; restored
    as the trainer does."""
    def call(tmp: str):
        import grain
        import jax.numpy as jnp

        from jaxformer.train.checkpoint import Checkpointer
        from jaxformer.train.data.pipeline import SavedState
        it = iter(grain.MapDataset.range(4).to_iter_dataset())
        next(it)
        c = Checkpointer(os.path.join(tmp, "c"), keep=2, async_save=False)
        try:
            c.save(1, {"w": jnp.ones(3)}, {"step": 1}, data=it)
        finally:
            c.close()
        with open(os.path.join(tmp, "c", "1", "data", "process_0-of-1.json"), "w") as f:
            f.write(text)
        r = Checkpointer(os.path.join(tmp, "c"), keep=2, read_only=True)
        try:
            saved = SavedState()
            r.restore_data(1, saved)
            return saved.state
        finally:
            r.close()
    return call


def _state(value):
    def call(tmp: str):
        from jaxformer.train.data.pipeline import check_state
        return check_state(value)
    return call


def _stored(text: str):
    def call(tmp: str):
        from jaxformer.train.workdir import stored_config
        _put(tmp, "w/config.yaml", text)
        return stored_config(os.path.join(tmp, "w"))
    return call


def _run_config(**sections):
    def call(tmp: str):
        from workdir_helpers import tiny_run_dict

        from jaxformer.train.config import config_from_dict
        return config_from_dict({**tiny_run_dict(), **sections})
    return call


def _run_yaml(tmp: str, **sections) -> None:
    import yaml
    from workdir_helpers import tiny_run_dict
    _put(tmp, "w/config.yaml", yaml.safe_dump({**tiny_run_dict(), **sections}))


def _model_dir(metrics: str, **sections):
    def setup(tmp: str) -> None:
        _run_yaml(tmp, **sections)
        _put(tmp, "w/model/last/metrics.json", metrics)
    return setup


def _plot_ok(tmp: str, _) -> None:
    assert os.path.getsize(os.path.join(tmp, "c.png")) > 0


EVAL = ["eval", "{tmp}/w", "--step", "last"]
BAD_METRICS = '{"step": [1], "loss": 1}\n{"step": null, "loss": 2}\n{"step": 3, "loss": [1]}\n' \
              '{"step": 4, "loss": {"a": 1}}\n{"step": 5, "loss": "x"}\n{"step": 6, "loss": true}\n' \
              '{"step": 7, "loss": null}\n{"step": 8, "loss": 2.5, "lr": [0]}\n[1]\nnull\n'
OWN_FILE_CASES = [
    Case("data_state_list", call=_data_state("[1]"),
         error=r"checkpoint step 1: the data position .*process_0-of-1\.json is unreadable .*must be a JSON object, not list"),
    Case("data_state_next_index_null", call=_data_state('{"next_index": null}'),
         error=r"process_0-of-1\.json is unreadable .*next_index must be a step count, got None"),
    Case("data_state_ok", call=_data_state('{"next_index": 1}'), check=lambda t, r: r == {"next_index": 1}),
    Case("data_state_no_key", call=_state({}), error=r"next_index must be a step count, got None"),
    Case("data_state_string", call=_state({"next_index": "2"}), error=r"next_index must be a step count, got '2'"),
    Case("data_state_bool", call=_state({"next_index": True}), error=r"next_index must be a step count, got True"),
    Case("data_state_negative", call=_state({"next_index": -1}), error=r"next_index must be a step count, got -1"),
    Case("data_state_null", call=_state(None), error=r"must be a JSON object, not NoneType"),
    Case("resume_config_yaml_list", call=_stored("[1, 2]\n"),
         error=r"w/config\.yaml: must be a YAML mapping of the run's config sections, not a list"),
    Case("resume_config_yaml_string", call=_stored("just text\n"), error=r"config\.yaml: must be a YAML mapping"),
    Case("resume_config_yaml_empty_ok", call=_stored(""), check=lambda t, r: r == {}),
    Case("config_model_null", call=_run_config(model=None), error=r"^model: must be a mapping of the section's fields, got None"),
    Case("config_data_list", call=_run_config(data=[1]), error=r"^data: must be a mapping .*got \[1\]"),
    Case("config_train_list", call=_run_config(train=[1, 2]), error=r"^train: must be a mapping"),
    Case("config_parallel_string", call=_run_config(parallel="x"), error=r"^parallel: must be a mapping"),
    Case("config_train_null_ok", call=_run_config(train=None), check=lambda t, r: r.train.steps > 0),
    Case("eval_config_model_null", argv=EVAL, error=r"w/config\.yaml: model: must be a mapping",
         setup=lambda t: _run_yaml(t, model=None)),
    Case("eval_config_data_list", argv=EVAL, error=r"w/config\.yaml: data: must be a mapping",
         setup=lambda t: _run_yaml(t, data=["x"])),
    Case("eval_metrics_json_list", argv=EVAL, error=r"model/last/metrics\.json: must be a JSON object, not list",
         setup=_model_dir("[1]")),
    Case("eval_metrics_json_garbage", argv=EVAL, error=r"model/last/metrics\.json: not valid JSON \(line 1",
         setup=_model_dir("{oops")),
    Case("eval_metrics_step_list", argv=EVAL, error=r"metrics\.json: step must be a step number, got \[2\]",
         setup=_model_dir('{"step": [2]}')),
    Case("eval_metrics_step_string", argv=EVAL, error=r"metrics\.json: step must be a step number, got '2'",
         setup=_model_dir('{"step": "2"}')),
    Case("plot_metrics_wrong_types", argv=["plot", "{tmp}/w", "--out", "{tmp}/c.png"],
         setup=lambda t: _put(t, "w/metrics.jsonl", '{"step": 1, "loss": 3.0}\n' + BAD_METRICS), check=_plot_ok,
         stderr=r"^warning: .*w/metrics\.jsonl: skipped 4 line\(s\) that are not a JSON object with an integer "
                r"step; the first, line 2: step is \[1\], not a step number\n$"),
    Case("plot_metrics_only_bad_steps", argv=["plot", "{tmp}/w", "--out", "{tmp}/c.png"],
         setup=lambda t: _put(t, "w/metrics.jsonl", '{"step": null}\n{"step": [1]}\n{"step": "3"}\n{"loss": 1}\n'
                              + '{"step": ' + "[" * 100 + "]" * 100 + '}\n{"step": 2, "lo\n'),
         check=_plot_ok, stderr=r"skipped 6 line\(s\) .*; the first, line 1: step is null, not a step number\n$"),
    Case("plot_metrics_good_says_nothing", argv=["plot", "{tmp}/w", "--out", "{tmp}/c.png"],
         setup=lambda t: _put(t, "w/metrics.jsonl", '{"step": 1, "loss": 3.0}\n\n{"step": 2, "loss": 2.0}\n'),
         check=_plot_ok, stderr=r"^$"),
]


# ----------------------------------------------------------------------------- resource bombs
def _hf(**changes):
    return lambda t: _hf_dir(t, config={**TINY_LLAMA, **changes})


def _png_header(width: int, height: int) -> bytes:
    """A PNG that claims width x height pixels (IHDR) but holds a few bytes of data: the
    decompression bomb's header, which Pillow reads at open."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def _decode(data_fn):
    def call(tmp: str):
        from jaxformer.train.data import image_folder
        cfg = image_folder.Config(path=os.path.join(tmp, "ds"), image_size=4)
        return image_folder.decode(data_fn(), "ds/bomb.png", cfg)
    return call


def _pinned(monkeypatch, tmp: str) -> None:
    """The pinned corpora read from {tmp}/embedded, at most 1 MiB each (the bomb: 2 MiB)."""
    import pathlib

    from jaxformer.train.data import pinned
    monkeypatch.setattr(pinned, "_folder", lambda: pathlib.Path(tmp) / "embedded")
    monkeypatch.setattr(pinned, "MAX_TEXT_BYTES", 1 << 20, raising=False)
    pinned.text.cache_clear()
    monkeypatch.setattr(pinned, "text", pinned.text.__wrapped__)


def _xz(tmp: str, data: bytes, cut: int = 0) -> None:
    raw = lzma.compress(data)
    os.makedirs(os.path.join(tmp, "embedded"), exist_ok=True)
    _put_bytes(tmp, "embedded/pydoc_topics.txt.xz", raw[:len(raw) - cut])


def _pinned_text(tmp: str):
    from jaxformer.train.data import pinned
    return pinned.text("pydoc_topics")


def _render_limits(seconds: float = 0.3, chars: int | None = None):
    def patch(monkeypatch, tmp: str) -> None:
        from jaxformer.train.data import chat
        monkeypatch.setattr(chat, "RENDER_SECONDS", seconds, raising=False)
        if chars is not None:
            monkeypatch.setattr(chat, "RENDER_CHARS", chars, raising=False)
    return patch


CHAT = ["data", "prepare", "--no-progress", "--format", "chat", "--input", "{tmp}/c.jsonl", "--tokenizer", "bytes",
        "--out", "{tmp}/out", "--eval-fraction", "0", "--chat-template", "{tmp}/t.jinja"]


def _chat(template: str, lines: str = GOOD_CHAT + "\n"):
    return lambda t: (_put(t, "c.jsonl", lines), _put(t, "t.jinja", template))


def _prepare_in_thread(argv):
    """`jaxformer ARGV` run by cli.main in a thread other than the main one -> its exit code
    (a signal-based time limit would not hold there)."""
    def call(tmp: str):
        import threading

        from jaxformer import cli
        out = {}
        t = threading.Thread(target=lambda: out.update(code=cli.main([a.replace("{tmp}", tmp) for a in argv])))
        t.start()
        t.join(120)
        assert not t.is_alive(), "the render was not stopped"
        return out.get("code")
    return call


NESTED = "{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}"
CHATML_LIKE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
               "{% if add_generation_prompt %}<|assistant|>{% endif %}")
BOMB_CASES = [
    Case("hf_config_3000_layers", argv=HF_ARGV, error=r"num_layers: 3000 is larger than any real model's",
         setup=_hf(num_hidden_layers=3000), protect=("hf",), absent=("out",)),
    Case("hf_config_huge_width", argv=HF_ARGV, error=r"d_model: 1048576 is larger than any real model's",
         setup=_hf(hidden_size=1 << 20, intermediate_size=64), protect=("hf",), absent=("out",)),
    Case("hf_config_huge_ffn", argv=HF_ARGV, error=r"d_ff: 1073741824 is larger than any real model's",
         setup=_hf(intermediate_size=1 << 30), protect=("hf",), absent=("out",)),
    Case("hf_config_huge_vocab", argv=HF_ARGV, error=r"vocab_size: 1073741824 is larger than any real model's",
         setup=_hf(vocab_size=1 << 30), protect=("hf",), absent=("out",)),
    Case("hf_config_huge_heads", argv=HF_ARGV, error=r"num_heads: 8192 is larger than any real model's",
         setup=_hf(hidden_size=8192 * 2, num_attention_heads=8192), protect=("hf",), absent=("out",)),
    Case("hf_config_huge_positions", argv=HF_ARGV, error=r"max_len: 1099511627776 is larger than any real model's",
         setup=_hf(max_position_embeddings=1 << 40), protect=("hf",), absent=("out",)),
    Case("train_yaml_5000_layers", argv=["config", "--config", "{tmp}/cfg.yaml", "--set", "model.num_layers=5000"],
         error=r"num_layers: 5000 is larger than any real model's", setup=_tiny),
    Case("train_state_does_not_fit", argv=["train", "--config", "{tmp}/cfg.yaml", "--workdir", "{tmp}/w", "--no-progress",
                                           "--set", "model.vocab_size=16777216", "--set", "model.d_model=65536"],
         error=r"the train state \(parameters and optimiser state\) needs [\d,.]+ GiB, more than the [\d,.]+ GiB "
               r"available on this host", setup=_tiny, absent=("w",)),
    Case("torch_train_state_does_not_fit", argv=["train", "--framework", "torch", "--config", "{tmp}/cfg.yaml", "--workdir",
                                                 "{tmp}/w", "--no-progress", "--set", "model.vocab_size=16777216",
                                                 "--set", "model.d_model=65536"],
         error=r"the train state \(parameters, gradients and optimiser state\) needs [\d,.]+ GiB, more than",
         setup=_tiny, absent=("w",)),
    Case("train_refused_nested_workdir_left_as_found",
         argv=["train", "--config", "{tmp}/cfg.yaml", "--workdir", "{tmp}/runs/a/w", "--no-progress",
               "--set", "model.vocab_size=16777216", "--set", "model.d_model=65536"],
         error=r"the train state .* needs [\d,.]+ GiB, more than", setup=lambda t: (_tiny(t), _put(t, "runs/keep", "x")),
         protect=("runs",), absent=("runs/a",)),
    Case("train_refused_existing_workdir_kept",
         argv=["train", "--config", "{tmp}/cfg.yaml", "--workdir", "{tmp}/w", "--no-progress",
               "--set", "model.vocab_size=16777216", "--set", "model.d_model=65536"],
         error=r"the train state .* needs [\d,.]+ GiB, more than", setup=lambda t: (_tiny(t), os.makedirs(os.path.join(t, "w"))),
         check=lambda t, r: os.listdir(os.path.join(t, "w")) == []),
    Case("eval_model_does_not_fit", argv=["eval", "{tmp}/w", "--step", "2"], error=r"the model needs [\d,.]+ GiB, more than",
         setup=lambda t: _run_yaml(t, model={"name": "lm", "vocab_size": 1 << 24, "d_model": 1 << 16, "num_heads": 4,
                                             "d_ff": 64, "num_layers": 2, "max_len": 32})),
    Case("config_1024_layers_ok", call=lambda t: __import__("jaxformer.config.models", fromlist=["x"]).LMConfig(
        vocab_size=64, d_model=32, num_heads=4, d_ff=64, num_layers=1024, max_len=32), check=lambda t, r: r.num_layers == 1024),
    Case("chat_template_nested_range", argv=CHAT, error=r"c\.jsonl:1: the chat template .*t\.jinja\) ran for more than "
                                                      r"0\.3 s on one conversation",
         setup=_chat(NESTED), patch=_render_limits(), absent=("out",)),
    Case("chat_template_nested_range_skip_bad", argv=[*CHAT, "--skip-bad"], error=r"ran for more than 0\.3 s",
         setup=_chat(NESTED), patch=_render_limits(), absent=("out",)),
    Case("chat_template_huge_output", argv=CHAT, error=r"wrote more than 4,096 characters for one conversation; refused",
         setup=_chat("{% for i in range(5000) %}x{% endfor %}" + CHATML_LIKE), patch=_render_limits(chars=4096),
         absent=("out",)),
    *[Case(f"chat_template_bomb_{name}", argv=CHAT, setup=_chat(expr + CHATML_LIKE), absent=("out",),
           error=r"c\.jsonl:1: the chat template .*t\.jinja\) builds .* more than [\d,]+; refused$")
      for name, expr in [("str_times", "{{ 'x' * 10**10 }}"), ("list_times", "{{ ([1] * 10**10)|length }}"),
                         ("times_reversed", "{{ 10**10 * 'ab' }}"), ("power", "{{ 2 ** 1000000000 }}"),
                         ("percent_width", "{{ '%10000000000d' % 1 }}"), ("star_width", "{{ '%*d' % (10**10, 1) }}"),
                         ("ljust", "{{ 'x'.ljust(10**10) }}"), ("center_filter", "{{ 'x'|center(10**10) }}"),
                         ("format_width", "{{ '{:>10000000000}'.format(1) }}"),
                         ("format_nested_width", "{{ '{:>{}}'.format(1, 10**10) }}"),
                         ("join_range", "{{ range(100000)|join('x' * 10**6) }}"),
                         ("replace", "{{ ('x' * 10**5).replace('x', 'y' * 10**5) }}"),
                         ("indent", "{{ ('a\n' * 10**5)|indent(10**5) }}"),
                         ("tojson_indent", "{{ messages|tojson(indent=10**10) }}")]],
    Case("chat_template_bomb_concat_doubling", argv=CHAT, absent=("out",), patch=_render_limits(chars=1 << 16),
         setup=_chat("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"
                     + CHATML_LIKE), error=r"builds a concatenation \('~'\) of 131,072 characters or items, more than 65,536"),
    Case("chat_template_bomb_plus_doubling", argv=CHAT, absent=("out",), patch=_render_limits(chars=1 << 16),
         setup=_chat("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}"
                     + CHATML_LIKE), error=r"builds a concatenation of 131,072 characters or items"),
    Case("chat_template_time_limit_in_a_thread", call=_prepare_in_thread([*CHAT, "--skip-bad"]), setup=_chat(NESTED),
         patch=_render_limits(), absent=("out",), check=lambda t, r: r == 2,
         stderr=r"c\.jsonl:1: the chat template .*ran for more than 0\.3 s on one conversation"),
    Case("chat_template_plain_ok_in_a_thread", call=_prepare_in_thread(CHAT), setup=_chat(CHATML_LIKE),
         check=lambda t, r: r == 0 and os.path.isfile(os.path.join(t, "out", "meta.json"))),
    Case("chat_template_sandbox_escape", argv=CHAT, error=r"c\.jsonl:1: the chat template .* failed: SecurityError",
         setup=_chat("{{ messages.__class__.__mro__ }}" + CHATML_LIKE), absent=("out",)),
    Case("chat_template_plain_ok", argv=CHAT, setup=_chat(CHATML_LIKE),
         check=lambda t, r: json.loads(Path(os.path.join(t, "out", "meta.json")).read_text())["splits"]["train"]["loss_tokens"] > 0),
    Case("png_bomb_header", call=_decode(lambda: _png_header(100_000, 100_000)),
         error=r"^ds/bomb\.png: refused: a decompression bomb"),
    Case("png_bomb_warning_size", call=_decode(lambda: _png_header(10_000, 10_000)),
         error=r"^ds/bomb\.png: refused: a decompression bomb"),
    Case("png_small_truncated", call=_decode(lambda: _png_header(64, 64)), error=r"^ds/bomb\.png: cannot decode the image"),
    Case("xz_corpus_bomb", call=_pinned_text, patch=_pinned, setup=lambda t: _xz(t, b"\0" * (2 << 20)),
         error=r"pydoc_topics\.txt\.xz: decompresses to more than 1048576 bytes"),
    Case("xz_corpus_truncated", call=_pinned_text, patch=_pinned, setup=lambda t: _xz(t, b"abc" * 1000, cut=30),
         error=r"pydoc_topics\.txt\.xz: cannot read the pinned corpus"),
    Case("xz_corpus_altered", call=_pinned_text, patch=_pinned, setup=lambda t: _xz(t, b"other text"),
         error=r"pydoc_topics\.txt\.xz: sha256 [0-9a-f]+\.\.\. differs from the pinned"),
]


# ----------------------------------------------------------------------------- unclear errors
def _bin(payload: bytes):
    def setup(tmp: str) -> None:
        os.makedirs(os.path.join(tmp, "hf"))
        _put(tmp, "hf/config.json", json.dumps(TINY_LLAMA))
        _put_bytes(tmp, "hf/pytorch_model.bin", payload)
    return setup


def _warnings_raise(monkeypatch, tmp: str) -> None:
    """A UserWarning raises (pytest records warnings instead of printing them): torch's pickle
    warning, which the CLI would print above its error, then fails the case."""
    import warnings
    warnings.simplefilter("error", UserWarning)  # pytest restores the filters after the test


def _one_class(tmp: str):
    from PIL import Image

    from jaxformer.train.data import image_folder
    os.makedirs(os.path.join(tmp, "ds", "cat"))
    for i in range(20):  # enough for an eval split
        Image.new("RGB", (4, 4), (i, 0, 0)).save(os.path.join(tmp, "ds", "cat", f"{i}.png"))
    return image_folder.sources({"path": os.path.join(tmp, "ds"), "image_size": 4}, 0)


def _one_label_parquet(labels):
    def call(tmp: str):
        import io

        import pyarrow as pa
        import pyarrow.parquet as pq
        from PIL import Image

        from jaxformer.train.data import image_folder
        buf = io.BytesIO()
        Image.new("RGB", (4, 4)).save(buf, format="PNG")
        table = pa.table({"image": [{"bytes": buf.getvalue(), "path": None}] * len(labels), "label": labels})
        os.makedirs(os.path.join(tmp, "ds"))
        pq.write_table(table, os.path.join(tmp, "ds", "data.parquet"))
        src = image_folder.sources({"path": os.path.join(tmp, "ds", "data.parquet"), "image_size": 4}, 0)
        return sorted(set(src[0].labels.tolist()) | set(src[1].labels.tolist()))
    return call


NO_ANSWER = ("{% for m in messages %}{{ m['role'] }}: {% if m['role'] != 'assistant' %}{{ m['content'] }}{% endif %}\n"
             "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}")
UNCLEAR_CASES = [
    Case("bin_pickle_protocol_5_no_warning", argv=HF_ARGV, error=r"^jaxformer convert: error: .*pytorch_model\.bin: "
                                                                 r"refused: not a plain tensor file",
         setup=_bin(b"\x80\x05garbage"), patch=_warnings_raise, protect=("hf",), absent=("out",)),
    Case("bin_pickle_protocol_5_dict_no_warning", argv=HF_ARGV,
         error=r"^jaxformer convert: error: .*pytorch_model\.bin: refused: not a plain tensor file",
         setup=_bin(__import__("pickle").dumps({"w": [1.0]}, protocol=5)), patch=_warnings_raise, protect=("hf",),
         absent=("out",)),
    Case("pair_syntax_error", argv=["parity", "--pair", "badsyn_mod:f"],
         error=r"--pair 'badsyn_mod:f': .*badsyn_mod\.py:1: SyntaxError: ", setup=lambda t: _put(t, "badsyn_mod.py", "def f(:\n")),
    Case("pair_raises_at_import", argv=["parity", "--pair", "boom_mod:f"],
         error=r"--pair 'boom_mod:f': importing .*boom_mod\.py raised RuntimeError: boom at import",
         setup=lambda t: _put(t, "boom_mod.py", "raise RuntimeError('boom at import')\n")),
    Case("pair_raises_keyerror_at_import", argv=["parity", "--pair", "key_mod:f"],
         error=r"importing .*key_mod\.py raised KeyError: 'missing'",
         setup=lambda t: _put(t, "key_mod.py", "{}['missing']\n")),
    Case("image_folder_one_class", call=_one_class, error=r"ds: one class folder \('cat'\); a classifier needs two or more"),
    Case("parquet_one_label", call=_one_label_parquet([0] * 20), error=r"every example has the label 0; a classifier"),
    Case("parquet_two_labels_ok", call=_one_label_parquet([0, 1] * 10), check=lambda t, r: r == [0, 1]),
    Case("chat_template_writes_no_answer", argv=CHAT, error=r"c\.jsonl:1: the chat template .* writes none of the "
                                                          r"assistant's text",
         setup=_chat(NO_ANSWER), absent=("out",)),
    Case("chat_template_no_answer_skip_bad", argv=[*CHAT, "--skip-bad"],
         error=r"every record was bad and skipped \(2\); the first: .*c\.jsonl:1: the chat template",
         setup=_chat(NO_ANSWER, GOOD_CHAT + "\n" + GOOD_CHAT + "\n"), absent=("out",)),
]

CASES = [*SHARD_CASES, *OWN_FILE_CASES, *BOMB_CASES, *UNCLEAR_CASES]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_data(case: Case, tmp_path, capsys, monkeypatch):
    run_case(case, tmp_path, capsys, monkeypatch)


# ----------------------------------------------------------------------------- data prepare killed
def _held_prepare(tmp: str) -> tuple[subprocess.Popen, int]:
    """`jaxformer data prepare` of a FIFO, held mid-write: the FIFO is opened (which the command
    does only inside its temporary output folder) and fed one document, but not closed, so the
    command waits for more. -> (the process, the FIFO's write end)."""
    fifo = os.path.join(tmp, "in.txt")
    os.mkfifo(fifo)
    p = subprocess.Popen([sys.executable, "-m", "jaxformer", *PREP, "--input", fifo, "--out", os.path.join(tmp, "out")],
                         cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while True:  # the write end opens once the command has opened the read end (ENXIO before)
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError:
            if p.poll() is not None or time.monotonic() > deadline:
                p.kill()
                pytest.fail(f"prepare did not open its input: {p.communicate()[1].decode()}")
            time.sleep(0.01)
    os.write(fd, b"first document\n\n")
    return p, fd


def _temps(tmp: str) -> list[str]:
    return sorted(n for n in os.listdir(tmp) if n.startswith(".tmp-out-"))


def _rerun_is_clean(tmp: str, capsys) -> None:
    from jaxformer import cli
    os.remove(os.path.join(tmp, "in.txt"))
    _put(tmp, "in.txt", "hello world\n\nsecond document\n")
    assert cli.main([*PREP, "--input", os.path.join(tmp, "in.txt"), "--out", os.path.join(tmp, "out")]) == 0
    capsys.readouterr()
    _no_stale(tmp)
    assert json.loads(Path(os.path.join(tmp, "out", "meta.json")).read_text())["splits"]["train"]["documents"] == 2


@pytest.mark.parametrize("signals", [(signal.SIGKILL,), (signal.SIGTERM,), (signal.SIGTERM, signal.SIGTERM)],
                         ids=["sigkill", "sigterm", "two_sigterms"])
def test_prepare_killed_then_rerun(signals, tmp_path, capsys):
    """Killed mid-write, `data prepare` leaves no output; SIGTERM removes its temporary folder
    on the way out (exit 143); SIGKILL (or a second SIGTERM during that cleanup) leaves it, and
    the next prepare of the same output removes it and writes a complete one."""
    tmp = str(tmp_path)
    p, fd = _held_prepare(tmp)
    assert len(_temps(tmp)) == 1  # mid-write: its temporary output exists
    for s in signals:
        p.send_signal(s)
    code = p.wait(timeout=300)
    err = p.stderr.read().decode()
    os.close(fd)
    assert "Traceback" not in err, err
    assert not os.path.lexists(os.path.join(tmp, "out"))
    if signals == (signal.SIGKILL,):
        assert code == -signal.SIGKILL and len(_temps(tmp)) == 1
    elif signals == (signal.SIGTERM,):
        assert code == 128 + signal.SIGTERM and _temps(tmp) == [], (code, _temps(tmp))
    _rerun_is_clean(tmp, capsys)
