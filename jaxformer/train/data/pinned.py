"""The embedded text corpora, pinned: the exact bytes the `stdlib_docs` and `text_source`
datasets train on, shipped with the package (`embedded/*.txt.xz`) and checked against their
sha256 at load.

The texts come from CPython itself (the language reference in `pydoc_data.topics`, stdlib
modules' source through `inspect.getsource` and `ast.unparse`), and those differ between Python
builds: the reference is 466,273 bytes on 3.11.7, 467,332 on 3.11.2, 493,500 on 3.12 and 511,947
on 3.13. Reading the pinned files instead, every Python trains on the same data, and the README's
figures hold everywhere.

Regenerating the files (a deliberate change of the training data, never done in CI; it changes
the README's figures): `python -m jaxformer.train.data.pinned`. It rewrites `embedded/` from the
running Python and prints the new PINNED table to paste below.
"""
from __future__ import annotations

import ast
import functools
import hashlib
import importlib
import inspect
import lzma
import os
import sys
from importlib import resources

# name -> sha256 of the UTF-8 text (the decompressed file), generated on CPython 3.11.7
PINNED = {
    "pydoc_topics": "71f2ff5d99bdc1f9c48c5c2353ad138201c5ca1c377e0226857ef8fa89b8bcee",
    "stdlib_code": "9efd188e329be3fe1ffffcca778ff8b4118aab367b7a73dbd7779d66c3766f25",
    "stdlib_docstrings": "1b45cfec08dc3a69acc0cd51ccc4f83b49e21456eb157410a2a2bb698d77e80f",
}
GENERATED_ON = "3.11.7"  # the CPython the pinned texts were read from
MAX_TEXT_BYTES = 64 << 20  # a pinned text decompresses to at most this (they are 0.5-2 MB)

# stdlib modules whose source (class 1) and docstrings (class 2) text_source reads
MODULES = ("argparse", "textwrap", "json.decoder", "json.encoder", "dataclasses", "functools",
           "pathlib", "collections", "calendar", "configparser", "difflib", "fractions", "heapq",
           "ipaddress", "shlex", "statistics", "string", "tarfile", "zipfile", "logging")


def file_name(name: str) -> str:
    return f"{name}.txt.xz"


def _folder():
    return resources.files("jaxformer.train.data") / "embedded"


@functools.cache
def text(name: str) -> str:
    """The pinned text `name` (a PINNED key), its hash checked; ValueError naming the file if it
    is missing, unreadable or altered."""
    if name not in PINNED:
        raise ValueError(f"no pinned text {name!r}; known: {sorted(PINNED)}")
    path = _folder() / file_name(name)
    try:
        raw = _decompress(path.read_bytes(), MAX_TEXT_BYTES)
    except (OSError, lzma.LZMAError) as e:
        raise ValueError(f"{path}: cannot read the pinned corpus ({e}); reinstall jaxformer") from None
    if raw is None:
        raise ValueError(f"{path}: decompresses to more than {MAX_TEXT_BYTES} bytes (an xz bomb?); "
                         "refused; reinstall jaxformer")
    digest = hashlib.sha256(raw).hexdigest()
    if digest != PINNED[name]:
        raise ValueError(f"{path}: sha256 {digest[:16]}... differs from the pinned "
                         f"{PINNED[name][:16]}...; the file was altered (reinstall jaxformer)")
    return raw.decode("utf-8")


def _decompress(data: bytes, limit: int) -> bytes | None:
    """xz `data` decompressed, or None if it holds more than `limit` bytes (never more than
    limit + 1 bytes are produced)."""
    d = lzma.LZMADecompressor()
    raw = d.decompress(data, max_length=limit + 1)
    if len(raw) > limit:
        return None
    if not d.eof:
        raise lzma.LZMAError("the compressed data ends early")
    return raw


# ---------------------------------------------------------------- the live texts (regeneration)
def live_texts() -> dict[str, str]:
    """The texts as the running Python gives them (what the pinned files were made from)."""
    from pydoc_data.topics import topics
    prose = "\n\n".join(topics[k] for k in sorted(topics))
    code, docs = [], []
    for module in MODULES:
        tree = ast.parse(inspect.getsource(importlib.import_module(module)))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                d = ast.get_docstring(node)
                if d:
                    docs.append(d)
                    body = node.body
                    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                        node.body = body[1:] or [ast.Pass()]
        code.append(ast.unparse(tree))  # no comments, no docstrings
    return {"pydoc_topics": prose, "stdlib_code": "\n\n".join(code), "stdlib_docstrings": "\n\n".join(docs)}


def regenerate(folder: str | None = None) -> dict[str, str]:
    """Write the live texts as `folder`/NAME.txt.xz (default: this package's embedded/) and
    return {name: sha256} for the PINNED table."""
    from jaxformer.fileio import atomic_file
    folder = folder or str(_folder())
    os.makedirs(folder, exist_ok=True)
    hashes = {}
    for name, t in live_texts().items():
        raw = t.encode("utf-8")
        with atomic_file(os.path.join(folder, file_name(name))) as tmp, open(tmp, "wb") as f:
            f.write(lzma.compress(raw, preset=9 | lzma.PRESET_EXTREME))
        hashes[name] = hashlib.sha256(raw).hexdigest()
    return hashes


if __name__ == "__main__":
    new = regenerate(sys.argv[1] if len(sys.argv) > 1 else None)
    print(f"# generated on CPython {sys.version.split()[0]}; paste into PINNED and GENERATED_ON")
    for k, v in new.items():
        print(f'    "{k}": "{v}",')
