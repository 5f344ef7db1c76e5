"""capsnet figures on synthesis runs: samples per noise seed, noise interpolation, the generator's capsule maps,
checked against the model's own images; and on pix2pix, which has no noise vector."""
from __future__ import annotations

import pytest
import torch

from capsnet import figures as fg
from capsnet.cli import main
from capsnet.data.tasks import load_test
from capsnet.evaluate import load_model
from capsnet.figures.synthesis import generator_maps, interpolate_noise, label_maps_shown, truncate_noise
from capsnet.models import Pix2pixConfig
from capsnet.synthesis import generate
from capsnet.train import TrainConfig

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_interpolation_ends_at_the_two_seeds_images(gan_run, data_root):
    model, _ = load_model(gan_run)
    label = load_test("mnist-skeleton", size=1, root=data_root, progress=False).images[0]
    rows = interpolate_noise(model, label, steps=5, seeds=(3, 4))
    assert rows.shape == (5, 1, 32, 32)
    ends = torch.cat([model.eval().generate(label[None], z=model.noise(1, s)) for s in (3, 4)])
    torch.testing.assert_close(rows[[0, -1]], ends)
    mid = model.generate(label[None], z=(model.noise(1, 3) + model.noise(1, 4)) / 2)
    torch.testing.assert_close(rows[2:3], mid, rtol=1e-4, atol=1e-5)


def test_the_interpolation_of_the_kth_label_map_ends_at_its_images_in_the_samples_figure(gan_run, data_root):
    """generate gives label map k row k of each seed's noise; the interpolation and capsule maps took row 0 for
    every map, so for maps after the first their 'seed 0' was not the samples figure's seed 0."""
    model, _ = load_model(gan_run)
    labels = load_test("mnist-skeleton", size=3, root=data_root, progress=False).images.float()
    samples = torch.stack([generate(model.eval(), labels, seed=s) for s in (0, 1)])  # (2, 3, 1, 32, 32)
    rows = interpolate_noise(model, labels[2], steps=3, seeds=(0, 1), row=2)
    torch.testing.assert_close(rows[[0, -1]], samples[:, 2], rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        grids = model.generator.capsule_grids(labels[2:3], model.noise(3, 1)[2:])
    maps = generator_maps(model, labels[2], seed=1, row=2)
    torch.testing.assert_close(maps["primary"], grids["primary"][0].norm(dim=1), rtol=1e-5, atol=1e-6)


def test_the_truncation_row_is_the_models_images_of_one_seeds_noise_cut_at_each_t(gan_run, data_root):
    model, _ = load_model(gan_run)
    labels = load_test("mnist-skeleton", size=3, root=data_root, progress=False).images.float()
    row = truncate_noise(model, labels[2], (0.0, 1.0, None), seed=5, row=2)
    assert row.shape == (3, 1, 32, 32)
    want = torch.cat([generate(model, labels, seed=5, truncation=t)[2:] for t in (0.0, 1.0, None)])
    torch.testing.assert_close(row, want, rtol=1e-5, atol=1e-6)  # label map 2's images in `capsnet generate`
    at_mean = model.generate(labels[2:3], z=torch.zeros(1, model.config.noise_dim))
    torch.testing.assert_close(row[:1], at_mean, rtol=1e-5, atol=1e-6)


def test_generator_maps_are_the_lengths_of_every_capsule_layer(gan_run, data_root):
    model, _ = load_model(gan_run)
    label = load_test("mnist-skeleton", size=1, root=data_root, progress=False).images[0]
    maps = generator_maps(model, label, seed=2)
    with torch.no_grad():
        grids = model.eval().generator.capsule_grids(label[None], model.noise(1, 2))
    # gan_run's widths: primary's 2 types x 0.75 on the 1/2 grid, 2 of 16x16; conv_3_2's 8 x 0.25 on the 1/8, 2 of 4x4
    assert list(maps) == list(grids) and maps["primary"].shape == (2, 16, 16) and maps["conv_3_2"].shape == (2, 4, 4)
    for name, g in grids.items():
        torch.testing.assert_close(maps[name], g[0].norm(dim=1), rtol=1e-5, atol=1e-6)


def test_figures_command_on_a_capspix2pix_run(gan_run, data_root, tmp_path, capsys, monkeypatch):
    out = tmp_path / "figs"
    drawn, plot = [], fg.report.plot_samples
    monkeypatch.setattr(fg.report, "plot_samples", lambda *a, **k: drawn.append(a[2]) or plot(*a, **k))
    assert main(["figures", "--checkpoint", str(gan_run), "--out", str(out), "--data-dir", str(data_root),
                 "--indices", "1", "3", "--misclassified", "3", "--dpi", "20", "--no-progress"]) == 0  # what, not how
    assert sorted(p.name for p in out.iterdir()) == ["capsule_maps_1.png", "capsule_maps_3.png", "interpolation.png",
                                                      "samples.png", "training_curves.png", "truncation.png"]
    assert all(fg.report.FIGURE_NAME.fullmatch(p.name) for p in out.iterdir())  # a later call's note's figures
    said = capsys.readouterr().out  # a flag with nothing to shape here is said, not skipped without a word
    assert ("--misclassified not used: a synthesis model's figures have no pose sweeps or misclassified inputs"
            in said)
    assert all(p.read_bytes()[:8] == PNG_MAGIC for p in out.iterdir())
    # the samples are `capsnet eval`'s images of test pairs 1 and 3 (each its test index's noise; found by a review,
    # 2026-11-29: they were drawn with the noise of their places in --indices, 0 and 1), and the spread the note
    # reports is theirs
    model, _ = load_model(gan_run)
    labels = load_test("mnist-skeleton", size=4, root=data_root, progress=False).images
    evals = torch.stack([generate(model, labels, seed=s)[[1, 3]] for s in fg.report.SAMPLE_SEEDS])
    assert torch.allclose(drawn[0], evals, atol=1e-5)
    spread = evals.std(0).mean().item()
    assert f"spread over noise seeds [0, 1, 2, 3]: {spread:.4f}" in said
    bad = tmp_path / "bad"
    assert main(["figures", "--checkpoint", str(gan_run), "--out", str(bad), "--dims", "0", "--no-progress"]) == 2
    assert "a synthesis model has no class capsules" in capsys.readouterr().err and not bad.exists()


def test_pix2pix_figures_have_samples_but_no_interpolation_or_capsules(tmp_path, data_root, capsys):
    from capsnet.gan import fit_gan

    run = tmp_path / "p2p"
    fit_gan(Pix2pixConfig(base_channels=4, disc_channels=4), TrainConfig(dataset="fashion-silhouette", epochs=1,
            batch_size=4, train_size=8, test_size=4), run, device="cpu", data_root=data_root, progress=False)
    out = tmp_path / "figs"
    assert main(["figures", "--checkpoint", str(run), "--out", str(out), "--data-dir", str(data_root), "--indices",
                 "0", "--dpi", "20", "--no-progress"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["samples.png", "training_curves.png"]
    # and says why (without a word before: a review, 2026-11-30)
    assert "pix2pix's noise is its dropout, no vector: no interpolation or truncation figures" in \
        capsys.readouterr().out
    with pytest.raises(fg.FigureError, match="takes no noise vector"):
        interpolate_noise(load_model(run)[0], torch.zeros(1, 32, 32))
    with pytest.raises(fg.FigureError, match="nothing to truncate"):
        truncate_noise(load_model(run)[0], torch.zeros(1, 32, 32), (0.5,))


def test_label_maps_are_drawn_each_by_its_own_range():
    """A user's class maps (0..3) were drawn as pixels / 255: all but black in the samples figure (a review,
    2026-12-01). Each map now spans black to white; 0/255 and 0/1 maps draw alike; an all-0 map stays black."""
    maps = torch.zeros(4, 1, 2, 3)
    maps[0, 0, 0] = torch.tensor([0.0, 1.0, 3.0])  # class maps 0..3
    maps[1, 0, 1] = 255.0  # a 0/255 map
    maps[2, 0, 1] = 1.0  # the same map at 0/1
    shown = label_maps_shown(maps.to(torch.uint8))
    assert shown[0, 0, 0].tolist() == pytest.approx([0.0, 1 / 3, 1.0])
    assert torch.equal(shown[1], shown[2]) and shown[1].max() == 1.0 and (shown[3] == 0).all()
