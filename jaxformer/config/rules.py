"""Config validation as data: each config class lists its rules (field, condition, message),
`check_rules` raises on the first one a config breaks, and `explain` lists every one it breaks
(`jaxformer config --explain`). Framework-free.

A rule's condition holds for a valid config. Its message is a format string over the config's
attributes and properties (`"must be > 0, got {norm_eps}"`), or a function of the config where
it computes a value; `when` limits a rule to the configs
it is about (`position == "t5"`), so a message never has to say "if"."""
from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from jaxformer.config.base import ConfigError, _coerce, nest_flat


@dataclass(frozen=True)
class Rule:
    """One named check of a config: `field: message` unless `ok(config)` holds (only where
    `when(config)` holds)."""

    name: str
    field: str
    ok: Callable[[Any], bool]
    message: str | Callable[[Any], str]
    when: Callable[[Any], bool] | None = None

    def applies(self, cfg) -> bool:
        return self.when is None or bool(self.when(cfg))

    def text(self, cfg) -> str:
        message = self.message(cfg) if callable(self.message) else self.message.format_map(_Attributes(cfg))
        return f"{self.field}: {message}"


class _Attributes(Mapping):
    """The config's attributes (properties too) as a format_map mapping."""

    def __init__(self, cfg):
        self._cfg = cfg

    def __getitem__(self, key):
        return getattr(self._cfg, key)

    def __iter__(self):
        return iter(())

    def __len__(self):
        return 0


def is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def positive_number(v) -> bool:
    return is_number(v) and v > 0


def positive_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _last(path: str) -> str:
    """A rule's name from its field's path: `attention.sliding_window` -> `sliding_window`."""
    return path.rsplit(".", 1)[-1]


def positive(*names: str, optional: bool = False) -> tuple[Rule, ...]:
    """Each named field is an int > 0 (or None, where optional)."""
    return tuple(Rule(f"{_last(n)}_positive", n, lambda c, n=n: positive_int(attrgetter(n)(c)),
                      f"must be a positive int, got {{{n}!r}}",
                      (lambda c, n=n: attrgetter(n)(c) is not None) if optional else None) for n in names)


def at_most(limits: dict[str, int]) -> tuple[Rule, ...]:
    """Each named field (an int, or None) is at most its limit: sizes no real model comes near,
    which a corrupt or hostile config would otherwise spend minutes or all memory building."""
    return tuple(Rule(f"{_last(n)}_real", n, lambda c, n=n, v=v: not positive_int(attrgetter(n)(c))
                      or attrgetter(n)(c) <= v,
                      f"{{{n}}} is larger than any real model's (at most {v:d} here); a corrupt config?")
                 for n, v in limits.items())


def choice(name: str, choices: Iterable[str], rule: str | None = None) -> Rule:
    """The field is one of `choices`; `rule` names the rule (default: the field's last part)."""
    choices = tuple(choices)
    return Rule(rule or f"{_last(name)}_choice", name, lambda c: attrgetter(name)(c) in choices,
                f"must be one of {choices}, got {{{name}!r}}")


def probability(*names: str) -> tuple[Rule, ...]:
    return tuple(Rule(f"{_last(n)}_probability", n,
                      lambda c, n=n: is_number(attrgetter(n)(c)) and 0.0 <= attrgetter(n)(c) < 1.0,
                      f"must be a probability in [0, 1), got {{{n}!r}}") for n in names)


def number_or_null(name: str, what: str = "null") -> Rule:
    """The field is a number > 0 or None."""
    return Rule(f"{_last(name)}_positive_or_null", name,
                lambda c: attrgetter(name)(c) is None or positive_number(attrgetter(name)(c)),
                f"must be a number > 0 or {what}, got {{{name}!r}}")


def as_tuples(cfg, *names: str) -> None:
    """YAML / JSON lists -> tuples (a frozen config stays hashable); before the rules run."""
    for name in names:
        if isinstance(getattr(cfg, name), list):
            object.__setattr__(cfg, name, tuple(getattr(cfg, name)))


def rules_of(cls: type) -> tuple[Rule, ...]:
    """The class's RULES after its bases' (a subclass adds to what its base checks)."""
    out: list[Rule] = []
    for klass in reversed(cls.__mro__):
        out.extend(klass.__dict__.get("RULES", ()))
    return tuple(out)


def check_rules(cfg) -> None:
    """ConfigError naming the field of the first rule of `type(cfg)` that `cfg` breaks."""
    for rule in rules_of(type(cfg)):
        if rule.applies(cfg) and not rule.ok(cfg):
            raise ConfigError(rule.text(cfg))


def broken(cfg) -> list[str]:
    """Every rule of `type(cfg)` that `cfg` breaks, as 'field: message [rule name]'. A rule that
    cannot be evaluated (an earlier broken rule left a field of the wrong type) is listed as not
    checked, with the reason."""
    out = []
    for rule in rules_of(type(cfg)):
        try:
            if rule.applies(cfg) and not rule.ok(cfg):
                out.append(f"{rule.text(cfg)} [{rule.name}]")
        except Exception as e:  # a field another broken rule names
            out.append(f"{rule.field}: not checked ({type(e).__name__}: {e}) [{rule.name}]")
    return out


def explain(cls: type, data: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Every problem of `data` as config class `cls`: unknown keys, values of the wrong type,
    and each rule it breaks (nested configs too, their fields prefixed). Empty when `cls(**data)`
    would be valid. A class without RULES is checked by building it (its first error)."""
    if not isinstance(data, Mapping):
        return [f"{prefix.rstrip('.') or cls.__name__}: expected a mapping, got {data!r}"]
    try:
        data = nest_flat(cls, data, prefix)
    except ConfigError as e:
        return [str(e)]
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    problems = [f"{prefix}{k}: unknown key for {cls.__name__}" for k in sorted(set(data) - set(fields))]
    values = {}
    for name, f in fields.items():
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                problems.append(f"{prefix}{name}: missing (it has no default)")
                return problems
            values[name] = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            continue
        nested = _nested_class(hints[name], data[name])
        if nested is not None:
            sub = explain(nested, data[name], f"{prefix}{name}.")
            problems.extend(sub)
            if sub:
                return problems  # the outer rules read the nested config
        try:
            values[name] = _coerce(hints[name], data[name], prefix + name)
        except ConfigError as e:
            problems.append(str(e))
            return problems
    if not rules_of(cls):
        try:
            cls(**values)
        except ConfigError as e:
            problems.append(f"{prefix}{e}")
        return problems
    cfg = object.__new__(cls)
    for name, value in values.items():
        object.__setattr__(cfg, name, value)
    normalise = getattr(cls, "normalise", None)
    if normalise is not None:
        normalise(cfg)
    problems.extend(prefix + p for p in broken(cfg))
    return problems


def _nested_class(tp, value) -> type | None:
    """The dataclass a field's value builds (a Mapping for `X | None`), else None."""
    if not isinstance(value, Mapping):
        return None
    for arg in (typing.get_args(tp) or (tp,)):
        if dataclasses.is_dataclass(arg):
            return arg
    return None
