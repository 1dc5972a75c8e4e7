"""Typed objects from untrusted dicts: unknown, missing or mistyped keys are refused by name.

Run configurations, worker commands and every message a peer sends arrive as JSON objects. A
renamed field that silently vanishes, or a string where a number belongs, would corrupt a run
without an error, so :func:`from_dict` checks each key against the dataclass's type hints.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, TypeVar

from .errors import UsageError

T = TypeVar("T")
#: Bounds for anything a peer sends: no huge strings, lists or numbers sneak into records.
MAX_STRING = 4096
MAX_LIST = 4096
MAX_INT = 2 ** 62


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _check(value: Any, tp: Any, path: str) -> Any:
    """``value`` converted to ``tp`` where lossless (int -> float), else a one-line error."""
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _check(value, option, path)
            except UsageError as exc:
                errors.append(str(exc))
        raise UsageError(errors[0] if len(errors) == 1 else
                         f"{path}: {value!r} is none of {', '.join(_type_name(o) for o in options)}")
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise UsageError(f"{path}: expected a list, got {type(value).__name__}")
        if len(value) > MAX_LIST:
            raise UsageError(f"{path}: {len(value)} items; at most {MAX_LIST} are accepted")
        args = typing.get_args(tp)
        item = args[0] if args else Any
        return [_check(v, item, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise UsageError(f"{path}: expected an object, got {type(value).__name__}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise UsageError(f"{path}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise UsageError(f"{path}: expected an integer, got {value!r}")
        if abs(value) > MAX_INT:
            raise UsageError(f"{path}: {value} is out of range (|x| <= 2^62)")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UsageError(f"{path}: expected a number, got {value!r}")
        if not math.isfinite(value):
            raise UsageError(f"{path}: {value!r} is not a finite number")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise UsageError(f"{path}: expected a string, got {type(value).__name__}")
        if len(value) > MAX_STRING:
            raise UsageError(f"{path}: a string of {len(value)} characters; at most {MAX_STRING}")
        return value
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, path)
    if isinstance(tp, type) and hasattr(tp, "from_checked"):  # a type that checks its own JSON form
        return tp.from_checked(value, path)
    raise TypeError(f"strict: unsupported field type {tp!r} at {path}")


def from_dict(cls: type[T], data: Any, what: str | None = None) -> T:
    """``cls(**data)`` after checking keys and types; raises :class:`UsageError` naming the key."""
    what = what or cls.__name__
    if not isinstance(data, dict):
        raise UsageError(f"{what}: expected an object, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields), key=str)
    if unknown:
        raise UsageError(f"{what}: unknown key {str(unknown[0])[:60]!r}; valid: {', '.join(fields)}")
    missing = [name for name, f in fields.items() if name not in data
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise UsageError(f"{what}: missing key {missing[0]!r}")
    values = {name: _check(value, hints[name], f"{what}.{name}") for name, value in data.items()}
    return cls(**values)


def to_dict(obj: Any) -> dict[str, Any]:
    """The plain-JSON form of a dataclass (the inverse of :func:`from_dict`)."""
    return dataclasses.asdict(obj)
