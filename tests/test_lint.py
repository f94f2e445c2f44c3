"""ruff over the whole tree, configured in pyproject.toml ([tool.ruff]): pyflakes (unused and
undefined names, unused imports), import order and syntax errors. A finding fails the suite
with ruff's own lines (`ruff check --fix` repairs most)."""
from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_ruff_finds_nothing():
    run = subprocess.run([sys.executable, "-m", "ruff", "check", "--output-format", "concise", "--no-cache", ROOT],
                         capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr


def test_ruff_would_catch_an_unused_import(tmp_path):
    """The lint really runs with the project's rules (so the test above can fail)."""
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n")
    run = subprocess.run([sys.executable, "-m", "ruff", "check", "--config", os.path.join(ROOT, "pyproject.toml"),
                          "--no-cache", str(bad)], capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 1 and "F401" in run.stdout
