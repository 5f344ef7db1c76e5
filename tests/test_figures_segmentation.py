"""capsnet.figures on segmentation runs: masks, reconstructions and capsule maps, checked against the model itself;
`capsnet figures` on the SegCaps run shared by the suite (``segmentation_run``) and on a U-Net."""
from __future__ import annotations

import re

import pytest
import torch

from capsnet import figures as fg
from capsnet.cli import main
from capsnet.data.segmentation import dice_iou
from capsnet.data.tasks import load_test
from capsnet.evaluate import load_model

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def model(segmentation_run):
    return load_model(segmentation_run)[0].eval()


@pytest.fixture(scope="module")
def canvases(data_root):
    return load_test("mnist-segmentation", size=6, root=data_root, progress=False)


def test_segment_is_the_models_own_output_thresholded_and_scored(model, canvases):
    seg = fg.segment(model, canvases.images, canvases.labels, batch_size=4)  # two batches
    with torch.no_grad():
        out = model(canvases.images.float())
    torch.testing.assert_close(seg.probabilities, out.probabilities)
    assert torch.equal(seg.predicted, (out.probabilities > 0.5).to(torch.uint8))
    torch.testing.assert_close(seg.reconstructions, out.reconstructions)  # no mask given: masked by the prediction
    dice, iou = dice_iou(seg.predicted, canvases.labels)
    assert torch.equal(seg.dice, dice) and torch.equal(seg.iou, iou)
    assert fg.segment(model, canvases.images).dice is None  # no truth, no scores
    with pytest.raises(fg.FigureError, match=r"masks must be \(6, 1, 64, 64\)"):
        fg.segment(model, canvases.images, canvases.labels[:3])


def test_a_figure_of_another_kind_of_model_is_a_figure_error(model, canvases):
    """A SegCaps given to the classifiers' figures, a classifier given to segment: AttributeError tracebacks (SegCaps'
    output has poses but no scores; segment read probabilities unchecked), where the other mismatches of the module
    are FigureErrors (a review, 2026-12-02)."""
    from capsnet.models import create_model

    for figure in (fg.predict, fg.reconstructions, fg.pose_sweep):
        with pytest.raises(fg.FigureError, match="this SegCaps has no class capsules: predict reads a capsule "
                                                 "classifier's poses and scores"):
            figure(model, canvases.images[:2])
    with pytest.raises(fg.FigureError, match=r"the input has images 28x28 \(HxW\), and this model segments images "
                                             r"whose sides are multiples of 8"):
        fg.pose_sweep(model, torch.rand(2, 1, 28, 28))
    for name in ("capsnet", "baseline"):
        classifier = create_model(name, **({"conv1_channels": 8, "primary_types": 2} if name == "capsnet" else {}))
        with pytest.raises(fg.FigureError, match=f"this {type(classifier).__name__} does not segment: segment reads a "
                                                 f"segmentation model's per-pixel probabilities"):
            fg.segment(classifier, torch.rand(2, 1, 28, 28))


def test_capsule_maps_are_the_lengths_of_every_layers_grid(model, canvases):
    maps = fg.capsule_maps(model, canvases.images[2])
    with torch.no_grad():
        grids = model.capsule_grids(canvases.images[2:3].float())
    assert list(maps) == list(grids) and list(maps)[0] == "conv1" and list(maps)[-1] == "seg_caps"
    for name, g in grids.items():
        torch.testing.assert_close(maps[name], g[0].norm(dim=1), rtol=1e-5, atol=1e-6)  # (T, H', W')
    # segmentation_run's capsule types (tests/conftest.py): primary 2 on the 1/2 grid, conv_3_2 2 on the 1/8 one
    assert maps["primary"].shape == (2, 32, 32) and maps["conv_3_2"].shape == (2, 8, 8)
    # the segmentation capsule's length is the model's probability
    torch.testing.assert_close(maps["seg_caps"][0], model(canvases.images[2:3].float()).probabilities[0, 0].detach(),
                               rtol=1e-4, atol=1e-5)


def test_the_capsule_maps_figure_draws_each_type_once_on_its_layers_scale():
    """One axes per capsule type (each layer a row, on its own scale: black 0, white the layer's longest capsule)
    and the input; none for the empty cells right of a layer with fewer types (they were made and hidden: half the
    figure's cells on SegCaps, half its drawing time)."""
    g = torch.Generator().manual_seed(0)
    maps = {"primary": torch.rand(3, 4, 4, generator=g), "caps": 2 * torch.rand(1, 2, 2, generator=g)}
    image = torch.rand(1, 8, 8, generator=g)
    fig = fg.plot_capsule_maps(maps, image)
    axes = fig.axes
    assert len(axes) == 1 + 3 + 1
    shown = [ax.images[0] for ax in axes]
    torch.testing.assert_close(torch.as_tensor(shown[0].get_array()).float().squeeze(), image[0])
    for ax, t in zip(axes[1:4], range(3)):
        assert torch.equal(torch.as_tensor(shown[1 + t].get_array()), maps["primary"][t])
        assert shown[1 + t].get_clim() == (0, float(maps["primary"].max())) and ax.get_title() == f"type {t}"
    assert shown[4].get_clim() == (0, float(maps["caps"].max())) and axes[4].get_title() == "type 0"
    assert axes[1].get_ylabel().startswith("primary\n3 types, 4x4") and axes[2].get_ylabel() == ""
    assert axes[4].get_ylabel().startswith("caps\n1 type, 2x2") and axes[4].get_subplotspec().colspan.start == 1
    with pytest.raises(fg.FigureError, match="no capsule layers"):
        fg.plot_capsule_maps({}, image)


def test_overlay_marks_right_false_and_missed_pixels():
    pred = torch.tensor([[1, 1], [0, 0]], dtype=torch.uint8)
    truth = torch.tensor([[1, 0], [1, 0]], dtype=torch.uint8)
    rgb = fg.overlay_masks(pred, truth)
    assert rgb[0, 0].tolist() == [1, 1, 1]  # both: white
    assert rgb[0, 1].tolist() == [1, 0, 0]  # predicted only: red
    assert rgb[1, 0].tolist() == [0, 0, 1]  # missed: blue
    assert rgb[1, 1].tolist() == [0, 0, 0]


def test_figures_command_on_a_segcaps_run(segmentation_run, data_root, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(fg.report, "WORST_POOL", 12)  # the worst of the first 12 canvases, not 1,000: quick
    out = tmp_path / "figs"
    assert main(["figures", "--checkpoint", str(segmentation_run), "--out", str(out), "--data-dir", str(data_root),
                 "--indices", "0", "3", "--misclassified", "2", "--no-progress"]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == ["capsule_maps_0.png", "capsule_maps_3.png", "segmentations.png", "segmentations_ood.png",
                     "training_curves.png", "worst.png"]
    assert all(p.read_bytes()[:8] == PNG_MAGIC for p in out.iterdir())
    assert all(fg.report.FIGURE_NAME.fullmatch(name) for name in names)  # what a later call's note counts as figures
    text = capsys.readouterr().out
    assert "the lowest Dice: images" in text and "mean Dice" in text
    # the worst images named are the lowest-Dice ones of the first WORST_POOL test canvases
    model = load_model(segmentation_run)[0]
    pool = load_test("mnist-segmentation", size=fg.report.WORST_POOL, root=data_root, progress=False)
    dice = fg.segment(model, pool.images, pool.labels).dice
    worst = text.split("the lowest Dice: images ")[1].splitlines()[0]
    assert [int(v) for v in worst.strip("[]").split(", ")] == dice.argsort(stable=True)[:2].tolist()


def test_figures_of_a_unet_on_the_users_folder_and_bad_flags_write_nothing(unet_run, tmp_path, capsys):
    run = unet_run  # 10 16x16 PNG pairs: 7 trained on, 3 held out for testing (p00, p05, p06: by their names)
    out = tmp_path / "figs"
    assert main(["figures", "--checkpoint", str(run), "--out", str(out), "--indices", "1", "--no-progress"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["segmentations.png", "training_curves.png", "worst.png"]
    captured = capsys.readouterr()
    said = captured.out
    assert "first 3 images: mean Dice" in said  # the held-out pairs
    # named by their files, as eval names them (indices alone before)
    assert re.search(r"test images \[1\] \(p05\.png\)", said), said
    worst = re.search(r"the lowest Dice: images \[(\d), (\d), (\d)\] \((\S+), (\S+), (\S+)\)", said)
    assert worst and [("p00.png", "p05.png", "p06.png")[int(i)] for i in worst.groups()[:3]] == [
        f.rstrip(",") for f in worst.groups()[3:]], said
    assert "warning" not in captured.err
    bad = tmp_path / "bad"
    assert main(["figures", "--checkpoint", str(run), "--out", str(bad), "--dims", "3", "--no-progress"]) != 0
    assert "a segmentation model has no class capsules" in capsys.readouterr().err and not bad.exists()
    assert main(["figures", "--checkpoint", str(run), "--out", str(bad), "--indices", "3", "--no-progress"]) != 0
    assert "--indices [3] out of range: the " in capsys.readouterr().err and not bad.exists()


def test_figures_of_a_run_whose_folder_changed_say_so_as_eval_does(tmp_path, mask_pairs, capsys):
    """eval warns when a run's folder holds other files than when it last saved; figures drew the same test pairs
    and printed their Dice without a word (a bug hunt, 2026-12-05)."""
    import numpy as np
    from PIL import Image

    from capsnet.models import UNetConfig
    from capsnet.train import TrainConfig, fit

    mask_pairs(tmp_path / "d", 10)
    fit(UNetConfig(base_channels=4, depth=2, input_height=16, input_width=16),
        TrainConfig(dataset=f"folder:{tmp_path / 'd'}", epochs=1, batch_size=4), tmp_path / "run", progress=False)
    mask = next((tmp_path / "d" / "masks").glob("*.png"))
    Image.fromarray(np.zeros((16, 16), np.uint8)).save(mask)  # one mask rewritten
    assert main(["figures", "--checkpoint", str(tmp_path / "run"), "--out", str(tmp_path / "figs"), "--no-progress",
                 "--misclassified", "0"]) == 0
    assert (f"capsnet figures: warning: folder:{tmp_path / 'd'} holds 20 files, as when the run last saved, but other "
            f"names or contents") in capsys.readouterr().err


def test_figures_default_to_the_images_a_small_folder_has_and_take_a_lone_checkpoint(unet_run, tmp_path, capsys,
                                                                                     monkeypatch):
    """Before: the default indices 0-7 were refused on a folder with 3 test images ("--indices [3, ...] out of range",
    a flag never typed), and a checkpoint file on its own or a run without metrics.jsonl was refused for want of
    training curves."""
    import shutil

    from capsnet.checkpoint import load_checkpoint, save_checkpoint

    import capsnet.figures.report as report

    out = tmp_path / "figs"
    titled, plot = [], report.plot_segmentations
    monkeypatch.setattr(report, "plot_segmentations", lambda *a, **k: titled.append(k["names"]) or plot(*a, **k))
    assert main(["figures", "--checkpoint", str(unet_run), "--out", str(out), "--no-progress"]) == 0
    assert "test images [0, 1, 2]" in capsys.readouterr().out
    # each image titled by its file as well as its index ("#0" alone before; a review, 2026-12-01)
    assert titled[0] == ["p00.png", "p05.png", "p06.png"] and sorted(titled[1]) == titled[0]
    monkeypatch.undo()
    solo = tmp_path / "solo" / "model.safetensors"
    solo.parent.mkdir()
    shutil.copy(unet_run / "best.safetensors", solo)  # its history travels in the checkpoint: the curves are drawn
    reads = []
    monkeypatch.setattr(report, "load_checkpoint", lambda *a, **k: reads.append(a) or load_checkpoint(*a, **k))
    assert main(["figures", "--checkpoint", str(solo), "--out", str(tmp_path / "f2"), "--no-progress"]) == 0
    assert reads == []  # the curves' history from the checkpoint the figures were drawn from, not a second read
    monkeypatch.undo()
    assert (tmp_path / "f2" / "training_curves.png").read_bytes()[:8] == PNG_MAGIC
    early = load_checkpoint(unet_run, "last")  # a run stopped before its first epoch's record
    early.state = {"epoch": 0, "step": 0, "history": [], "best": None}
    (tmp_path / "early").mkdir()
    save_checkpoint(tmp_path / "early" / "last.safetensors", early)
    assert main(["figures", "--checkpoint", str(tmp_path / "early"), "--which", "last", "--out", str(tmp_path / "f3"),
                 "--no-progress"]) == 0
    assert "no training curves: no run given has finished an epoch" in capsys.readouterr().out
    assert (tmp_path / "f3" / "segmentations.png").exists() and not (tmp_path / "f3" / "training_curves.png").exists()


def test_indices_past_a_generated_test_set_are_refused_before_it_is_made(segmentation_run, tmp_path, monkeypatch,
                                                                         capsys):
    """--indices 10000 on mnist-segmentation made 10,000 canvases (about 10 s) before refusing."""
    from capsnet.figures import report

    made = []
    monkeypatch.setattr(report, "load_test", lambda *a, **k: made.append(a) or pytest.fail("the set was made"))
    out = tmp_path / "figs"
    assert main(["figures", "--checkpoint", str(segmentation_run), "--out", str(out), "--indices", "2", "10000",
                 "--no-progress"]) == 2
    assert ("--indices [10000] out of range: the mnist-segmentation test set has 10,000 images, 0..9999"
            in capsys.readouterr().err) and made == [] and not out.exists()
