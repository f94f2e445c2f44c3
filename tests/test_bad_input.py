"""Every bad input a user can give the CLI, in one table. Each row asserts the exit code, a phrase
of the message, that stderr is one or two lines with no traceback, and that what the row
protects (an existing workdir, a destination, an input) is byte-for-byte unchanged, with nothing
new left behind where the command would have written.

A row runs `jaxformer ARGV` in-process (cli.main, stderr captured) from a fresh temporary
directory that its `setup` fills; `subprocess=True` runs it as a separate process instead (for
rows that need signals, resource limits or a clean interpreter).
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
import sys
from typing import Callable

import pytest


@dataclasses.dataclass(frozen=True)
class Row:
    name: str
    argv: list[str]  # after `jaxformer`; "{tmp}" is replaced by the row's directory
    phrase: str  # must appear in stderr (case-insensitive)
    setup: Callable[[str], None] | None = None  # fills the row's directory
    code: int = 2
    protect: tuple[str, ...] = ()  # paths (relative) whose bytes and listing must not change
    absent: tuple[str, ...] = ()  # paths (relative) that must not exist afterwards
    subprocess: bool = False
    env: dict | None = None


def snapshot(root: str, rel: str) -> dict:
    """{relative path: sha256} of a file or every file under a folder (missing: {})."""
    path = os.path.join(root, rel)
    if os.path.isfile(path):
        return {rel: hashlib.sha256(open(path, "rb").read()).hexdigest()}
    out = {}
    for dirpath, dirs, files in os.walk(path):
        for name in dirs + files:
            p = os.path.join(dirpath, name)
            key = os.path.relpath(p, root)
            out[key] = hashlib.sha256(open(p, "rb").read()).hexdigest() if os.path.isfile(p) else "dir"
    return out


def run_row(row: Row, tmp: str, capsys) -> tuple[int, str]:
    argv = [a.replace("{tmp}", tmp) for a in row.argv]
    if row.subprocess:
        env = {**os.environ, **(row.env or {})}
        r = subprocess.run([sys.executable, "-m", "jaxformer", *argv], cwd=tmp, env=env,
                           capture_output=True, text=True, timeout=600)
        return r.returncode, r.stderr
    from jaxformer import cli
    cwd = os.getcwd()
    os.chdir(tmp)
    try:
        code = cli.main(argv)
    except SystemExit as e:  # argparse usage errors
        code = e.code
    finally:
        os.chdir(cwd)
    return code, capsys.readouterr().err


def _not_a_run(tmp: str) -> None:
    os.makedirs(os.path.join(tmp, "empty"))
    with open(os.path.join(tmp, "keep.png"), "wb") as f:
        f.write(b"an existing picture")


ROWS: list[Row] = [
    # ---------------------------------------------------------------- plot and parity report
    Row("plot_dir_without_metrics", ["plot", "{tmp}/empty", "--out", "{tmp}/keep.png"], "no metrics.jsonl",
        setup=_not_a_run, protect=("keep.png", "empty")),
    Row("plot_missing_dir", ["plot", "{tmp}/nowhere"], "no metrics.jsonl", absent=("nowhere",)),
    # ---------------------------------------------------------------- config and workdir (train)
    # ---------------------------------------------------------------- export, load, generate
    # ---------------------------------------------------------------- convert and import
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_bad_input(row: Row, tmp_path, capsys):
    tmp = str(tmp_path)
    if row.setup:
        row.setup(tmp)
    before = {p: snapshot(tmp, p) for p in row.protect}
    code, err = run_row(row, tmp, capsys)
    assert code == row.code, f"exit {code}, expected {row.code}; stderr:\n{err}"
    assert row.phrase.lower() in err.lower(), err
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert 1 <= len(lines) <= 2, f"{len(lines)} lines on stderr:\n{err}"
    for p in row.protect:
        assert snapshot(tmp, p) == before[p], f"{p} changed"
    for p in row.absent:
        assert not os.path.lexists(os.path.join(tmp, p)), f"{p} was left behind"
    leftovers = [n for n in os.listdir(tmp) if n.startswith(".tmp-")]
    assert not leftovers, f"temporary files left behind: {leftovers}"
