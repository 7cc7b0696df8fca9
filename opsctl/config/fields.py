"""The one generic loader of the config file: each key is declared once, as a dataclass field.

A section is a frozen dataclass; each field's name is its YAML key, its annotation is the type the
YAML value must have, and `key(...)` gives its default, its check and the hint an error shows. `load`
turns a YAML mapping into the dataclass, checking every key, and raises a one-line ConfigError that
names the key path, the value found and what is expected:

    config key prometheus.timeout_seconds: must be > 0, got -1
    config key safety.max_drains_per_run: expected an integer, got float 1.5
    config key prometheus.urll: unknown key (known: basic_auth, bearer_token_file, ...)

A key that is absent, or null where its type does not admit null, takes its default; null where the
type admits it (`str | None`) is None. pydantic and msgspec were measured against this: neither names
the known keys of a mistyped one nor shows the bad value in one line, and pydantic takes `true` for a
number; both would still need this file's checks (readable files, regular expressions, paths).

Durations are stored one way, as `Duration` (seconds, a float), whichever way the file spells them.
"""

import math
import re
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields, is_dataclass
from functools import cache
from pathlib import Path
from types import NoneType, UnionType
from typing import TYPE_CHECKING, Any, TypeVar

from opsctl.errors import ConfigError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")
Check = Callable[[Any], object]
# A key's own parser (value, default, key path) -> value, for a key that no annotation can describe.
Parse = Callable[[Any, Any, str], Any]

_DURATION = re.compile(r"^(\d+)([smhd])$")
_UNIT_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
DURATION_HINT = "a duration such as 30s, 5m, 1h or a number of seconds"


class Duration(float):
    """A duration in seconds. str() spells it as Prometheus does (30s, 2m, 1h, 1500ms), so it goes
    into PromQL and messages as it is; everything else sees a float."""

    def __str__(self) -> str:
        millis = round(self * 1000)
        if millis % 1000:
            return f"{millis}ms"
        seconds = millis // 1000
        for unit, size in _UNIT_SECONDS.items():
            if seconds and seconds % size == 0:
                return f"{seconds // size}{unit}"
        return "0s"


def parse_duration(value: object) -> Duration:
    """'90s', '5m', '1h', '2d' or a number of seconds (>= 0) -> Duration; else ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{value!r} is not {DURATION_HINT}")
    if isinstance(value, str):
        match = _DURATION.match(value)
        if not match:
            raise ValueError(f"{value!r} is not {DURATION_HINT}")
        return Duration(int(match.group(1)) * _UNIT_SECONDS[match.group(2)])
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{value!r} is not {DURATION_HINT}")
    return Duration(value)


def duration(text: str) -> Duration:
    """A default written as in the file: duration("2m") == Duration(120)."""
    return parse_duration(text)


def duration_seconds(value: str | float) -> int:
    """'90s' -> 90, '5m' -> 300, a number of seconds (a config Duration) -> it, rounded up to whole seconds.
    A string must be whole seconds in one unit (s, m, h, d): such a string goes into PromQL unchanged."""
    if isinstance(value, str):
        match = _DURATION.match(value)
        if not match:
            raise ValueError(f"{value!r} is not a duration like 30s, 5m, 1h")
        return int(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    return math.ceil(value)


def key(default: Any = MISSING, *, factory: Callable[[], Any] | None = None, check: Check | None = None,
        hint: str = "", each: Check | None = None, each_hint: str = "", parse: Parse | None = None,
        normalize: Callable[[Any], Any] | None = None) -> Any:
    """A config key: its default (or `factory`; neither: the key is required), a `check` of the
    whole value with the `hint` its error shows, an `each` check of every item of a list, a `parse`
    of its own instead of the annotation's, and a `normalize` applied to a good value."""
    meta = {"check": check, "hint": hint, "each": each, "each_hint": each_hint, "parse": parse,
            "normalize": normalize}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    if default is MISSING:
        return field(metadata=meta)
    return field(default=default, metadata=meta)


def fail(path: str, message: str, value: object = MISSING) -> typing.NoReturn:
    """The one-line error of a bad key: its path, what is expected and (when given) what was found."""
    got = "" if value is MISSING else f", got {_shown(value)}"
    raise ConfigError(f"config key {path}: {message}{got}")


def _shown(value: object) -> str:
    text = "null" if value is None else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def join(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


@dataclass(frozen=True)
class _Key:
    field: Field[Any]
    kind: Any  # the resolved annotation


@cache
def yaml_keys(cls: type) -> tuple[_Key, ...]:
    """The YAML keys of a section: its fields, less those marked internal (not read from the file)."""
    hints = typing.get_type_hints(cls)
    return tuple(_Key(f, hints[f.name]) for f in fields(cls) if f.init and not f.metadata.get("internal"))


def load(cls: type[T], raw: object, where: str) -> T:
    """The section `cls` from the YAML value `raw` found at key path `where` ("" for the top)."""
    data = _section_mapping(cls, raw, where)
    values: dict[str, Any] = {}
    for entry in yaml_keys(cls):
        name, path = entry.field.name, join(where, entry.field.name)
        if data.get(name) is not None:
            values[name] = _value(entry, data[name], path)
        elif name in data and _optional(entry.kind):
            values[name] = None
        elif entry.field.default is MISSING and entry.field.default_factory is MISSING:
            hint = entry.field.metadata["hint"]
            fail(path, "is required" + (f"; it {hint}" if hint else ""))
    section = cls(**values)
    check_together = getattr(section, "check_together", None)
    if check_together is not None:
        check_together(where)
    return section


def _section_mapping(cls: type, raw: object, where: str) -> Mapping[str, Any]:
    names = [entry.field.name for entry in yaml_keys(cls)] + list(getattr(cls, "YAML_ONLY", ()))
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        fail(where, f"expected a mapping (keys: {', '.join(sorted(names))})", raw)
    retired: dict[str, str] = getattr(cls, "RETIRED", {})
    for name in raw:
        if name in retired:
            fail(join(where, str(name)), retired[name])
        if name not in names:
            fail(join(where, str(name)), f"unknown key (known: {', '.join(sorted(names))})"
                                         f"{getattr(cls, 'UNKNOWN_HINT', '')}")
    return {name: value for name, value in raw.items() if name not in getattr(cls, "YAML_ONLY", ())}


def _value(entry: _Key, raw: object, path: str) -> Any:
    meta = entry.field.metadata
    parse: Parse | None = meta["parse"]
    default = entry.field.default if entry.field.default_factory is MISSING else entry.field.default_factory()
    value = parse(raw, default, path) if parse else _convert(_required(entry.kind), raw, path, meta["hint"])
    if meta["each"] is not None:
        for index, item in enumerate(value):
            if not meta["each"](item):
                fail(f"{path}[{index}]", meta["each_hint"], item)
    if meta["check"] is not None and not meta["check"](value):
        fail(path, meta["hint"] or "invalid value", raw)
    return meta["normalize"](value) if meta["normalize"] else value


def _optional(kind: Any) -> bool:
    return isinstance(kind, UnionType) and NoneType in typing.get_args(kind)


def _required(kind: Any) -> Any:
    """X for X | None."""
    if _optional(kind):
        (kind,) = [arg for arg in typing.get_args(kind) if arg is not NoneType]
    return kind


def _convert(kind: Any, raw: object, path: str, hint: str) -> Any:
    """`raw` as the type `kind`. A value of the wrong kind: "expected int, got str 'many'"; a list or
    mapping whose items are of the wrong kind: the key's hint, which says what they must be."""
    if is_dataclass(kind):
        return load(typing.cast(type["DataclassInstance"], kind), raw, path)
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is tuple:
        if not isinstance(raw, list):
            _wrong(path, "list", raw)
        if is_dataclass(args[0]):
            return tuple(load(typing.cast(type["DataclassInstance"], args[0]), x, f"{path}[{i}]")
                         for i, x in enumerate(raw))
        if not all(_is(args[0], x) for x in raw):
            fail(path, hint or f"must be a list of {_name(args[0])}", raw)
        return tuple(_scalar(args[0], x) for x in raw)
    if origin is dict:
        if not isinstance(raw, dict):
            _wrong(path, "dict", raw)
        if not all(isinstance(k, str) and _is(args[1], v) for k, v in raw.items()):
            fail(path, hint or f"must map names to {_name(args[1])}", raw)
        return {k: _scalar(args[1], v) for k, v in raw.items()}
    if kind is Duration:
        try:
            return parse_duration(raw)
        except ValueError:
            fail(path, f"expected {DURATION_HINT}", raw)
    if kind in (int, float) and isinstance(raw, bool):  # YAML's yes/true is never a number
        fail(path, "expected a number", raw)
    if not _is(kind, raw):
        _wrong(path, "str" if kind is Path else kind.__name__, raw)
    return _scalar(kind, raw)


def _is(kind: Any, raw: object) -> bool:
    if kind is Any:
        return True
    if typing.get_origin(kind) is dict:
        return isinstance(raw, dict)
    if kind in (int, float) and isinstance(raw, bool):
        return False
    if kind is float:
        return isinstance(raw, (int, float))
    return isinstance(raw, str if kind is Path else kind)


def _scalar(kind: Any, raw: Any) -> Any:
    return float(raw) if kind is float else Path(raw) if kind is Path else raw


def _name(kind: Any) -> str:
    return {str: "strings", int: "integers", float: "numbers"}.get(kind, "mappings")


def _wrong(path: str, expected: str, raw: object) -> typing.NoReturn:
    raise ConfigError(f"config key {path}: expected {expected}, got {type(raw).__name__} {_shown(raw)}")


def walk(cls: type, where: str = "") -> list[tuple[str, Any]]:
    """(key path, default) of every key under section `cls`; a list of sections is one key."""
    out: list[tuple[str, Any]] = []
    for entry in yaml_keys(cls):
        path = join(where, entry.field.name)
        if isinstance(entry.kind, type) and is_dataclass(entry.kind):
            out += walk(entry.kind, path)
        else:
            f = entry.field
            out.append((path, f.default if f.default_factory is MISSING else f.default_factory()))
    return out
