"""A labelled text task from real text that ships with Python: given a snippet of bytes, say
where it comes from.

    class 0  prose of the language reference  (pydoc_data.topics)
    class 1  Python source code of stdlib modules (comments and docstrings removed)
    class 2  docstrings of the same stdlib modules, their classes and functions

Each class's text is split by position (first 90% train, last 10% eval); snippets are random
windows of seq_len - 1 bytes, prefixed by [CLS] (id 1) for first-token pooling. The text is
CPython's own, so it can differ slightly between Python versions; on one version it is fixed.
"""
from __future__ import annotations

import ast
import importlib
import inspect
from dataclasses import dataclass

import numpy as np

from jaxformer.config.base import check, check_positive
from jaxformer.train.data import tokenizer

MODULES = ("argparse", "textwrap", "json.decoder", "json.encoder", "dataclasses", "functools",
           "pathlib", "collections", "calendar", "configparser", "difflib", "fractions", "heapq",
           "ipaddress", "shlex", "statistics", "string", "tarfile", "zipfile", "logging")
CLASSES = ("reference prose", "python code", "docstrings")


@dataclass(frozen=True)
class Config:
    seq_len: int = 64
    examples_per_class: int = 2000
    eval_fraction: float = 0.1

    def __post_init__(self):
        check_positive(self, "seq_len", "examples_per_class")
        check(self.seq_len >= 8, "seq_len", "must be >= 8")
        check(0 < self.eval_fraction < 0.5, "eval_fraction", f"must be in (0, 0.5), got {self.eval_fraction}")


def _code_and_docstrings() -> tuple[str, str]:
    code, docs = [], []
    for name in MODULES:
        src = inspect.getsource(importlib.import_module(name))
        tree = ast.parse(src)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                d = ast.get_docstring(node)
                if d:
                    docs.append(d)
                    body = node.body
                    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                        node.body = body[1:] or [ast.Pass()]
        code.append(ast.unparse(tree))  # no comments, no docstrings
    return "\n\n".join(code), "\n\n".join(docs)


def texts() -> list[str]:
    from pydoc_data.topics import topics
    prose = "\n\n".join(topics[k] for k in sorted(topics))
    code, docs = _code_and_docstrings()
    return [prose, code, docs]


def _snippets(ids: np.ndarray, n: int, length: int, rng: np.random.Generator) -> np.ndarray:
    starts = rng.integers(0, len(ids) - length, size=n)
    return ids[starts[:, None] + np.arange(length)[None, :]]


def load(cfg: Config, seed: int):
    rng = np.random.default_rng(seed)
    n_eval = max(1, int(cfg.examples_per_class * cfg.eval_fraction))
    parts = {"train": ([], []), "eval": ([], [])}
    for label, text in enumerate(texts()):
        ids = tokenizer.encode(text)
        cut = int(len(ids) * 0.9)
        for split, seg, n in (("train", ids[:cut], cfg.examples_per_class), ("eval", ids[cut:], n_eval)):
            snip = _snippets(seg, n, cfg.seq_len - 1, rng)
            parts[split][0].append(np.concatenate([np.full((n, 1), tokenizer.BOS, np.int32), snip], 1))
            parts[split][1].append(np.full(n, label, np.int32))
    out = []
    for split in ("train", "eval"):
        ids, labels = np.concatenate(parts[split][0]), np.concatenate(parts[split][1])
        perm = rng.permutation(len(ids))  # interleave classes (eval batches see all classes)
        out.append({"ids": ids[perm].astype(np.int32), "labels": labels[perm]})
    return out[0], out[1]
