"""Damaged or hostile files a user may receive (a run folder, a data set): one line naming the file, never another
exception's traceback (found by fuzzing capsnet's parsers, 2026-11-30; each case failed before its fix)."""
from __future__ import annotations

import io
import json
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from capsnet.checkpoint import CheckpointError, read_json_object
from capsnet.data import DataError


def test_json_nested_past_pythons_limit_is_a_damaged_file(tmp_path):
    """A config.json of 100,000 opening brackets: a RecursionError traceback from resume's config check."""
    (tmp_path / "config.json").write_text("[" * 100_000)
    with pytest.raises(CheckpointError, match=r"config.json is damaged \(JSON nested too deep\); fix it"):
        read_json_object(tmp_path / "config.json", "fix it")


def test_metrics_whose_values_are_not_numbers_are_named_before_any_figure(tmp_path):
    """A metrics.jsonl line with "test_error": null (or a list, or a 400-digit integer) failed inside the plotting,
    after the other figures were written; a line nested past the recursion limit was a traceback too."""
    from capsnet.figures.arrays import FigureError, read_metrics

    good = {"epoch": 1, "train_loss": 0.5, "test_error": 0.1, "test_accuracy": 0.9}
    for bad, said in ((None, "None"), ([1, 2], r"\[1, 2\]"), (10 ** 400, "1000000000"), (True, "True")):
        (tmp_path / "metrics.jsonl").write_text(json.dumps(good) + "\n" + json.dumps({**good, "epoch": 2,
                                                                                      "test_error": bad}) + "\n")
        with pytest.raises(FigureError, match=rf"metrics.jsonl, line 2: test_error must be numbers, got {said}"):
            read_metrics(tmp_path)
    (tmp_path / "metrics.jsonl").write_text(json.dumps({**good, "test_error": float("nan")}) + "\n")
    assert len(read_metrics(tmp_path)) == 1  # a diverged epoch's NaN is a number
    (tmp_path / "metrics.jsonl").write_text("[" * 100_000 + "\n")
    with pytest.raises(FigureError, match=r"line 1, is not JSON \(nested too deep\)"):
        read_metrics(tmp_path)


def test_an_integer_past_floats_range_is_said_not_an_overflow():
    """--model-option conv1_channels=1 followed by 400 zeros (or such a config in a checkpoint): OverflowError while
    formatting the refusal."""
    from capsnet.models import CapsNetConfig

    with pytest.raises(ValueError, match=r"conv1_channels must be in 1\.\.1,048,576, got 100000000000\.\.\. "
                                         r"\(401 digits\)"):
        CapsNetConfig(conv1_channels=10 ** 400)
    with pytest.raises(ValueError, match=r"got 1e\+20"):
        CapsNetConfig(conv1_channels=10 ** 20)


def _palette_png_with_long_trns(path):
    """A 2x2 palette PNG whose tRNS chunk holds 257 entries, one more than a palette can have."""
    buf = io.BytesIO()
    Image.new("P", (2, 2), 0).save(buf, "PNG")
    data = buf.getvalue()
    at = data.index(b"IDAT") - 4
    trns = b"\xff" * 257
    chunk = struct.pack(">I", len(trns)) + b"tRNS" + trns + struct.pack(">I", zlib.crc32(b"tRNS" + trns))
    path.write_bytes(data[:at] + chunk + data[at:])
    return path


def test_a_damaged_transparency_chunk_names_the_file(tmp_path):
    """Pillow's "palette index out of range" reached the user as the whole message, naming no file (predict, a
    folder: data set, generate), and the viewer answered an upload of it with a 500."""
    from capsnet.data.png import mask_array, opaque_image_array
    from capsnet.viz.engine import ViewerError
    from capsnet.viz.images import canvas_input

    png = _palette_png_with_long_trns(tmp_path / "x.png")
    for read in (opaque_image_array, mask_array):
        with pytest.raises(DataError, match=rf"{png} has a damaged transparency chunk \(.*\); re-save it"):
            read(png)
    with pytest.raises(ViewerError, match=r"the image has a damaged transparency chunk"):
        canvas_input(png.read_bytes(), (1, 2, 2))
    assert np.asarray(Image.open(png)).shape == (2, 2)  # the file itself opens: only its transparency is damaged


def test_a_damaged_value_of_megabytes_is_cut_short_in_the_message(trained_run, tmp_path, capsys):
    """A checkpoint whose state.epoch is 10,000 nested lists, or whose model name is 100,000 characters: the
    "one-line" error echoed all of it (found by fuzzing)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from capsnet.cli import main

    with safe_open(str(trained_run / "best.safetensors"), "pt") as f:
        meta, tensors = dict(f.metadata()), {k: f.get_tensor(k) for k in f.keys()}
    meta.pop("digest", None)
    state = json.loads(meta["state"])
    for changes in ({"state": json.dumps({**state, "epoch": [[0] * 10] * 1000})}, {"model": "m" * 100_000}):
        save_file(tensors, str(tmp_path / "bad.safetensors"), metadata={**meta, **changes})
        assert main(["eval", "--checkpoint", str(tmp_path / "bad.safetensors"), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and len(err) < 2000 and "..." in err, err[:300]


def test_a_saved_epochs_sums_past_floats_range_are_a_damaged_checkpoint():
    """A save inside an epoch whose running sums hold 10**400: math.isfinite raised OverflowError, a traceback
    (found reading the day's change)."""
    from capsnet.checkpoint import _check_within

    with pytest.raises(ValueError, match=r"state.within.sums must be a list of finite numbers, got \[1000"):
        _check_within({"epoch": 2, "batches": 1, "seen": 0, "sums": [10 ** 400], "seconds": 1.0}, 1)
    with pytest.raises(ValueError, match=r"state.within.seconds must be a number >= 0"):
        _check_within({"epoch": 2, "batches": 1, "seen": 0, "sums": [1.0], "seconds": 10 ** 400}, 1)


def test_a_saved_epochs_pending_evaluation_must_be_a_switch():
    """``evaluation_pending`` (every batch of the epoch trained, its evaluation left to the resume) is true or
    false; a word there would have let a damaged file resume with no batch left and no evaluation promised."""
    from capsnet.checkpoint import _check_within

    within = {"epoch": 2, "batches": 3, "seen": 96, "sums": [1.0, 2.0], "seconds": 1.0}
    _check_within({**within, "evaluation_pending": True}, 1)
    with pytest.raises(ValueError, match=r"state.within.evaluation_pending must be true or false, got 'yes'"):
        _check_within({**within, "evaluation_pending": "yes"}, 1)


def test_a_saves_batch_count_and_epoch_are_checked():
    """A save inside an epoch holds at least one of its batches and the epoch after state.epoch: a count of 0 and
    an epoch equal to state.epoch were accepted by a mutated check without a test failing (mutation testing,
    2026-12-01)."""
    from capsnet.checkpoint import _check_within

    within = {"epoch": 2, "batches": 3, "seen": 96, "sums": [1.0, 2.0], "seconds": 1.0}
    with pytest.raises(ValueError, match=r"state.within.batches must be an integer >= 1, got 0"):
        _check_within({**within, "batches": 0}, 1)
    with pytest.raises(ValueError, match=r"state.within.epoch must be 2 \(the epoch after state.epoch 1\), got 1"):
        _check_within({**within, "epoch": 1}, 1)


def test_the_digest_tells_a_tensor_of_another_dtype_with_the_same_bytes():
    """A tensor re-typed in place (int32 read as float32: the same bytes) is another checkpoint: the digest names each
    tensor's dtype as well as its bytes."""
    import torch

    from capsnet.checkpoint import tensor_digest

    a = torch.arange(4, dtype=torch.int32)
    assert tensor_digest({"w": a}) != tensor_digest({"w": a.view(torch.float32)})
    assert tensor_digest({"w": a}) == tensor_digest({"w": a.clone()})
