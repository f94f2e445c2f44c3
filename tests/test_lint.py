"""ruff over the whole tree, configured in pyproject.toml ([tool.ruff]): pyflakes (unused and
undefined names, unused imports), import order, syntax errors, bugbear (B: zip without strict=,
closures over loop variables, calls in defaults, ...), pyupgrade (UP), simplify (SIM) and unused
`noqa` comments (RUF100). A finding fails the suite with ruff's own lines (`ruff check --fix`
repairs most). A `noqa` that stays says why on its own line."""
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


def test_every_noqa_says_why():
    """`# noqa: CODE (reason)`: a suppression without a reason on the same line is refused."""
    import re
    bare = []
    for folder in ("jaxformer", "torch_ref", "tests", "parity_tests", "bench", "docs", "examples", "train"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
            for name in files:
                if not name.endswith(".py"):
                    continue
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8") as f:
                    for i, line in enumerate(f, 1):
                        m = re.search(r"#\s*noqa\b(:\s*[A-Z]+[0-9]+(?:\s*,\s*[A-Z]+[0-9]+)*)?(.*)$", line)
                        if m and not re.search(r"\w", m.group(2)):
                            bare.append(f"{os.path.relpath(path, ROOT)}:{i}: {line.strip()}")
    assert not bare, "noqa without a reason:\n" + "\n".join(bare)
