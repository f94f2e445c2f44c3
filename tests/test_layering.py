"""The package layering, checked from the source: every import (top-level, in-function, and a
string naming a module, as importlib and the registries use) goes down, never up.

    0. the package root (jaxformer/__init__.py) is the facade: `jaxformer.load` may reach any
       rank, but only inside functions, so `import jaxformer` stays framework-free
    1. config, tables, fileio                                 framework-free
    2. lowering, memory (jax only); then layers; then models   jax / flax
    3. convert; then interop (torch.nn import); then checkpoint_io, generation, parity
    4. hf, train, port                                       (none imports another)
    5. cli, __main__

torch_ref imports only torch_ref and the framework-free rank-1 modules. The core (config,
layers, models) never imports torch or torch_ref. torch_ref is imported only by parity, convert,
the CLI, the torch twin of the trainer (`jaxformer/train/torch/`, which the CLI loads
only for `--framework torch`) and the trainers' trajectory check (`jaxformer/train/trajectory.py`); parity, convert and the CLI import it only inside functions.
The rest of jaxformer never imports it at all.
"""
from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RANK = {
    "jaxformer": 1, "jaxformer.config": 1, "jaxformer.tables": 1, "jaxformer.fileio": 1,
    "jaxformer.lowering": 1.5, "jaxformer.memory": 1.5, "jaxformer.layers": 2, "jaxformer.models": 2.5,
    "jaxformer.convert": 3, "jaxformer.module_weights": 3.3, "jaxformer.checkpoint_io": 3.5, "jaxformer.generation": 3.5,
    "jaxformer.parity": 3.5, "jaxformer.interop": 3.25,
    "jaxformer.hf": 4, "jaxformer.train": 4, "jaxformer.port": 4,
    "jaxformer.cli": 5, "jaxformer.__main__": 6,
}
FRAMEWORK_FREE = ("jaxformer", "jaxformer.config", "jaxformer.tables", "jaxformer.fileio")
HOLDS_TORCH_REF = ("jaxformer.parity", "jaxformer.convert", "jaxformer.cli",
                   "jaxformer.train.torch.trainer", "jaxformer.train.torch.tasks",
                   "jaxformer.train.torch.init", "jaxformer.train.trajectory")
CORE = ("jaxformer.config", "jaxformer.layers", "jaxformer.models")
MODULE_STRING = re.compile(r"^(jaxformer|torch_ref)(\.[A-Za-z_]\w*)+")


def _room(module: str) -> str:
    """The RANK key a dotted module belongs to (its longest listed prefix)."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in RANK:
            return ".".join(parts[:n])
    raise AssertionError(f"{module}: not in the layering table; add it to RANK")


def _within(module: str, prefixes) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _modules(top: str):
    for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(dirpath, f), ROOT)[:-3].replace(os.sep, ".")
                yield rel.removesuffix(".__init__"), os.path.join(dirpath, f)


def imports(path: str, module: str):
    """-> [(imported module, lineno, lazy)] for import statements and module-path strings."""
    tree = ast.parse(Path(path).read_text(), path)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    top_level = {id(n) for n in tree.body}
    out = []
    for node in ast.walk(tree):
        lazy = id(node) not in top_level
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno, lazy) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            out += [(f"{base}.{a.name}" if _is_module(f"{base}.{a.name}") else base, node.lineno, lazy)
                    for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            m = MODULE_STRING.match(node.value)
            if m and node.value[m.end():m.end() + 1] in ("", ":"):
                out.append((m.group(0), node.lineno, True))
    return out


def _is_module(dotted: str) -> bool:
    p = os.path.join(ROOT, *dotted.split("."))
    return os.path.isdir(p) or os.path.isfile(p + ".py")


JAXFORMER = sorted(_modules("jaxformer"))
TORCH_REF = sorted(_modules("torch_ref"))


@pytest.mark.parametrize("module,path", JAXFORMER, ids=[m for m, _ in JAXFORMER])
def test_jaxformer_imports_go_down(module, path):
    room = _room(module)
    bad = []
    for target, line, lazy in imports(path, module):
        top = target.split(".")[0]
        where = f"{os.path.relpath(path, ROOT)}:{line} imports {target}"
        if module == "jaxformer":  # the facade: anything, but never at import time
            if top == "jaxformer" and target != "jaxformer" and not lazy:
                bad.append(f"{where} at import time (the package root imports nothing eagerly)")
            continue
        if top == "jaxformer" and target != "jaxformer" and not _within(target, (room,)):
            other = _room(target)
            if RANK[other] >= RANK[room]:
                bad.append(f"{where} (rank {RANK[other]} from rank {RANK[room]})")
        if top == "torch_ref":
            if not _within(module, HOLDS_TORCH_REF):
                bad.append(f"{where} (only parity, convert, the CLI and the torch trainer hold both trees)")
            elif not lazy and not _within(module, ("jaxformer.train",)):
                bad.append(f"{where} at import time (import torch_ref inside the function that needs it)")
        if top in ("torch", "torch_ref") and _within(module, CORE):
            bad.append(f"{where} (the core stays free of torch)")
        framework_free = module == "jaxformer" or _within(module, FRAMEWORK_FREE[1:])
        if top in ("jax", "flax", "optax", "orbax", "torch") and framework_free:
            bad.append(f"{where} (a framework-free module)")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("module,path", TORCH_REF, ids=[m for m, _ in TORCH_REF])
def test_torch_ref_imports_only_framework_free_config(module, path):
    bad = []
    for target, line, _ in imports(path, module):
        top = target.split(".")[0]
        where = f"{os.path.relpath(path, ROOT)}:{line} imports {target}"
        if top in ("jax", "flax", "optax", "orbax"):
            bad.append(where)
        if top == "jaxformer" and not any(_within(target, (p,)) for p in FRAMEWORK_FREE[1:]):
            bad.append(f"{where} (torch_ref may import only {FRAMEWORK_FREE[1:]})")
    assert not bad, "\n".join(bad)


def test_package_root_imports_no_framework():
    """`import jaxformer` (which torch_ref does through jaxformer.config) pulls in no framework."""
    import subprocess
    import sys
    code = ("import sys, jaxformer, jaxformer.config, jaxformer.tables, jaxformer.fileio; "
            "bad = [m for m in ('jax', 'flax', 'torch', 'optax') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr


def test_checker_sees_lazy_and_string_imports(tmp_path):
    """The checker is not blind: an in-function import and a module-path string both count."""
    f = tmp_path / "m.py"
    f.write_text("def f():\n    import torch_ref.models\n    return 'jaxformer.cli.train'\n")
    got = imports(str(f), "jaxformer.models.m")
    assert ("torch_ref.models", 2, True) in got and ("jaxformer.cli.train", 3, True) in got


def _module_of(target: str, known) -> str | None:
    """The known module a dotted import target names (its longest known prefix)."""
    parts = target.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in known:
            return ".".join(parts[:n])
    return None


def import_graph(modules: dict[str, str]) -> dict[str, set[str]]:
    """module -> the modules it imports (top-level, lazy and string), among `modules`. A module
    naming one of its own parent packages in a string (importlib.resources.files of its data
    folder) does not import it: Python has loaded the parent before the module anyway."""
    graph = {m: set() for m in modules}
    for module, path in modules.items():
        tree = ast.parse(Path(path).read_text(), path)
        strings = {n.lineno for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        for target, line, lazy in imports(path, module):
            other = _module_of(target, modules)
            if other is None or other == module:
                continue
            if lazy and line in strings and module.startswith(other + "."):
                continue
            graph[module].add(other)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle_inside_a_package():
    """Within a package the modules import each other one way too: no circle, lazy imports and
    module-path strings included (a lazy import that goes back is still an arrow back)."""
    found = circles(import_graph(dict(JAXFORMER + TORCH_REF)))
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_circle_checker_sees_a_lazy_circle(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("import jaxformer.layers.b\n")
    b.write_text("def f():\n    import jaxformer.layers.a\n")
    graph = import_graph({"jaxformer.layers.a": str(a), "jaxformer.layers.b": str(b)})
    assert circles(graph) == [["jaxformer.layers.a", "jaxformer.layers.b"]]
