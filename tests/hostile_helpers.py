"""Shared by the hostile-input modules (tests/test_hostile.py, tests/test_hostile_data.py): the
Case record, its runner, and the setups both use (links, a killed writer's leftovers, a small
tokens dir). A case sets up a fresh temporary directory, then runs a CLI command in-process (or
in a subprocess) or a Python call, and expects one of:
  - a one- or two-line error matching `error` (CLI: exit 2, no traceback), with every path in
    `protect` byte-for-byte unchanged and nothing in `absent` or `.tmp-*` left behind;
  - a correct result: `check(tmp, result)` holds (CLI: exit 0), and stderr matches `stderr`
    when given (a one-line warning).
`patch(monkeypatch, tmp)` simulates a fault (a full disk) or lowers a limit for the case.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_bad_input import _put, run_row, snapshot


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    argv: list[str] | None = None  # a CLI command ("{tmp}" replaced), or
    call: Callable[[str], Any] | None = None  # a Python call on the case's directory
    error: str | None = None  # regex the one-line error must match; None: success
    setup: Callable[[str], None] | None = None
    protect: tuple[str, ...] = ()
    absent: tuple[str, ...] = ()
    check: Callable[[str, Any], None] | None = None  # success: what must hold after
    patch: Callable[[Any, str], None] | None = None
    secret: str | None = None  # must not appear in the error (bytes of a file outside)
    # for run_row (test_bad_input.Row's fields)
    subprocess: bool = False
    env: dict | None = None
    preexec: Any = None
    keeps_temps: bool = False  # a live writer's temps are meant to stay
    stderr: str | None = None  # success: regex stderr must match (else: nothing on stderr checked)


def _dead_pid() -> int:
    """The pid of a process that has exited (a killed writer's, for stale temp names)."""
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _stale(tmp: str, target: str, file: bool = False) -> None:
    """A killed write's leftover beside `target`: .tmp-NAME-pPID-XXXX of a dead process."""
    name = f".tmp-{os.path.basename(target)}-p{_dead_pid()}-abc123"
    path = os.path.join(tmp, os.path.dirname(target), name)
    if file:
        _put(tmp, os.path.relpath(path, tmp), "partial")
    else:
        _put(tmp, os.path.join(os.path.relpath(path, tmp), "part.npy"), "partial")


def _no_stale(tmp: str, _=None) -> None:
    left = [n for _, dirs, files in os.walk(tmp) for n in dirs + files if n.startswith(".tmp-")]
    assert not left, left


def _seq(*fns):
    def setup(tmp: str) -> None:
        for f in fns:
            f(tmp)
    return setup


def _link(target: str, rel: str):
    def setup(tmp: str) -> None:
        os.makedirs(os.path.dirname(os.path.join(tmp, rel)), exist_ok=True)
        os.symlink(target if os.path.isabs(target) else os.path.join(tmp, target), os.path.join(tmp, rel))
    return setup


def _tokens(tmp: str, rel: str = "tok", **meta_changes) -> None:
    """{tmp}/rel: a valid tokens dir (8 ids, byte tokenizer), meta.json then changed: a key
    set to a value (None deletes), or "shard": the train shard's file name."""
    from jaxformer.train.data.tokens import TokensWriter
    with TokensWriter(os.path.join(tmp, rel), vocab_size=259, eos_id=258,
                      tokenizer={"spec": "bytes", "kind": "bytes"}) as w:
        w.add("train", [1, 2, 3, 4, 5, 6, 7])
    path = os.path.join(tmp, rel, "meta.json")
    meta = json.loads(Path(path).read_text())
    for k, v in meta_changes.items():
        if k == "shard":
            meta["splits"]["train"]["shards"][0]["file"] = v
        elif k == "whole":
            meta = v
        else:
            meta[k] = v
    with open(path, "w") as f:
        json.dump(meta, f)


def _open_split(tmp: str, rel: str = "tok"):
    from jaxformer.train.data.tokens import TokensDir
    return TokensDir(os.path.join(tmp, rel)).split("train")


def _open_split(tmp: str, rel: str = "tok"):
    from jaxformer.train.data.tokens import TokensDir
    return TokensDir(os.path.join(tmp, rel)).split("train")


def run_case(case: Case, tmp_path, capsys, monkeypatch) -> None:
    tmp = str(tmp_path)
    if case.setup:
        case.setup(tmp)
        capsys.readouterr()  # the setup's own output (progress bars) is no case's
    before = {p: snapshot(tmp, p) for p in case.protect}
    if case.patch:
        case.patch(monkeypatch, tmp)
    if case.argv is not None:
        code, err = run_row(case, tmp, capsys)
        result = None
        if case.error is None:
            assert code == 0, f"exit {code}; stderr:\n{err}"
        else:
            assert code == 2, f"exit {code}, expected 2; stderr:\n{err}"
            assert "Traceback" not in err, err
            lines = [ln for ln in err.splitlines() if ln.strip()]
            assert 1 <= len(lines) <= 2, f"{len(lines)} lines on stderr:\n{err}"
            assert re.search(case.error, lines[0]), err
    else:
        import yaml
        if case.error is None:
            result = case.call(tmp)
            err = capsys.readouterr().err
        else:
            with pytest.raises((ValueError, OSError, yaml.YAMLError)) as info:
                case.call(tmp)
            err = str(info.value).strip()
            if isinstance(info.value, yaml.YAMLError):
                err = str(getattr(info.value, "problem", None) or err)
            lines = err.splitlines()
            assert len(lines) <= 2, f"{len(lines)} lines:\n{err}"
            assert re.search(case.error, lines[0]), err
    if case.secret:
        assert case.secret not in err, err
    if case.check is not None:
        assert case.check(tmp, result) is not False
    for p in case.protect:
        assert snapshot(tmp, p) == before[p], f"{p} changed"
    for p in case.absent:
        assert not os.path.lexists(os.path.join(tmp, p)), f"{p} was left behind"
    if case.stderr is not None:
        assert re.search(case.stderr, err), err
    if not case.keeps_temps:
        _no_stale(tmp)
