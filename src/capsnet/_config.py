"""Strict (de)serialisation and checks shared by the frozen config dataclasses.

A config may come from a checkpoint someone else wrote, so every field is
checked against its annotated type (``"10"`` is not an int, ``"yes"`` not a
bool) and every size against a range, with one message naming the field.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any, TypeVar

from ._numbers import is_finite, is_int, number_repr

__all__ = ["JsonConfig", "config_from_dict", "check_types", "plain_numbers", "check_range", "OutOfRange",
           "check_choice", "json_value", "hash_as_saved", "MAX_WEIGHTS"]

T = TypeVar("T")

# Refuse configs whose weights would not fit a large GPU (2^31 float32 weights: 8 GiB), before allocating any.
MAX_WEIGHTS = 2**31


def hash_as_saved(config: Any) -> int:
    """A config's hash from its JSON record (``__hash__ = hash_as_saved`` in the class body, and again in every
    frozen subclass, which would write its own field-tuple hash): for a config with a dict field
    (routing_options)."""
    def plain(v: Any) -> Any:  # 1 and 1.0 equal (the configs compare equal), so they hash alike: a number as a float
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        return float(v) if is_int(v) else v

    return hash(json.dumps(plain(config.to_dict()), sort_keys=True))


def json_value(text: str) -> Any:
    """A field's value as typed on a command line: JSON (3, 0.5, true, [64, 128], "x"), else the text itself."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def config_from_dict(cls: type[T], d: dict[str, Any]) -> T:
    """Build ``cls(**d)``, rejecting unknown keys by name (a typo must not pass silently)."""
    if not isinstance(d, dict):
        raise ValueError(f"a {cls.__name__} must be a JSON object of fields, got {type(d).__name__}")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} keys {unknown}; valid keys are {sorted(known)}")
    return cls(**d)


class JsonConfig:
    """``to_dict`` and ``from_dict`` for a frozen config dataclass: its fields as JSON values (tuples as lists; a
    config with a tuple field turns lists back into tuples in its ``__post_init__``), and back through
    ``config_from_dict``. ``from_saved`` reads a configuration a checkpoint recorded: a field added to the config
    since, with a default other than what the code of that time did, reads as that older behaviour
    (``_SAVED_BEFORE``: field -> value, set by a subclass without annotation, so not a field; a subclass of such a
    config names only the fields it adds or changes: its bases' entries hold for it too)."""

    _SAVED_BEFORE: dict[str, Any] = {}

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls: type[T], d: dict[str, Any]) -> T:
        return config_from_dict(cls, d)

    @classmethod
    def from_saved(cls: type[T], d: dict[str, Any]) -> T:
        """``from_dict`` of a configuration a checkpoint recorded, the fields it predates at their old values."""
        if not isinstance(d, dict):
            return config_from_dict(cls, d)  # refused there, by name
        before: dict[str, Any] = {}
        for base in reversed(cls.__mro__):  # the bases' entries first, so that a subclass's own win
            before |= base.__dict__.get("_SAVED_BEFORE", {})
        return config_from_dict(cls, cls._saved({k: v for k, v in before.items() if k not in d} | d))

    @classmethod
    def _saved(cls, d: dict[str, Any]) -> dict[str, Any]:
        """A saved configuration's fields as this version builds them (a subclass may set back values that an older
        version saved without using them and this one refuses); as they are by default."""
        return d


_TYPES = {  # annotation -> (test, what it must be)
    "int": (is_int, "an integer"),
    "float": (is_finite, "a finite number"),
    "float | None": (lambda v: v is None or is_finite(v), "a finite number or null"),
    "int | None": (lambda v: v is None or is_int(v), "an integer or null"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "tuple[int, ...]": (lambda v: isinstance(v, (list, tuple)) and all(is_int(x) for x in v), "a list of integers"),
    "tuple[float, ...]": (lambda v: isinstance(v, (list, tuple)) and all(is_finite(x) for x in v),
                          "a list of finite numbers"),
    "dict[str, Any]": (lambda v: isinstance(v, dict) and all(isinstance(k, str) for k in v)
                       and all(v is None or isinstance(v, (bool, str)) or is_finite(v) for v in v.values()),
                       "a JSON object of named numbers, true/false or strings"),
}


def _plain(v: Any) -> Any:
    """A NumPy scalar (np.int64(64) from a sweep's np.arange, np.float32(0.5)) as the Python number it holds, in a
    list or tuple too; other values as they are."""
    if type(v).__module__ == "numpy" and getattr(v, "ndim", None) == 0:
        return v.item()
    if isinstance(v, (list, tuple)) and any(type(x).__module__ == "numpy" for x in v):
        return type(v)(_plain(x) for x in v)
    return v


def plain_numbers(config: Any) -> None:
    """NumPy scalars in ``config``'s fields made the Python numbers they hold (``check_types`` does so first)."""
    for f in dataclasses.fields(config):
        object.__setattr__(config, f.name, _plain(getattr(config, f.name)))


def check_types(config: Any) -> None:
    """Each field of a config dataclass holds a value of its annotated type (NumPy scalars become the Python numbers
    they hold, so the config saves as JSON); a ValueError names the first field that does not."""
    for f in dataclasses.fields(config):
        test, what = _TYPES[f.type]
        value = _plain(getattr(config, f.name))
        object.__setattr__(config, f.name, value)
        if not test(value):
            # a list typed as --model-option decoder_hidden=512,1024 arrives as the string '512,1024'
            number = r"\d+(\.\d+)?" if f.type == "tuple[float, ...]" else r"\d+"
            hint = f"; give a JSON list, e.g. {f.name}=[{value.replace(' ', '')}]" if f.type.startswith("tuple[") \
                and isinstance(value, str) and re.fullmatch(rf"\s*{number}(\s*,\s*{number})+\s*", value) else ""
            raise ValueError(f"{type(config).__name__}.{f.name} must be {what}, got {number_repr(value)}{hint}")


class OutOfRange(ValueError):
    """``check_range``'s error, with the field's ``name`` and its bounds ``lo`` and ``hi`` for a caller that says
    more (the CLI: the size to pad or crop a user's images to)."""

    def __init__(self, message: str, name: str = "", lo: float = -math.inf, hi: float = math.inf) -> None:  # the
        # defaults: an unpickled one (its args are the message alone) is still made
        super().__init__(message)
        self.name, self.lo, self.hi = name, lo, hi


def check_range(config: Any, name: str, lo: float, hi: float) -> None:
    """``lo <= config.name <= hi`` (each item, for a list), or an ``OutOfRange`` (a ValueError) naming the field and
    the range."""
    value = getattr(config, name)
    listed = isinstance(value, (list, tuple))
    for i, v in enumerate(value if listed else (value,)):
        if not lo <= v <= hi:
            got = number_repr(value) + (f" (entry {i}, {number_repr(v)})" if listed else "")
            raise OutOfRange(f"{type(config).__name__}.{name} must be in {_number(lo)}..{_number(hi)}, got {got}",
                             name, lo, hi)


def check_choice(config: Any, name: str, choices: Any) -> None:
    """``config.name`` is one of ``choices`` (its values, or a dict keyed by them), or a ValueError naming the
    field and the choices."""
    value = getattr(config, name)
    if value not in choices:
        raise ValueError(f"{type(config).__name__}.{name} must be one of {', '.join(choices)}, got {value!r}")


def _number(x: float) -> str:
    return f"{x:,}" if is_int(x) else f"{x:g}"
