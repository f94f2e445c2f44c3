"""docs/shared.md covers every shared function (issue 52): an ast scan of the SHARED modules'
public top-level functions (and the public methods of RECORDS), each of which must be named in a
row of the inventory table, and every test a row names must exist. A new function in a shared
module fails here until it has a row: its formula, its independent reference, its test (or
"none yet", said out loud).
"""
from __future__ import annotations

import ast
import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "shared.md")

# How the list was chosen: the jaxformer modules both trees run (what torch_ref/ and
# jaxformer/train/torch/ import from jaxformer: `grep -rhoE "from jaxformer[a-zA-Z_.]* import"
# torch_ref jaxformer/train/torch` -> config/, tables.py, train/optim.py, train/init.py,
# train/tasks.py, train/data/), the code only one tree has and the mirror therefore never checks
# (the HF importers and exporters, hf/), and the decode-weight quantizers, whose rounding rule
# the two trees' twins share. The trees' plumbing (convert.py, checkpoint_io.py, fileio.py,
# train/config.py, train/workdir.py, train/logging_utils.py) moves values without arithmetic
# and is left out.
SHARED = (
    "jaxformer/config/*.py",
    "jaxformer/tables.py",
    "jaxformer/train/optim.py",
    "jaxformer/train/init.py",
    "jaxformer/train/tasks.py",
    "jaxformer/train/data/*.py",
    "jaxformer/hf/*.py",
    "jaxformer/layers/kernels/quant.py",
)
# record classes whose public methods are rules both trees build layers from (which layers
# slide, head sizes, score scale, per-layer RoPE)
RECORDS = {"jaxformer/config/transformer.py": ("TransformerConfig",)}

_ROW = re.compile(r"^\|\s*`([^`]+\.py)`:\s*(.*?)\s*\|")
_TEST = re.compile(r"`(tests/[\w/]+\.py)::(test_\w+)`")


def shared_modules() -> list[str]:
    out = []
    for pattern in SHARED:
        out += sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern)))
    return out


def public_functions(path: str) -> list[str]:
    """Public top-level functions of a module, and Class.method for its RECORDS classes."""
    with open(os.path.join(ROOT, path)) as f:
        tree = ast.parse(f.read())
    funcs = (ast.FunctionDef, ast.AsyncFunctionDef)
    names = [n.name for n in tree.body if isinstance(n, funcs) and not n.name.startswith("_")]
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in RECORDS.get(path, ()):
            names += [f"{node.name}.{n.name}" for n in node.body if isinstance(n, funcs) and not n.name.startswith("_")]
    return names


def inventory(text: str) -> tuple[dict[str, set[str]], list[tuple[str, str]]]:
    """-> ({module: names its rows list}, [(test file, test name) every row names])."""
    covered: dict[str, set[str]] = {}
    tests = []
    for line in text.splitlines():
        m = _ROW.match(line)
        if not m:
            continue
        covered.setdefault(m.group(1), set()).update(re.findall(r"`([\w.]+)`", m.group(2)))
        tests += _TEST.findall(line.rsplit("|", 2)[-2])
    return covered, tests


def missing_functions(text: str) -> list[str]:
    covered, _ = inventory(text)
    return [f"{path}: {name}" for path in shared_modules() for name in public_functions(path)
            if name not in covered.get(path, set())]


def _read_doc() -> str:
    with open(DOC) as f:
        return f.read()


def test_every_shared_function_has_a_row():
    missing = missing_functions(_read_doc())
    assert not missing, ("functions of shared modules without a row in docs/shared.md (add one: "
                         "formula, independent reference, test or 'none yet'):\n  " + "\n  ".join(missing))


def test_every_named_test_exists():
    _, tests = inventory(_read_doc())
    assert len(tests) > 50
    bad = []
    for file, name in sorted(set(tests)):
        path = os.path.join(ROOT, file)
        if not os.path.exists(path):
            bad.append(f"{file} (no such file)")
            continue
        with open(path) as f:
            if not re.search(rf"^def {name}\(", f.read(), re.M):
                bad.append(f"{file}::{name} (no such test)")
    assert not bad, "docs/shared.md names tests that do not exist:\n  " + "\n  ".join(bad)


def test_the_check_can_fail():
    """Removing a row, or one name from a row, makes a function go missing."""
    text = _read_doc()
    row = next(line for line in text.splitlines() if line.startswith("| `jaxformer/train/optim.py`: `lr_multiplier`"))
    assert missing_functions(text.replace(row + "\n", "")) == ["jaxformer/train/optim.py: lr_multiplier"]
    row = next(line for line in text.splitlines() if line.startswith("| `jaxformer/tables.py`: `rope_inv_freq`"))
    assert missing_functions(text.replace(row, row.replace(", `yarn_mscale`", ""))) == ["jaxformer/tables.py: yarn_mscale"]
    assert len(shared_modules()) > 50 and sum(len(public_functions(p)) for p in shared_modules()) > 300
