"""`data.name: image_folder` (train/data/image_folder.py): your own images for vit and swin, from
a folder per class, a `datasets.save_to_disk` folder or Parquet files. Every image below is
written by Pillow into tmp_path: no download."""
from __future__ import annotations

import io
import os

import numpy as np
import pytest
from PIL import Image

from jaxformer.config import ConfigError
from jaxformer.train.config import config_from_dict
from jaxformer.train.data import image_folder

CLASSES = ("cat", "dog", "owl")
PER_CLASS = 5


def _image(label: int, i: int) -> Image.Image:
    """A class-coloured image of varying size and mode (the loader resizes and converts)."""
    rng = np.random.default_rng(10 * label + i)
    h, w = 10 + 3 * i, 14 + label
    x = rng.integers(0, 60, (h, w, 3), dtype=np.uint8)
    x[..., label] += 180  # the class is the dominant channel: learnable in a few steps
    im = Image.fromarray(x)
    return im.convert("RGBA") if i == 1 else im.convert("L") if i == 2 and label == 0 else im


def make_folder(root) -> str:
    for label, c in enumerate(CLASSES):
        os.makedirs(root / c)
        for i in range(PER_CLASS):
            _image(label, i).save(root / c / f"{i}.{'jpg' if i == 3 else 'png'}")
    (root / "cat" / "notes.txt").write_text("not an image: skipped")
    (root / ".hidden").mkdir()
    return str(root)


def _png(im: Image.Image) -> bytes:
    buf = io.BytesIO()
    im.save(buf, "PNG")
    return buf.getvalue()


def _cfg(path, **kw):
    return image_folder.Config(path=str(path), image_size=8, **kw)


def test_folder_sources_decode_lazily_with_a_seeded_stratified_split(tmp_path):
    path = make_folder(tmp_path / "imgs")
    train, evaluation = image_folder.sources(_cfg(path, eval_fraction=0.2), seed=0)
    assert len(train) == 12 and len(evaluation) == 3  # round(0.2 * 5) = 1 per class
    assert sorted(evaluation.labels) == [0, 1, 2]
    item = train[0]
    assert set(item) == {"images", "labels"}
    assert item["images"].shape == (8, 8, 3) and item["images"].dtype == np.float32
    assert item["labels"].shape == () and item["labels"].dtype == np.int32
    again, _ = image_folder.sources(_cfg(path, eval_fraction=0.2), seed=0)
    other, _ = image_folder.sources(_cfg(path, eval_fraction=0.2), seed=1)
    assert list(again.labels) == list(train.labels)
    assert [train._read(i)[1] for i in range(12)] != [other._read(i)[1] for i in range(12)]
    arrays, _ = image_folder.load(_cfg(path, eval_fraction=0.2), seed=0)
    np.testing.assert_array_equal(arrays["images"][5], train[5]["images"])
    np.testing.assert_array_equal(arrays["labels"], train.labels)


def test_decode_resizes_converts_and_normalizes(tmp_path):
    white = tmp_path / "white.png"
    Image.new("RGB", (5, 3), (255, 255, 255)).save(white)
    x = image_folder.decode(str(white), "white.png", _cfg(tmp_path, mean=[0.5, 0.25, 0.0], std=[0.5, 0.25, 2.0]))
    assert x.shape == (8, 8, 3)
    np.testing.assert_allclose(x[0, 0], [1.0, 3.0, 0.5])
    grey = image_folder.decode(_png(_image(1, 0)), "x", _cfg(tmp_path, num_channels=1, mean=[0.0], std=[1.0]))
    assert grey.shape == (8, 8, 1) and grey.min() >= 0.0 and grey.max() <= 1.0
    raw = image_folder.decode(str(white), "white.png", _cfg(tmp_path, normalize=False))
    np.testing.assert_array_equal(raw, np.ones((8, 8, 3), np.float32))


def _hf_dataset():
    datasets = pytest.importorskip("datasets")
    images = [_image(label, i) for label in range(3) for i in range(PER_CLASS)]
    labels = [label for label in range(3) for _ in range(PER_CLASS)]
    feats = datasets.Features({"img": datasets.Image(), "y": datasets.ClassLabel(names=list(CLASSES))})
    return datasets.Dataset.from_dict({"img": images, "y": labels}, features=feats), images, labels


def test_hf_save_to_disk_and_parquet(tmp_path):
    ds, images, labels = _hf_dataset()
    cfg = dict(image_column="img", label_column="y", eval_fraction=0.2)
    ds.save_to_disk(str(tmp_path / "disk"))
    ds.to_parquet(str(tmp_path / "data.parquet"))
    for path in (tmp_path / "disk", tmp_path / "data.parquet"):
        assert image_folder.num_classes(_cfg(path, **cfg)) == 3
        train, evaluation = image_folder.sources(_cfg(path, **cfg), seed=0)
        assert len(train) == 12 and len(evaluation) == 3
        for src in (train, evaluation):
            for i in range(len(src)):
                data, name = src._read(i)
                k = int(name.rsplit(" ", 1)[-1])  # "... row K": the example's row
                assert src.labels[i] == labels[k]
                want = image_folder.decode(_png(images[k].convert("RGB")), "want", _cfg(path))
                np.testing.assert_allclose(src[i]["images"], want, atol=1e-6)
    # a DatasetDict: its own train / test splits are used as they are
    import datasets
    dd = datasets.DatasetDict({"train": ds.select(range(10)), "test": ds.select(range(10, 15))})
    dd.save_to_disk(str(tmp_path / "dict"))
    train, evaluation = image_folder.sources(_cfg(tmp_path / "dict", **cfg), seed=0)
    assert len(train) == 10 and list(evaluation.labels) == labels[10:]


def _run(path, model: dict, data: dict | None = None, **train):
    return config_from_dict({
        "model": model, "data": {"name": "image_folder", "path": str(path), "image_size": 8, "eval_fraction": 0.4,
                                 **(data or {})},
        "train": {"steps": 3, "batch_size": 4, "eval_every": 3, "eval_batches": 1, "checkpoint_every": 3,
                  "async_checkpoint": False, "warmup_steps": 1, **train}})


VIT = {"name": "vit", "image_size": 8, "patch_size": 4, "num_channels": 3, "num_classes": 3, "d_model": 16,
       "num_heads": 2, "d_ff": 32, "num_layers": 1}
SWIN = {"name": "swin", "image_size": 8, "patch_size": 2, "num_channels": 3, "num_classes": 3, "embed_dim": 8,
        "depths": [1], "num_heads": [2], "window_size": 4}


def test_image_folder_trains_vit_and_swin(tmp_path):
    from jaxformer.train.jax_trainer import JaxTrainer
    path = make_folder(tmp_path / "imgs")
    for name, model in (("vit", VIT), ("swin", SWIN)):
        trainer = JaxTrainer(_run(path, model), str(tmp_path / name), progress=False)
        history = trainer.run()
        assert len(history) == 3 and all(np.isfinite(r["loss"]) for r in history)
        assert 0.0 <= trainer.last_eval["eval_accuracy"] <= 1.0


BAD = {
    "missing_path": (lambda t: t / "nope", {}, "no such file or folder"),
    "empty_folder": (lambda t: (t / "e").mkdir() or t / "e", {}, "no class folders"),
    "class_without_images": (lambda t: (make_folder(t / "i"), (t / "i" / "zebra").mkdir(),
                                        (t / "i" / "zebra" / "a.txt").write_text("x"))[0],
                             {}, "class folder 'zebra' has no images"),
    "vit_image_size": (lambda t: make_folder(t / "i"), {"image_size": 16}, "model.image_size=8 differs from "
                       "data.image_size=16"),
    "channels": (lambda t: make_folder(t / "i"), {"num_channels": 1}, "model.num_channels=3 differs"),
    "num_classes": (lambda t: (make_folder(t / "i"), (t / "i" / "yak").mkdir(),
                               _image(0, 0).save(t / "i" / "yak" / "0.png"))[0],
                    {}, "model.num_classes=3 differs from the 4 classes"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_a_clear_error_at_config_load(case, tmp_path):
    setup, data, msg = BAD[case]
    path = setup(tmp_path)
    with pytest.raises(ConfigError, match=msg):
        _run(path, VIT, data)


def test_undecodable_image_is_named(tmp_path):
    path = make_folder(tmp_path / "imgs")
    (tmp_path / "imgs" / "dog" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    with pytest.raises(ValueError, match=r"dog/broken\.png: cannot decode the image"):
        image_folder.load(_cfg(path, eval_fraction=0.2), seed=0)
