"""What a Hugging Face family exports of our configs, declared field by field (`Family.exports`),
and the export check that reads the declaration (`problems`). Imports neither jax nor torch.

A family declares, per model name it exports ("lm", "encoder", ...), each config field it
covers as one of:
  WRITES          its export (config.json or the weights) carries the field, at any value;
  a plain value   the field must equal it (LLaMA: norm="rmsnorm");
  Need(ok, text)  written where ok(cfg) holds, else refused with `text` (a format string over
                  the config's attributes and properties: relations between fields);
  Ignored(why)    accepted at any value and not written, for the stated reason;
  Sub({...})      a nested config (moe, mla), declared field by field the same way.
Every declared field is checked. The check is positive: a field away from its class default
that the declaration does not cover is refused by name, so an option no family declares (a
new one included) never exports silently. IGNORED_BY_ALL names the fields that never change
the exported model, UNREAD those no layer reads in the config at hand.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from jaxformer.hf.common import exportable_ffns


class _Writes:
    def __repr__(self) -> str:
        return "WRITES"


WRITES = _Writes()  # the one marker of a written field


@dataclass(frozen=True)
class Need:
    """A field written only where ok(cfg) holds; else the refusal `text`, a format string over
    the config's attributes (a nested config's, inside Sub)."""

    ok: Callable[[Any], bool]
    text: str


def plain_multi_head(family: str) -> dict:
    """The Needs of a family with plain multi-head attention (GPT-2, GPT-NeoX, BERT, RoBERTa):
    a feed-forward activation HF can name, no grouped-query attention, head_dim = d_model / heads."""
    return dict(
        ffn=Need(lambda c: c.feedforward.kind in exportable_ffns(),
                 f"feedforward.kind={{feedforward.kind!r}} ({family} activations: {exportable_ffns()})"),
        num_kv_heads=Need(lambda c: c.resolved_kv_heads == c.attention.num_heads,
                          f"attention.num_kv_heads={{attention.num_kv_heads}} ({family} has no grouped-query attention)"),
        head_dim=Need(lambda c: c.resolved_head_dim * c.attention.num_heads == c.d_model,
                      f"attention.head_dim={{attention.head_dim}} ({family} needs d_model / num_heads)"))


@dataclass(frozen=True)
class Ignored:
    """A field accepted at any value and not written: `why` says why that loses nothing."""

    why: str


@dataclass(frozen=True)
class Sub:
    """A nested config (moe, mla) declared field by field; `missing`: the refusal of None
    (None = accepted, nothing to write)."""

    fields: Mapping[str, Any]
    missing: str | None = None


# Fields no family writes, because they never change what an exported model computes
IGNORED_BY_ALL = {
    "scan_layers": "how JAX runs the layers (lax.scan over stacked params): the same weights and outputs",
    "dtype": "the compute dtype of our forward pass; the weights are written as stored",
}
# Fields no layer reads where `unread(cfg)` holds (a family that declares one checks it itself)
UNREAD = {
    "norms.norm_bias": lambda c: c.norms.kind != "layernorm",  # RMSNorm has no bias
    "positions.rope_base": lambda c: c.positions.kind != "rope",
    "positions.rel_num_buckets": lambda c: c.positions.kind != "t5",  # T5's relative position buckets
    "positions.rel_max_distance": lambda c: c.positions.kind != "t5",
}


def by_path(exports: Mapping[str, Any], cls: type) -> dict[str, Any]:
    """A declaration keyed by record path: the flat key of a record field (`sliding_window`, as
    families declare them) -> its path (`attention.sliding_window`), through the config's
    FLAT_PATHS (config/base.py's shim); other keys as they are."""
    paths = getattr(cls, "FLAT_PATHS", None) or {}
    return {paths.get(k, k): v for k, v in exports.items()}


def leaves(cfg) -> list[tuple[str, dataclasses.Field, Any]]:
    """(path, field, value) of each field of `cfg`, a record's fields by their path
    (`attention.sliding_window`); nested configs (moe, mla) stay one leaf."""
    paths = getattr(type(cfg), "FLAT_PATHS", None) or {}
    records = {p.split(".")[0] for p in paths.values()}
    out = []
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if f.name in records:
            out += [(f"{f.name}.{g.name}", g, getattr(value, g.name)) for g in dataclasses.fields(value)]
        else:
            out.append((f.name, f, value))
    return out


class _Attributes(Mapping):
    """A config's attributes (properties too) for str.format_map."""

    def __init__(self, cfg):
        self._cfg = cfg

    def __getitem__(self, key):
        return getattr(self._cfg, key)

    def __iter__(self):
        return iter(())

    def __len__(self):
        return 0


def at_default(f: dataclasses.Field, value) -> bool:
    """Is `value` the field's class default? A field without one never is."""
    if f.default is not dataclasses.MISSING:
        return value == f.default
    if f.default_factory is not dataclasses.MISSING:
        return value == f.default_factory()
    return False


def problems(exports: Mapping[str, Any], cfg, uncovered: Callable[[str, Any], str], prefix: str = "") -> list[str]:
    """What of `cfg` the declaration `exports` cannot write, one line each. uncovered(label,
    value) -> the refusal of a field away from its default that `exports` does not cover."""
    out = []
    exports = by_path(exports, type(cfg))
    for key, f, value in leaves(cfg):
        label = prefix + key
        spec = exports.get(key, dataclasses.MISSING)
        if spec is dataclasses.MISSING:
            if not (key in IGNORED_BY_ALL or at_default(f, value) or key in UNREAD and UNREAD[key](cfg)):
                out.append(uncovered(label, value))
        elif isinstance(spec, Sub):
            if value is None and spec.missing is not None:
                out.append(f"{label}=None ({spec.missing})")
            elif value is not None:
                out += problems(spec.fields, value, uncovered, prefix=f"{label}.")
        elif isinstance(spec, Need):
            if not spec.ok(cfg):
                out.append(prefix + spec.text.format_map(_Attributes(cfg)))
        elif spec is not WRITES and not isinstance(spec, Ignored) and value != spec:
            out.append(f"{label}={value!r} (needs {spec!r})")
    return out


def covers(exports: Mapping[str, Any], key: str, value) -> bool:
    """Does the declaration take `key` at `value` (the fields other families write)?"""
    spec = exports.get(key, dataclasses.MISSING)
    if spec is dataclasses.MISSING:
        return False
    return spec is WRITES or isinstance(spec, (Need, Ignored, Sub)) or spec == value
