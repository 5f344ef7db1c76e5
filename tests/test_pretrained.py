"""Trained models shipped in the package: packed from a run, found by name, loaded, scored.

The mechanism is tested on the suite's shared tiny run, packed into a folder
that stands in for the package's; the model that ships (when this checkout
has it) is checked against the figures its model card records.
"""
from __future__ import annotations

import importlib
import json
import re
import sys

import pytest
import torch

from capsnet import pretrained as shipped
from capsnet.checkpoint import CheckpointError, load_checkpoint
from capsnet.cli import main
from capsnet.data import load_dataset
from capsnet.evaluate import evaluate_checkpoint, load_model
from capsnet.models import CapsNet, list_pretrained, pretrained


@pytest.fixture
def packed(trained_run, tmp_path, monkeypatch):
    """The shared run packed as shipped model "tiny", in a folder standing in for the package's."""
    folder = tmp_path / "shipped"
    folder.mkdir()
    shipped.pack(trained_run, folder / "tiny.safetensors")
    monkeypatch.setattr(shipped, "_dir", lambda: folder)
    return folder / "tiny.safetensors"


def test_a_report_names_a_shipped_file_by_its_model_and_any_other_file_by_its_path(packed, tmp_path):
    """``pretrained.named``: the shipped file, by any path or a link to it, is ``pretrained:NAME`` of the file it
    is; a copy elsewhere, a link named like a shipped model that points elsewhere, or a missing file keep their
    paths (a review, 2026-12-02: a link's own name had been taken)."""
    assert shipped.named(packed) == "pretrained:tiny"
    assert shipped.named(str(packed.parent / "." / "tiny.safetensors")) == "pretrained:tiny"
    (tmp_path / "link.safetensors").symlink_to(packed)
    assert shipped.named(tmp_path / "link.safetensors") == "pretrained:tiny"
    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / "tiny.safetensors").write_bytes(packed.read_bytes())
    assert shipped.named(tmp_path / "copy" / "tiny.safetensors") == str(tmp_path / "copy" / "tiny.safetensors")
    (packed.parent / "other.bin").write_bytes(b"x")
    (tmp_path / "tiny.safetensors").symlink_to(packed.parent / "other.bin")  # named like it, not it
    assert shipped.named(tmp_path / "tiny.safetensors") == str(tmp_path / "tiny.safetensors")
    assert shipped.named(tmp_path / "missing.safetensors") == str(tmp_path / "missing.safetensors")


def test_pack_keeps_the_final_epoch_in_half_precision_without_optimizer(trained_run, packed):
    last = load_checkpoint(trained_run, which="last")
    ckpt = load_checkpoint("pretrained:tiny")
    assert ckpt.path == packed and ckpt.optimizer_state is None and not ckpt.rng_state
    assert ckpt.state["epoch"] == last.state["epoch"] == last.train_config["epochs"]  # the last epoch, not the best
    assert ckpt.state["history"] == last.state["history"]
    assert {t.dtype for t in ckpt.model_state.values()} == {torch.float16}
    for name, t in last.model_state.items():
        torch.testing.assert_close(ckpt.model_state[name].float(), t, rtol=1e-3, atol=1e-4)
    assert packed.stat().st_size < 0.6 * (trained_run / "last.safetensors").stat().st_size


def test_pack_refuses_a_best_checkpoint_and_the_runs_own_files(trained_run, tmp_path):
    """Given best.safetensors, pack shipped the best epoch (a file is loaded as it is, whatever which= says); given
    the run's own last.safetensors as the target, it wrote over it and the run could no longer resume."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    before = (run / "last.safetensors").read_bytes()
    with pytest.raises(ValueError, match=r"best.safetensors is not a run's last checkpoint \(a best.safetensors is "
                                         r"the best epoch, not the final one\)"):
        shipped.pack(run / "best.safetensors", tmp_path / "x.safetensors")
    for target in ("last.safetensors", "best.safetensors"):
        with pytest.raises(ValueError, match=f"{target} is the run's own checkpoint; packing over it would lose"):
            shipped.pack(run, run / target)
    assert (run / "last.safetensors").read_bytes() == before and not (tmp_path / "x.safetensors").exists()
    # the run's history and settings were written over without a word; a folder or a missing one named a temporary
    metrics, config = (run / "metrics.jsonl").read_bytes(), (run / "config.json").read_bytes()
    for target, said in ((run / "metrics.jsonl", "is not a .safetensors name; pack writes a checkpoint: give one, "
                                                 "e.g. metrics.safetensors"),
                         (run / "config.json", "is not a .safetensors name"),
                         (tmp_path, f"the target {tmp_path} is a folder; give a file path, e.g. "
                                    f"{tmp_path / 'NAME.safetensors'}"),
                         (tmp_path / "nope" / "x.safetensors", f"the folder {tmp_path / 'nope'} does not exist")):
        with pytest.raises(ValueError, match=re.escape(said)):
            shipped.pack(run, target)
    assert (run / "metrics.jsonl").read_bytes() == metrics and (run / "config.json").read_bytes() == config
    assert not list(tmp_path.glob(".*tmp*")) and not list(run.glob(".*tmp*"))
    assert shipped.pack(run / "last.safetensors", tmp_path / "y.safetensors").exists()  # the run's last: as the run
    # a run stopped at the end of epoch 2 of the 3 it was training (its config says 3): no final epoch's weights
    from capsnet.checkpoint import load_checkpoint, save_checkpoint

    stopped = load_checkpoint(run, "last")
    stopped.train_config["epochs"] = 3
    save_checkpoint(run / "last.safetensors", stopped)
    with pytest.raises(ValueError, match=r"stopped after epoch 2 of the 3 it was training: its weights are not a "
                                         r"final epoch's; finish the run"):
        shipped.pack(run, tmp_path / "z.safetensors")
    assert not (tmp_path / "z.safetensors").exists()


def test_pretrained_returns_an_eval_mode_float32_model_that_predicts_as_the_run(trained_run, packed):
    model = pretrained("tiny")
    assert list_pretrained() == ["tiny"] and isinstance(model, CapsNet) and not model.training
    # the name as the CLI spells it too (it was refused: "no shipped model named 'pretrained:tiny' (did you mean
    # pretrained:tiny?)"); load_model gives a run's model in eval mode as well (it gave it training: a batch norm
    # model's scores depended on the batch and overwrote its saved statistics)
    assert torch.equal(pretrained("pretrained:tiny").digits.weight, model.digits.weight)
    assert not load_model(trained_run)[0].training and not load_model("pretrained:tiny")[0].training
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    full, _ = load_model(trained_run, which="last")
    x = load_dataset("mnist-sample", "test").images[:100].float() / 255
    with torch.no_grad():
        half_scores, full_scores = model(x).scores, full.eval()(x).scores
    assert (half_scores.argmax(1) == full_scores.argmax(1)).float().mean() >= 0.98
    torch.testing.assert_close(half_scores, full_scores, atol=5e-3, rtol=0)


def test_eval_cli_takes_a_shipped_name_and_writes_its_report_here(packed, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["eval", "--checkpoint", "pretrained:tiny", "--dataset", "mnist-sample", "--no-progress"]) == 0
    # scored on another set than it was trained on (mnist): the set is in the report's name
    report = json.loads((tmp_path / "eval-tiny-mnist-sample.json").read_text())
    done = evaluate_checkpoint("pretrained:tiny", dataset="mnist-sample", progress=False)
    assert report["accuracy"] == pytest.approx(done.results[""].accuracy)
    # named as given, as the viewer names it: the file's place inside site-packages differs per install (a review
    # of a wheel install, 2026-12-02)
    assert report["checkpoint"] == "pretrained:tiny" and done.report()["checkpoint"] == "pretrained:tiny"
    assert not list(packed.parent.glob("eval-*"))  # nothing written into the package


class _Stop(Exception):
    pass


@pytest.mark.parametrize("name, module, function, default", [
    ("capspix2pix-mnist", "capsnet.synthesis", "evaluate_synthesis", 64),
    ("segcaps-mnist", "capsnet.evaluate", "evaluate_segmentation", 64),
    ("capsnet-mnist-small", "capsnet.evaluate", "evaluate", 256)])
def test_eval_takes_the_batch_size_typed_and_each_kinds_own_default(name, module, function, default, tmp_path,
                                                                    data_root, monkeypatch):
    """A synthesis or segmentation checkpoint's evaluation ran at most 64 examples a pass whatever --batch-size
    said (two reviews, 2026-12-02); 64 is their default now, and a typed value holds."""
    seen = []

    def recording(*args, batch_size, **kw):
        seen.append(batch_size)
        raise _Stop

    importlib.import_module(module)  # by sys.modules: "capsnet.evaluate" as a dotted path is the package's function
    monkeypatch.setattr(sys.modules[module], function, recording)
    monkeypatch.chdir(tmp_path)
    for typed in ([], ["--batch-size", "512"]):
        with pytest.raises(_Stop):
            main(["eval", "--checkpoint", f"pretrained:{name}", "--device", "cpu", "--data-dir", str(data_root),
                  "--test-size", "16", "--no-progress", *typed])
    assert seen == [default, 512]


def test_an_unknown_shipped_name_lists_the_shipped_ones(packed, capsys):
    with pytest.raises(CheckpointError, match="no shipped model named 'nope'; the shipped ones are pretrained:tiny"):
        load_checkpoint("pretrained:nope")
    assert main(["eval", "--checkpoint", "pretrained:nope"]) == 2
    assert "pretrained:tiny" in capsys.readouterr().err
    # a model's registry name, or a slip of the keys, is told the shipped model it meant
    for typed in ("ti", "tinny"):
        with pytest.raises(CheckpointError, match=rf"no shipped model named '{typed}' \(did you mean pretrained:tiny\?\)"):
            load_checkpoint(f"pretrained:{typed}")
    with pytest.raises(CheckpointError, match=r"pretrained: names no shipped model \(give pretrained:NAME\)"):
        load_checkpoint("pretrained:")
    # a Path of the name, as a notebook may hold it ("'PosixPath' object has no attribute 'startswith'")
    from pathlib import Path

    assert isinstance(pretrained(Path("tiny")), CapsNet) and shipped.path(Path("tiny")) == packed
    # a slip in which= was ignored for a shipped model (and a file), where a run directory refused it
    for source in ("pretrained:tiny", packed):
        with pytest.raises(CheckpointError, match=r"which must be 'best' or 'last' .* got 'lastt'"):
            load_model(source, which="lastt")


# ------------------------------------------------------------------ the models that ship

# name -> the data set it was trained on (tools/make_pretrained.py); each is checked when this checkout ships it
SHIPPED = {shipped.DEFAULT: "mnist", "capsnet-fashion-small": "fashion-mnist", "efficient-capsnet-mnist": "mnist",
           "em-capsnet-mnist": "mnist", "segcaps-mnist": "mnist-segmentation", "capspix2pix-mnist": "mnist-skeleton",
           "capspix2pix-fashion": "fashion-silhouette"}
CLASSIFIERS = [n for n, d in SHIPPED.items() if d in ("mnist", "fashion-mnist")]
SAMPLE_SIZE = 100  # tools/make_pretrained.py's: the shipped-sample canvases or pairs a card records


def _each(names, *marks):
    return pytest.mark.parametrize("name", [pytest.param(n, marks=[*marks, pytest.mark.skipif(
        n not in shipped.names(), reason=f"{n} is not in this checkout yet: python tools/make_pretrained.py makes it")])
        for n in names])


each_shipped = _each(SHIPPED)


def _measured(name: str) -> dict:
    """The figures tools/make_pretrained.py measured and wrote into the model card."""
    assert "<!-- measured: {" in shipped.card(name)
    return shipped.measured(name)


@each_shipped
def test_a_shipped_model_is_small_half_precision_and_as_its_card_says(name):
    assert shipped.path(name).stat().st_size < 5 * 2**20  # "a few MB at most"
    ckpt = load_checkpoint(f"pretrained:{name}")
    # every float tensor in half precision; integer buffers (batch norm's step counters) as they were
    assert {t.dtype for t in ckpt.model_state.values() if t.is_floating_point()} == {torch.float16}
    assert {t.dtype for t in ckpt.model_state.values() if not t.is_floating_point()} <= {torch.int64}
    assert sum(t.numel() for t in ckpt.model_state.values()) == _measured(name)["weights"]
    assert ckpt.state["epoch"] == ckpt.train_config["epochs"] and ckpt.train_config["dataset"] == SHIPPED[name]
    assert "tools/make_pretrained.py" in shipped.card(name)


@_each([n for n, d in SHIPPED.items() if d == "mnist"])
def test_a_shipped_mnist_model_scores_on_the_shipped_sample_what_its_card_says(name):
    done = evaluate_checkpoint(f"pretrained:{name}", dataset="mnist-sample", progress=False)
    assert done.results[""].accuracy == pytest.approx(_measured(name)["sample_accuracy"], abs=1e-9)
    assert done.results[""].accuracy >= 0.98


def _scores_as_its_card_says(name: str, data_root) -> None:
    dataset = SHIPPED[name]
    done = evaluate_checkpoint(f"pretrained:{name}", dataset=dataset, root=data_root, batch_size=500, progress=False)
    key = f"{dataset.replace('-', '_')}_test_accuracy"
    assert done.results[""].accuracy == pytest.approx(_measured(name)[key], abs=1e-9)


@_each([n for n, d in SHIPPED.items() if d == "fashion-mnist"])
def test_a_shipped_model_without_a_shipped_sample_scores_on_its_first_test_images_what_its_card_says(name, data_root):
    """No sample of Fashion-MNIST ships: its card records the first 1,000 test images' figure, checked here to the
    image; the whole test set (9 s of the default suite) is checked with the others under -m slow."""
    done = evaluate_checkpoint(f"pretrained:{name}", dataset=SHIPPED[name], root=data_root, test_size=1000,
                               batch_size=500, progress=False)
    assert done.images == 1000
    assert done.results[""].accuracy == pytest.approx(_measured(name)["first_1000_test_accuracy"], abs=1e-9)


# EM's inference: about 50 s for the 10,000 test digits on one thread; the other MNIST classifiers about 14 s each;
# the Fashion model 9 s. The default suite scores each of them on the shipped sample instead (its card's figure, to
# the digit), and the Fashion model on its first 1,000 test images (above).
@_each(CLASSIFIERS, pytest.mark.slow)
def test_a_shipped_model_scores_on_its_test_set_what_its_card_says(name, data_root):
    _scores_as_its_card_says(name, data_root)


# ------------------------------------------------------------------ the shipped segmentation and synthesis models


def _sample_canvases_dice(name: str, which: str) -> float:
    """The shipped SegCaps' Dice on the card's sample canvases of one set ("": as trained, "ood"), scored as
    capsnet eval scores them (its evaluate_segmentation), without the other set (each took half of 12 s)."""
    from capsnet.data.tasks import load_test
    from capsnet.evaluate import evaluate_segmentation

    split = load_test("mnist-sample-segmentation", size=SAMPLE_SIZE, progress=False).to("cpu")
    chosen = split if which == "" else split.extra[which]
    model, _ = load_model(f"pretrained:{name}")
    return evaluate_segmentation(model, chosen.images, chosen.labels, batch_size=50).dice


@_each(["segcaps-mnist"])
def test_the_shipped_segcaps_scores_on_canvases_of_the_shipped_digits_what_its_card_says(name):
    measured = _measured(name)
    dice = _sample_canvases_dice(name, "")
    # thresholded masks: a pixel at 0.5 +- rounding could flip between thread counts; one pixel moves Dice ~1e-4
    assert dice == pytest.approx(measured["sample_dice"], abs=1e-3)
    assert dice >= 0.85 and measured["sample_ood_dice"] >= 0.7  # it segments, not just draws blobs
    assert measured["test_dice"] >= 0.88


@_each(["segcaps-mnist"], pytest.mark.slow)  # the out-of-distribution canvases: the same weights, as many again
def test_the_shipped_segcaps_scores_on_the_sample_out_of_distribution_canvases_what_its_card_says(name):
    assert _sample_canvases_dice(name, "ood") == pytest.approx(_measured(name)["sample_ood_dice"], abs=1e-3)


def _draws_as_its_card_says(name: str, monkeypatch, **where):
    """The shipped CapsPix2pix ``name`` scores on its card's first ``SAMPLE_SIZE`` pairs (``where``: their data set
    and folder) the L1, SSIM and judged accuracy the card records; the evaluation returned."""
    from capsnet import synthesis
    from capsnet.synthesis import evaluate_synthesis_checkpoint

    # the card's sample figures are noise seed 0's; a second draw shows the noise is used (eight took 12 s of 13)
    monkeypatch.setattr(synthesis, "SPREAD_SEEDS", 2)
    done = evaluate_synthesis_checkpoint(f"pretrained:{name}", test_size=SAMPLE_SIZE, **where)
    r, measured = done.results[""], _measured(name)
    assert done.pairs == SAMPLE_SIZE
    assert r.l1 == pytest.approx(measured["sample_l1"], abs=1e-5)
    assert r.ssim == pytest.approx(measured["sample_ssim"], abs=1e-5)
    # the judge's reading of 100 images: one of them may flip between thread counts at a near tie, no more
    assert r.judge_accuracy == pytest.approx(measured["sample_judge_accuracy"], abs=0.0101)
    assert r.spread > 0  # the noise is used
    return done


@_each(["capspix2pix-mnist"])
def test_the_shipped_capspix2pix_draws_from_skeletons_of_the_shipped_digits_what_its_card_says(name, monkeypatch):
    done = _draws_as_its_card_says(name, monkeypatch, dataset="mnist-sample-skeleton")
    assert done.judge == "pretrained:capsnet-mnist-small"
    assert done.results[""].judge_accuracy >= 0.9 and done.results[""].ssim >= 0.7  # digits


@_each(["capspix2pix-fashion"])
def test_the_shipped_fashion_capspix2pix_draws_from_its_first_test_silhouettes_what_its_card_says(name, data_root,
                                                                                                   monkeypatch):
    """No Fashion-MNIST pairs ship: its card records the first 100 test pairs' figures, checked here; the whole
    test set under -m slow."""
    done = _draws_as_its_card_says(name, monkeypatch, dataset="fashion-silhouette", root=data_root)
    assert done.judge == "pretrained:capsnet-fashion-small"  # judged by the shipped Fashion-MNIST classifier
    assert done.results[""].judge_accuracy >= 0.75 and done.results[""].ssim >= 0.6  # garments, not blobs


@_each(["segcaps-mnist", "capspix2pix-mnist", "capspix2pix-fashion"], pytest.mark.slow)
def test_a_shipped_segmentation_or_synthesis_model_scores_on_its_test_set_what_its_card_says(name, data_root):
    measured = _measured(name)
    if SHIPPED[name] == "mnist-segmentation":
        done = evaluate_checkpoint(f"pretrained:{name}", root=data_root, batch_size=64, progress=False)
        assert done.images == 10_000 and done.results[""].dice == pytest.approx(measured["test_dice"], abs=1e-4)
        assert done.results["ood"].dice == pytest.approx(measured["ood_dice"], abs=1e-4)
    else:
        from capsnet.synthesis import evaluate_synthesis_checkpoint

        r = evaluate_synthesis_checkpoint(f"pretrained:{name}", root=data_root).results[""]
        assert r.ssim == pytest.approx(measured["test_ssim"], abs=1e-5)
        assert r.judge_accuracy == pytest.approx(measured["test_judge_accuracy"], abs=2e-4)


@_each(["segcaps-mnist", "capspix2pix-mnist"])
def test_the_viewer_opens_a_shipped_segmentation_or_synthesis_model_offline_on_the_shipped_digits(name):
    from capsnet.viz.engine import load_viewer

    viewer = load_viewer(f"pretrained:{name}", progress=False)
    sample = {"mnist-segmentation": "mnist-sample-segmentation", "mnist-skeleton": "mnist-sample-skeleton"}
    assert viewer.info()["dataset"] == sample[SHIPPED[name]]
    walked = viewer.walk(viewer.test_input(3))
    if SHIPPED[name] == "mnist-segmentation":
        assert walked["dice"] > 0.5  # the fourth canvas's digit found
    else:
        assert walked["scores"] and all(0 <= s["l1"] < 0.2 for s in walked["scores"])


@_each(["segcaps-mnist", "capspix2pix-mnist"])
def test_the_figures_of_a_shipped_segmentation_or_synthesis_model_draw_offline_on_the_shipped_digits(name, tmp_path,
                                                                                                     monkeypatch, capsys):
    from capsnet.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()  # no MNIST here: the shipped digits are used
    assert main(["figures", "--no-progress", "--checkpoint", f"pretrained:{name}", "--data-dir", str(tmp_path / "empty"),
                 "--indices", "0", "--misclassified", "0", "--dpi", "20"]) == 0
    sample = {"mnist-segmentation": "mnist-sample-segmentation", "mnist-skeleton": "mnist-sample-skeleton"}
    out = capsys.readouterr().out
    assert f"{sample[SHIPPED[name]]} test" in out
    assert out.splitlines()[0].startswith("checkpoint ")  # what was drawn from first, then what was seen
    assert (tmp_path / f"figures-{name}" / "capsule_maps_0.png").is_file()


@_each(["capspix2pix-fashion"])
def test_the_viewer_opens_the_shipped_fashion_capspix2pix_on_fashion_silhouettes(name, data_root):
    from capsnet.viz.engine import load_viewer

    viewer = load_viewer(f"pretrained:{name}", data_dir=data_root, test_size=8, progress=False)
    assert viewer.info()["dataset"] == "fashion-silhouette"  # no Fashion-MNIST pairs ship: its own data set
    walked = viewer.walk(viewer.test_input(3))
    assert walked["scores"] and all(0 <= s["l1"] < 0.2 for s in walked["scores"])


@_each(["capsnet-fashion-small"])
def test_the_viewer_opens_the_shipped_fashion_model_on_fashion_mnist_not_on_the_shipped_digits(
        name, data_root, tmp_path, blank_routing_and_sweeps):
    """It opened on the shipped MNIST digits (a Fashion-MNIST classifier reading handwriting); there are no shipped
    Fashion-MNIST items, so it opens on Fashion-MNIST itself (downloaded, or from --data-dir)."""
    from capsnet.viz.engine import load_viewer

    viewer = load_viewer(f"pretrained:{name}", data_dir=data_root, progress=False, test_size=50)
    assert viewer.info()["dataset"] == "fashion-mnist"
    assert viewer.info()["classes"][0] == "T-shirt/top" and "warning" not in viewer.info()
    # asked for the shipped digits it opens on them, and says that the classes are not the ones it learned
    viewer = load_viewer(f"pretrained:{name}", dataset="mnist-sample", progress=False)
    assert viewer.info()["classes"][0] == "0"
    assert viewer.info()["warning"].startswith("the model was trained on fashion-mnist (T-shirt/top, Trouser")
    from capsnet.figures import write_figures

    blank_routing_and_sweeps()  # what the figures say, not how they draw
    done = write_figures([f"pretrained:{name}"], dataset="mnist-sample", indices=[0], misclassified=0, dpi=20,
                         out=tmp_path / "f", progress=False)  # the figures say it too
    assert any(n.startswith("warning: the model was trained on fashion-mnist") for n in done.notes)


@_each(["em-capsnet-mnist"])
def test_the_shipped_em_model_opens_in_the_viewer_and_draws_its_routing_offline(name, tmp_path, monkeypatch, capsys):
    """The EM matrix-capsule model ships too: the viewer opens it on the shipped digits with its EM rounds, reads
    them as its run did, and `capsnet figures` draws its routing offline."""
    from capsnet.cli import main
    from capsnet.viz.engine import load_viewer

    viewer = load_viewer(f"pretrained:{name}", progress=False)
    info = viewer.info()
    assert info["dataset"] == "mnist-sample" and info["routing"] == "em" and info["routing_iterations"] == 2
    walks = [(viewer.walk(viewer.test_input(k)), viewer.test_input(k).source["label"]) for k in range(20)]
    assert sum(w["predicted"] == label for w, label in walks) >= 19  # its card: over 98% of the shipped digits
    assert all(0 <= s <= 1 for w, _ in walks for s in w["lengths"])  # the class capsules' activations
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()  # no MNIST here: the shipped digits are used
    assert main(["figures", "--no-progress", "--checkpoint", f"pretrained:{name}", "--data-dir", str(tmp_path / "empty"),
                 "--indices", "0", "--misclassified", "0", "--dpi", "20"]) == 0
    assert "mnist-sample test" in capsys.readouterr().out
    assert (tmp_path / f"figures-{name}" / "routing_0.png").is_file()


def test_make_pretrained_into_another_folder_counts_and_names_what_it_wrote(trained_run, tmp_path, monkeypatch):
    """tools/make_pretrained.py --out DIR: the card counted the weights of (and timed) the model the package ships
    under that name, not the one just packed, and its command line left out --work and --out. The training step
    and the measurements (checked above for the shipped cards) stand aside here; the packing is the tool's own."""
    import importlib.util
    import shutil
    import subprocess
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("make_pretrained", Path(__file__).parents[1] / "tools" /
                                                  "make_pretrained.py")
    tool = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(__import__("sys").modules, "make_pretrained", tool)  # its dataclasses look their module up
    spec.loader.exec_module(tool)
    work = tmp_path / "work"
    shutil.copytree(trained_run, work)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: None)  # the run is trained already
    monkeypatch.setattr(tool, "MEASURE", {"classification": lambda *a: ({}, "")})
    assert tool.main(["--work", str(work), "--out", str(tmp_path / "ship")]) == 0
    card = (tmp_path / "ship" / "capsnet-mnist-small.md").read_text()
    tiny = sum(v.numel() for v in load_checkpoint(work, "last").model_state.values())
    shipped_count = sum(p.numel() for p in pretrained("capsnet-mnist-small").parameters())
    assert tiny != shipped_count and f"{tiny:,} weights, stored in float16" in card, card
    assert f"`python tools/make_pretrained.py --work {work} --out {tmp_path / 'ship'}`" in card
    # every figure the card prints is in its record: the training run's final epoch and the load time too (an audit
    # of the reported numbers, 2026-12-03, found them in the text alone)
    record = json.loads(re.search(r"<!-- measured: (\{.*\}) -->", card).group(1))
    final = load_checkpoint(work, "last").state["history"][-1]
    assert record["training_final"]["test_accuracy"] == final["test_accuracy"] and record["weights"] == tiny
    assert f"Load time**: {record['load_ms']} ms" in card
    # a measurement stopped (minutes of it; Ctrl-C) left the new weights under the old card (a review, 2026-11-30)
    shipped = {p.name: p.read_bytes() for p in (tmp_path / "ship").iterdir()}

    def stopped(*a):
        raise KeyboardInterrupt
    monkeypatch.setattr(tool, "MEASURE", {"classification": stopped})
    (work / "last.safetensors").write_bytes((work / "last.safetensors").read_bytes())  # a new run's, say
    state = dict(load_checkpoint(work, "last").model_state)
    with pytest.raises(KeyboardInterrupt):
        tool.main(["--work", str(work), "--out", str(tmp_path / "ship")])
    assert {p.name: p.read_bytes() for p in (tmp_path / "ship").iterdir()} == shipped and state
