"""Framework-free config helpers: strict dict -> frozen dataclass loading.

This module imports neither jax nor torch, so both trees (and the YAML loader) share it.
"""
from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Mapping
from typing import Any


class ConfigError(ValueError):
    """A config key is unknown or a value is invalid. The message names the key."""


def check(cond: bool, field: str, msg: str) -> None:
    """Raise ConfigError naming `field` unless `cond` holds."""
    if not cond:
        raise ConfigError(f"{field}: {msg}")


def check_positive(obj: Any, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        check(isinstance(value, int) and not isinstance(value, bool) and value > 0,
              name, f"must be a positive int, got {value!r}")


def check_choice(obj: Any, name: str, choices: typing.Iterable[str]) -> None:
    value = getattr(obj, name)
    choices = tuple(choices)
    check(value in choices, name, f"must be one of {choices}, got {value!r}")


def check_prob(obj: Any, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        check(isinstance(value, (int, float)) and 0.0 <= value < 1.0,
              name, f"must be a probability in [0, 1), got {value!r}")


def _coerce(tp: Any, value: Any, key: str) -> Any:
    """Coerce a YAML value to the annotated type, or raise ConfigError naming `key`."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(arg, value, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{key}: bad value {value!r}")
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return from_dict(tp, value, prefix=key + ".")
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(args[0], v, f"{key}[{i}]") for i, v in enumerate(value))
        if len(args) != len(value):
            raise ConfigError(f"{key}: expected {len(args)} items, got {len(value)}")
        return tuple(_coerce(a, v, f"{key}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True)))
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected a bool, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{key}: expected an int, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)  # YAML reads 1e-4 (no dot) as a string
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected a float, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    if tp is Any:
        return value
    return value


def from_dict(cls: type, data: Mapping[str, Any], prefix: str = "") -> Any:
    """Build dataclass `cls` from `data`. Unknown keys and bad values raise ConfigError."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{prefix.rstrip('.') or cls.__name__}: expected a mapping, got {data!r}")
    data = nest_flat(cls, data, prefix)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(
            f"unknown config key(s) {', '.join(prefix + k for k in unknown)} for {cls.__name__}; "
            f"valid keys: {', '.join(sorted(fields))}")
    missing = sorted(name for name, f in fields.items() if name not in data
                     and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
    if missing:
        raise ConfigError(f"missing config key(s) {', '.join(prefix + k for k in missing)} for "
                          f"{cls.__name__} (they have no default)")
    kwargs = {k: _coerce(hints[k], v, prefix + k) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError as e:
        msg = str(e)
        raise ConfigError(prefix + msg if prefix and not msg.startswith(prefix) else msg) from None


def to_dict(obj: Any) -> dict:
    """Dataclass -> plain dict (tuples become lists) for YAML/JSON."""
    def conv(v: Any) -> Any:
        if dataclasses.is_dataclass(v):
            return {f.name: conv(getattr(v, f.name)) for f in dataclasses.fields(v) if f.init}
        if isinstance(v, (list, tuple)):
            return [conv(x) for x in v]
        if isinstance(v, dict):
            return {k: conv(x) for k, x in v.items()}
        return v
    return conv(obj)


def replace(obj: Any, **changes: Any) -> Any:
    """dataclasses.replace that also takes a config's flat keys (`sliding_window=4`), record
    paths (`**{"attention.sliding_window": 4}`) and partial records (`attention={...}`): each
    changes only the record fields it names."""
    paths = getattr(type(obj), "FLAT_PATHS", None)
    if not paths:
        return dataclasses.replace(obj, **changes)
    records = _records(type(obj))
    direct, parts = {}, {}
    for key, value in changes.items():
        rec, name, given = _record_path(paths, records, key)
        if rec is None:
            if key in records and isinstance(value, Mapping):
                for name, v in value.items():
                    _put(parts, key, name, v, f"{key}.{name}")
            else:
                direct[key] = value
        else:
            _put(parts, rec, name, value, given)
    for rec, fields in parts.items():
        if rec in direct:
            name, (given, _) = next(iter(fields.items()))
            raise ConfigError(f"{given} and {rec}.{name} given together ({rec} is given whole)")
        direct[rec] = dataclasses.replace(getattr(obj, rec), **{n: v for n, (_, v) in fields.items()})
    return dataclasses.replace(obj, **direct)


# ----------------------------------------------------------------------------- flat keys
# A config built from records (TransformerConfig) names each record field's flat key in its
# class attribute FLAT_PATHS {"sliding_window": "attention.sliding_window", ...}. The one shim
# below maps them, for YAML (from_dict), Python keywords (the FlatKeywords metaclass), replace
# and --set overrides (override_path): a flat key lands at its record path; a flat key and its
# nested form given together are refused, naming both.

@functools.cache
def _record_class(cls: type, rec: str) -> type:
    return typing.get_type_hints(cls)[rec]


def _records(cls: type) -> set[str]:
    return {path.split(".")[0] for path in cls.FLAT_PATHS.values()}


def _record_path(paths: Mapping[str, str], records: set[str], key: str) -> tuple[str | None, str | None, str]:
    """A key -> (record, field, the key as given) when it is a flat key or a dotted record path."""
    if key in paths:
        rec, name = paths[key].split(".")
        return rec, name, key
    if "." in key and key.split(".")[0] in records:
        rec, name = key.split(".", 1)
        return rec, name, key
    return None, None, key


def _put(parts: dict, rec: str, name: str, value: Any, given: str) -> None:
    fields = parts.setdefault(rec, {})
    if name in fields:
        raise ConfigError(f"{fields[name][0]} and {given} given together; they name one field ({rec}.{name})")
    fields[name] = (given, value)


def nest_flat(cls: type, data: Mapping[str, Any], prefix: str = "") -> dict:
    """The nested form of `data` for `cls`: each flat key (and dotted record path) moved into
    its record's mapping. A flat key whose record is given too, as a mapping naming the same
    field or as a whole record, is a ConfigError naming both."""
    paths = getattr(cls, "FLAT_PATHS", None)
    if not paths:
        return dict(data)
    records = _records(cls)
    out, parts = {}, {}
    for key, value in data.items():
        rec, name, given = _record_path(paths, records, key)
        if rec is None:
            out[key] = value
        else:
            _put(parts, rec, name, value, prefix + given)
    for rec, fields in parts.items():
        whole = out.get(rec)
        if whole is None:
            out[rec] = {n: v for n, (_, v) in fields.items()}
        elif isinstance(whole, Mapping):
            both = sorted(set(whole) & set(fields))
            if both:
                raise ConfigError(f"{fields[both[0]][0]} and {prefix}{rec}.{both[0]} given together; "
                                  "write one of them (the nested form)")
            out[rec] = {**whole, **{n: v for n, (_, v) in fields.items()}}
        else:
            name, (given, _) = next(iter(fields.items()))
            raise ConfigError(f"{given} and {prefix}{rec}.{name} given together ({prefix}{rec} is given whole)")
    return out


def layered(cls: type, *layers: Mapping[str, Any]) -> Any:
    """cls built from keyword layers, a later layer's field winning over an earlier one's (a
    preset's sizes, its flavour, the caller's overrides): each layer nested (nest_flat) and
    merged record field by record field, so `num_heads=8` over a preset keeps its other
    attention fields."""
    merged: dict[str, Any] = {}
    records = _records(cls) if getattr(cls, "FLAT_PATHS", None) else set()
    for layer in layers:
        for key, value in nest_flat(cls, layer).items():
            if key in records:
                fields = dict(value) if isinstance(value, Mapping) else {
                    f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
                merged[key] = {**merged.get(key, {}), **fields}
            else:
                merged[key] = value
    return cls(**merged)


def override_path(cls: type, section: Mapping[str, Any], parts: list[str]) -> list[str]:
    """Where a --set key (`rope_base`, `positions.rope_base`; the parts after `model.`) lands in
    a model section: in the form the section already writes the field, so a flat override of a
    nested YAML (or a nested one of a flat YAML) replaces the value instead of clashing with it."""
    paths = getattr(cls, "FLAT_PATHS", None)
    if not paths:
        return parts
    if len(parts) == 1 and parts[0] in paths and parts[0] not in section:
        rec, name = paths[parts[0]].split(".")
        if isinstance(section.get(rec), Mapping):
            return [rec, name]
    if len(parts) == 2:
        flat = {v: k for k, v in paths.items()}.get(".".join(parts))
        if flat is not None and flat in section:
            return [flat]
    return parts


class FlatKeywords(type):
    """Metaclass of configs with FLAT_PATHS: Config(sliding_window=4) builds the attention
    record from the flat keyword (nest_flat); a record given as a mapping is built from it."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if getattr(cls, "FLAT_PATHS", None):
            kwargs = nest_flat(cls, kwargs)
            for rec in _records(cls):
                if isinstance(kwargs.get(rec), Mapping):
                    record = _record_class(cls, rec)
                    unknown = sorted(set(kwargs[rec]) - {f.name for f in dataclasses.fields(record)})
                    if unknown:
                        raise ConfigError(f"unknown config key(s) {', '.join(f'{rec}.{k}' for k in unknown)} "
                                          f"for {record.__name__}")
                    kwargs[rec] = record(**kwargs[rec])
        return super().__call__(*args, **kwargs)
