"""What each registered model is and what can be set on it: the data behind ``capsnet models``.

``catalog()`` gives one row a registered model (name, title, paper, task,
default input, weights); ``describe(name)`` one model in full: every field of
its config with its type, its default and the note written beside the field
in the config class. Those source comments are the fields' documentation, so
the listing cannot drift from the code: a field without a comment is shown
without a note. ``shipped()`` lists the trained models inside the package.
"""
from __future__ import annotations

import dataclasses
import inspect
import io
import re
import textwrap
import tokenize
from typing import Any

from .._docs import class_summary, table_cell

__all__ = ["catalog", "describe", "field_notes", "shipped", "format_catalog", "format_model", "DATASET_FIELDS"]

# a field in a dataclass body: four spaces, a name, an annotation, an optional default
_FIELD = re.compile(r"^ {4}([A-Za-z_]\w*)\s*:\s*[^=#]+?(?:=.*)?$")
_COMMENT_ONLY = re.compile(r"^ {4}#\s?(.*)$")


def _trailing_comment(line: str) -> str | None:
    """The comment ending ``line`` (a ``#`` inside a string is not one), or None."""
    try:
        for tok in tokenize.generate_tokens(io.StringIO(line.strip() + "\n").readline):
            if tok.type == tokenize.COMMENT:
                return tok.string[1:].strip()
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return None
    return None


def _notes_in(cls: type) -> dict[str, str]:
    """The notes of the fields ``cls`` itself declares: the comment ending a field's line, else the comment lines
    right above it. Comment lines right below a field whose line ends in a comment continue its note when what
    follows them is another such field, a blank line or the end of the fields (a section heading there wants a
    blank line above it); above a field without a comment of its own they are that field's note."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # no source (a frozen or interactive build): no notes, the rest still listed
        return {}
    own = set(cls.__dict__.get("__annotations__", {}))
    notes: dict[str, str] = {}
    above: list[str] = []
    previous = None  # the field on the line just above the comment lines, if its note ended that line
    for line in source.splitlines()[1:] + [""]:
        comment = _COMMENT_ONLY.match(line)
        if comment:
            above.append(comment.group(1).strip())
            continue
        field = _FIELD.match(line)
        trailing = _trailing_comment(line) if field else None
        if above and previous in notes and (trailing or not field):  # not the next field's own note: the lines
            notes[previous] += " " + " ".join(above)  # go on the note of the field above them (its sentence continued)
        if line.startswith("    def ") or line.startswith("    @"):
            break  # the methods: no fields below
        previous = None
        if field and field.group(1) in own:
            note = trailing or " ".join(above)
            if note:
                notes[field.group(1)] = note
                previous = field.group(1) if trailing else None
        above = []
    return notes


def field_notes(config_cls: type) -> dict[str, str]:
    """Each field of a config dataclass -> its note from the source, a subclass's note over its base's."""
    notes: dict[str, str] = {}
    for cls in reversed(config_cls.__mro__):
        if dataclasses.is_dataclass(cls):
            notes |= _notes_in(cls)
    return notes


def _row(name: str) -> dict[str, Any]:
    from . import model_spec, num_weights

    spec = model_spec(name)
    config = spec.config()
    row = {"name": name, "title": spec.title, "paper": spec.paper, "task": spec.kind,
           "input": [config.in_channels, config.input_height, config.input_width],
           "weights": num_weights(config)}
    if hasattr(config, "generator_weights"):
        row["generator_weights"] = config.generator_weights
    return row


def catalog() -> list[dict[str, Any]]:
    """One row a registered model, in registry order: name, title, paper, task, default input (C, H, W), weights
    at the defaults (and the generator's, for a synthesis model)."""
    from . import list_models

    return [_row(name) for name in list_models()]


def describe(name: str) -> dict[str, Any]:
    """One registered model in full: ``catalog()``'s row, the config's summary, its fields (name, type, default,
    note) in declaration order and the shipped trained models of it. An unknown name is a ValueError listing the
    valid ones."""
    from . import model_spec

    spec = model_spec(name)
    notes = field_notes(spec.config)
    config = spec.config()
    defaults = config.to_dict()  # as JSON values: a tuple as a list
    fields = [{"name": f.name, "type": str(f.type), "default": defaults[f.name], "note": notes.get(f.name, "")}
              for f in dataclasses.fields(config)]
    return _row(name) | {"summary": class_summary(spec.config), "fields": fields,
                         "train_defaults": dict(spec.train_defaults),
                         "pretrained": [p["name"] for p in shipped() if p["model"] == name]}


def shipped() -> list[dict[str, Any]]:
    """The trained models inside the package: name (for ``pretrained:NAME``), model, data set, epochs, the test
    accuracy (a classifier's; None for the others, or where neither card nor history has one) and ``test_figure``,
    the headline test figure as text (a classifier's accuracy, a segmentation model's Dice, a synthesis model's
    SSIM), both of the final epoch's weights: as its card measured it, on the whole test set with the shipped
    float16 weights, else (a card without the figure) as the training run scored it; None where neither has one."""
    from .. import pretrained
    from ..checkpoint import load_checkpoint
    from . import MODELS

    rows = []
    for name in pretrained.names():
        ckpt = load_checkpoint(pretrained.path(name))
        history = ckpt.state.get("history") or []
        last = history[-1] if history else {}
        kind = MODELS[ckpt.model_name].kind if ckpt.model_name in MODELS else "classification"
        dataset = (ckpt.train_config or {}).get("dataset")
        key, text = {"classification": ("test_accuracy", lambda v: f"{100 * v:.2f}%"),
                     "segmentation": ("test_dice", lambda v: f"Dice {v:.4f}"),
                     "synthesis": ("test_ssim", lambda v: f"SSIM {v:.4f}")}[kind]
        # the card's figure (the whole test set, the shipped weights): a segmentation run scores 2,000 canvases
        card = pretrained.measured(name)
        figure = card.get(f"{str(dataset).replace('-', '_')}_{key}" if kind == "classification" else key,
                          last.get(key))
        accuracy = figure if kind == "classification" else None
        rows.append({"name": name, "model": ckpt.model_name, "dataset": dataset,
                     "epochs": ckpt.state.get("epoch"), "test_accuracy": accuracy,
                     "test_figure": None if figure is None else text(figure)})
    return rows


# ------------------------------------------------------------------------------------------ as text

# the fields `capsnet train` sets from --dataset (capsnet.train.input_fields): the defaults below are for the papers'
# data
DATASET_FIELDS = ("in_channels", "input_height", "input_width", "num_classes", "out_channels")


def _weights(row: dict[str, Any]) -> str:
    text = f"{row['weights']:,}"
    return text + (f" (generator {row['generator_weights']:,})" if "generator_weights" in row else "")


def format_catalog() -> str:
    """``catalog()`` and ``shipped()`` as Markdown tables, with how to see and set a model's fields."""
    lines = ["| name | model | paper | task | input (C x H x W) | weights |", "|---|---|---|---|---|---:|"]
    for r in catalog():
        lines.append(f"| {r['name']} | {r['title']} | {r['paper']} | {r['task']} | {'x'.join(map(str, r['input']))} "
                     f"| {_weights(r)} |")
    lines += ["", "Input sizes and weights are the defaults; `capsnet train` sizes the input and the classes from "
              "--dataset.", "", "Trained models shipped with capsnet (`--checkpoint pretrained:NAME`):", "",
              "| name | model | data | epochs | test figure |", "|---|---|---|---:|---:|"]
    for p in shipped():
        lines.append(f"| pretrained:{p['name']} | {p['model']} | {p['dataset']} | {p['epochs']} | "
                     f"{p['test_figure'] or '-'} |")
    lines += ["", "Test figures of the final epoch's weights as each model's card measured them: the whole test set, "
              "the shipped float16 weights.",
              "", "`capsnet models NAME` lists a model's fields; `capsnet train --model NAME --model-option "
              "FIELD=VALUE` sets one."]
    return "\n".join(lines)


def _example(name: str, fields: list[dict[str, Any]]) -> tuple[str, Any]:
    """A field of model ``name`` and a value other than its default that its config takes: the first switch turned
    over, else the first count doubled (an example that changes something, where the last field at its default
    changed nothing); the last field at its default when neither is taken."""
    from . import model_spec

    config = model_spec(name).config
    settable = [f for f in fields if f["name"] not in DATASET_FIELDS]
    tries = [(f["name"], not f["default"]) for f in settable if isinstance(f["default"], bool)]
    tries += [(f["name"], f["default"] * 2) for f in settable if f["type"] == "int" and isinstance(f["default"], int)
              and not isinstance(f["default"], bool)]
    for field, value in tries:
        try:
            config(**{field: value})
        except (ValueError, TypeError):
            continue
        return field, value
    return fields[-1]["name"], fields[-1]["default"]


def format_model(name: str) -> str:
    """``describe(name)`` as text: what the model is, then a Markdown table of its fields."""
    import json

    d = describe(name)
    paper = f", {d['paper']}" if d["paper"] else ""
    lines = [f"{name}: {d['title']}{paper} ({d['task']})"]
    if d["summary"]:
        lines.append(d["summary"])
    lines += [f"{_weights(d)} weights at these defaults, input {'x'.join(map(str, d['input']))}.", "",
              "| field | type | default | note |", "|---|---|---|---|"]
    for f in d["fields"]:
        note = f["note"]
        if f["name"] in DATASET_FIELDS:
            note = "set from --dataset by `capsnet train`" + (f"; {note}" if note else "")
        lines.append(f"| {f['name']} | {table_cell(f['type'])} | {table_cell(json.dumps(f['default']))} | "
                     f"{table_cell(note)} |")
    field, value = _example(name, d["fields"])
    # no spaces in the example's JSON ([512,1024], not [512, 1024]), so the line works as typed in a shell
    value = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    lines += ["", f"Set a field: `capsnet train --model {name} --model-option FIELD=VALUE` (VALUE as JSON; a string "
              f"may go unquoted), e.g. `--model-option {field}={value}`; in Python: "
              f"`capsnet.models.create_model({name!r}, FIELD=VALUE)`."]
    if d["train_defaults"]:
        lines.append("Trained with " + ", ".join(f"--{k.replace('_', '-')} {v}" + (
            " (under the exponential schedule; none under --lr-schedule linear)" if k == "warmup_steps" else "")
            for k, v in d["train_defaults"].items()) + " unless another value is typed (`capsnet train` and the "
            "experiments).")
    if d["pretrained"]:
        lines.append("Shipped trained: " + ", ".join(f"pretrained:{p}" for p in d["pretrained"]) + ".")
    return "\n".join(lines)
