"""The embedded text corpora are pinned bytes shipped with the package (train/data/pinned.py):
their hash is checked at load, an altered file is refused, and on the CPython they were made
from they equal the live texts, so the main job trains on exactly the data it always did."""
from __future__ import annotations

import hashlib
import lzma
import shutil
import sys

import numpy as np
import pytest

from jaxformer.train.data import pinned, stdlib_docs, text_source

SAME_PYTHON = sys.version.split()[0] == pinned.GENERATED_ON


def _digest(arrays: dict) -> str:
    m = hashlib.sha256()
    for k in sorted(arrays):
        m.update(k.encode() + str(arrays[k].shape).encode() + str(arrays[k].dtype).encode())
        m.update(np.ascontiguousarray(arrays[k]).tobytes())
    return m.hexdigest()


def test_pinned_texts_match_their_hashes():
    for name, sha in pinned.PINNED.items():
        assert hashlib.sha256(pinned.text(name).encode("utf-8")).hexdigest() == sha
    assert len(pinned.text("pydoc_topics").encode()) == 466_273  # CPython 3.11.7's reference


def test_main_job_data_are_the_same_bytes_as_before():
    """The lm config's windows (seq_len 128) and text_source's default examples, hashed when
    the datasets still read CPython 3.11.7 live: any change of the data changes these."""
    train, evaluation = stdlib_docs.load(stdlib_docs.Config(seq_len=128), 0)
    assert train["tokens"].shape == (3460, 129) and evaluation["tokens"].shape == (180, 129)
    assert _digest(train) == "a14b6f1c5002af159b3c25234564b8ef19c9a9d26583267db3e826a12023edad"
    assert _digest(evaluation) == "b07d5cba3909c7f31ae62135ab2db83917dcd8949628b28edaa77d60c4f948b4"
    train, evaluation = text_source.load(text_source.Config(), 0)
    assert _digest(train) == "d19cb6f5d7389652fe9c89da0b5270dee34db6e8525c895e0a8158d50eaf110d"
    assert _digest(evaluation) == "3f77c65155a801d73f0ae4b09ff92637cb95a00146db304022da7e224c00f77f"


@pytest.mark.skipif(not SAME_PYTHON, reason=f"the pinned texts come from CPython {pinned.GENERATED_ON}")
def test_pinned_texts_equal_the_live_ones_on_their_python():
    live = pinned.live_texts()
    for name in pinned.PINNED:
        assert live[name] == pinned.text(name), name


def test_an_altered_file_is_refused(tmp_path, monkeypatch):
    folder = tmp_path / "embedded"
    shutil.copytree(pinned._folder(), folder)
    raw = lzma.decompress((folder / "pydoc_topics.txt.xz").read_bytes())
    (folder / "pydoc_topics.txt.xz").write_bytes(lzma.compress(raw.replace(b"statement", b"statemant", 1)))
    (folder / "stdlib_code.txt.xz").write_bytes(b"not xz")
    monkeypatch.setattr(pinned, "_folder", lambda: folder)
    pinned.text.cache_clear()
    try:
        with pytest.raises(ValueError, match=r"pydoc_topics\.txt\.xz: sha256 .* differs .* altered"):
            pinned.text("pydoc_topics")
        with pytest.raises(ValueError, match=r"stdlib_code\.txt\.xz: cannot read"):
            pinned.text("stdlib_code")
        (folder / "stdlib_docstrings.txt.xz").unlink()
        with pytest.raises(ValueError, match=r"stdlib_docstrings\.txt\.xz: cannot read"):
            pinned.text("stdlib_docstrings")
    finally:
        pinned.text.cache_clear()


def test_regenerate_writes_files_that_load(tmp_path, monkeypatch):
    hashes = pinned.regenerate(str(tmp_path))
    monkeypatch.setattr(pinned, "_folder", lambda: tmp_path)
    monkeypatch.setattr(pinned, "PINNED", hashes)
    pinned.text.cache_clear()
    try:
        assert set(hashes) == {"pydoc_topics", "stdlib_code", "stdlib_docstrings"}
        assert pinned.text("stdlib_code")  # the written files pass their own hashes
    finally:
        pinned.text.cache_clear()
