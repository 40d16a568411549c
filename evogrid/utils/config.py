"""Frozen, validated config dataclasses: one place for every default, range and help text.

A config field is declared with `param(default, help, lo=..., hi=...)`. From that one
declaration come the constructor's check (type, finiteness, range), the dict round trip
used by `--config` files and checkpoint metadata, the `evogrid train` options with their
defaults and help, and the `evogrid config` listing.

    @dataclasses.dataclass(frozen=True)
    class MyConfig(Config):
        sigma: float = param(0.05, "initial search std", lo=0.0, lo_open=True)

Cross-field rules go in a `_check(self)` method; every `_check` along the class's
bases runs (a config built from several bases checks all of their rules).
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing


def param(default, help: str, *, lo=None, hi=None, lo_open: bool = False, choices=None, cli: str | None = None):
    """A config field: `default`, one-line `help`, numeric range [lo, hi] (lo exclusive with
    `lo_open`), allowed `choices`, and an optional short command-line spelling `cli` (e.g. "--pop")."""
    meta = {"help": help, "lo": lo, "hi": hi, "lo_open": lo_open, "choices": choices, "cli": cli}
    if isinstance(default, (list, dict, set)):
        raise TypeError("config defaults must be immutable (use a tuple)")
    return dataclasses.field(default=default, metadata=meta)


def _describe(tp) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(tp))
    if origin is tuple:
        return "a list of " + {int: "integers", float: "numbers", str: "strings"}.get(typing.get_args(tp)[0], "values")
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false",
            type(None): "null"}.get(tp, str(tp))


def _coerce(name: str, value, tp):
    """`value` as type `tp`, or a ValueError that names the field and what it expects."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            try:
                return _coerce(name, value, arg)
            except ValueError:
                continue
        raise ValueError(f"{name} must be {_describe(tp)}, got {value!r}")
    if tp is type(None):
        if value is None:
            return None
    elif origin is tuple:
        if isinstance(value, (list, tuple)):
            return tuple(_coerce(f"{name}[{i}]", v, typing.get_args(tp)[0]) for i, v in enumerate(value))
    elif tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    raise ValueError(f"{name} must be {_describe(tp)}, got {value!r}")


def _check_range(name: str, value, meta) -> None:
    values = value if isinstance(value, tuple) else (value,)
    for v in values:
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            continue
        if not math.isfinite(v):
            raise ValueError(f"{name} must be a finite number, got {v}")
        lo, hi = meta.get("lo"), meta.get("hi")
        too_low = lo is not None and (v <= lo if meta.get("lo_open") else v < lo)
        if too_low or (hi is not None and v > hi):
            left = "(" if meta.get("lo_open") else "["
            span = f"{left}{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}]"
            raise ValueError(f"{name} must be in {span}, got {v}")
    choices = meta.get("choices")
    if choices is not None and value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(str, choices))}, got {value!r}")


def _norm(name: str) -> str:
    return name.lower().replace("_", "").replace("-", "")


def _spelled_as_choice(value, choices):
    """A string choice in the spelling the choices have, whatever its case, '_' and '-' (the CLI's rule:
    "open-es", "OpenES" and "Open_ES" are one algorithm); anything else unchanged."""
    if not isinstance(value, str) or choices is None or value in choices:
        return value
    same = [c for c in choices if isinstance(c, str) and _norm(c) == _norm(value)]
    return same[0] if len(same) == 1 else value


def refuse_unused(config, chooser: str, owners: dict) -> None:
    """Raise where a field that the value of `chooser` (e.g. the algorithm) does not use is set away from its
    default: `owners` maps such a field to the values that use it. A setting that would be ignored is an error."""
    chosen = getattr(config, chooser)
    default = {f.name: f.default for f in dataclasses.fields(config)}
    for name, users in owners.items():
        if chosen not in users and getattr(config, name) != default[name]:
            raise ValueError(f"{name} is not used by {chosen} (it is an option of {', '.join(users)}); leave it unset")


def unused_options(config_cls, value: str) -> list[str]:
    """The options of `config_cls` that `value` of its chooser (e.g. the algorithm) does not use, from the
    class's `_owners()` (the map `refuse_unused` checks): the options the CLI leaves out for it."""
    owners = config_cls._owners() if hasattr(config_cls, "_owners") else {}
    return [field for field, users in owners.items() if value not in users]


class Config:
    """Base of the frozen config dataclasses: checked on construction, dict round trip."""

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = _coerce(f.name, getattr(self, f.name), field_type(type(self), f.name))
            value = _spelled_as_choice(value, f.metadata.get("choices"))
            _check_range(f.name, value, f.metadata)
            object.__setattr__(self, f.name, value)
        for klass in reversed(type(self).__mro__):
            check = klass.__dict__.get("_check")
            if check is not None:
                check(self)

    @classmethod
    def from_dict(cls, values):
        """Build from a dict (a --config file, a checkpoint's config.json), naming unknown keys."""
        if not isinstance(values, dict):
            raise ValueError(f"a {cls.__name__} must be given as an object of key: value pairs, got {type(values).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown config key(s) {', '.join(unknown)}; valid keys: {', '.join(sorted(known))}")
        return cls(**values)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def defaults(cls) -> dict:
        """name -> default of every field (a run written before a field existed ran with its default)."""
        return {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                for f in dataclasses.fields(cls)
                if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}

    @classmethod
    def describe(cls) -> list[tuple[str, str, object, str]]:
        """(name, type, default, help) of every field, for listings and generated options."""
        return [(f.name, _describe(field_type(cls, f.name)), f.default, f.metadata.get("help", ""))
                for f in dataclasses.fields(cls)]


def field_type(cls, name: str):
    """The annotated type of field `name` of a config class."""
    return typing.get_type_hints(cls)[name]
