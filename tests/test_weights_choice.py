"""--weights beyond eval: predict, export, figures, the viewer and generate load an averaged run's training weights
(``--weights training``), which are the weights of a plain run of the same seed (test_average), and name what they
write apart from what the average writes."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from PIL import Image

from capsnet.checkpoint import CheckpointError
from capsnet.cli import main
from capsnet.data.tasks import load_test
from capsnet.evaluate import load_model
from capsnet.gan import fit_gan
from capsnet.models import CapsNetConfig, Pix2pixConfig
from capsnet.train import TrainConfig, fit

CAPS = CapsNetConfig(conv1_channels=8, primary_types=2, decoder_hidden=(32, 64))
CLASSIFY = TrainConfig(dataset="mnist-sample", epochs=1, batch_size=32, train_size=96, test_size=32, seed=3)
GAN = TrainConfig(dataset="mnist-skeleton", epochs=1, batch_size=8, train_size=16, test_size=4, lr=2e-4)


@pytest.fixture(scope="module")
def classifier_runs(tmp_path_factory):
    """A CapsNet trained plainly and the same seed trained with --ema-decay (3 steps each): root/plain, root/avg."""
    root = tmp_path_factory.mktemp("weights")
    fit(CAPS, CLASSIFY, root / "plain", device="cpu", progress=False)
    fit(CAPS, replace(CLASSIFY, ema_decay=0.7), root / "avg", device="cpu", progress=False)
    return root


def _digits(folder, n=4):
    folder.mkdir()
    test = load_test("mnist-sample", size=n, progress=False)
    assert test.images.dtype == torch.uint8  # stored as bytes
    for k, image in enumerate(test.images):
        Image.fromarray(image[0].numpy()).save(folder / f"digit{k}.png")


def _scores(done):
    return [(r["file"], r["class"], r["score"]) for r in done.rows]


def test_predict_with_the_training_weights_predicts_as_the_plain_run(classifier_runs, tmp_path, capsys):
    from capsnet.predict import PREDICTIONS_FILE, predict_folder

    _digits(tmp_path / "digits")
    run = {name: classifier_runs / name for name in ("plain", "avg")}
    plain = predict_folder(run["plain"], tmp_path / "digits", tmp_path / "p", which="last")
    trained = predict_folder(run["avg"], tmp_path / "digits", tmp_path / "t", which="last", weights="training")
    saved = predict_folder(run["avg"], tmp_path / "digits", tmp_path / "s", which="last")
    assert _scores(trained) == _scores(plain)
    assert [s for *_, s in _scores(saved)] != [s for *_, s in _scores(plain)]  # the average predicts otherwise
    # on the command line: the plain run's predictions, and said; without the flag, the average's
    for out, weights in (("cli", ["--weights", "training"]), ("cli-saved", [])):
        assert main(["predict", "--checkpoint", str(run["avg"]), "--which", "last", *weights,
                     "--images", str(tmp_path / "digits"), "--out", str(tmp_path / out), "--no-progress"]) == 0
        said = "(the run's training weights, not the average" in capsys.readouterr().out
        assert said == bool(weights), out  # said for the training weights alone
    assert (tmp_path / "cli" / PREDICTIONS_FILE).read_bytes() == (tmp_path / "p" / PREDICTIONS_FILE).read_bytes()
    assert (tmp_path / "cli-saved" / PREDICTIONS_FILE).read_bytes() == (tmp_path / "s" / PREDICTIONS_FILE).read_bytes()
    # a checkpoint without training weights says why and writes nothing
    with pytest.raises(CheckpointError, match="only a run's last checkpoint keeps them"):
        predict_folder(run["avg"], tmp_path / "digits", tmp_path / "never", which="best", weights="training")
    assert not (tmp_path / "never").exists()


@pytest.mark.e2e
def test_export_of_the_training_weights_is_named_apart_and_computes_the_plain_run(classifier_runs, capsys):
    import onnxruntime

    from capsnet.export import ExportError, export_model, trace_model

    assert main(["export", "--checkpoint", str(classifier_runs / "avg"), "--which", "last", "--weights",
                 "training"]) == 0
    assert "(the run's training weights, not the average" in capsys.readouterr().out
    path = classifier_runs / "avg" / "last-training-weights.onnx"
    assert path.is_file()
    assert not (classifier_runs / "avg" / "last.onnx").exists()  # the average's default name is left alone
    x = load_test("mnist-sample", size=3, progress=False).images.float() / 255  # stored as bytes
    session = onnxruntime.InferenceSession(str(path))
    got = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    plain, _ = load_model(classifier_runs / "plain", which="last")
    saved, _ = load_model(classifier_runs / "avg", which="last")
    with torch.no_grad():
        want, other = plain.eval()(x).lengths.numpy(), saved.eval()(x).lengths.numpy()
    assert np.allclose(got, want, atol=1e-5) and not np.allclose(got, other, atol=1e-5)
    for source in (plain, trace_model(plain)):  # a model or a trace has no training weights to pick
        with pytest.raises(ExportError, match="weights='training' picks a checkpoint's weights"):
            export_model(source, classifier_runs / "model.onnx", weights="training")
    with pytest.raises(ExportError, match="weights must be one of saved, training, got 'bogus'"):
        export_model(plain, classifier_runs / "model.onnx", weights="bogus")
    assert not (classifier_runs / "model.onnx").exists()


def test_figures_of_the_training_weights_go_to_their_own_folder_and_draw_the_plain_run(classifier_runs, tmp_path,
                                                                                       capsys,
                                                                                       blank_routing_and_sweeps):
    from capsnet.figures import write_figures

    # one input, one pose-sweep row, no misclassified inputs (a prediction over the whole test split): the figure
    # compared is the reconstructions. The routing and the pose sweep, the slowest to draw and not compared, are
    # blank figures (test_figures.py draws them)
    blank_routing_and_sweeps()
    assert main(["figures", "--checkpoint", str(classifier_runs / "avg"), "--which", "last", "--weights", "training",
                 "--indices", "0", "--misclassified", "0", "--dims", "0", "--no-progress"]) == 0
    assert "(the run's training weights, not the average" in capsys.readouterr().out
    trained = classifier_runs / "avg" / "figures-training-weights"
    common = dict(which="last", indices=[0], misclassified=0, dims=[0], progress=False)
    plain = write_figures(classifier_runs / "plain", out=tmp_path / "plain", **common)
    saved = write_figures(classifier_runs / "avg", out=tmp_path / "saved", **common)
    figure = "reconstructions.png"  # drawn from the model's weights alone
    assert (trained / figure).read_bytes() == (plain.folder / figure).read_bytes()
    assert (saved.folder / figure).read_bytes() != (plain.folder / figure).read_bytes()


def test_the_viewer_opens_the_training_weights_and_says_so(classifier_runs, capsys):
    from capsnet.viz import ViewerError, load_viewer

    viewer = load_viewer(classifier_runs / "avg", which="last", weights="training", progress=False)
    plain, _ = load_model(classifier_runs / "plain", which="last")
    assert viewer.info()["weights"] == "training"
    assert all(torch.equal(t, plain.state_dict()[k]) for k, t in viewer.model.state_dict().items())
    assert load_viewer(classifier_runs / "avg", which="last", progress=False).info()["weights"] == "saved"
    with pytest.raises(ViewerError, match="weights='training' picks a checkpoint's weights; give a checkpoint"):
        load_viewer(None, weights="training")
    for flags in ([], ["--untrained"]):  # the shipped model, or an untrained one: neither keeps training weights
        assert main(["viz", *flags, "--weights", "training"]) != 0
        assert "--weights training needs --checkpoint RUN_DIR, a run trained with --ema-decay" in \
            capsys.readouterr().err


def test_generate_with_the_training_weights_draws_the_plain_runs_images(tmp_path, data_root):
    from capsnet.synthesis import generate_folder

    small = Pix2pixConfig(base_channels=4, disc_channels=4)
    fit_gan(small, GAN, tmp_path / "plain", device="cpu", data_root=data_root, progress=False)
    fit_gan(small, replace(GAN, ema_decay=0.8), tmp_path / "avg", device="cpu", data_root=data_root, progress=False)
    labels = tmp_path / "labels"
    labels.mkdir()
    for k in range(2):
        a = np.zeros((32, 32), np.uint8)
        a[8:24, 10 + 3 * k] = 255
        Image.fromarray(a).save(labels / f"map{k}.png")
    images = {}
    for name, run, weights in (("plain", "plain", "saved"), ("saved", "avg", "saved")):
        done = generate_folder(tmp_path / run, labels, tmp_path / f"out-{name}", which="last", weights=weights)
        images[name] = [np.array(Image.open(f)) for f in sorted(done.files)]
    assert main(["generate", "--checkpoint", str(tmp_path / "avg"), "--which", "last", "--weights", "training",
                 "--labels", str(labels), "--out", str(tmp_path / "out-trained"), "--no-progress"]) == 0
    images["trained"] = [np.array(Image.open(f)) for f in sorted((tmp_path / "out-trained").iterdir())]
    assert all(np.array_equal(a, b) for a, b in zip(images["trained"], images["plain"], strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(images["saved"], images["plain"], strict=True))
