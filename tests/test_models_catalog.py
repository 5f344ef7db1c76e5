"""capsnet.models.catalog and `capsnet models`: the registered models, their fields with the notes from their config
classes' source, and the shipped trained models."""
from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass

import pytest

from capsnet import pretrained
from capsnet.checkpoint import load_checkpoint
from capsnet.data.tasks import TASKS, task
from capsnet.models import MODELS, create_model, list_models, model_spec
from capsnet.models.catalog import (DATASET_FIELDS, catalog, describe, field_notes, format_catalog, format_model,
                                    shipped)
from capsnet.train import input_fields
from cli_helpers import in_process


@dataclass(frozen=True)
class _Base:
    width: int = 3  # how wide
    # the block comment above a field
    # is its note, in one line
    depth: int = 2
    name: str = "a # b"  # a '#' inside the default's string is not where the note starts
    plain: bool = False
    long: int = 1  # a note too long for its line goes
    # on below it (before: cut at "goes")
    after: int = 0  # its own note
    last: int = 0  # the last field's note goes on below
    # it too (before: cut at "below")

    def method(self) -> int:
        hidden: int = 1  # a local in a method, not a field
        return hidden


@dataclass(frozen=True)
class _Child(_Base):
    depth: int = 5  # the subclass's own note wins
    width: int = 4


def test_field_notes_read_the_comment_beside_or_above_each_field_and_a_subclass_keeps_its_bases_notes():
    both = {"name": "a '#' inside the default's string is not where the note starts",
            "long": 'a note too long for its line goes on below it (before: cut at "goes")', "after": "its own note",
            "last": 'the last field\'s note goes on below it too (before: cut at "below")'}
    assert field_notes(_Base) == {"width": "how wide", "depth": "the block comment above a field is its note, in one line",
                                  **both}
    assert field_notes(_Child) == {"width": "how wide", "depth": "the subclass's own note wins", **both}


def test_every_registered_model_has_a_row_with_its_paper_task_input_and_weights():
    rows = catalog()
    assert [r["name"] for r in rows] == list_models()
    for r in rows:
        spec = model_spec(r["name"])
        assert r["title"] == spec.title and r["task"] == spec.kind and r["paper"], r  # every model names its paper
        config = spec.config()
        assert r["input"] == [config.in_channels, config.input_height, config.input_width]
    for name in ("em-capsnet-small", "inverted-capsnet", "efficient-capsnet", "segcaps", "capspix2pix"):
        model = create_model(name)  # weights counted on the built model, not taken from the config
        row = next(r for r in rows if r["name"] == name)
        assert row["weights"] == sum(p.numel() for p in model.parameters()), name
        if name == "capspix2pix":
            assert row["generator_weights"] == sum(p.numel() for p in model.generator.parameters())


def test_describe_lists_every_config_field_with_its_default_and_source_note():
    d = describe("em-capsnet-small")
    config = MODELS["em-capsnet-small"].config()
    assert [f["name"] for f in d["fields"]] == [f.name for f in dataclasses.fields(config)]
    assert all(f["default"] == getattr(config, f["name"]) for f in d["fields"])
    notes = {f["name"]: f["note"] for f in d["fields"]}
    assert notes["conv1_channels"] == "A" and notes["primary_types"] == "B"  # the small variant's sizes, base's notes
    assert '"child-type" over those windows for each parent type' in notes["conv_e_step"]  # a block comment above
    assert d["summary"].startswith("The paper's small variant") and d["pretrained"] == ["em-capsnet-mnist"]
    capsnet_fields = {f["name"]: f for f in describe("capsnet")["fields"]}
    assert capsnet_fields["decoder_hidden"]["default"] == [512, 1024]  # a tuple as JSON shows it
    assert "truncated at 2 standard deviations" in capsnet_fields["init"]["note"]  # a block comment above
    assert set(describe("capsnet")["pretrained"]) == {"capsnet-mnist-small", "capsnet-fashion-small"}
    assert describe("baseline")["train_defaults"] == {"warmup_steps": 200} and d["train_defaults"] == {"lr": 3e-3}
    assert describe("efficient-capsnet")["train_defaults"] == {"lr": 5e-4, "augment": "efficient-capsnet"}
    assert describe("capsnet")["train_defaults"] == {}
    assert describe("pix2pix")["train_defaults"] == describe("capspix2pix")["train_defaults"] == {"lr": 2e-4}
    assert "Trained with --warmup-steps 200 (under the exponential schedule; none under --lr-schedule linear) unless "\
           "another value is typed" in format_model("baseline")
    with pytest.raises(ValueError, match="unknown model 'nope'; valid names are capsnet, "):
        describe("nope")


def test_the_fields_train_sets_from_the_data_set_are_the_ones_marked_so():
    for name in list_models():
        kind = model_spec(name).kind
        dataset = next(t for t in TASKS if task(t).kind == kind) if kind != "classification" else "mnist"
        assert set(input_fields(name, dataset)) <= set(DATASET_FIELDS), name
    table = format_model("unet")
    assert "| in_channels | int | 1 | set from --dataset by `capsnet train` |" in table
    assert "| batch_norm | bool | true | after every convolution" in table


def test_shipped_models_report_the_whole_test_set_figure_their_cards_measured(monkeypatch):
    """The table printed a segmentation model's Dice on the 2,000 canvases its training run scored (0.9034) beside
    a card that says 0.912 on all 10,000: it now prints the card's measured figure, the run's only without one."""
    rows = shipped()
    assert [r["name"] for r in rows] == pretrained.names() and rows
    for r in rows:
        ckpt = load_checkpoint(pretrained.path(r["name"]))
        assert r["model"] == ckpt.model_name and r["epochs"] == ckpt.state["epoch"]
        measured = pretrained.measured(r["name"])
        if r["dataset"] in ("mnist", "fashion-mnist"):  # a classifier: its accuracy on the whole test set
            key = r["dataset"].replace("-", "_") + "_test_accuracy"
            assert r["test_figure"] == f"{100 * measured[key]:.2f}%" and r["test_accuracy"] == measured[key]
        else:  # Dice or SSIM
            name, value = r["test_figure"].split()
            assert r["test_accuracy"] is None
            assert float(value) == pytest.approx(measured["test_dice" if name == "Dice" else "test_ssim"], abs=5e-5)
        assert r["test_figure"].split()[-1].rstrip("%") in pretrained.card(r["name"]), r
    # a card without the figure: the training run's final epoch
    monkeypatch.setattr(pretrained, "measured", lambda name: {})
    for r in shipped():
        history = load_checkpoint(pretrained.path(r["name"])).state["history"][-1]
        key = {"Dice": "test_dice", "SSIM": "test_ssim"}.get(r["test_figure"].split()[0], "test_accuracy")
        value = float(r["test_figure"].split()[-1].rstrip("%")) / (100 if key == "test_accuracy" else 1)
        assert value == pytest.approx(history[key], abs=5e-5), r


def test_capsnet_models_prints_every_model_and_shipped_model(capsys):
    r = in_process(capsys, "models")
    assert r.returncode == 0 and r.stdout == format_catalog() + "\n"
    lines = r.stdout.splitlines()
    for row in catalog():
        assert any(line.startswith(f"| {row['name']} | {row['title']} | {row['paper']} |") for line in lines), row
    assert "| capspix2pix | CapsPix2pix | Bass et al. 2019 | synthesis | 1x32x32 | 2,182,225 (generator 1,519,953) |" \
        in lines
    for name in pretrained.names():
        assert any(line.startswith(f"| pretrained:{name} |") for line in lines)


def test_capsnet_models_name_prints_a_row_per_field_and_json_matches_the_library(capsys):
    r = in_process(capsys, "models", "inverted-capsnet")
    assert r.returncode == 0
    fields = [f.name for f in dataclasses.fields(MODELS["inverted-capsnet"].config)]
    rows = [line for line in r.stdout.splitlines() if re.match(r"\| [a-z_0-9]+ \| ", line)]
    assert [row.split(" | ")[0][2:] for row in rows] == ["field", *fields]  # the header, then one row a field
    assert "| routing_iterations | int | 2 | the paper's CIFAR runs" in r.stdout
    assert "--model-option backbone_channels=256" in r.stdout  # its first count doubled: it has no switch
    r = in_process(capsys, "models", "segcaps", "--json")
    assert r.returncode == 0 and json.loads(r.stdout) == json.loads(json.dumps(describe("segcaps")))
    r = in_process(capsys, "models", "--json")
    assert json.loads(r.stdout) == json.loads(json.dumps({"models": catalog(), "pretrained": shipped()}))


@pytest.mark.parametrize("name", list(MODELS))
def test_the_example_of_capsnet_models_name_is_one_shell_word_that_sets_its_field(name):
    """`--model-option decoder_hidden=[512, 1024]` split in two when typed (argparse: unrecognized arguments: 1024]):
    each model's example is now one shell word. It set the last field to its default, which changed nothing (a
    review, 2026-12-02): now a value other than the default, which the model's config takes."""
    import shlex

    line = next(line for line in format_model(name).splitlines() if line.startswith("Set a field"))
    example = re.search(r"e\.g\. `--model-option ([^`]*)`", line).group(1)
    (word,) = shlex.split(example)
    key, value = word.split("=", 1)
    default = dataclasses.asdict(MODELS[name].config())[key]
    try:
        read = json.loads(value)
    except json.JSONDecodeError:  # a string may go unquoted
        read = value
    assert read != (list(default) if isinstance(default, tuple) else default)
    assert getattr(MODELS[name].config(**{key: read}), key) == read


def test_capsnet_models_with_an_unknown_name_lists_the_valid_ones(capsys):
    r = in_process(capsys, "models", "em-capsnet-big")
    assert r.returncode == 2 and "invalid choice: 'em-capsnet-big'" in r.stderr and "'em-capsnet-small'" in r.stderr


def test_a_model_of_ones_own_whose_config_does_not_count_its_weights_is_counted_by_building_it(monkeypatch, capsys):
    """`capsnet models` read config.num_weights, so a model registered without one crashed it with an
    AttributeError; the count now comes from the model built on the meta device."""
    import torch
    from torch import nn

    from capsnet._config import JsonConfig
    from capsnet.models import ModelSpec, num_weights

    @dataclass(frozen=True)
    class TinyConfig(JsonConfig):
        input_height: int = 28
        input_width: int = 28
        in_channels: int = 1
        num_classes: int = 10

    class Tiny(nn.Module):
        def __init__(self, config: TinyConfig) -> None:
            super().__init__()
            self.config = config
            self.linear = nn.Linear(config.input_height * config.input_width, config.num_classes)  # 7,850 weights

        def forward(self, images: torch.Tensor) -> torch.Tensor:
            return self.linear(images.flatten(1))

    monkeypatch.setitem(MODELS, "tiny", ModelSpec(TinyConfig, Tiny, lambda *a, **k: None, "a tiny model"))
    assert num_weights(TinyConfig()) == 28 * 28 * 10 + 10
    assert num_weights(model_spec("capsnet").config()) == model_spec("capsnet").config().num_weights
    row = next(r for r in catalog() if r["name"] == "tiny")
    assert row["weights"] == 7850 and row["input"] == [1, 28, 28]
    r = in_process(capsys, "models")
    assert r.returncode == 0 and "tiny" in r.stdout and "7,850" in r.stdout


@pytest.mark.parametrize("name", list(MODELS))
def test_every_field_of_every_registered_model_has_a_note(name):
    """`capsnet models NAME` showed 13 fields with an empty note column (CapsNet's primary_dim, primary_kernel and
    primary_stride, the GANs' fake_label and beta2, ...: a review, 2026-12-02); the notes are the config classes'
    source comments, so a field added without one fails here (the sizes `capsnet train` sets from --dataset are
    said so in the listing)."""
    from capsnet.models.catalog import DATASET_FIELDS

    bare = [f["name"] for f in describe(name)["fields"] if not f["note"].strip() and f["name"] not in DATASET_FIELDS]
    assert not bare, f"{name}: fields without a note: {bare}"
