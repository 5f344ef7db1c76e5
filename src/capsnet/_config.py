"""Strict (de)serialisation shared by the frozen config dataclasses."""
from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

__all__ = ["config_from_dict"]

T = TypeVar("T")


def config_from_dict(cls: type[T], d: dict[str, Any]) -> T:
    """Build ``cls(**d)``, rejecting unknown keys by name (a typo must not pass silently)."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} keys {unknown}; valid keys are {sorted(known)}")
    return cls(**d)
