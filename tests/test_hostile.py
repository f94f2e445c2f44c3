"""Hostile files and killed processes (issue 35, part A): data lost, or read or written outside
its tree, and the safe file layer (jaxformer/fileio.py) that prevents it. One table of cases;
each sets up a fresh temporary directory, then runs a CLI command in-process or a Python call,
and expects a one-line error or a correct result (tests/hostile_helpers.py: Case, run_case).
Files, data, bombs and kills: tests/test_hostile_data.py.

The style follows tests/test_bad_input.py (whose runner and snapshot the helpers reuse).
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hostile_helpers import Case, _dead_pid, _link, _no_stale, _open_split, _seq, _stale, _tokens, run_case
from test_bad_input import (
    GOOD_CHAT,
    HF_ARGV,
    TINY_LLAMA,
    _adapter,
    _built,
    _hf_dir,
    _put,
    _put_bytes,
    _safetensors_bytes,
    _tiny,
)


# ----------------------------------------------------------------------------- tokens dirs
def _outside_npy(tmp: str) -> None:
    np.save(os.path.join(tmp, "outside.npy"), np.arange(8, dtype=np.uint16))


def _deep(n: int = 5000) -> Any:
    v: Any = 1
    for _ in range(n):
        v = [v]
    return v


DEEP_JSON = "[" * 5000 + "]" * 5000
TOKENS_CASES = [
    Case("tokens_shard_dotdot", call=_open_split, error=r"meta\.json: shard file '\.\./outside\.npy' leads outside",
         setup=_seq(_outside_npy, lambda t: _tokens(t, shard="../outside.npy")), protect=("outside.npy",)),
    Case("tokens_shard_absolute", call=_open_split, error=r"shard file '/.*outside\.npy' is an absolute path",
         setup=_seq(_outside_npy, lambda t: _tokens(t, shard=os.path.join(t, "outside.npy"))),
         protect=("outside.npy",)),
    Case("tokens_shard_symlink_out", call=_open_split, error=r"shard file 'link\.npy' leads outside",
         setup=_seq(_outside_npy, lambda t: _tokens(t, shard="link.npy"), _link("outside.npy", "tok/link.npy")),
         protect=("outside.npy",)),
    Case("tokens_shard_not_a_string", call=_open_split, error=r"splits\.train\.shards\[0\] must be",
         setup=lambda t: _tokens(t, shard=["x"])),
    Case("tokens_meta_is_a_list", call=_open_split, error=r"meta\.json: must be a JSON object, not list",
         setup=lambda t: _tokens(t, whole=[1, 2])),
    Case("tokens_meta_deep", call=_open_split, error=r"meta\.json: JSON nested deeper than",
         setup=lambda t: (_tokens(t), _put(t, "tok/meta.json", DEEP_JSON))),
    Case("tokens_meta_deep_field", call=_open_split, error=r"meta\.json: JSON nested deeper than",
         setup=lambda t: _tokens(t, source=_deep(200))),
    Case("tokens_meta_vocab_null", call=_open_split, error=r"vocab_size must be a positive integer, got None",
         setup=lambda t: _tokens(t, vocab_size=None)),
    Case("tokens_meta_eos_outside_vocab", call=_open_split, error=r"eos_id must be an id in \[0, 259\), got 999",
         setup=lambda t: _tokens(t, eos_id=999)),
    Case("tokens_meta_splits_list", call=_open_split, error=r"splits must be an object",
         setup=lambda t: _tokens(t, splits=[])),
    Case("tokens_meta_tokenizer_null", call=_open_split, error=r"tokenizer must be an object",
         setup=lambda t: _tokens(t, tokenizer=None)),
    Case("tokens_meta_garbage", call=_open_split, error=r"meta\.json: not valid JSON \(line 1",
         setup=lambda t: (_tokens(t), _put(t, "tok/meta.json", "{oops"))),
    Case("tokens_good_shard_reads", call=lambda t: _open_split(t).read(0, 8).tolist(),
         setup=_tokens, check=lambda t, r: r == [1, 2, 3, 4, 5, 6, 7, 258]),
    Case("tokens_tokenizer_file_escapes",
         call=lambda t: __import__("jaxformer.train.data.tokenizer", fromlist=["x"]).tokenizer_for_tokens_dir(
             os.path.join(t, "tok")),
         error=r"tokenizer file '\.\./t\.json' leads outside",
         setup=lambda t: (_put(t, "t.json", "{}"), _tokens(t, tokenizer={"kind": "tokenizers", "file": "../t.json"})),
         protect=("t.json",)),
    Case("tokens_tokenizer_file_absolute",
         call=lambda t: __import__("jaxformer.train.data.tokenizer", fromlist=["x"]).tokenizer_for_tokens_dir(
             os.path.join(t, "tok")),
         error=r"tokenizer file '/etc/passwd' is an absolute path",
         setup=lambda t: _tokens(t, tokenizer={"kind": "tokenizers", "file": "/etc/passwd"})),
    Case("checkpoint_tokenizer_file_escapes",
         call=lambda t: __import__("jaxformer.train.data.tokenizer", fromlist=["x"]).from_entry(
             {"kind": "tokenizers", "file": "../../t.json"}, os.path.join(t, "run", "model"), what="ckpt"),
         error=r"ckpt: tokenizer file '\.\./\.\./t\.json' leads outside",
         setup=lambda t: (_put(t, "t.json", "{}"), os.makedirs(os.path.join(t, "run", "model"))),
         protect=("t.json",)),
]


# ----------------------------------------------------------------------------- JSON / YAML limits
def _fileio():
    from jaxformer import fileio
    return fileio


BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n" \
       "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
PARSE_CASES = [
    Case("yaml_alias_bomb", call=lambda t: _fileio().yaml_load(BOMB), error=r"the alias \*a is refused"),
    Case("yaml_single_alias", call=lambda t: _fileio().yaml_load("a: &x 1\nb: *x\n"), error=r"alias \*x is refused"),
    Case("yaml_merge_key", call=lambda t: _fileio().yaml_load("a: &x {k: 1}\nb: {<<: *x}\n"), error=r"alias"),
    Case("yaml_deep_flow", call=lambda t: _fileio().yaml_load("[" * 5000 + "]" * 5000), error=r"nested deeper than"),
    Case("yaml_deep_block", call=lambda t: _fileio().yaml_load("".join(" " * i + "k:\n" for i in range(200))),
         error=r"nested deeper than"),
    Case("yaml_duplicate_key", call=lambda t: _fileio().yaml_load("train: {lr: 1}\ntrain: {lr: 2}\n"),
         error=r"the key 'train' appears twice"),
    Case("yaml_python_tag", call=lambda t: _fileio().yaml_load("x: !!python/object/apply:os.system [true]\n"),
         error=r"could not determine a constructor"),
    Case("yaml_plain_ok", call=lambda t: _fileio().yaml_load("a: [1, {b: c}]\n"),
         check=lambda t, r: r == {"a": [1, {"b": "c"}]}),
    Case("json_deep", call=lambda t: _fileio().json_loads(DEEP_JSON, "x.json"), error=r"^x\.json: JSON nested deeper"),
    Case("json_deep_object", call=lambda t: _fileio().json_loads('{"a":' * 3000 + "1" + "}" * 3000, "x.json"),
         error=r"nested deeper"),
    Case("json_65_levels", call=lambda t: _fileio().json_loads("[" * 65 + "]" * 65, "x.json"), error=r"nested deeper"),
    Case("json_64_levels_ok", call=lambda t: _fileio().json_loads("[" * 64 + "]" * 64, "x.json"),
         check=lambda t, r: isinstance(r, list)),
    Case("json_bad_utf8", call=lambda t: _fileio().json_loads(b'{"a": "\xff"}', "x.json"), error=r"x\.json: not valid JSON"),
    Case("json_file_too_big", call=lambda t: _fileio().read_json(os.path.join(t, "big.json"), max_bytes=10),
         error=r"big\.json: 12 bytes; a JSON file here holds at most 10", setup=lambda t: _put(t, "big.json", '"0123456789"')),
    Case("json_file_wrong_type", call=lambda t: _fileio().read_json(os.path.join(t, "l.json"), expect=dict),
         error=r"l\.json: must be a JSON object, not list", setup=lambda t: _put(t, "l.json", "[]")),
]


# ----------------------------------------------------------------------------- metrics, lock: no links
def _metrics(tmp: str, text: str) -> None:
    _put(tmp, "w/metrics.jsonl", text)


def _read_metrics(tmp: str):
    from jaxformer.train.logging_utils import read_metrics
    return read_metrics(os.path.join(tmp, "w"))


def _write_metrics(tmp: str):
    from jaxformer.train.logging_utils import MetricsWriter
    MetricsWriter(os.path.join(tmp, "w"), resume_step=2, tensorboard=False).write({"step": 3, "loss": 1.0})


def _lock(tmp: str):
    from jaxformer.train.workdir import WorkdirLock
    WorkdirLock(os.path.join(tmp, "w"))


GOOD = '{"step": 1, "loss": 2.0}\n'
LINK_CASES = [
    Case("metrics_line_deep", call=_read_metrics, setup=lambda t: _metrics(t, GOOD + DEEP_JSON + "\n"),
         check=lambda t, r: [x["step"] for x in r] == [1]),
    Case("metrics_step_list", call=_read_metrics, setup=lambda t: _metrics(t, GOOD + '{"step": [2]}\n{"step": null}\n'),
         check=lambda t, r: [x["step"] for x in r] == [1]),
    Case("metrics_step_bool_or_str", call=_read_metrics,
         setup=lambda t: _metrics(t, GOOD + '{"step": true}\n{"step": "3"}\n[1]\n'),
         check=lambda t, r: [x["step"] for x in r] == [1]),
    Case("metrics_link_out_on_resume", call=_write_metrics, error=r"metrics\.jsonl is a symbolic link",
         setup=_seq(lambda t: _put(t, "outside.txt", "keep\n"), _link("outside.txt", "w/metrics.jsonl")),
         protect=("outside.txt",)),
    Case("metrics_dangling_link", call=_write_metrics, error=r"metrics\.jsonl is a symbolic link",
         setup=_link("nowhere.txt", "w/metrics.jsonl"), absent=("nowhere.txt",)),
    Case("lock_link_out", call=_lock, error=r"\.lock is a symbolic link",
         setup=_seq(lambda t: _put(t, "outside.txt", "keep\n"), _link("outside.txt", "w/.lock")),
         protect=("outside.txt",)),
    Case("train_lock_link_out", argv=["train", "--config", "{tmp}/cfg.yaml", "--workdir", "{tmp}/w", "--no-progress"],
         error=r"\.lock is a symbolic link",
         setup=_seq(_tiny, lambda t: _put(t, "outside.txt", "keep\n"), _link("outside.txt", "w/.lock")),
         protect=("outside.txt",), absent=("w/config.yaml", "w/checkpoints")),
    Case("atomic_file_replaces_link_not_target", call=lambda t: _fileio().write_text(os.path.join(t, "w", "x"), "new"),
         setup=_seq(lambda t: _put(t, "outside.txt", "keep\n"), _link("outside.txt", "w/x")),
         check=lambda t, r: Path(os.path.join(t, "outside.txt")).read_text() == "keep\n"
         and not os.path.islink(os.path.join(t, "w", "x")) and Path(os.path.join(t, "w", "x")).read_text() == "new"),
]


# ----------------------------------------------------------------------------- CLI: config files
TRAIN = ["train", "--config", "{tmp}/cfg.yaml", "--workdir", "{tmp}/w", "--no-progress"]


def _cfg_text(extra: str):
    def setup(tmp: str) -> None:
        _tiny(tmp)
        with open(os.path.join(tmp, "cfg.yaml"), "a") as f:
            f.write(extra)
    return setup


CONFIG_CASES = [
    Case("train_yaml_alias_bomb", argv=["train", "--config", "{tmp}/bomb.yaml", "--workdir", "{tmp}/w"],
         error=r"bomb\.yaml: not valid YAML \(line \d+, column \d+\): the alias \*a is refused",
         setup=lambda t: _put(t, "bomb.yaml", BOMB), absent=("w",)),
    Case("train_yaml_deep", argv=["train", "--config", "{tmp}/deep.yaml", "--workdir", "{tmp}/w"],
         error=r"deep\.yaml: not valid YAML .*nested deeper than", setup=lambda t: _put(t, "deep.yaml", "[" * 5000),
         absent=("w",)),
    Case("train_yaml_duplicate_section", argv=TRAIN, error=r"cfg\.yaml: not valid YAML .*'train' appears twice",
         setup=_cfg_text("train: {steps: 8}\n"), absent=("w",)),
    Case("train_set_alias_bomb", argv=[*TRAIN, "--set", "train.lr=" + BOMB.replace("\n", ", ").join("{}")],
         error=r"--set train\.lr: not a valid YAML value: the alias \*a is refused", setup=_tiny, absent=("w",)),
    Case("train_set_deep", argv=[*TRAIN, "--set", "train.lr=" + "[" * 3000], error=r"--set train\.lr: .*nested deeper",
         setup=_tiny, absent=("w",)),
    Case("convert_config_yaml_alias", argv=["convert", "{tmp}/w.safetensors", "{tmp}/out.safetensors", "--to", "flax",
                                            "--config", "{tmp}/bomb.yaml"],
         error=r"bomb\.yaml: not a valid config .*alias", absent=("out.safetensors",),
         setup=lambda t: (_put_bytes(t, "w.safetensors", _safetensors_bytes()), _put(t, "bomb.yaml", BOMB))),
    Case("hf_config_json_deep", argv=HF_ARGV, error=r"config\.json: JSON nested deeper than \d+ levels",
         setup=lambda t: _hf_dir(t, config={**TINY_LLAMA, "extra": _deep(100)}), protect=("hf",), absent=("out",)),
    Case("hf_config_json_very_deep", argv=HF_ARGV, error=r"config\.json: JSON nested deeper",
         setup=lambda t: (_hf_dir(t), _put(t, "hf/config.json", '{"a": ' + DEEP_JSON + "}")),
         protect=("hf",), absent=("out",)),
    Case("hf_safetensors_header_deep", argv=HF_ARGV, error=r"model\.safetensors: header is not JSON \(JSON nested deeper",
         setup=lambda t: _hf_dir(t, weights=len(DEEP_JSON).to_bytes(8, "little") + DEEP_JSON.encode()),
         protect=("hf",), absent=("out",)),
    Case("hf_index_deep", argv=HF_ARGV, error=r"model\.safetensors\.index\.json: JSON nested deeper",
         setup=lambda t: (_hf_dir(t), _put(t, "hf/model.safetensors.index.json", DEEP_JSON)),
         protect=("hf",), absent=("out",)),
    Case("hf_config_json_garbage", argv=HF_ARGV, error=r"config\.json: not valid JSON \(line 1, column 2\)",
         setup=lambda t: (_hf_dir(t), _put(t, "hf/config.json", "{oops")), protect=("hf",), absent=("out",)),
]


# ----------------------------------------------------------------------------- CLI: --overwrite never deletes an input
def _hf_in(rel: str):
    def setup(tmp: str) -> None:
        _hf_dir(tmp)
        os.makedirs(os.path.dirname(os.path.join(tmp, rel)) or tmp, exist_ok=True)
        os.rename(os.path.join(tmp, "hf"), os.path.join(tmp, rel))
    return setup


PREP = ["data", "prepare", "--no-progress", "--eval-fraction", "0", "--tokenizer", "bytes"]


def _text(rel: str = "in.txt"):
    return lambda t: _put(t, rel, "hello world\n\nsecond document\n")


def _dataset_dir(tmp: str) -> None:
    import datasets
    datasets.Dataset.from_dict({"text": ["hello", "world"]}).save_to_disk(os.path.join(tmp, "ds"))


OVERWRITE_CASES = [
    Case("convert_adapter_is_dst", argv=[*HF_ARGV[:-1], "{tmp}/a", "--adapter", "{tmp}/a", "--overwrite"],
         error=r"a is --adapter .*/a; write the output elsewhere", setup=_adapter, protect=("a", "hf")),
    Case("convert_dst_holds_adapter", argv=[*HF_ARGV[:-1], "{tmp}/p", "--adapter", "{tmp}/p/ad", "--overwrite"],
         error=r"p holds --adapter .*p/ad", protect=("p", "hf"),
         setup=lambda t: (_adapter(t), os.makedirs(os.path.join(t, "p")), os.rename(os.path.join(t, "a"), os.path.join(t, "p", "ad")))),
    Case("convert_dst_inside_adapter", argv=[*HF_ARGV[:-1], "{tmp}/a/sub", "--adapter", "{tmp}/a", "--overwrite"],
         error=r"sub lies inside --adapter", setup=_adapter, protect=("a", "hf")),
    Case("convert_adapter_via_link_is_dst", argv=[*HF_ARGV[:-1], "{tmp}/alink", "--adapter", "{tmp}/a", "--overwrite"],
         error=r"alink is --adapter", setup=_seq(_adapter, _link("a", "alink")), protect=("a", "hf")),
    Case("convert_dst_holds_hf_source", argv=["convert", "--from", "hf", "{tmp}/p/base", "--to", "flax", "{tmp}/p",
                                             "--overwrite"],
         error=r"p holds the input directory .*p/base", setup=_hf_in("p/base"), protect=("p",)),
    Case("convert_dst_holds_hf_source_no_overwrite", argv=["convert", "--from", "hf", "{tmp}/p/base", "--to", "flax",
                                                          "{tmp}/p"],
         error=r"holds the input directory", setup=_hf_in("p/base"), protect=("p",)),
    Case("convert_dst_inside_hf_source", argv=["convert", "--from", "hf", "{tmp}/hf", "--to", "flax", "{tmp}/hf/out"],
         error=r"out lies inside the input directory", setup=_hf_dir, protect=("hf",)),
    Case("convert_dst_links_to_hf_parent", argv=["convert", "--from", "hf", "{tmp}/p/base", "--to", "flax", "{tmp}/q",
                                                "--overwrite"],
         error=r"q holds the input directory", setup=_seq(_hf_in("p/base"), _link("p", "q")), protect=("p",)),
    Case("prepare_input_linked_into_out", argv=[*PREP, "--input", "{tmp}/out/in.txt", "--out", "{tmp}/out", "--overwrite"],
         error=r"out holds the input .*in\.txt", setup=_seq(_text(), _link("in.txt", "out/in.txt")),
         protect=("in.txt", "out")),
    Case("prepare_input_via_link_to_out", argv=[*PREP, "--input", "{tmp}/lnk/in.txt", "--out", "{tmp}/out", "--overwrite"],
         error=r"out holds the input .*lnk/in\.txt", setup=_seq(_text("out/in.txt"), _link("out", "lnk")),
         protect=("out",)),
    Case("prepare_out_is_input", argv=[*PREP, "--input", "{tmp}/in.txt", "--out", "{tmp}/in.txt", "--overwrite"],
         error=r"in\.txt is the input", setup=_text(), protect=("in.txt",)),
    Case("prepare_out_inside_dataset_dir", argv=[*PREP, "--input", "{tmp}/ds", "--out", "{tmp}/ds/tokens"],
         error=r"tokens lies inside the input .*ds", setup=_dataset_dir, protect=("ds",), absent=("ds/tokens",)),
    Case("prepare_tokenizer_inside_out", argv=["data", "prepare", "--no-progress", "--input", "{tmp}/in.txt", "--out",
                                               "{tmp}/out", "--tokenizer", "{tmp}/out/tokenizer.json", "--overwrite"],
         error=r"out holds the tokenizer", setup=_seq(_text(), lambda t: _put(t, "out/tokenizer.json", "{}")),
         protect=("out", "in.txt")),
    Case("prepare_template_inside_out", argv=[*PREP[:-2], "--format", "chat", "--input", "{tmp}/c.jsonl", "--out",
                                              "{tmp}/out", "--tokenizer", "bytes", "--chat-template",
                                              "{tmp}/out/t.jinja", "--overwrite"],
         error=r"out holds the chat template", protect=("out", "c.jsonl"),
         setup=lambda t: (_put(t, "c.jsonl", GOOD_CHAT + "\n"), _put(t, "out/t.jinja", "{{ messages }}"))),
]


# ----------------------------------------------------------------------------- links out of an adapter dir
SECRET = "root:x:0:0:SECRET-BYTES"


def _adapter_link(name: str, target: str):
    def setup(tmp: str) -> None:
        _adapter(tmp)
        if target == "secret":
            _put(tmp, "passwd", SECRET + "\n" * 8)
        else:  # a valid adapter elsewhere
            os.rename(os.path.join(tmp, "a"), os.path.join(tmp, "elsewhere"))
            _adapter_dir_only(tmp)
        dst = os.path.join(tmp, "a", name)
        if os.path.lexists(dst):
            os.remove(dst)
        os.symlink(os.path.join(tmp, "passwd" if target == "secret" else f"elsewhere/{name}"), dst)
    return setup


def _adapter_dir_only(tmp: str) -> None:
    os.makedirs(os.path.join(tmp, "a"))
    with open(os.path.join(tmp, "elsewhere", "adapter_config.json")) as f:
        _put(tmp, "a/adapter_config.json", f.read())


ADAPTER_ARGV = [*HF_ARGV, "--adapter", "{tmp}/a"]
ADAPTER_CASES = [
    Case("adapter_weights_link_to_passwd", argv=ADAPTER_ARGV, error=r"adapter_model\.safetensors' resolves to .* outside",
         setup=_adapter_link("adapter_model.safetensors", "secret"), secret=SECRET, protect=("a", "passwd"),
         absent=("out",)),
    Case("adapter_weights_link_to_valid_adapter", argv=ADAPTER_ARGV, error=r"adapter_model\.safetensors' resolves to",
         setup=_adapter_link("adapter_model.safetensors", "valid"), protect=("a", "elsewhere"), absent=("out",)),
    Case("adapter_config_link_to_passwd", argv=ADAPTER_ARGV, error=r"adapter_config\.json' resolves to .* outside",
         setup=_adapter_link("adapter_config.json", "secret"), secret=SECRET, protect=("a",), absent=("out",)),
    Case("adapter_bin_link_to_passwd", argv=ADAPTER_ARGV, error=r"adapter_model\.bin' resolves to .* outside",
         setup=_seq(_adapter_link("adapter_model.bin", "secret"),
                    lambda t: os.remove(os.path.join(t, "a", "adapter_model.safetensors"))),
         secret=SECRET, protect=("a",), absent=("out",)),
]


# ----------------------------------------------------------------------------- image cells outside the dataset
def _png(path: str) -> None:
    from PIL import Image
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.new("RGB", (4, 4), (255, 0, 0)).save(path)


def _image_read(cell: str):
    def call(tmp: str):
        import pyarrow as pa

        from jaxformer.train.data import image_folder
        _png(os.path.join(tmp, "ds", "img", "a.png"))
        _png(os.path.join(tmp, "secret.png"))
        value = cell.replace("{tmp}", tmp)
        table = pa.table({"image": [{"bytes": None, "path": value}], "label": [0]})
        cfg = image_folder.Config(path=os.path.join(tmp, "ds", "data.parquet"), image_size=4)
        read, _ = image_folder._table_split(table, cfg, "ds/data.parquet")
        data, name = read(0)
        return image_folder.decode(data, name, cfg)
    return call


def _parquet_ds(last: str, struct: bool = True):
    """{tmp}/ds/data.parquet: 20 rows, labels 0 and 1; rows 0-18 hold a PNG (its bytes, or a
    path inside), row 19 the path `last` ("{tmp}" replaced); {tmp}/secret.png lies outside."""
    def setup(tmp: str) -> None:
        import io

        import pyarrow as pa
        import pyarrow.parquet as pq
        from PIL import Image
        _png(os.path.join(tmp, "ds", "img", "a.png"))
        _png(os.path.join(tmp, "secret.png"))
        buf = io.BytesIO()
        Image.new("RGB", (4, 4)).save(buf, format="PNG")
        last_path = last.replace("{tmp}", tmp)
        if struct:
            cells = [{"bytes": buf.getvalue(), "path": "../elsewhere/ignored.png"}] * 19 + \
                [{"bytes": None, "path": last_path}]
        else:
            cells = ["img/a.png"] * 19 + [last_path]
        pq.write_table(pa.table({"image": cells, "label": [0, 1] * 10}), os.path.join(tmp, "ds", "data.parquet"))
    return setup


def _image_sources(tmp: str):
    from jaxformer.train.data import image_folder
    train, evaluation = image_folder.sources({"path": os.path.join(tmp, "ds", "data.parquet"), "image_size": 4}, 0)
    return len(train) + len(evaluation)


VIT_PARQUET = ["train", "--config", "vit", "--workdir", "{tmp}/w", "--no-progress", "--set", "data.name=image_folder",
               "--set", "data.path={tmp}/ds/data.parquet", "--set", "data.image_size=4", "--set", "model.image_size=4",
               "--set", "model.patch_size=2", "--set", "model.num_classes=2", "--set", "train.steps=2"]
IMAGE_CASES = [
    Case("image_parquet_outside_refused_at_open", call=_image_sources, setup=_parquet_ds("../secret.png"),
         error=r"data\.parquet row 19: column 'image''s image path '\.\./secret\.png' leads outside"),
    Case("image_parquet_string_column_outside", call=_image_sources, setup=_parquet_ds("{tmp}/secret.png", struct=False),
         error=r"row 19: column 'image''s image path '/.*secret\.png' leads outside"),
    Case("image_parquet_bytes_with_any_path_ok", call=_image_sources, setup=_parquet_ds("img/a.png"),
         check=lambda t, r: r == 20),
    Case("image_parquet_outside_cli_train", argv=VIT_PARQUET, setup=_parquet_ds("../secret.png"),
         error=r"row 19: column 'image''s image path '\.\./secret\.png' leads outside", absent=("w",), protect=("ds",)),
    Case("image_cell_dotdot", call=_image_read("../secret.png"), error=r"row 0: column 'image''s image path '\.\./secret\.png' leads outside"),
    Case("image_cell_absolute_outside", call=_image_read("{tmp}/secret.png"), error=r"image path '/.*secret\.png' leads outside"),
    Case("image_cell_inside_relative", call=_image_read("img/a.png"), check=lambda t, r: r.shape == (4, 4, 3)),
    Case("image_cell_inside_absolute", call=_image_read("{tmp}/ds/img/a.png"), check=lambda t, r: r.shape == (4, 4, 3)),
    Case("image_cell_link_out", call=_image_read("img/l.png"), setup=_link("secret.png", "ds/img/l.png"),
         error=r"image path 'img/l\.png' leads outside"),
]


# ----------------------------------------------------------------------------- full disks: one line, nothing partial
def _full_disk_on(module: str, attr: str, message: str | None = None):
    """Every call of module.attr fails as a write on a full disk does (an OSError, or a library
    error carrying the OS code when `message`)."""
    def patch(monkeypatch, tmp: str) -> None:
        import importlib
        mod = importlib.import_module(module)

        def fail(*a, **k):
            if message:
                raise Exception(message)  # safetensors' SafetensorError is a plain Exception
            raise OSError(28, "No space left on device")
        monkeypatch.setattr(mod, attr, fail)
    return patch


SAFETENSORS_FULL = "Error while serializing: I/O error: No space left on device (os error 28)"
DISK_CASES = [
    Case("prepare_full_disk_last_shard", argv=[*PREP, "--input", "{tmp}/in.txt", "--out", "{tmp}/out"],
         error=r"No space left on device", setup=_text(), absent=("out",), protect=("in.txt",),
         patch=_full_disk_on("numpy", "save")),
    Case("prepare_full_disk_meta", argv=[*PREP, "--input", "{tmp}/in.txt", "--out", "{tmp}/out", "--overwrite"],
         error=r"No space left on device", setup=_seq(_text(), lambda t: _put(t, "out/keep", "old")),
         protect=("out", "in.txt"), patch=_full_disk_on("jaxformer.train.data.tokens", "write_text")),
    Case("export_torch_full_disk", argv=["export", "{tmp}/plain", "--to", "torch", "{tmp}/out.safetensors"],
         error=r"cannot write .*out\.safetensors: No space left on device", setup=lambda t: _built(t, "plain", "plain"),
         protect=("plain",), absent=("out.safetensors",), patch=_full_disk_on("safetensors.numpy", "save_file", SAFETENSORS_FULL)),
    Case("export_hf_full_disk", argv=["export", "{tmp}/plain", "--to", "hf", "{tmp}/out"],
         error=r"cannot write .*out: No space left on device", setup=lambda t: _built(t, "plain", "plain"),
         protect=("plain",), absent=("out",), patch=_full_disk_on("safetensors.numpy", "save_file", SAFETENSORS_FULL)),
    Case("export_torch_full_disk_keeps_old", argv=["export", "{tmp}/plain", "--to", "torch", "{tmp}/out.safetensors",
                                                   "--overwrite"],
         error=r"No space left on device", setup=lambda t: (_built(t, "plain", "plain"), _put(t, "out.safetensors", "old")),
         protect=("plain", "out.safetensors"), patch=_full_disk_on("safetensors.numpy", "save_file", SAFETENSORS_FULL)),
    Case("atomic_dir_library_error_other", call=lambda t: _raise_in_atomic_dir(t, ValueError("not an OS error")),
         error=r"^not an OS error$", absent=("d",)),
]


def _raise_in_atomic_dir(tmp: str, e: Exception):
    with _fileio().atomic_dir(os.path.join(tmp, "d")) as d:
        _put(d, "x", "partial")
        raise e


# ----------------------------------------------------------------------------- leftovers after kills
def _stale_and_live(tmp: str) -> None:
    _text()(tmp)
    _stale(tmp, "out")
    _put(tmp, f".tmp-out-p{os.getpid()}-live1/x", "a running writer's")  # a live process's: kept
    _put(tmp, f".tmp-out-x-p{_dead_pid()}-other/x", "another target's")  # not out's: kept


def _kept_live_and_other(tmp: str, _) -> None:
    names = sorted(n for n in os.listdir(tmp) if n.startswith(".tmp-"))
    assert names == [f".tmp-out-p{os.getpid()}-live1", names[1]] and names[1].startswith(".tmp-out-x-p"), names
    assert os.path.isfile(os.path.join(tmp, "out", "meta.json"))


LEFTOVER_CASES = [
    Case("prepare_rerun_cleans_stale", argv=[*PREP, "--input", "{tmp}/in.txt", "--out", "{tmp}/out"],
         setup=_seq(_text(), lambda t: _stale(t, "out")), check=_no_stale),
    Case("prepare_failed_rerun_cleans_stale", argv=[*PREP, "--input", "{tmp}/in.txt", "--out", "{tmp}/out"],
         error=r"No space left", setup=_seq(_text(), lambda t: _stale(t, "out")), absent=("out",),
         patch=_full_disk_on("numpy", "save")),
    Case("prepare_keeps_live_and_other_temps", argv=[*PREP, "--input", "{tmp}/in.txt", "--out", "{tmp}/out"],
         setup=_stale_and_live, check=_kept_live_and_other, keeps_temps=True),
    Case("export_torch_cleans_stale", argv=["export", "{tmp}/plain", "--to", "torch", "{tmp}/out.safetensors"],
         setup=lambda t: (_built(t, "plain", "plain"), _stale(t, "out.safetensors", file=True)), check=_no_stale),
    Case("export_no_tokenizer_writes_weights_alone", argv=["export", "{tmp}/plain", "--to", "hf", "{tmp}/out",
                                                          "--no-tokenizer"],
         setup=lambda t: (_built(t, "plain", "plain"), _put(t, "plain/tokenizer.json", "garbage")),
         check=lambda t, r: sorted(os.listdir(os.path.join(t, "out"))) == ["config.json", "model.safetensors"],
         protect=("plain",)),
    Case("export_flax_cleans_stale", argv=["export", "{tmp}/plain", "--to", "flax", "{tmp}/out"],
         setup=lambda t: (_built(t, "plain", "plain"), _stale(t, "out")), check=_no_stale),
    Case("clean_stale_returns_names", call=lambda t: _fileio().clean_stale(os.path.join(t, "out")),
         setup=lambda t: _stale(t, "out"), check=lambda t, r: len(r) == 1 and not os.listdir(t)),
]


# ----------------------------------------------------------------------------- checkpoints folder
def _ckpt(tmp: str, *entries: str) -> None:
    """{tmp}/c, a checkpoints folder: "7/" an empty folder, "9@" a link to itself (a loop),
    "5m" a folder with orbax's metadata file but garbage inside, "x.orbax-checkpoint-tmp-1" a
    partial write."""
    os.makedirs(os.path.join(tmp, "c"))
    for e in entries:
        if e.endswith("@"):
            os.symlink(e[:-1], os.path.join(tmp, "c", e[:-1]))
        elif e.endswith("m"):
            _put(tmp, f"c/{e[:-1]}/_CHECKPOINT_METADATA", "garbage")
            _put(tmp, f"c/{e[:-1]}/state/x", "garbage")
        else:
            os.makedirs(os.path.join(tmp, "c", e))


def _steps(tmp: str):
    from jaxformer.train.jax_trainer import checkpoint_steps
    return checkpoint_steps(os.path.join(tmp, "c"))


def _restore(tmp: str):
    import jax.numpy as jnp

    from jaxformer.train.checkpoint import Checkpointer
    c = Checkpointer(os.path.join(tmp, "c"), keep=2, read_only=True)
    try:
        return c.restore({"w": jnp.ones(3)})
    finally:
        c.close()


def _writer(tmp: str):
    from jaxformer.train.checkpoint import Checkpointer
    c = Checkpointer(os.path.join(tmp, "c"), keep=2, async_save=False)
    try:
        return c.all_steps()
    finally:
        c.close()


def _copied_step(tmp: str) -> None:
    """{tmp}/c: step 5 saved, then its folder copied as step 11 (step 11's record says 5)."""
    import shutil

    import jax.numpy as jnp

    from jaxformer.train.checkpoint import Checkpointer
    c = Checkpointer(os.path.join(tmp, "c"), keep=3, async_save=False)
    try:
        c.save(5, {"w": jnp.full(3, 5.0)}, {"loss": 1.0})
    finally:
        c.close()
    shutil.copytree(os.path.join(tmp, "c", "5"), os.path.join(tmp, "c", "11"))


def _restore_said(tmp: str):
    """-> (the restored record's step, state, the warnings logged)."""
    import logging
    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda r: said.append(r.getMessage())
    log = logging.getLogger("jaxformer.checkpoint")
    log.addHandler(handler)
    try:
        state, record = _restore(tmp)
    finally:
        log.removeHandler(handler)
    return record["step"], state["w"].tolist(), said


def _torch_restore_copied(tmp: str):
    """The torch trainer's restore of torch_checkpoints/ holding step_5 and a copy of it as
    step_11 (its train_state.pt says step 5) -> (the step restored, the weight)."""
    import shutil

    import torch
    from safetensors.torch import save_file

    from jaxformer.train.torch.trainer import TorchTrainer
    d = os.path.join(tmp, "tc")
    module = torch.nn.Linear(2, 1, bias=False)
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    os.makedirs(os.path.join(d, "step_5"))
    with torch.no_grad():
        module.weight.fill_(5.0)
    save_file(module.state_dict(), os.path.join(d, "step_5", "model.safetensors"))
    torch.save({"step": 5, "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                "rng": torch.get_rng_state()}, os.path.join(d, "step_5", "train_state.pt"))
    shutil.copytree(os.path.join(d, "step_5"), os.path.join(d, "step_11"))
    with torch.no_grad():
        module.weight.fill_(0.0)
    t = TorchTrainer.__new__(TorchTrainer)
    t.module, t.opt, t.sched, t.ckpt_dir = module, opt, sched, d
    return t._restore(), module.weight.tolist()


CKPT_CASES = [
    Case("torch_ckpt_record_names_other_step", call=_torch_restore_copied,
         check=lambda t, r: r == (5, [[5.0, 5.0]]),
         stderr=r"^warning: torch checkpoint step 11: ValueError: its train_state\.pt names step 5, not 11; "
                r"resumed from step 5\n$"),
    Case("ckpt_record_names_other_step", call=_restore_said, setup=_copied_step,
         check=lambda t, r: r[:2] == (5, [5.0] * 3) and len(r[2]) == 1
         and re.search(r"step 11 in .*/c is unreadable \(its record names step 5, not 11\); resumed from step 5", r[2][0])),
    Case("ckpt_empty_junk_not_a_step", call=_steps, setup=lambda t: _ckpt(t, "7"), check=lambda t, r: r == []),
    Case("ckpt_link_loop_not_a_step", call=_steps, setup=lambda t: _ckpt(t, "9@"), check=lambda t, r: r == []),
    Case("ckpt_committed_is_a_step", call=_steps, setup=lambda t: _ckpt(t, "7", "9@", "4m", "3.orbax-checkpoint-tmp-1"),
         check=lambda t, r: r == [4]),
    Case("ckpt_restore_junk_only", call=_restore, setup=lambda t: _ckpt(t, "7", "9@"), error=r"^no checkpoint in .*/c$"),
    Case("ckpt_all_corrupt_one_line", call=_restore, setup=lambda t: _ckpt(t, "8m", "4m", "2m", "7"),
         error=r"^no restorable checkpoint in .*/c: step\(s\) 8, 4, 2 unreadable \(step 8: \w+"),
    Case("ckpt_writer_removes_partial_and_junk", call=_writer,
         setup=lambda t: _ckpt(t, "7", "9@", "3.orbax-checkpoint-tmp-1"),
         check=lambda t, r: r == [] and os.listdir(os.path.join(t, "c")) == []),
]

CASES = [*TOKENS_CASES, *PARSE_CASES, *LINK_CASES, *CONFIG_CASES, *OVERWRITE_CASES, *ADAPTER_CASES,
         *IMAGE_CASES, *DISK_CASES, *LEFTOVER_CASES, *CKPT_CASES]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile(case: Case, tmp_path, capsys, monkeypatch):
    run_case(case, tmp_path, capsys, monkeypatch)
