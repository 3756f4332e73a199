"""Declared placer options: each placer's knobs as one frozen dataclass.

A placer lists what it can be told, with types, defaults and a line of help, so that
``devplace.place`` can refuse a misspelt or mistyped option by name (not fail deep inside), and
``devplace algos --json`` can show every knob. Learning placers declare their hyper-parameters the
same way, with the paper the default comes from in the help.

>>> from dataclasses import dataclass
>>> @dataclass(frozen=True)
... class Knobs:
...     imbalance: float = option(0.05, "allowed load imbalance")
...     acyclic: bool = option(True, "repair the partition so no cycle crosses devices")
>>> parse_options(Knobs, {"imbalance": 1}, "metis")
Knobs(imbalance=1.0, acyclic=True)
>>> [o["name"] + ": " + o["type"] for o in describe_options(Knobs)]
['imbalance: float', 'acyclic: bool']
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from devplace.errors import PlacementError


def option(default: Any, help: str, choices: tuple | None = None) -> Any:
    """A dataclass field with its one-line help (and optionally the values it may take)."""
    metadata = {"help": help} | ({"choices": tuple(choices)} if choices else {})
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class NoOptions:
    """For a placer that takes no options."""


NO_OPTIONS = NoOptions()


def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _type_name(hint) -> str:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(hint))
    if origin is tuple:
        args = typing.get_args(hint)
        return f"tuple of {_type_name(args[0])}" if args else "tuple"
    if hint is type(None):
        return "None"
    return getattr(hint, "__name__", str(hint))


def _coerce(value: Any, hint) -> Any:
    """``value`` as ``hint`` asks, or raise ValueError. Lenient only where no meaning changes:
    an int for a float, a list or a comma-separated string for a tuple."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg)
            except ValueError:
                continue
        raise ValueError
    if origin is tuple or hint is tuple:
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if not isinstance(value, (list, tuple)):
            raise ValueError
        args = typing.get_args(hint)
        if args and args[-1] is not Ellipsis:  # a fixed-shape tuple, e.g. tuple[tuple[str, float], ...]
            return tuple(value)
        inner = args[0] if args else Any
        return tuple(value if inner is Any else [_coerce(v, inner) for v in value])
    if hint is Any:
        return value
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ValueError
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ValueError
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value):
            return float(value)
        raise ValueError
    if hint is str:
        if isinstance(value, str):
            return value
        raise ValueError
    if isinstance(hint, type) and isinstance(value, hint):
        return value
    raise ValueError


def parse_options(cls, values: dict, placer: str):
    """An instance of ``cls`` from user-given ``values``; a PlacementError names a bad option and
    lists the valid ones, so no placer ever sees an option it did not declare."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        valid = ", ".join(f"{name} ({_type_name(hint)})" for name, hint in _hints(cls).items())
        raise PlacementError(
            f"placer {placer!r} has no option {', '.join(map(repr, unknown))}: "
            + (f"its options are {valid}" if fields else "it takes no options")
        )
    hints = _hints(cls)
    coerced = {}
    for name, value in values.items():
        try:
            coerced[name] = _coerce(value, hints[name])
        except ValueError:
            raise PlacementError(
                f"option {name!r} of placer {placer!r} must be {_type_name(hints[name])}, not {value!r}"
            ) from None
        choices = fields[name].metadata.get("choices")
        if choices and coerced[name] not in choices:
            raise PlacementError(
                f"option {name!r} of placer {placer!r} is {value!r}: use one of {', '.join(map(str, choices))}"
            )
    return cls(**coerced)


def describe_options(cls) -> list[dict]:
    """Name, type, default and help of each option, in declaration order (for ``algos --json``)."""
    hints = _hints(cls)
    return [
        {"name": f.name, "type": _type_name(hints[f.name]), "default": f.default,
         "help": f.metadata.get("help", "")} | ({"choices": list(f.metadata["choices"])}
                                                if "choices" in f.metadata else {})
        for f in dataclasses.fields(cls)
    ]


__all__ = ["option", "NoOptions", "NO_OPTIONS", "parse_options", "describe_options"]
