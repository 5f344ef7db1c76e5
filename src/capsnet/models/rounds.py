"""Routing rounds a config sets that its routing never uses.

A routing that makes one pass (self-attention) takes no rounds, so a config's
``routing_iterations`` (and SegCaps' ``primary_routing_iterations`` and
``strided_routing_iterations``) route
nothing under it: a config built anew refuses them away from their defaults,
and one read back from a checkpoint saved before that (``JsonConfig._saved``)
has them set back to the defaults, so the run still loads.
"""
from __future__ import annotations

from dataclasses import fields
from typing import Any

from ..routing import list_routings, routing_takes

__all__ = ["ROUNDS", "unused_rounds", "saved_rounds", "check_rounds", "SavedRounds"]

# the fields that set routing rounds, refused away from their defaults under a routing that makes one pass
ROUNDS = ("routing_iterations", "primary_routing_iterations", "strided_routing_iterations")


def unused_rounds(config: Any, routing: str) -> dict[str, int]:
    """The defaults of ``config``'s (a config class's or instance's) rounds fields when ``routing`` makes one pass,
    which routes nothing with them; {} for a routing that iterates."""
    if routing not in list_routings() or routing_takes(routing, "iterations"):
        return {}
    return {f.name: f.default for f in fields(config) if f.name in ROUNDS}


def saved_rounds(cls: type, d: dict[str, Any]) -> dict[str, Any]:
    """A saved config dict with the rounds its one-pass routing never used set back to ``cls``'s defaults, so a run
    saved before they were refused (an experiment's --routing-iterations over segcaps:self-attention) still loads."""
    routing = d.get("routing", "dynamic")
    return d | unused_rounds(cls, routing) if isinstance(routing, str) else d


class SavedRounds:
    """A config mixin (before ``JsonConfig``): ``from_saved`` reads its rounds back through ``saved_rounds``."""

    @classmethod
    def _saved(cls, d: dict[str, Any]) -> dict[str, Any]:
        return saved_rounds(cls, d)


def check_rounds(config: Any, routing: str) -> None:
    """A ValueError naming the first rounds field of ``config`` set away from its default under a one-pass
    ``routing``."""
    for name, default in unused_rounds(config, routing).items():
        if getattr(config, name) != default:
            raise ValueError(f"{type(config).__name__}.{name} sets the rounds of a routing that iterates; {routing} "
                             f"routing makes one pass: leave it at {default}")
