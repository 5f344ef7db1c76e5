"""What each registered routing algorithm is and takes, for ``capsnet routings`` and for people choosing one.

Read from the code itself, so it cannot drift from it: a routing's options are its constructor's keyword parameters
with their defaults, each one's note is its entry under "Args:" in the class docstring, and its properties are the
ones the registry reads (``routing_takes``, the ``pose_bias``, ``probabilities`` and ``length_activations`` class
attributes).
"""
from __future__ import annotations

import inspect
import json
import re
from typing import Any

from .._docs import class_doc, class_summary, table_cell
from . import LAYER_SIZES, TRAITS, _registered, list_routings, routing_is, routing_takes

__all__ = ["routing_catalog", "describe_routing", "format_routings", "format_routing"]


def _arg_notes(cls: type) -> dict[str, str]:
    """Each constructor argument's note from the class docstring's "Args:" block (Google style: ``name: text``,
    or ``a, b: text`` for several, continued on more deeply indented lines), on one line each."""
    doc = class_doc(cls)
    match = re.search(r"^Args:\n((?:[ \t]+.*\n?|\n)*)", doc, re.M)
    if not match:
        return {}
    notes: dict[str, str] = {}
    names: list[str] = []
    for line in match.group(1).splitlines():
        head = re.match(r"^ {4}([\w, ]+):\s*(.*)$", line)
        if head and not line.startswith(" " * 5):
            names = [n.strip() for n in head.group(1).split(",")]
            for n in names:
                notes[n] = head.group(2).strip()
        elif line.strip() and names:
            for n in names:
                notes[n] = f"{notes[n]} {line.strip()}".strip()
        elif not line.strip():
            names = []
    return notes


def _row(name: str) -> dict[str, Any]:
    """Routing ``name``'s row: name, class, summary, whether it iterates, takes a pose bias, gives activations in
    [0, 1] (what CapsNet's ``routing`` field needs) and activations that are its poses' lengths, and the layer sizes
    it is built with."""
    cls = _registered(name)
    parameters = inspect.signature(cls).parameters
    return {"name": name, "class": cls.__name__, "summary": class_summary(cls),
            "iterates": routing_takes(name, "iterations"),
            **{trait: routing_is(name, trait) for trait in TRAITS},
            "layer_sizes": [s for s in LAYER_SIZES if s in parameters and s != "iterations"]}


def routing_catalog() -> list[dict[str, Any]]:
    """One row per registered routing (``_row``)."""
    return [_row(name) for name in list_routings()]


def describe_routing(name: str) -> dict[str, Any]:
    """Routing ``name``'s row and its options: each constructor parameter with its default (None where it has none:
    the layer gives it) and note, the layer's sizes and ``iterations`` marked as set by the layer that builds it."""
    cls = _registered(name)
    notes = _arg_notes(cls)
    options = []
    for p in inspect.signature(cls).parameters.values():
        if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
            continue
        default = None if p.default is p.empty else p.default
        options.append({"name": p.name, "default": default, "note": notes.get(p.name, ""),
                        "set_by_layer": p.name in LAYER_SIZES})
    return _row(name) | {"options": options}


def format_routings() -> str:
    """The registered routings as a table, and how to choose one."""
    lines = ["| routing | class | iterates | pose bias | activations in [0, 1] | activations are lengths | built with |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in routing_catalog():
        lines.append(f"| {r['name']} | {r['class']} | {'yes' if r['iterates'] else 'no (one pass)'} | "
                     f"{'yes' if r['pose_bias'] else 'no'} | {'yes' if r['probabilities'] else 'no'} | "
                     f"{'yes' if r['length_activations'] else 'no'} | "
                     f"{', '.join(r['layer_sizes']) or '-'} |")
    return "\n".join(lines)


def format_routing(name: str) -> str:
    """Routing ``name``: its summary and a table of its options (default and note)."""
    d = describe_routing(name)
    lines = [f"{d['name']}: {d['class']}. {d['summary']}", ""]
    if not d["options"]:  # (a table of no rows said nothing)
        return "\n".join(lines + ["It takes no options."])
    lines += ["| option | default | note |", "| --- | --- | --- |"]
    for o in d["options"]:
        default = "set by the layer" if o["set_by_layer"] else json.dumps(o["default"])
        lines.append(f"| {o['name']} | {table_cell(default)} | {table_cell(o['note'])} |")
    return "\n".join(lines)
