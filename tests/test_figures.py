"""capsnet.figures and `capsnet figures`, on the CapsNet trained briefly on real MNIST (``trained_run``)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from capsnet import figures as fg
from capsnet.figures.report import FIGURE_NAME
from capsnet.cli import main
from capsnet.data import load_dataset
from capsnet.evaluate import load_model
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def run_dir(trained_run) -> Path:
    return trained_run


@pytest.fixture(scope="module")
def model(run_dir):
    return load_model(run_dir)[0].eval()


@pytest.fixture(scope="module")
def test_set(data_root):
    return load_dataset("mnist", "test", root=data_root)


def _inputs(test_set, n=4):
    return test_set.images[:n].float() / 255.0, test_set.labels[:n]


# -------------------------------------------------------------------------------- arrays


def test_swept_poses_move_one_coordinate_by_exactly_the_deltas():
    pose = torch.linspace(-0.3, 0.4, 16, dtype=torch.float64)
    dims, deltas = [0, 5, 15], [-0.25, -0.1, 0.0, 0.05, 0.25]
    out = fg.swept_poses(pose, dims, deltas)
    assert out.shape == (3, 5, 16)
    for a, d in enumerate(dims):
        for k, delta in enumerate(deltas):
            expected = pose.clone()
            expected[d] = pose[d] + delta
            assert torch.equal(out[a, k], expected)
    changed = (out != pose).sum(-1)  # coordinates that differ from the pose
    assert changed.tolist() == [[1, 1, 0, 1, 1]] * 3


def test_default_deltas_are_the_papers_figure_4():
    assert fg.DEFAULT_DELTAS == (-0.25, -0.2, -0.15, -0.1, -0.05, 0.0, 0.05, 0.1, 0.15, 0.2, 0.25)


def test_swept_poses_reject_bad_dims_and_deltas():
    with pytest.raises(fg.FigureError, match=r"\[16\] out of range.*16 dimensions, 0..15"):
        fg.swept_poses(torch.zeros(16), [3, 16])
    with pytest.raises(fg.FigureError, match="finite"):
        fg.swept_poses(torch.zeros(16), [0], [0.1, float("nan")])
    with pytest.raises(fg.FigureError, match="one capsule"):
        fg.swept_poses(torch.zeros(2, 16), [0])


def test_a_decoder_without_reconstruct_is_named_so_by_figures_and_the_viewer():
    """A classifier holding a decoder but no reconstruct(poses, index) method: the viewer said it "has no decoder"
    where figures named the method; both now raise models.cannot_reconstruct's words (figures checked here)."""
    from capsnet.models import CapsNet, CapsNetConfig, cannot_reconstruct, reconstructs

    class NoMethod(CapsNet):
        reconstruct = None

    small = dict(conv1_channels=8, primary_types=2)
    with_method, without = CapsNet(CapsNetConfig(**small)), NoMethod(CapsNetConfig(**small))
    assert reconstructs(with_method) and cannot_reconstruct(with_method) is None
    assert not reconstructs(without)
    said = cannot_reconstruct(without)
    assert said.startswith("this NoMethod has a decoder but no reconstruct(poses, index) method: it cannot reconstruct")
    with pytest.raises(fg.FigureError, match=r"^this NoMethod has a decoder but no reconstruct\(poses, index\)"):
        fg.reconstructions(without, torch.rand(2, 1, 28, 28))
    decoderless = CapsNet(CapsNetConfig(**small, decoder=False))
    assert cannot_reconstruct(decoderless) == "this CapsNet has no decoder: it cannot reconstruct"
    with pytest.raises(fg.FigureError, match="^this CapsNet has no decoder: it cannot reconstruct$"):
        fg.reconstructions(decoderless, torch.rand(2, 1, 28, 28))
    from capsnet.models import create_model
    unet = create_model("unet", input_height=16, input_width=16, depth=1)  # a segmentation model without a decoder
    with pytest.raises(fg.FigureError, match="^this UNet has no decoder: it cannot reconstruct$"):  # AttributeError
        fg.reconstructions(unet, torch.rand(2, 1, 16, 16))  # for a day (a review)


def test_pose_sweep_shape_and_its_zero_column_is_the_plain_reconstruction(model, test_set):
    x, y = _inputs(test_set)
    dims = [1, 7, 15]
    sweep = fg.pose_sweep(model, x, dims=dims)
    assert sweep.shape == (4, 3, 11, 28, 28)
    with torch.no_grad():
        plain = model(x).reconstructions[:, 0]  # masked by the longest capsule, as the sweep without labels
        as_label = model(x, y).reconstructions[:, 0]
    for a in range(3):
        torch.testing.assert_close(sweep[:, a, 5], plain, rtol=1e-5, atol=1e-6)  # delta 0.00
    assert not torch.allclose(sweep[:, :, 0], sweep[:, :, 10])  # moving a dimension changes the decoding
    labelled = fg.pose_sweep(model, x, y, dims=[0], deltas=[0.0])
    torch.testing.assert_close(labelled[:, 0, 0], as_label, rtol=1e-5, atol=1e-6)


def test_pose_sweep_accepts_uint8_images_and_rejects_bad_labels(model, test_set):
    sweep = fg.pose_sweep(model, test_set.images[:2], dims=[0], deltas=[0.0, 0.1])
    assert sweep.shape == (2, 1, 2, 28, 28)
    with pytest.raises(fg.FigureError, match="classes 0..9"):
        fg.pose_sweep(model, test_set.images[:2], torch.tensor([3, 10]))
    with pytest.raises(fg.FigureError, match="images must be"):
        fg.pose_sweep(model, torch.zeros(2, 1, 32, 32))


def test_predict_refuses_a_model_without_class_capsules_in_words():
    """A review (2026-12-02): the CNN baseline's logits met `out.poses` as an AttributeError."""
    from capsnet.models import create_model

    baseline = create_model("baseline", channels=(4,), hidden=(8,))
    with pytest.raises(fg.FigureError, match="this BaselineCNN has no class capsules: predict reads a capsule"):
        fg.predict(baseline, torch.rand(3, 1, 28, 28))


def test_reconstructions_match_the_models_own_masking(model, test_set):
    x, y = _inputs(test_set)
    rec = fg.reconstructions(model, x, y)
    with torch.no_grad():
        out_pred, out_label = model(x), model(x, y)
    assert torch.equal(rec.predicted, out_pred.lengths.argmax(1))
    torch.testing.assert_close(rec.from_predicted, out_pred.reconstructions)
    torch.testing.assert_close(rec.from_label, out_label.reconstructions)
    assert rec.from_predicted.shape == (4, 1, 28, 28)
    # labels that are never the prediction (misclassified digits, what the panel is for): decoded from the label's
    # capsule, not the predicted one (the same images, all classified right, hid the swap: mutation testing)
    wrong = (rec.predicted + 1) % 10
    rec = fg.reconstructions(model, x, wrong)
    with torch.no_grad():
        torch.testing.assert_close(rec.from_label, model(x, wrong).reconstructions)
    assert not torch.allclose(rec.from_label, rec.from_predicted)


def test_routing_trace_rounds_shapes_and_maps(model, test_set):
    x, _ = _inputs(test_set, 3)
    trace = fg.routing_trace(model, x)
    I = 4 * 6 * 6
    assert trace.coupling.shape == (3, 3, I, 10) and trace.grid == (4, 6, 6)
    torch.testing.assert_close(trace.coupling[:, 0], torch.full((3, I, 10), 0.1))  # round 1: uniform
    torch.testing.assert_close(trace.coupling.sum(-1), torch.ones(3, 3, I))
    with torch.no_grad():
        out = model(x)
        u = model.primary(torch.relu(model.conv1(x)))
    torch.testing.assert_close(trace.coupling[:, -1], out.coupling)  # the last round is what the model used
    torch.testing.assert_close(trace.lengths, out.lengths)
    torch.testing.assert_close(trace.primary, u.norm(dim=-1))
    assert not torch.allclose(trace.coupling[:, 1], trace.coupling[:, 0])  # routing moved the coefficients
    maps = trace.coupling_maps()
    assert maps.shape == (3, 3, 10, 6, 6)
    n, r, j, row, col = 2, 2, 7, 4, 1
    by_hand = sum(trace.coupling[n, r, t * 36 + row * 6 + col, j] for t in range(4)) / 4  # i ordered (type, row, col)
    torch.testing.assert_close(maps[n, r, j, row, col], by_hand)
    assert trace.primary_maps()[n, 3, row, col] == trace.primary[n, 3 * 36 + row * 6 + col]


def test_one_routing_rounds_constant_coupling_is_drawn_in_one_colour_in_every_panel():
    """With one routing round every coupling is 1/J: each panel normalised the constant range on its own and the
    colour bar widened only the last one's, so nine classes were drawn dark and the tenth teal (a review,
    2026-11-30). The panels share one scale; primary lengths all zero likewise."""
    import dataclasses

    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from capsnet.models import create_model

    torch.manual_seed(0)
    model = create_model("capsnet", conv1_channels=8, primary_types=2, routing_iterations=1).eval()
    x = torch.rand(1, 1, 28, 28)
    trace = fg.routing_trace(model, x)
    assert torch.equal(trace.coupling, torch.full_like(trace.coupling, 0.1))
    for dead in (False, True):  # and every primary capsule of length zero
        if dead:
            trace = dataclasses.replace(trace, primary=torch.zeros_like(trace.primary))
        fig = fg.plot_routing(trace, 0, image=x[0])
        FigureCanvasAgg(fig).draw()  # the colour bars are drawn, as when saved
        top, bottom = fig.subfigs
        colours = {tuple(np.unique(im.to_rgba(im.get_array()).reshape(-1, 4), axis=0).ravel())
                   for ax in top.axes for im in ax.images if im.get_cmap().name == "viridis"}
        assert len(colours) == 1 and len(next(iter(colours))) == 4  # ten panels, one colour between them
        if dead:
            lows = {tuple(np.unique(im.to_rgba(im.get_array()).reshape(-1, 4), axis=0).ravel())
                    for ax in bottom.axes for im in ax.images}
            assert len(lows) == 1
    # a coupling constant but for float32 rounding (a routing that averages its votes: 0.1 +- 7.5e-9 once averaged
    # over the types) was stretched over the whole colour map: bright maps with dark corners (a review)
    wobble = (torch.rand(trace.coupling.shape, generator=torch.Generator().manual_seed(1)) - 0.5) * 1.5e-8
    fig = fg.plot_routing(dataclasses.replace(trace, coupling=trace.coupling + wobble), 0, image=x[0])
    FigureCanvasAgg(fig).draw()
    rgba = np.concatenate([im.to_rgba(im.get_array()).reshape(-1, 4) for ax in fig.subfigs[0].axes
                           for im in ax.images if im.get_cmap().name == "viridis"])
    assert np.ptp(rgba, axis=0).max() < 0.01, np.ptp(rgba, axis=0)  # the middle colour, or its neighbour in the map


def test_read_metrics_good_empty_corrupt_missing(run_dir, tmp_path):
    records = fg.read_metrics(run_dir)
    assert [r["epoch"] for r in records] == [1, 2] and "test_error" in records[-1]
    (tmp_path / "metrics.jsonl").write_text("")
    with pytest.raises(fg.FigureError, match="no epoch yet"):
        fg.read_metrics(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"epoch": 1, "train_loss": 0.5}\n{"epoch": 2, "train_lo')
    with pytest.raises(fg.FigureError, match="line 2, is not JSON"):
        fg.read_metrics(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('[1, 2]\n')
    with pytest.raises(fg.FigureError, match="line 1, is not a capsnet epoch record"):
        fg.read_metrics(tmp_path)
    with pytest.raises(fg.FigureError, match="not found"):
        fg.read_metrics(tmp_path / "nowhere")


# -------------------------------------------------------------------------------- files


@pytest.mark.parametrize("fmt,magic", [("png", PNG_MAGIC), ("svg", b"<?xml"), ("pdf", b"%PDF")])
def test_save_figure_writes_valid_deterministic_files(tmp_path, fmt, magic):
    lengths = torch.tensor([[0.05, 0.95, 0.2], [0.5, 0.1, 0.3]])
    paths = [fg.save_figure(fg.plot_lengths(lengths, torch.tensor([1, 0])), tmp_path / f"{name}.{fmt}")
             for name in ("a", "b")]
    data = [p.read_bytes() for p in paths]
    assert data[0].startswith(magic)
    assert data[0] == data[1]  # the same figure gives the same bytes
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"a.{fmt}", f"b.{fmt}"]  # no temporary files left
    if fmt == "png":
        import matplotlib.image

        assert matplotlib.image.imread(paths[0]).ndim == 3


def test_save_figure_rejects_unknown_format_and_leaves_nothing(tmp_path):
    with pytest.raises(fg.FigureError, match="unknown figure format 'bmp'.*png, svg, pdf"):
        fg.save_figure(fg.plot_lengths(torch.rand(1, 10)), tmp_path / "x.bmp")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("fmt", ["png", "svg"])
def test_save_figure_keeps_a_setting_made_during_the_save(tmp_path, monkeypatch, fmt):
    """save_figure ran every save under rc_context, which restores all of matplotlib's settings when it ends: a
    setting another thread made meanwhile was undone, and overlapping SVG saves left svg.hashsalt set (a review,
    2026-11-30). A PNG save now touches none; an SVG save sets and restores the salt alone."""
    import matplotlib

    fig = fg.plot_lengths(torch.rand(1, 10))
    save, seen = fig.savefig, []

    def meanwhile(*args, **kwargs):  # another thread's setting, made while the file is written
        seen.append(matplotlib.rcParams["svg.hashsalt"])
        matplotlib.rcParams["font.size"] = 17.0
        return save(*args, **kwargs)

    monkeypatch.setattr(fig, "savefig", meanwhile)
    with matplotlib.rc_context():  # the test's own: this process's settings as they were, after it
        salt = matplotlib.rcParams["svg.hashsalt"]
        fg.save_figure(fig, tmp_path / f"x.{fmt}")
        assert matplotlib.rcParams["font.size"] == 17.0 and matplotlib.rcParams["svg.hashsalt"] == salt
    assert seen == ["capsnet" if fmt == "svg" else salt]


def test_plot_lengths_takes_a_models_output_and_refuses_no_inputs():
    """A model's scores require grad (numpy() refused them) and no inputs divided by zero (a review, 2026-11-30)."""
    scores = torch.rand(2, 10, requires_grad=True) * 1
    fig = fg.plot_lengths(scores)
    for ax, row in zip(fig.axes, scores.detach()):  # one panel per input, its bars the scores
        np.testing.assert_allclose([bar.get_height() for bar in ax.patches], row.numpy(), rtol=1e-6)
    for plot in (lambda: fg.plot_lengths(torch.rand(0, 10)),
                 lambda: fg.plot_reconstructions(torch.rand(0, 1, 28, 28), None, torch.zeros(0))):
        with pytest.raises(fg.FigureError, match="no inputs to show"):
            plot()


def test_save_figure_failure_leaves_no_partial_file(tmp_path, monkeypatch):
    fig = fg.plot_lengths(torch.rand(1, 10))

    def broken(*args, **kwargs):
        args[0].write(b"\x89PNG half")
        raise OSError("disk full")

    monkeypatch.setattr(fig, "savefig", broken)
    with pytest.raises(OSError, match="disk full"):
        fg.save_figure(fig, tmp_path / "x.png")
    assert list(tmp_path.iterdir()) == []


# -------------------------------------------------------------------------------- the command


def _figures(*args) -> int:
    return main(["figures", "--no-progress", "--device", "cpu", *map(str, args)])


def _first_200_test_images(monkeypatch):
    """The figures' test split cut to its first 200 images (quick; the misclassified ones are looked for among
    them); returns the loader it replaced."""
    from capsnet.figures import report

    real_load = report.load_test
    monkeypatch.setattr(report, "load_test", lambda name, **kw: real_load(name, **{**kw, "size": 200}))
    return real_load


def test_figures_command_writes_every_figure(run_dir, data_root, tmp_path, capsys, monkeypatch,
                                             blank_routing_and_sweeps):
    # the test split cut to its first 200 images for speed (the misclassified inputs are looked for among them), the
    # pose sweeps to two dimensions, the PNGs drawn at 40 dpi (which files, not their resolution)
    _first_200_test_images(monkeypatch)
    out = tmp_path / "figs"
    # 3 given twice: drawn once (it was counted and listed twice)
    assert _figures("--checkpoint", run_dir, run_dir, "--out", out, "--data-dir", data_root, "--indices", 3, 10, 3,
                    "--misclassified", 4, "--dims", 0, 15, "--dpi", 40) == 0
    names = sorted(p.name for p in out.iterdir())
    expected = {"reconstructions.png", "lengths.png", "training_curves.png", "pose_sweep_3.png", "pose_sweep_10.png",
                "routing_3.png", "routing_10.png"}
    assert set(names) == expected | {"misclassified.png"}  # a model of 2 epochs on 1,000 digits misses some of 200
    for name in names:
        assert (out / name).read_bytes().startswith(PNG_MAGIC), name
    printed = capsys.readouterr().out
    assert f"wrote {len(names)} figures to {out}" in printed and "misclassified" in printed
    assert printed.count("pose_sweep_3.png") == 1
    # the run chose its best on the test split (no --val-size): drawn from its final epoch, as eval scores it
    assert "drawn from last.safetensors, the final epoch's weights" in printed
    assert f"checkpoint {run_dir / 'last.safetensors'}" in printed
    assert all(FIGURE_NAME.fullmatch(name) for name in names)  # the names the note below knows as figures
    # drawn again into the folder with fewer indices: what it replaced, and the earlier figures it left, said (a
    # review, 2026-12-02: --which best then last mixed two checkpoints' figures under "wrote 5 figures"); the
    # user's own files there are not figures of an earlier call. What is replaced and what is left, not how it is
    # drawn (the call above rendered every kind): the two slowest figures become blank ones.
    blank_routing_and_sweeps()
    (out / "holiday.png").write_bytes(b"mine")
    assert _figures("--checkpoint", run_dir, "--out", out, "--data-dir", data_root, "--indices", 10,
                    "--misclassified", 0, "--dims", 0, "--dpi", 40) == 0
    printed = capsys.readouterr().out
    assert f"wrote 5 figures to {out} (5 files of the same names replaced):" in printed
    assert (f"note: 3 other figures in {out} came from an earlier `capsnet figures` (another --which, --indices, "
            f"--format or --weights) and were left as they were: misclassified.png, pose_sweep_3.png, routing_3.png; "
            f"give another --out to keep each drawing apart\n") in printed


def test_figures_into_a_folder_another_is_writing_are_refused_and_an_error_leaves_no_folder(run_dir, data_root,
                                                                                           tmp_path, capsys):
    """Two `capsnet figures` into one --out interleaved their files, one run's figures beside another's (a review,
    2026-11-30): the second is refused, as a second run into a run's folder is; the folder a refused or failed call
    made is not left behind."""
    from capsnet.checkpoint import RunLock

    out = tmp_path / "figs"
    out.mkdir()
    with RunLock(out) as other:
        other.acquire()
        assert _figures("--checkpoint", run_dir, "--out", out, "--data-dir", data_root) == 2
        assert f"{out} is being written by another capsnet run (process {os.getpid()})" in capsys.readouterr().err
        assert [p.name for p in out.iterdir()] == [".lock"]
    fresh = tmp_path / "new" / "figs"
    assert _figures("--checkpoint", run_dir, "--out", fresh, "--data-dir", data_root, "--indices", 10_000) == 2
    assert "--indices" in capsys.readouterr().err and not (tmp_path / "new").exists()
    (tmp_path / "keep").mkdir()  # a folder the user made stays, empty or not
    assert _figures("--checkpoint", run_dir, "--out", tmp_path / "keep" / "figs", "--data-dir", data_root,
                    "--indices", 10_000) == 2
    assert (tmp_path / "keep").is_dir() and not (tmp_path / "keep" / "figs").exists()


def test_figures_that_fail_after_a_file_keep_it_and_their_own_error(run_dir, tmp_path, monkeypatch):
    from capsnet.figures import report

    def draw_one_then_fail(*a, out, **k):
        (out / "lengths.png").write_bytes(b"drawn")
        raise RuntimeError("the drawing failed")
    monkeypatch.setattr(report, "_draw", draw_one_then_fail)
    out = tmp_path / "new" / "figs"
    with pytest.raises(RuntimeError, match="the drawing failed"):  # not the cleanup's "directory not empty"
        report.write_figures(run_dir, out=out, progress=False)
    assert [p.name for p in out.iterdir()] == ["lengths.png"]


def test_figures_command_default_inputs(run_dir, data_root, tmp_path, monkeypatch):
    # Which inputs the command picks, not how they are drawn (the tests above render every kind): the two
    # slowest figures, 10 of each, become blank ones.
    from matplotlib.figure import Figure

    from capsnet.figures import report

    monkeypatch.setattr(report, "plot_routing", lambda *a, **k: Figure(figsize=(1, 1)))
    monkeypatch.setattr(report, "plot_pose_sweep", lambda *a, **k: Figure(figsize=(1, 1)))
    out = tmp_path / "default"
    assert _figures("--checkpoint", run_dir, "--out", out, "--data-dir", data_root, "--dpi", 20,
                    "--misclassified", 0, "--dims", 0, 15, "--delta-range", 0.5, "--delta-step", 0.25) == 0
    test = load_dataset("mnist", "test", root=data_root)
    first = sorted(int((test.labels == k).nonzero()[0]) for k in range(10))  # the first test image of each class
    assert sorted(p.name for p in out.glob("pose_sweep_*.png")) == sorted(f"pose_sweep_{i}.png" for i in first)
    assert not (out / "misclassified.png").exists()


def test_figures_command_svg(run_dir, data_root, tmp_path):
    out = tmp_path / "svg"
    assert _figures("--checkpoint", run_dir, "--out", out, "--data-dir", data_root, "--format", "svg", "--indices", 0,
                    "--misclassified", 0, "--dims", 0, 15) == 0
    assert {p.name for p in out.iterdir()} == {"reconstructions.svg", "pose_sweep_0.svg", "routing_0.svg",
                                               "lengths.svg", "training_curves.svg"}
    assert all(p.read_bytes().startswith(b"<?xml") for p in out.iterdir())


@pytest.mark.parametrize("args,message", [
    (["--indices", 10000], "--indices [10000] out of range: the mnist test set has 10000 images"),
    (["--dims", 3, 16], "--dims [16] out of range: the class capsules have 16 dimensions"),
    (["--delta-range", 0.25, "--delta-step", 0.1], "not a whole number of --delta-step"),
    (["--delta-step", 1e-320], "not a whole number of --delta-step"),  # OverflowError: infinity over a step this small
])
def test_figures_command_bad_arguments_write_nothing(run_dir, data_root, tmp_path, capsys, args, message):
    out = tmp_path / "figs"
    assert _figures("--checkpoint", run_dir, "--out", out, "--data-dir", data_root, *args) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not out.exists()


def test_figures_command_run_without_checkpoint(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text('{"epoch": 1, "train_loss": 0.5}\n')
    assert _figures("--checkpoint", tmp_path / "run", "--out", tmp_path / "figs") == 2
    err = capsys.readouterr().err
    assert "capsnet figures: error:" in err and "best.safetensors" in err
    assert not (tmp_path / "figs").exists()


@pytest.mark.parametrize("content,message", [("", None), ('{"epoch": 1, "tra\n', "line 1, is not JSON"),
                                             ('{"epoch": 1, "train_loss": 0.5}\n' * 2, "line 2: epoch 1 after epoch 1")])
def test_figures_command_empty_or_corrupt_metrics(run_dir, data_root, tmp_path, capsys, blank_routing_and_sweeps,
                                                  content, message):
    """An emptied metrics.jsonl (training writes it whole) refused every figure as "no epoch yet" though the
    checkpoint held its epochs: its history draws the curves now; a repeated epoch doubled the curve back (a
    review, 2026-12-01)."""
    other = tmp_path / "other"
    other.mkdir()
    for name in ("best.safetensors", "config.json"):
        (other / name).write_bytes((run_dir / name).read_bytes())
    (other / "metrics.jsonl").write_text(content)
    out = tmp_path / "figs"
    if message is None:
        blank_routing_and_sweeps()  # the training curves are the figure in question
        assert _figures("--checkpoint", other, "--out", out, "--data-dir", data_root, "--indices", "0",
                        "--misclassified", "0", "--dims", "0") == 0
        assert (out / "training_curves.png").is_file()
        return
    assert _figures("--checkpoint", other, "--out", out, "--data-dir", data_root) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_example_notebook_runs_on_a_checkpoint(run_dir, data_root, monkeypatch, tmp_path, capsys):
    """The code cells of examples/look_inside.ipynb, in order, as a script (IPython magics left out): on the run
    $CAPSNET_CHECKPOINT names; without one, from a folder with no runs/, on the shipped small CapsNet (it failed
    there, and wanted 45 minutes of training first: a review, 2026-11-30)."""
    notebook = json.loads((Path(__file__).parents[1] / "examples" / "look_inside.ipynb").read_text())
    cells = ["\n".join(line for line in "".join(cell["source"]).splitlines() if not line.startswith(("%", "from IPython")))
             for cell in notebook["cells"] if cell["cell_type"] == "code"]
    monkeypatch.setenv("CAPSNET_CHECKPOINT", str(run_dir))
    exec(cells[0], given := {"display": None})
    assert given["CHECKPOINT"] == str(run_dir) and given["ckpt"].path.parent == run_dir
    # a run trained without --val-size: its best was chosen on the test split, so its last epoch's weights, said
    # (it opened best.safetensors silently, under a comment saying it was chosen on a validation split: a review)
    assert given["ckpt"].path.name == "last.safetensors" and given["ckpt"].state["epoch"] == 2
    assert "best.safetensors was chosen on the test split: last.safetensors" in capsys.readouterr().out
    monkeypatch.setenv("CAPSNET_CHECKPOINT", str(run_dir / "best.safetensors"))  # the file itself: its last too
    exec(cells[0], given := {"display": None})
    assert given["ckpt"].path == run_dir / "last.safetensors"
    monkeypatch.delenv("CAPSNET_CHECKPOINT")
    # offline and without the data: the shipped model reads the digits shipped with it (it read the real MNIST, which
    # an empty data folder does not hold: a review, 2026-11-30)
    (tmp_path / "no-data").mkdir()
    monkeypatch.setenv("CAPSNET_DATA", str(tmp_path / "no-data"))
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    shown = []
    namespace: dict = {"display": shown.append}  # collects the figures; IPython need not be installed
    for source in cells:
        exec(source, namespace)
    from matplotlib.figure import Figure

    assert namespace["CHECKPOINT"] == "pretrained:capsnet-mnist-small"
    assert "no run at runs/mnist-cpu3 (nor ../runs/mnist-cpu3): the shipped small CapsNet" in capsys.readouterr().out
    assert len(shown) == 4 and all(isinstance(f, Figure) for f in shown)
    assert namespace["sweep"].shape == (1, 16, 11, 28, 28)
    assert namespace["test"].name == "mnist-sample" and int(namespace["y"]) == 7  # the real test set's first digit
    assert list((tmp_path / "cwd").iterdir()) == [] and list((tmp_path / "no-data").iterdir()) == []  # nothing written


# ------------------------------------------------------------------------- every capsule model


def test_a_routing_view_whose_grid_does_not_cover_the_routed_capsules_is_refused_naming_the_method():
    """A model's routing_view whose grid (types, rows, columns) did not multiply to the I capsules routed reached
    the figure as an IndexError from its labels (a review of adding a model, 2026-12-02)."""
    import numpy as np

    from capsnet.models import create_model

    model = create_model("capsnet", conv1_channels=8, primary_types=2, decoder_hidden=(16,)).eval()
    own = model.routing_view
    model.routing_view = lambda images: own(images)._replace(grid=(2, 1, 1))  # 2 where 2 x 6 x 6 are routed
    with pytest.raises(fg.FigureError, match=r"CapsNet.routing_view: grid \(2, 1, 1\) must be \(types, rows, "
                                             r"columns\) of the 72 capsules routed, types \* rows \* columns = 72"):
        fg.routing_trace(model, torch.rand(2, 1, 28, 28))
    model.routing_view = lambda images: own(images)._replace(scores=own(images).scores[:, :9])
    with pytest.raises(fg.FigureError, match=r"scores must be \(2, 10\) for rounds \(2, 3, 72, 10\), got \(2, 9\)"):
        fg.routing_trace(model, torch.rand(2, 1, 28, 28))
    model.routing_view = lambda images: own(images)._replace(grid=tuple(np.int64(k) for k in own(images).grid))
    with pytest.raises(fg.FigureError, match=r"grid \(.*\) must be three positive Python ints \(types, rows, "):
        fg.routing_trace(model, torch.rand(2, 1, 28, 28))
    model.routing_view = lambda images: own(images)._replace(grid=(True, 72, 1))
    with pytest.raises(fg.FigureError, match=r"grid \(True, 72, 1\) must be three positive Python ints"):
        fg.routing_trace(model, torch.rand(2, 1, 28, 28))
    model.routing_view = lambda images: tuple(own(images))
    with pytest.raises(fg.FigureError, match="CapsNet.routing_view returned tuple, not a capsnet.routing.RoutingView"):
        fg.routing_trace(model, torch.rand(2, 1, 28, 28))


@pytest.mark.parametrize("name,small", [
    ("capsnet", dict(conv1_channels=8, primary_types=2, decoder_hidden=(16, 32))),
    ("efficient-capsnet", dict(decoder_hidden=(16, 32))),
    ("em-capsnet-small", dict(conv1_channels=8, primary_types=2, caps1_types=4, caps2_types=4)),
    ("inverted-capsnet", dict(backbone_channels=8, primary_types=4, caps_types=4)),
])
def test_routing_trace_of_every_capsule_model(name, small):
    from capsnet.models import create_model

    torch.manual_seed(0)
    model = create_model(name, num_classes=10, input_height=28, input_width=28, **small).eval()
    x = torch.rand(3, 1, 28, 28)
    trace = fg.routing_trace(model, x)
    N, R, I, J = trace.coupling.shape
    assert (N, J) == (3, 10) and I == trace.grid[0] * trace.grid[1] * trace.grid[2] and trace.primary.shape == (3, I)
    with torch.no_grad():
        out = model(x)
    torch.testing.assert_close(trace.lengths, out.scores)
    # the last round is the model's own coupling, the children reordered to (type, row, column)
    T, H, W = trace.grid
    own = out.coupling
    if name in ("em-capsnet-small", "inverted-capsnet"):  # the class layers flatten (row, column, type)
        own = own.view(3, H, W, T, J).permute(0, 3, 1, 2, 4).reshape(3, I, J)
    torch.testing.assert_close(trace.coupling[:, -1], own)
    assert trace.coupling_maps().shape == (3, R, J, H, W)
    # the lower capsules' maps say what they show: EM's are activations (in 0..1), the others' pose lengths
    assert trace.primary_are == {"em-capsnet-small": "activations", "inverted-capsnet": "largest couplings"}.get(
        name, "lengths")
    if name == "inverted-capsnet":  # each child's largest coupling in the last pass (its pose lengths are
        torch.testing.assert_close(trace.primary, trace.coupling[:, -1].amax(-1))  # layer-normalised: all near 4)
    if name == "em-capsnet-small":
        assert 0 <= trace.primary.min() and trace.primary.max() <= 1
    fig = fg.plot_routing(trace, 0)
    assert f"Lower capsule {trace.primary_are}, one map per capsule type" in fig.subfigs[1]._suptitle.get_text()
    if trace.grid[1:] == (1, 1):  # Efficient-CapsNet: a strip per class, one cell per lower capsule (was one cell)
        shown = fig.subfigs[0].axes[1 + 3].images[0].get_array()  # round 1, class 3
        torch.testing.assert_close(torch.as_tensor(shown[:, 0]), trace.coupling[0, 0, :, 3])
        assert "one cell per lower capsule" in fig.subfigs[0]._suptitle.get_text()


def test_figures_command_on_a_model_without_decoder(tmp_path, data_root, capsys, blank_routing_and_sweeps):
    blank_routing_and_sweeps()  # what is drawn and said (its routing figure: test_routing_trace_of_every_capsule_model)
    run = tmp_path / "run"
    assert main(["train", "--model", "inverted-capsnet", "--dataset", "mnist-sample", "--epochs", "1",
                 "--train-size", "64", "--test-size", "32", "--batch-size", "32", "--model-option", "backbone_channels=8",
                 "--model-option", "primary_types=4", "--model-option", "caps_types=4", "--out", str(run),
                 "--no-progress"]) == 0
    out = tmp_path / "figs"
    capsys.readouterr()
    assert _figures("--checkpoint", run, "--out", out, "--indices", 0, 60, "--dpi", 30, "--dims", 1) == 0
    assert {p.name for p in out.iterdir()} == {"routing_0.png", "routing_60.png", "lengths.png", "training_curves.png"}
    # what it did not draw, and the flag it did not use, are said (both were skipped without a word)
    assert ("no reconstructions, misclassified inputs or pose sweeps: --model inverted-capsnet has no decoder (--dims "
            "not used)") in capsys.readouterr().out
    # --dims out of the class capsules' range was refused though nothing uses it here; --misclassified went unnamed
    out2 = tmp_path / "figs2"
    assert _figures("--checkpoint", run, "--out", out2, "--indices", 0, "--dpi", 30, "--dims", 99,
                    "--misclassified", 3) == 0
    assert "has no decoder (--dims, --misclassified not used)" in capsys.readouterr().out


def test_sweep_change_is_the_largest_mean_pixel_change_from_the_unswept_tile():
    from capsnet.figures.plots import sweep_change

    deltas = [-0.1, 0.0, 0.1]
    sweep = torch.zeros(2, 3, 4, 4)
    sweep[0, 0, 0, :] = 1.0  # dim 0 at -0.1: 4 of 16 pixels change by 1 -> 0.25
    sweep[1, 2] = 0.1  # dim 1 at +0.1: every pixel changes by 0.1
    torch.testing.assert_close(sweep_change(sweep, deltas), torch.tensor([0.25, 0.1]))


def test_a_sweep_that_barely_moves_says_so_on_the_figure():
    from capsnet.figures.plots import plot_pose_sweep

    deltas = [-0.25, 0.0, 0.25]
    flat = torch.full((2, 3, 28, 28), 0.3)
    flat[:, :, 0, 0] += torch.tensor([0.0, 0.0, 0.5])  # one pixel: 0.5 / 784 mean change
    title = plot_pose_sweep(flat, [0, 1], deltas)._suptitle.get_text()
    assert "barely moves (at most 0.001 mean pixel change)" in title
    moving = flat.clone()
    moving[1, 2, :14] = 1.0  # half the pixels of one tile change by 0.7
    assert "barely" not in plot_pose_sweep(moving, [0, 1], deltas)._suptitle.get_text()
    # the columns read as the deltas asked (+.2f wrote 0.125 as +0.12 and 0.0005 as +0.00), and a small range is
    # not blamed on the model (a review, 2026-11-30)
    fine = [-0.125, -0.0005, 0.0, 0.0005, 0.125]
    fig = plot_pose_sweep(torch.full((2, 5, 28, 28), 0.3), [0, 1], fine)
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["-0.125", "-0.0005", "+0", "+0.0005", "+0.125"]
    tiny = plot_pose_sweep(flat, [0, 1], [-0.01, 0.0, 0.01])._suptitle.get_text()
    assert "a wider range of changes moves it further" in tiny and "barely trained" not in tiny


def test_one_run_given_twice_draws_one_curve_named_without_a_double_slash(run_dir):
    from capsnet.figures.report import _labels, _runs

    runs = _runs([run_dir, run_dir / "best.safetensors"])
    assert len(runs) == 1 and not next(iter(runs)).startswith("/")
    assert _labels([Path("/run")]) == ["run"]


def test_curves_of_runs_with_one_name_are_told_apart_and_a_gan_run_beside_a_classifier_is_refused_first(
        run_dir, data_root, tmp_path, capsys):
    """Before: runs were keyed by their folder's name (mnist/capsnet-seed0 and fashion-mnist/capsnet-seed0 drew one
    curve), and a GAN run's metrics beside a classifier's raised KeyError after half the figures were written."""
    import shutil

    from capsnet.figures.report import _labels, _runs

    assert _labels([Path("/x/mnist/capsnet-seed0"), Path("/x/fashion-mnist/capsnet-seed0"), Path("/y/other")]) == [
        "mnist/capsnet-seed0", "fashion-mnist/capsnet-seed0", "other"]
    assert _labels([Path("/a/b/run"), Path("/c/b/run")]) == ["a/b/run", "c/b/run"]
    for data in ("mnist", "fashion-mnist"):
        shutil.copytree(run_dir, tmp_path / data / "run", ignore=shutil.ignore_patterns("*.safetensors"))
    runs = _runs([tmp_path / "mnist" / "run", tmp_path / "fashion-mnist" / "run"])
    assert list(runs) == ["mnist/run", "fashion-mnist/run"] and all(runs.values())
    gan = tmp_path / "gan"
    gan.mkdir()
    (gan / "metrics.jsonl").write_text(json.dumps({"epoch": 1, "train_d_loss": 0.5, "train_g_loss": 3.0}) + "\n")
    out = tmp_path / "figs"
    assert _figures("--checkpoint", run_dir, gan, "--out", out, "--data-dir", data_root) == 2
    assert "holds another kind of run than" in capsys.readouterr().err and not out.exists()
    # a segmentation run beside a classifier: both have train_loss, and the classifier's accuracy was drawn as Dice
    seg = tmp_path / "seg"
    seg.mkdir()
    (seg / "metrics.jsonl").write_text(json.dumps({"epoch": 1, "train_loss": 0.5, "test_dice": 0.7,
                                                   "test_accuracy": 0.7}) + "\n")
    assert _figures("--checkpoint", run_dir, seg, "--out", out, "--data-dir", data_root) == 2
    err = capsys.readouterr().err
    assert "holds another kind of run than" in err and "accuracy, not Dice" in err and not out.exists()
    with pytest.raises(fg.FigureError, match="seg holds another kind of run .*have train_loss, and accuracy, not Dice"):
        _runs([run_dir, seg])
    with pytest.raises(fg.FigureError, match="holds another kind of run .*have train_loss, and Dice"):
        _runs([seg, run_dir], kind="segmentation")


def test_a_shipped_model_draws_its_figures_into_the_working_folder(data_root, tmp_path, monkeypatch):
    """pretrained:NAME was refused ('not found': no metrics.jsonl); its history travels in the checkpoint, and its
    figures must not go into the installed package."""
    from matplotlib.figure import Figure

    from capsnet import pretrained
    from capsnet.figures import report

    monkeypatch.setattr(report, "plot_routing", lambda *a, **k: Figure(figsize=(1, 1)))  # which files, not drawing
    monkeypatch.setattr(report, "plot_pose_sweep", lambda *a, **k: Figure(figsize=(1, 1)))
    monkeypatch.chdir(tmp_path)
    shipped = sorted(p.name for p in pretrained.DIR.iterdir())
    assert _figures("--checkpoint", "pretrained:capsnet-mnist-small", "--data-dir", data_root, "--indices", 0,
                    "--misclassified", 0, "--dpi", 20) == 0
    out = tmp_path / "figures-capsnet-mnist-small"
    assert {"training_curves.png", "reconstructions.png", "pose_sweep_0.png"} <= {p.name for p in out.iterdir()}
    assert sorted(p.name for p in pretrained.DIR.iterdir()) == shipped


def test_a_shipped_mnist_model_draws_its_figures_offline_on_the_shipped_digits(tmp_path, monkeypatch, capsys):
    """Without --dataset the figures of pretrained:capsnet-mnist-small used MNIST itself, a download; they now use the
    digits that ship with it (as the viewer does). An empty data folder stands in for a machine without MNIST."""
    from matplotlib.figure import Figure

    from capsnet.figures import report

    monkeypatch.setattr(report, "plot_routing", lambda *a, **k: Figure(figsize=(1, 1)))
    monkeypatch.setattr(report, "plot_pose_sweep", lambda *a, **k: Figure(figsize=(1, 1)))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    assert _figures("--checkpoint", "pretrained:capsnet-mnist-small", "--data-dir", tmp_path / "empty",
                    "--indices", 0, "--misclassified", 0, "--dpi", 20) == 0
    assert "mnist-sample test images [0]" in capsys.readouterr().out
    # asked for MNIST itself, it still looks there, and says what is missing
    assert _figures("--checkpoint", "pretrained:capsnet-mnist-small", "--dataset", "mnist", "--data-dir",
                    tmp_path / "empty", "--indices", 0, "--misclassified", 0, "--dpi", 20, "--out", tmp_path / "x") == 2
    assert "mnist" in capsys.readouterr().err.lower() and not (tmp_path / "x").exists()


def test_a_figure_write_cut_short_earlier_is_cleared_by_the_next(tmp_path):
    """kill -9 during `capsnet figures` left .routing_61.png.tmp-XXXX in the folder, and reruns kept it."""
    stale = tmp_path / ".lengths.png.tmp-o1vcpa2v"
    other = tmp_path / ".other.png.tmp-abcdefgh"  # another figure's: not this write's to clear
    stale.write_bytes(b"half a png")
    other.write_bytes(b"x")
    fg.save_figure(fg.plot_lengths(torch.rand(1, 10)), tmp_path / "lengths.png")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.png.tmp-abcdefgh", "lengths.png"]


def test_a_figure_write_of_a_process_still_running_is_left_to_it(tmp_path):
    """Two `capsnet figures` into one folder: each took the other's temporary file for a killed run's and removed
    it, and the other failed with "cannot write in ...: No such file or directory" (a review, 2026-11-30). A
    temporary file names its writer's pid; only an ended process's is cleared."""
    import subprocess
    import sys

    from capsnet.checkpoint import RunLock, _start_ticks

    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(ended.stdout)
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as alive:
        try:
            start = _start_ticks(alive.pid) or 0  # its start, in clock ticks since boot (Linux: /proc)
            mine = tmp_path / f".lengths.png.tmp-{alive.pid}-{start}-k2j4x9p0"  # being written by a running process
            left = tmp_path / f".lengths.png.tmp-{dead}-{start}-a8b7c6d5"  # cut short: its process has ended
            # written by an earlier process of the same pid (pid 1 in every container): another start
            reused = tmp_path / f".lengths.png.tmp-{alive.pid}-{start + 12345}-m3n4b5v6"
            import time

            young = tmp_path / f".lengths.png.tmp-{dead}-{start}-y0y0y0y0"  # maybe a writer on another host: too new
            for p in (mine, left, reused, young):
                p.write_bytes(b"part of a png")
                if p is not young:  # an hour old (a temporary file is cleared only once STALE_WRITE_S old)
                    os.utime(p, (time.time() - 3600, time.time() - 3600))
            if not start:  # no /proc here: the pid alone decides
                reused.unlink()
            fg.save_figure(fg.plot_lengths(torch.rand(1, 10)), tmp_path / "lengths.png")
            assert sorted(p.name for p in tmp_path.iterdir()) == sorted([mine.name, young.name, "lengths.png"])
            run = tmp_path / "run"  # a run's folder, as training takes its lock: the same rule
            run.mkdir()
            for p in (run / f".eval-last.json.tmp-{alive.pid}-{start}-q1w2e3r4",
                      run / f".last.safetensors.tmp-{dead}-{start}-z9y8x7w6"):
                p.write_bytes(b"part")
            with RunLock(run) as lock:
                lock.acquire()
                assert [p.name for p in run.glob(".*.tmp-*")] == [f".eval-last.json.tmp-{alive.pid}-{start}-q1w2e3r4"]
        finally:
            alive.kill()


def test_the_class_score_plot_names_its_scores_draws_margins_only_for_a_margin_loss_and_titles_test_indices():
    """EM's activations and the inverted model's probabilities were drawn as 'capsule length' under the margin
    loss's m+ and m- lines, in panels titled by their place ('input 0') where the other figures name test indices."""
    fig = fg.plot_lengths(torch.rand(2, 10), torch.tensor([1, 7]), score="class capsule activation", m_plus=None,
                          m_minus=None, indices=[3, 41])
    first = fig.axes[0]
    assert first.get_ylabel() == "class capsule activation" and first.get_title() == "test image 3: true 1"
    assert fig.axes[1].get_title() == "test image 41: true 7" and first.get_lines() == []
    assert first.get_legend() is None
    margin = fg.plot_lengths(torch.rand(1, 10)).axes[0]
    assert margin.get_ylabel() == "capsule length" and [l.get_ydata()[0] for l in margin.get_lines()] == [0.9, 0.1]
    from capsnet.figures.report import class_scores

    assert class_scores("em-capsnet-small") == ("class capsule activation", None)
    assert class_scores("inverted-capsnet") == ("class probability", None)
    # CapsNet under another routing keeps its margin loss; self-attention's activations are its poses' lengths (as
    # export names them), EM's come from its cost
    assert class_scores("capsnet") == ("capsule length", (0.9, 0.1))
    assert class_scores("capsnet", "self-attention") == ("class capsule length (self-attention routing)", (0.9, 0.1))
    assert class_scores("capsnet", "em") == ("class capsule activation (em routing)", (0.9, 0.1))
    assert class_scores("em-capsnet", "em") == ("class capsule activation", None)  # its own routing: the entry's word


def test_misclassified_inputs_are_shown_with_their_test_indices(model, test_set):
    """Nothing said which test images they were (worst.png does): each panel names its index (a review,
    2026-11-30), to find it again with --indices or in the viewer."""
    from capsnet.figures.plots import plot_misclassified

    images, labels = _inputs(test_set, 2)
    wrong = (labels + 1) % 10  # told they are other digits: the true capsule is the label given
    rec = fg.reconstructions(model, images, wrong)
    fig = plot_misclassified(images, rec, wrong, indices=[7, 42])
    titles = [fig.axes[n].get_title() for n in range(2)]
    assert titles[0].startswith("#7: true ") and titles[1].startswith("#42: true ")


def test_the_figures_functions_leave_a_training_model_training():
    """A figure drawn mid-training (predict, routing_trace, segment, capsule_maps, interpolate_noise,
    truncate_noise, generator_maps) runs in eval mode and gives the caller's model back in its own mode: they left it
    in eval mode, so training carried on with dropout off and batch norm frozen."""
    from capsnet.figures import segmentation as fs, synthesis as fsyn
    from capsnet.models import create_model

    torch.manual_seed(0)
    capsnet = create_model("capsnet", conv1_channels=8, primary_types=2, decoder_hidden=(16, 32))
    segcaps = create_model("segcaps-r1", input_height=16, input_width=16)
    gan = create_model("capspix2pix", noise_dim=8, disc_channels=4, input_height=8, input_width=8)
    images, canvases, label = torch.rand(2, 1, 28, 28), torch.rand(2, 1, 16, 16), torch.rand(1, 8, 8)
    calls = [(capsnet, lambda: fg.predict(capsnet, images)), (capsnet, lambda: fg.routing_trace(capsnet, images)),
             (segcaps, lambda: fs.segment(segcaps, canvases)), (segcaps, lambda: fs.capsule_maps(segcaps, canvases[0])),
             (gan, lambda: fsyn.interpolate_noise(gan, label, steps=2)),
             (gan, lambda: fsyn.truncate_noise(gan, label, [None, 0.5])),
             (gan, lambda: fsyn.generator_maps(gan, label))]
    for model, call in calls:
        seen = []  # the mode every submodule ran in: eval, as before
        hooks = [m.register_forward_pre_hook(lambda m, args: seen.append(m.training)) for m in model.modules()]
        model.train()
        call()
        for hook in hooks:
            hook.remove()
        assert seen and not any(seen) and model.training and all(m.training for m in model.modules())
        model.eval()
        call()
        assert not model.training


def test_the_curves_of_a_one_epoch_run_tick_whole_epochs_only():
    """A run of one epoch: its curves' epoch axis ticked 0.96, 0.98, ... 1.04."""
    import matplotlib

    matplotlib.use("Agg")
    from capsnet.figures.plots import plot_training_curves
    from capsnet.figures.synthesis import plot_gan_curves

    record = {"epoch": 1, "train_loss": 0.5, "train_accuracy": 0.9, "test_loss": 0.4, "test_error": 0.1}
    gan = {"epoch": 1, "train_d_loss": 0.6, "train_g_loss": 2.0, "train_l1": 0.1, "test_l1": 0.1, "test_ssim": 0.7}
    for fig in (plot_training_curves({"run": [record]}), plot_gan_curves({"gan": [gan]})):
        fig.canvas.draw()
        for ax in fig.axes:
            lo, hi = ax.get_xlim()
            shown = [t for t in ax.get_xticks() if lo <= t <= hi]
            assert shown == [1.0], shown


def test_the_curves_of_a_run_evaluated_every_few_epochs_join_its_held_out_points():
    """--eval-every 2: the held-out series were NaN between evaluations, so matplotlib drew dots no line joined, and
    a last epoch not evaluated dropped the held-out loss and called a validation split "test" (a review,
    2026-12-01)."""
    import matplotlib

    matplotlib.use("Agg")
    from capsnet.figures.plots import plot_training_curves

    records = [{"epoch": e, "train_loss": 1.0 / e, "train_accuracy": 0.5 + e / 10} for e in (1, 2, 3, 4, 5)]
    for e in (2, 4):  # evaluated on the validation split; epoch 5, the last, not evaluated
        records[e - 1] |= {"val_loss": 0.3 / e, "val_error": 0.2 / e}
    ax_loss, ax_acc, ax_err = plot_training_curves({"run": records}).axes
    held_loss = [ln for ln in ax_loss.get_lines() if ln.get_label() == "run val"]
    assert len(held_loss) == 1 and list(held_loss[0].get_xdata()) == [2, 4]
    assert list(held_loss[0].get_ydata()) == pytest.approx([0.15, 0.075])
    err, = ax_err.get_lines()
    assert err.get_label() == "run (val)" and list(err.get_xdata()) == [2, 4]
    assert list(err.get_ydata()) == pytest.approx([10.0, 5.0])
    assert list(ax_acc.get_lines()[0].get_xdata()) == [1, 2, 3, 4, 5]


def test_the_drawing_has_a_bar_that_counts_the_figures(run_dir, data_root, tmp_path, capsys, monkeypatch,
                                                       blank_routing_and_sweeps):
    """The figures were drawn for 16-22 s with no bar and no line, in a terminal or a log (a review, 2026-11-30)."""
    from capsnet import _progress
    from capsnet.figures import write_figures

    monkeypatch.setattr(_progress, "LOG_INTERVAL_S", 0.0)  # a log line at every figure
    blank_routing_and_sweeps()  # counted as any figure, drawn or blank
    done = write_figures(run_dir, out=tmp_path / "figs", root=data_root, indices=[3], misclassified=0, dims=[0],
                         device="cpu", progress=True)  # no prediction over the whole test split, a one-row sweep
    err = capsys.readouterr().err
    assert f"figures: {len(done.files)} figures [" in err.splitlines()[-1], err
    assert "figures: 1 figures [" in err  # ticked as each was written


def test_the_misclassified_figure_and_the_pose_sweeps_pick_by_the_models_prediction(run_dir, data_root, tmp_path,
                                                                                     monkeypatch,
                                                                                     blank_routing_and_sweeps):
    """The numbers behind two figures, from the model's own predictions computed here: the misclassified figure
    shows the first test images whose longest capsule is not their label (in test order) and the note counts them
    all; each pose sweep moves the capsule of the image's prediction (its title says so), not its label's. The test
    split is cut to its first 200 images for speed. Found by mutation testing (2026-11-30): choosing the
    "misclassified" images by the shortest capsule, and sweeping the true class's capsule, both survived the suite."""
    import capsnet.figures.report as report
    from capsnet.figures import write_figures

    real_load, real_sweep, real_plot = _first_200_test_images(monkeypatch), report.pose_sweep, report.plot_misclassified
    blank_routing_and_sweeps()  # the sweep's poses are computed as before; their drawing is blank
    swept, shown = [], []
    monkeypatch.setattr(report, "pose_sweep", lambda m, images, classes, **kw: swept.append(classes.tolist()) or
                        real_sweep(m, images, classes, **kw))
    monkeypatch.setattr(report, "plot_misclassified", lambda *a, indices, **kw: shown.append(indices) or
                        real_plot(*a, indices=indices, **kw))
    test = real_load("mnist", size=200, extras=False, root=data_root, progress=False)
    model = load_model(run_dir, which="last")[0].eval()  # the figures of a run that chose on the test split
    with torch.no_grad():
        predicted = model(test.images.float() / 255).lengths.argmax(1)
    errors = (predicted != test.labels).nonzero().flatten().tolist()
    assert errors  # a model of 2 epochs on 1,000 digits misses some of 200
    index = errors[0]
    done = write_figures(run_dir, out=tmp_path / "figs", root=data_root, indices=[index], misclassified=3,
                         dims=[0], dpi=20, device="cpu", progress=False)
    assert shown == [errors[:3]]
    assert f"mnist test set: {len(errors)} of 200 misclassified" in done.notes
    assert swept == [[int(predicted[index])]] and int(predicted[index]) != int(test.labels[index])


def test_class_names_longer_than_a_digit_stand_on_end_under_the_score_bars():
    digits = fg.plot_lengths(torch.rand(1, 10))
    fashion = fg.plot_lengths(torch.rand(1, 10), classes=["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                                          "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"])
    assert {t.get_rotation() for t in digits.axes[0].get_xticklabels()} == {0.0}
    assert {t.get_rotation() for t in fashion.axes[0].get_xticklabels()} == {90.0}
    assert [t.get_text() for t in fashion.axes[0].get_xticklabels()][:2] == ["T-shirt/top", "Trouser"]
    assert fashion.get_figheight() > digits.get_figheight()  # room below the bars for the names
    many = fg.plot_lengths(torch.rand(1, 40), torch.tensor([3]), classes=[f"c{k:02d}" for k in range(40)])
    assert [t.get_text() for t in many.axes[0].get_xticklabels()] == [f"c{k:02d}" for k in range(0, 40, 2)]
    long = fg.plot_lengths(torch.rand(2, 2), torch.tensor([0, 1]), classes=["golden_retriever_puppy", "lab"])
    assert [a.get_title() for a in long.axes] == ["input 0\ntrue golden_retriever_…", "input 1\ntrue lab"]
    assert long.axes[0].get_xticklabels()[0].get_text() == "golden_retriever_…"


def test_a_model_drawn_on_other_classes_names_its_capsules_by_its_own(tmp_path, monkeypatch):
    """A review (2026-12-01): the Fashion-MNIST model drawn on digits had its predictions, routing columns and length
    bars named by the digits ("pred 8" under a bag's reconstruction). The true labels keep the data set's names."""
    from matplotlib.figure import Figure

    from capsnet.figures import report

    seen = {}

    def keep(name):
        def plot(*args, **kwargs):
            seen[name] = (args, kwargs)
            return Figure(figsize=(1, 1))
        return plot

    for name in ("plot_reconstructions", "plot_routing", "plot_lengths", "plot_pose_sweep"):
        monkeypatch.setattr(report, name, keep(name))
    monkeypatch.chdir(tmp_path)
    assert _figures("--checkpoint", "pretrained:capsnet-fashion-small", "--dataset", "mnist-sample", "--indices", 0,
                    "--misclassified", 0, "--dims", 0, "--dpi", 20) == 0
    from capsnet.data.sets import _SPECS

    fashion, digits = list(_SPECS["fashion-mnist"].classes), [str(k) for k in range(10)]
    args, _ = seen["plot_reconstructions"]
    assert list(args[3]) == digits and list(args[4]) == fashion  # true labels by digit, predictions by item
    assert seen["plot_routing"][1]["classes"] == fashion and seen["plot_lengths"][1]["classes"] == fashion
    label = seen["plot_pose_sweep"][1]["label"]  # "test image 0 (true 7), the capsule of its prediction Sandal"
    assert label.startswith("test image 0 (true 7), the capsule of its prediction ") and label.rsplit(
        "prediction ", 1)[1] in fashion


@pytest.mark.parametrize("name,small", [
    ("capsnet", dict(conv1_channels=8, primary_types=2, decoder_hidden=(16, 32))),
    ("em-capsnet-small", dict(conv1_channels=8, primary_types=2, caps1_types=4, caps2_types=4)),
])
def test_two_camera_and_standardised_inputs_are_drawn_not_a_traceback(name, small, tmp_path):
    """`capsnet figures` on any smallNORB run ended in matplotlib's "Invalid shape (32, 32, 2) for image data" (its
    two cameras), and inputs standardised per image (CIFAR-10's, smallNORB's) were clamped to [0, 1]: everything
    below the mean black (a review, 2026-12-01). Two channels are drawn side by side, values outside [0, 1] stretched
    from their own minimum to maximum."""
    from capsnet.models import create_model

    torch.manual_seed(0)
    model = create_model(name, num_classes=5, in_channels=2, input_height=32, input_width=32, **small).eval()
    x = torch.randn(3, 2, 32, 32)  # standardised, as smallNORB's held images are
    figures = [fg.plot_routing(fg.routing_trace(model, x), 0, image=x[0])]
    if name == "capsnet":
        figures.append(fg.plot_reconstructions(x, fg.reconstructions(model, x), torch.tensor([0, 1, 2])))
        sweep = fg.pose_sweep(model, x[:1], dims=[0, 1], deltas=[-0.1, 0.0, 0.1])[0]  # (2, 3, 2, 32, 32)
        figures.append(fg.plot_pose_sweep(sweep, [0, 1], [-0.1, 0.0, 0.1], image=x[0]))
        tile = figures[-1].axes[-1].images[0].get_array()
        assert tile.shape == (2 * 34 - 2, 3 * 66 - 2)  # each tile the two cameras side by side
    for k, fig in enumerate(figures):
        fg.save_figure(fig, tmp_path / f"{k}.png")
    shown = fg.plots.shown_image(x[0])
    assert shown.shape == (32, 64) and shown.min() == 0 and shown.max() == 1
    lo, hi = x[0].min(), x[0].max()
    torch.testing.assert_close(shown[:, :32], (x[0, 0] - lo) / (hi - lo))  # camera 0 on the left, stretched
    torch.testing.assert_close(shown[:, 32:], (x[0, 1] - lo) / (hi - lo))
    inside = torch.rand(3, 8, 8)  # images in [0, 1] are drawn as they are
    torch.testing.assert_close(fg.plots.shown_image(inside), inside.permute(1, 2, 0))
