"""Atomic file and directory writes (framework-free, bottom layer).

Everything jaxformer writes goes through these: the content is built under a temporary name
in the destination's own folder and renamed into place only when complete, so a failed or
killed write leaves no partial file and never touches an existing good one.

    with atomic_file("out.safetensors") as tmp:   # tmp: a path in the same folder
        save_file(tensors, tmp)
    with atomic_dir("ckpt", overwrite=True) as tmp:  # tmp: an empty folder beside ckpt
        ...
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from typing import Iterator


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _parent(path: str) -> str:
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    return parent


@contextlib.contextmanager
def atomic_file(path: str) -> Iterator[str]:
    """Yield a temporary path beside `path`; on a clean exit it replaces `path` (os.replace is
    atomic on POSIX), on any error it is removed and `path` is left as it was."""
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{os.path.basename(path)}-", dir=_parent(path))
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it 0600; a written file gets the usual mode
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


@contextlib.contextmanager
def atomic_dir(path: str, *, overwrite: bool = False) -> Iterator[str]:
    """Yield an empty temporary folder beside `path`; on a clean exit it takes `path`'s place.

    An existing `path` is an error (FileExistsError, raised before anything is written) unless
    overwrite is True; it is then removed only after the new folder is complete."""
    if os.path.lexists(path) and not overwrite:
        raise FileExistsError(f"{path} exists; choose another output or pass --overwrite")
    tmp = tempfile.mkdtemp(prefix=f".tmp-{os.path.basename(os.path.abspath(path))}-", dir=_parent(path))
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it 0700
    try:
        yield tmp
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.remove(path)
        os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_text(path: str, text: str) -> None:
    """Write a text file atomically."""
    with atomic_file(path) as tmp:
        with open(tmp, "w") as f:
            f.write(text)
