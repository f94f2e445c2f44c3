"""Framework-free config helpers: strict dict -> frozen dataclass loading.

This module imports neither jax nor torch, so both trees (and the YAML loader) share it.
"""
from __future__ import annotations

import dataclasses
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
    return dataclasses.replace(obj, **changes)
