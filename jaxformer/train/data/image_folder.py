"""Your own images for `vit` and `swin`: `data.name: image_folder`.

`data.path` is one of (`format: auto` tells them apart):
  folder   one sub-folder per class (`PATH/cat/*.png`, `PATH/dog/*.jpg`); classes are the
           sorted folder names, labels their index. Hidden files and files whose extension
           Pillow does not know are skipped.
  hf_disk  a `datasets` folder written by `save_to_disk` (a Dataset, or a DatasetDict whose
           `train` split trains and whose `validation` or `test` split evaluates).
  parquet  a Parquet file, or a folder of them, with an image column (HF's Image struct of
           bytes/path, raw bytes, or a path) and an integer label column.

Every image is decoded with Pillow, converted to grey (num_channels 1) or RGB (3), resized to
image_size x image_size (bilinear, aspect ratio not kept), scaled to [0, 1], then normalised per
channel: (x - mean) / std (unless normalize is false). Channels-last float32 [H, W, C], as the digits dataset, so the vit
and swin tasks read {"images", "labels"} unchanged.

Without given splits, the split is seeded and stratified: round(eval_fraction * n) images of
each class go to eval. `sources(cfg, seed)` gives random-access sources that decode one image
per `__getitem__` (for a loader that reads lazily); `load(cfg, seed)` decodes everything into
arrays. An image that cannot be decoded is an error naming it.
"""
from __future__ import annotations

import io
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from jaxformer.config.base import check, check_choice, check_positive, from_dict

FORMATS = ("auto", "folder", "hf_disk", "parquet")


@dataclass(frozen=True)
class Config:
    """The YAML `data:` keys besides `name`."""

    path: str = ""
    format: str = "auto"
    image_size: int = 32  # vit: must equal model.image_size
    num_channels: int = 3  # 1 = grey, 3 = RGB; must equal model.num_channels
    mean: tuple[float, ...] = (0.5,)  # one value for every channel, or one per channel
    std: tuple[float, ...] = (0.5,)
    normalize: bool = True  # false: pixels stay in [0, 1] (mean and std unused)
    eval_fraction: float = 0.1  # when the data has no eval split of its own
    image_column: str = "image"  # hf_disk and parquet
    label_column: str = "label"

    def __post_init__(self) -> None:
        check(isinstance(self.path, str) and self.path != "", "path", "must name your images (a folder or file)")
        check_choice(self, "format", FORMATS)
        check_positive(self, "image_size")
        check(self.num_channels in (1, 3), "num_channels", f"must be 1 or 3, got {self.num_channels}")
        for k in ("mean", "std"):
            v = tuple(getattr(self, k))
            object.__setattr__(self, k, v)
            check(len(v) in (1, self.num_channels) and all(isinstance(x, (int, float)) for x in v), k,
                  f"needs 1 or num_channels={self.num_channels} numbers, got {list(v)}")
        check(all(s > 0 for s in self.std), "std", f"must be > 0, got {list(self.std)}")
        check(0.0 < self.eval_fraction < 1.0, "eval_fraction", f"must be in (0, 1), got {self.eval_fraction}")


def as_config(data_cfg: Config | Mapping) -> Config:
    if isinstance(data_cfg, Config):
        return data_cfg
    return from_dict(Config, {k: v for k, v in data_cfg.items() if k != "name"}, prefix="data.")


# ----------------------------------------------------------------------------- decoding
def _bomb_warning_is_error() -> None:
    """Pillow warns (DecompressionBombWarning) for an image of Image.MAX_IMAGE_PIXELS to twice
    that, and raises past it: both refuse here. The filter is (re)placed first in the process's
    list at every decode (warnings.catch_warnings is not thread-safe, and grain decodes on
    threads; placing it again is idempotent), for that warning class only."""
    import warnings

    from PIL import Image
    warnings.filterwarnings("error", category=Image.DecompressionBombWarning)


def decode(data: bytes | str, name: str, cfg: Config) -> np.ndarray:
    """Encoded image bytes (or a file path) -> float32 [image_size, image_size, num_channels],
    normalised. ValueError naming `name` if Pillow cannot read it."""
    from PIL import Image, UnidentifiedImageError
    _bomb_warning_is_error()
    try:
        with Image.open(io.BytesIO(data) if isinstance(data, (bytes, bytearray)) else data) as im:
            im = im.convert("L" if cfg.num_channels == 1 else "RGB")
            im = im.resize((cfg.image_size, cfg.image_size), Image.Resampling.BILINEAR)
            x = np.asarray(im, np.float32) / 255.0
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise ValueError(f"{name}: refused: a decompression bomb ({e})"[:400]) from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        raise ValueError(f"{name}: cannot decode the image ({type(e).__name__}: {e})") from None
    x = x.reshape(cfg.image_size, cfg.image_size, cfg.num_channels)
    if not cfg.normalize:
        return x
    mean, std = np.asarray(cfg.mean, np.float32), np.asarray(cfg.std, np.float32)
    return ((x - mean) / std).astype(np.float32)


class ImageSource:
    """Random access to one split: `len(src)`, and `src[i]` -> {"images": float32 [H, W, C],
    "labels": int32 []}, decoded when asked for. `read(i)` -> (encoded bytes or path, a name for
    errors) of example i."""

    def __init__(self, read: Callable[[int], tuple[Any, str]], labels: np.ndarray, cfg: Config):
        self._read, self.labels, self.cfg = read, np.asarray(labels, np.int32), cfg

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        i = int(i)
        if not -len(self) <= i < len(self):
            raise IndexError(f"image index {i} out of range [0, {len(self)})")
        i %= len(self)
        data, name = self._read(i)
        return {"images": decode(data, name, self.cfg), "labels": np.asarray(self.labels[i])}


# ----------------------------------------------------------------------------- formats
def resolve_format(cfg: Config) -> str:
    p = cfg.path
    if not os.path.exists(p):
        raise ValueError(f"data.path {p}: no such file or folder")
    if cfg.format != "auto":
        return cfg.format
    if os.path.isfile(p):
        return "parquet"
    names = os.listdir(p)
    if {"dataset_info.json", "state.json", "dataset_dict.json"} & set(names):
        return "hf_disk"
    if any(n.endswith(".parquet") for n in names):
        return "parquet"
    return "folder"


def _image_extensions() -> set[str]:
    from PIL import Image
    return {ext.lower() for ext in Image.registered_extensions()}


def _folder_items(root: str) -> tuple[list[str], list[int], list[str]]:
    """-> (files, labels, class names) of a folder of class folders."""
    if not os.path.isdir(root):
        raise ValueError(f"data.path {root}: not a folder of class folders")
    classes = sorted(d for d in os.listdir(root) if not d.startswith(".") and os.path.isdir(os.path.join(root, d)))
    if not classes:
        raise ValueError(f"data.path {root}: no class folders (expected one sub-folder of images per class)")
    if len(classes) == 1:
        raise ValueError(f"data.path {root}: one class folder ({classes[0]!r}); a classifier needs two or "
                         "more (with one, every label is the same and the loss trains to 0)")
    exts = _image_extensions()
    files, labels = [], []
    for label, c in enumerate(classes):
        found = sorted(f for f in os.listdir(os.path.join(root, c)) if not f.startswith(".")
                       and os.path.splitext(f)[1].lower() in exts)
        if not found:
            raise ValueError(f"data.path {root}: class folder {c!r} has no images")
        files += [os.path.join(root, c, f) for f in found]
        labels += [label] * len(found)
    return files, labels, classes


def _cell(value: Any, name: str, column: str, root: str) -> Any:
    """An image cell: HF's Image struct {bytes, path}, raw bytes, or a path (relative to the
    dataset's folder `root`; it must lie inside it, links resolved)."""
    if isinstance(value, dict):
        value = value.get("bytes") or value.get("path")
    if not isinstance(value, (bytes, bytearray, str)):
        raise ValueError(f"{name}: column {column!r} holds {type(value).__name__}, not an encoded image")
    if isinstance(value, str):
        from jaxformer.fileio import inside
        value = inside(root, value, source=name, field=f"column {column!r}'s image path", absolute=True)
    return value


def _check_paths(images, where: str, column: str, root: str) -> None:
    """Every image path a Parquet table reads (a string cell, or an Image struct's path where it
    has no bytes) checked when the table opens, before any image is decoded: a path leaving the
    dataset refuses the data at config load, as it would when its row is read."""
    import pyarrow as pa
    import pyarrow.compute as pc
    if not isinstance(images, (pa.ChunkedArray, pa.Array)):
        return  # an HF Dataset's column: each cell is checked when read (_cell)
    kind = images.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        paths, rows = images, None
    elif pa.types.is_struct(kind) and kind.get_field_index("path") >= 0:
        paths = pc.struct_field(images, "path")
        if kind.get_field_index("bytes") >= 0 and not pa.types.is_null(kind.field("bytes").type):
            data = pc.struct_field(images, "bytes")
            rows = pc.or_kleene(pc.is_null(data), pc.equal(pc.binary_length(data), 0))
            paths = pc.if_else(rows, paths, pa.scalar(None, paths.type))
    else:
        return
    for i, p in enumerate(paths.to_pylist()):
        if p is not None:
            _cell(p, f"{where} row {i}", column, root)


def _check_labels(labels: np.ndarray, where: str) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.size == 0:
        raise ValueError(f"{where}: no examples")
    if not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0:
        raise ValueError(f"{where}: labels must be integers >= 0 (got {labels.dtype}, min {labels.min()})")
    return labels.astype(np.int32)


def _table_split(table, cfg: Config, where: str) -> tuple[Callable, np.ndarray]:
    """(reader, labels) of a pyarrow table or an HF Dataset with image and label columns."""
    for col in (cfg.image_column, cfg.label_column):
        if col not in table.column_names:
            raise ValueError(f"{where}: no column {col!r} (columns: {table.column_names}); set "
                             f"data.image_column / data.label_column")
    labels = _check_labels(np.asarray(table[cfg.label_column]), where)
    images = table[cfg.image_column]
    root = cfg.path if os.path.isdir(cfg.path) else os.path.dirname(os.path.abspath(cfg.path))
    _check_paths(images, where, cfg.image_column, root)

    def read(i: int):
        name = f"{where} row {i}"
        v = images[i]
        v = v.as_py() if hasattr(v, "as_py") else v
        return _cell(v, name, cfg.image_column, root), name
    return read, labels


def _hf_disk(cfg: Config) -> tuple[tuple, tuple | None]:
    import datasets
    ds = datasets.load_from_disk(cfg.path)

    def prepare(d, split):
        if cfg.image_column in d.column_names and isinstance(d.features[cfg.image_column], datasets.Image):
            d = d.cast_column(cfg.image_column, datasets.Image(decode=False))  # we decode with Pillow
        return _table_split(d, cfg, f"{cfg.path} [{split}]")
    if isinstance(ds, datasets.DatasetDict):
        if "train" not in ds:
            raise ValueError(f"data.path {cfg.path}: a DatasetDict without a 'train' split ({list(ds)})")
        held = next((s for s in ("validation", "test") if s in ds), None)
        return prepare(ds["train"], "train"), (prepare(ds[held], held) if held else None)
    return prepare(ds, "all"), None


def _parquet_table(cfg: Config, columns: list[str]):
    import pyarrow as pa
    import pyarrow.parquet as pq
    files = [cfg.path] if os.path.isfile(cfg.path) else sorted(
        os.path.join(cfg.path, f) for f in os.listdir(cfg.path) if f.endswith(".parquet"))
    if not files:
        raise ValueError(f"data.path {cfg.path}: no .parquet files")
    tables = []
    for f in files:
        try:
            tables.append(pq.read_table(f, columns=columns))
        except (pa.ArrowInvalid, KeyError, OSError) as e:
            raise ValueError(f"{f}: cannot read the columns {columns} ({e}); set data.image_column / "
                             "data.label_column") from None
    return pa.concat_tables(tables).combine_chunks()


def _parquet(cfg: Config) -> tuple:
    return _table_split(_parquet_table(cfg, [cfg.image_column, cfg.label_column]), cfg, cfg.path)


def _split(labels: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded stratified split -> (train indices, eval indices)."""
    rng = np.random.default_rng(seed)
    held = []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        rng.shuffle(idx)
        held.append(idx[: int(round(fraction * len(idx)))])
    is_eval = np.zeros(len(labels), bool)
    is_eval[np.concatenate(held)] = True
    if not is_eval.any() or is_eval.all():
        raise ValueError(f"data.eval_fraction={fraction} leaves an empty split of {len(labels)} images; "
                         "add images or change it")
    return rng.permutation(np.flatnonzero(~is_eval)), np.flatnonzero(is_eval)


def _subset(read, labels, idx) -> tuple[Callable, np.ndarray]:
    return (lambda i: read(int(idx[i]))), labels[idx]


def sources(data_cfg: Config | Mapping, seed: int) -> tuple[ImageSource, ImageSource]:
    """-> (train, eval) random-access sources; nothing is decoded yet."""
    cfg = as_config(data_cfg)
    fmt = resolve_format(cfg)
    held = None
    if fmt == "folder":
        files, labels, _ = _folder_items(cfg.path)
        whole = ((lambda i: (files[i], files[i])), np.asarray(labels, np.int32))
    elif fmt == "hf_disk":
        whole, held = _hf_disk(cfg)
    else:
        whole = _parquet(cfg)
    seen = np.unique(whole[1] if held is None else np.concatenate([whole[1], held[1]]))
    if seen.size < 2:
        raise ValueError(f"data.path {cfg.path}: every example has the label {int(seen[0])}; a classifier "
                         "needs two or more classes (with one, the loss trains to 0)")
    if held is None:
        tr, ev = _split(whole[1], cfg.eval_fraction, seed)
        train, held = _subset(*whole, tr), _subset(*whole, ev)
    else:
        train = _subset(*whole, np.random.default_rng(seed).permutation(len(whole[1])))
    return ImageSource(*train, cfg), ImageSource(*held, cfg)


def num_classes(data_cfg: Config | Mapping) -> int:
    """Classes in the data: class folders, or 1 + the largest label."""
    cfg = as_config(data_cfg)
    fmt = resolve_format(cfg)
    if fmt == "folder":
        return len(_folder_items(cfg.path)[2])
    if fmt == "parquet":  # the label column only
        table = _parquet_table(cfg, [cfg.label_column])
        return int(_check_labels(np.asarray(table[cfg.label_column]), cfg.path).max()) + 1
    train, evaluation = sources(cfg, 0)
    return int(max(train.labels.max(), evaluation.labels.max())) + 1


def load(data_cfg: Config | Mapping, seed: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """-> (train, eval): {"images": float32 [N, H, W, C], "labels": int32 [N]}, all decoded."""
    out = []
    for src in sources(data_cfg, seed):
        c = src.cfg
        images = np.empty((len(src), c.image_size, c.image_size, c.num_channels), np.float32)
        for i in range(len(src)):
            images[i] = src[i]["images"]
        out.append({"images": images, "labels": src.labels.copy()})
    return out[0], out[1]
