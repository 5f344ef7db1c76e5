"""SynthesisViewer: what the viewer shows of a synthesis model, checked against the library's own generation, the
figures' paths and values computed here."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from capsnet.data.tasks import load_test
from capsnet.evaluate import load_model
from capsnet.figures.synthesis import generator_maps
from capsnet.image_metrics import l1_error, ssim
from capsnet.models import create_model
from capsnet.synthesis import generate, samples
from capsnet.viz import SynthesisViewer, ViewerError, decode, load_viewer
from capsnet.viz.synthesis import INTERPOLATION_STEPS

Q = 1 / 255 + 1e-6  # the viewer's arrays are quantised to 1/255 of their range


def test_samples_are_the_images_generate_makes_for_that_row(gan_run, pix2pix_viewer, data_root):
    model, _ = load_model(gan_run)
    labels = load_test("mnist-skeleton", size=4, extras=False, root=data_root, progress=False).images  # (4, 1, 32, 32)
    for m, maps in [(model, labels), (pix2pix_viewer.model, pix2pix_viewer.test_labels)]:
        made = {seed: generate(m, maps, seed=seed) for seed in (3, 0, 7)}  # every row's images, once per seed
        for row in (0, 2):
            got = samples(m, maps[row], [3, 0, 7], row=row)  # (3, 1, 32, 32): one batch
            for k, seed in enumerate([3, 0, 7]):
                torch.testing.assert_close(got[k], made[seed][row], atol=1e-6, rtol=0)
    torch.testing.assert_close(samples(model, labels[1], [2], row=1, truncation=0.5)[0],
                               generate(model, labels, seed=2, truncation=0.5)[1], atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="give at least one seed"):
        samples(model, labels[0], [])
    # a batch where one map goes was told of a shape it never had, (2, 2, 1, 32, 32)
    with pytest.raises(ValueError, match=r"label must be one label map \(C, H, W\), got \(2, 1, 32, 32\): pass one "
                                         r"of the batch, labels\[i\]"):
        samples(model, labels[:2], [0])


def test_a_test_walk_shows_the_images_eval_scores_with_their_scores(synthesis_viewer, data_root):
    v = synthesis_viewer
    test = load_test("mnist-skeleton", size=4, extras=False, root=data_root, progress=False)
    w = v.walk(v.test_input(index=2), seeds=[1, 5, 2])
    assert w["source"] == {"kind": "test", "index": 2, "class": int(test.labels[2]),
                           "class_name": test.classes[int(test.labels[2])]}
    assert np.abs(decode(w["input"]) - test.images[2].numpy()).max() <= Q
    assert np.abs(decode(w["truth"]) - test.components[2].numpy()).max() <= Q
    got = torch.from_numpy(decode(w["samples"]))  # (3, 1, 32, 32)
    made = torch.stack([generate(v.model, test.images, seed=s)[2] for s in (1, 5, 2)])  # what capsnet eval scores
    assert got.shape == (3, 1, 32, 32) and (got - made).abs().max() <= Q
    real = test.components[2].expand_as(made)
    assert [s["seed"] for s in w["scores"]] == [1, 5, 2]
    np.testing.assert_allclose([s["l1"] for s in w["scores"]], l1_error(made, real).numpy(), rtol=1e-6)
    np.testing.assert_allclose([s["ssim"] for s in w["scores"]], ssim(made, real).numpy(), rtol=1e-6)
    x = made.double().numpy()
    # over the seeds, per pixel; the viewer's float32 images come from its own batch, so they may round otherwise in
    # the last place than these (a 1.4e-7 relative difference on an AMD EPYC host): float32's tolerance, as above
    assert w["spread"] == pytest.approx(x.std(axis=0, ddof=1).mean(), rel=1e-6)
    assert w["spread"] > 0  # a generator that ignores its noise would show 0 here


def test_the_interpolation_runs_from_the_first_seeds_image_to_the_seconds(synthesis_viewer):
    v = synthesis_viewer
    w = v.walk(v.test_input(index=1), seeds=[0, 6])
    row = decode(w["interpolation"])  # (8, 1, 32, 32)
    ends = decode(w["samples"])
    assert row.shape == (INTERPOLATION_STEPS, 1, 32, 32)
    assert np.abs(row[0] - ends[0]).max() <= 2 * Q and np.abs(row[-1] - ends[1]).max() <= 2 * Q
    assert np.abs(row[3] - row[0]).max() > 0.01 and np.abs(row[3] - row[-1]).max() > 0.01  # in between
    assert v.walk(v.test_input(index=1), seeds=[6])["interpolation"] is None  # one seed: nothing to move between


def test_truncation_zero_gives_every_seed_the_noises_mean(synthesis_viewer, data_root):
    v = synthesis_viewer
    w = v.walk(v.test_input(index=0), seeds=[0, 1, 2], truncation=0)
    x = decode(w["samples"])
    assert w["truncation"] == 0.0 and np.abs(x - x[0]).max() == 0 and w["spread"] == 0.0
    labels = load_test("mnist-skeleton", size=4, extras=False, root=data_root, progress=False).images
    w = v.walk(v.test_input(index=3), seeds=[4], truncation=1.5)
    made = generate(v.model, labels, seed=4, truncation=1.5)[3]
    assert np.abs(decode(w["samples"])[0] - made.numpy()).max() <= Q
    assert w["spread"] is None and w["scores"][0]["seed"] == 4


def test_the_noise_map_conv1_maps_and_layers_are_the_first_seeds(synthesis_viewer):
    v = synthesis_viewer
    gen = v.model.generator
    inp = v.test_input(index=2)
    w = v.walk(inp, seeds=[3, 1])
    z = v.model.noise(3, 3)[2:]  # row 2 of seed 3's draw: the noise this pair gets in capsnet eval
    with torch.no_grad():
        noise = gen.noise(z).view(32, 32)
    assert np.abs(decode(w["noise_map"]) - noise.detach().numpy()).max() <= float(noise.abs().max()) * 2 * Q
    maps = F.leaky_relu(gen.conv1(torch.cat([inp.image[None], noise[None, None]], dim=1)), 0.01)[0].detach()
    got = decode(w["feature_maps"])  # (16, 32, 32), each map from 0 to its maximum
    top = maps.flatten(1).amax(1).clamp_min(1e-12)[:, None, None].numpy()
    assert got.shape == (16, 32, 32) and np.abs(got - maps.clamp_min(0).numpy()).max() <= (top * Q).max()
    lengths = generator_maps(v.model, inp.image, seed=3, row=2)  # the figures' path
    assert [layer["name"] for layer in w["layers"]] == list(lengths) == [layer["name"] for layer in v.info()["layers"]]
    for layer in w["layers"]:
        want = lengths[layer["name"]].numpy()
        assert np.abs(decode(layer["lengths"]) - want).max() <= want.max() * Q + 1e-7


@pytest.mark.parametrize("name, children", [
    ("conv_2_1", lambda g: g["primary"]),
    # SegCaps' skip: 4 + 4 types in gan_run (8 + 8 at the paper's width)
    ("deconv_1_2", lambda g: torch.cat([g["deconv_1_1"], g["conv_3_1"]], dim=1)),
])
def test_routing_at_a_layer_is_its_coupling_per_round(synthesis_viewer, name, children):
    v = synthesis_viewer
    layer = next(d for d in v.info()["layers"] if d["name"] == name)
    w = v.walk(v.test_input(index=2), routing=name, seeds=[4, 1])
    c = decode(w["routing"]["coupling"])  # (R, J, T, h, w)
    r = layer["routing"]
    assert w["routing"]["layer"] == name and r["rounds"] == 3
    assert c.shape == (r["rounds"], r["parents"], r["children"], *layer["grid"])
    # the layer routed again here, from the capsules the generator makes of test pair 2 under the first seed's noise
    gen = v.model.generator
    with torch.no_grad():
        grids = gen.capsule_grids(v.test_labels[2][None].float(), v.model.noise(3, 4)[2:])
        parents, result = gen.caps[name].route(children(grids), record=True)
    torch.testing.assert_close(parents, grids[name])  # the children given are the ones the generator routed
    P, R, T, J = result.rounds.shape
    h, w_ = grids[name].shape[-2:]
    expected = result.rounds.reshape(h, w_, R, T, J).permute(2, 4, 3, 0, 1).numpy()  # (R, J, T, h, w)
    hi = w["routing"]["coupling"]["hi"]
    np.testing.assert_allclose(c, expected, atol=hi / 255 + 1e-6)
    assert np.abs(c[-1] - c[0]).max() > 0.01  # the rounds differ: agreement moved the coupling
    np.testing.assert_allclose(c.sum(axis=1), 1.0, atol=r["parents"] * hi / 255)  # softmax over the parent types
    np.testing.assert_allclose(c[0], 1 / r["parents"], atol=hi / 255)  # round 1: uniform, before any agreement


def test_an_upload_is_row_0_as_capsnet_generate_makes_it(synthesis_viewer):
    v = synthesis_viewer
    label = v.test_labels[3]
    w = v.walk(v.image_input(label, {"kind": "upload", "size": [32, 32]}), seeds=[0, 1])
    made = generate(v.model, label[None], seed=1)[0]  # a folder of this one map
    assert w["truth"] is None and w["scores"] is None and w["source"]["kind"] == "upload"
    assert np.abs(decode(w["samples"])[1] - made.numpy()).max() <= Q
    again = v.walk(v.image_input(label, {"kind": "upload", "size": [32, 32]}), seeds=[0, 1])
    assert again["samples"] == w["samples"]  # deterministic in eval mode


def test_pix2pix_shows_its_dropout_samples_and_no_noise_vector(pix2pix_viewer):
    v = pix2pix_viewer
    info = v.info()
    assert info["kind"] == "synthesis" and info["noise"] == "dropout" and info["noise_dim"] == 0
    assert info["layers"] == [] and info["routing_layers"] == [] and info["interpolation_steps"] == 0
    assert info["routing"] is None  # no capsule layers
    w = v.walk(v.test_input(index=1), seeds=[0, 9])
    assert w["interpolation"] is None and w["noise_map"] is None and w["layers"] == [] and w["routing"] is None
    made = torch.stack([generate(v.model, v.test_labels, seed=s)[1] for s in (0, 9)])
    assert np.abs(decode(w["samples"]) - made.numpy()).max() <= Q
    assert w["spread"] > 0  # its dropout is its noise
    first = v.model.generator.down[0]
    maps = F.leaky_relu(first(v.test_labels[1][None]), 0.2)[0].detach()  # (64, 16, 16), as down[1] sees them
    top = maps.flatten(1).amax(1).clamp_min(1e-12)[:, None, None].numpy()
    assert np.abs(decode(w["feature_maps"]) - maps.clamp_min(0).numpy()).max() <= (top * Q).max()
    with pytest.raises(ViewerError, match="no noise vector to truncate"):
        v.walk(v.test_input(index=0), truncation=1.0)


@pytest.mark.parametrize("call, fragment", [
    (lambda v: v.walk(v.test_input(index=0), seeds=[]), "seeds must be a list of 1 to 8 integers"),
    (lambda v: v.walk(v.test_input(index=0), seeds=list(range(9))), "seeds must be a list of 1 to 8 integers"),
    (lambda v: v.walk(v.test_input(index=0), seeds=[1, -1]), "seeds must be a list of 1 to 8 integers"),
    (lambda v: v.walk(v.test_input(index=0), seeds=[True]), "seeds must be a list of 1 to 8 integers"),
    (lambda v: v.walk(v.test_input(index=0), seeds="0,1"), "seeds must be a list of 1 to 8 integers"),
    (lambda v: v.walk(v.test_input(index=0), seeds=[2, 2]), "repeats a seed"),
    (lambda v: v.walk(v.test_input(index=0), truncation=-1), "truncation must be a finite number >= 0"),
    (lambda v: v.walk(v.test_input(index=0), truncation=float("nan")), "truncation must be a finite number"),
    (lambda v: v.walk(v.test_input(index=0), truncation="1"), "truncation must be a finite number"),
    (lambda v: v.walk(v.test_input(index=0), routing="nope"), "unknown routing layer 'nope': the capsule layers"),
    (lambda v: v.test_input(index=4), "test index 4 out of range: the test set has 4 label maps, 0..3"),
    (lambda v: v.test_input(label=3), "picked by index"),
    (lambda v: v.image_input(torch.zeros(1, 28, 28), {"kind": "upload"}), "image must be (1, 32, 32)"),
    (lambda v: v.reconstruct([0.0] * 16, 0), "no digit capsules to move"),
])
def test_bad_requests_are_named(synthesis_viewer, call, fragment):
    with pytest.raises(ViewerError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        call(synthesis_viewer)


def test_the_other_kinds_of_model_are_refused_with_where_they_open():
    with pytest.raises(ViewerError, match="SynthesisViewer shows a synthesis model"):
        SynthesisViewer(create_model("unet"))
    model = create_model("capspix2pix")
    with pytest.raises(ViewerError, match="test_images must give one image"):
        SynthesisViewer(model, test_labels=torch.zeros(2, 1, 32, 32), test_images=torch.zeros(2, 1, 28, 28))
    with pytest.raises(ViewerError, match=r"test label maps are \(1, 28, 28\) but the model takes \(1, 32, 32\)"):
        SynthesisViewer(model, test_labels=torch.zeros(2, 1, 28, 28), test_images=torch.zeros(2, 1, 28, 28))


def test_load_viewer_opens_a_gan_run_on_its_test_pairs(gan_run, data_root, monkeypatch):
    monkeypatch.setattr("capsnet.viz.synthesis.SYNTHESIS_TEST_SIZE", 6)
    v = load_viewer(gan_run, data_dir=data_root, progress=False)
    assert isinstance(v, SynthesisViewer) and v.info()["test_size"] == 6 and v.dataset == "mnist-skeleton"
    test = load_test("mnist-skeleton", size=6, extras=False, root=data_root, progress=False)
    assert torch.equal(v.test_labels, test.images) and torch.equal(v.test_images, test.components)
    assert v.info()["classes"] == list(test.classes) and torch.equal(v.test_classes, test.labels)
    with pytest.raises(ViewerError, match="capspix2pix is a synthesis model but mnist-segmentation is a segmentation "
                                          "data set: open it on mnist-skeleton, mnist-sample-skeleton \\(offline\\), "
                                          "fashion-silhouette or pairs:DIR"):
        load_viewer(gan_run, dataset="mnist-segmentation", data_dir=data_root, progress=False)


def test_the_json_of_a_full_walk_stays_small(synthesis_viewer):
    v = synthesis_viewer
    info = v.info()
    w = v.walk(v.test_input(index=0), seeds=list(range(8)), routing="conv_2_1")
    assert len(json.dumps(info)) < 8_000 and len(json.dumps(w)) < 200_000


def test_a_run_on_the_users_own_pairs_opens_on_them_without_classes(tmp_path):
    from PIL import Image

    from capsnet.gan import fit_gan
    from capsnet.models import CapsPix2pixConfig
    from capsnet.train import TrainConfig

    rng = np.random.default_rng(0)
    for k in range(6):
        for sub, a in (("labels", (rng.random((16, 16)) > 0.6) * 255), ("images", rng.integers(0, 256, (16, 16)))):
            (tmp_path / "d" / sub).mkdir(parents=True, exist_ok=True)
            Image.fromarray(a.astype(np.uint8)).save(tmp_path / "d" / sub / f"p{k}.png")
    name = f"pairs:{tmp_path / 'd'}"
    small = CapsPix2pixConfig(input_height=16, input_width=16, noise_dim=8, disc_channels=4,
                              level_widths=(0.25, 0.25, 0.25, 0.25))  # what the viewer opens on, not the model's size
    fit_gan(small, TrainConfig(dataset=name, epochs=1, batch_size=4), tmp_path / "run", device="cpu", progress=False)
    v = load_viewer(tmp_path / "run", progress=False)
    test = load_test(name, extras=False, progress=False)  # the pairs held out for testing, every one
    info = v.info()
    assert info["dataset"] == name and info["classes"] == [] and info["test_size"] == len(test) >= 1
    w = v.walk(v.test_input(index=0), seeds=[0, 1])
    assert w["source"] == {"kind": "test", "index": 0} and len(w["scores"]) == 2  # scored, but no class to name
    assert np.abs(decode(w["truth"]) - test.components[0].numpy()).max() <= Q


def test_a_rows_truncated_noise_is_that_row_of_the_truncated_draw(synthesis_viewer):
    from capsnet.synthesis import row_noise

    m = synthesis_viewer.model
    for row, t in [(0, None), (5, 0.7), (37, 0.0), (37, 2.5)]:
        torch.testing.assert_close(row_noise(m, row, 9, truncation=t), m.noise(row + 1, 9, truncation=t)[row:],
                                   rtol=0, atol=0)
    with pytest.raises(ValueError, match="truncation must be a finite number >= 0"):
        row_noise(m, 0, 0, truncation=-1.0)


def test_the_info_names_the_generators_routing(synthesis_viewer):
    """The page's header says which algorithm the capsule layers route by (CapsPix2pix takes self-attention too)."""
    from capsnet.models import create_model
    from capsnet.viz import SynthesisViewer

    assert synthesis_viewer.info()["routing"] == "dynamic"
    assert synthesis_viewer.info()["upload_style"] == "as-is"  # label maps are taken as they are
    torch.manual_seed(0)
    model = create_model("capspix2pix", routing="self-attention")
    routed = SynthesisViewer(model, test_labels=torch.zeros(2, 1, 32, 32), test_images=torch.zeros(2, 1, 32, 32))
    assert routed.info()["routing"] == "self-attention" and len(routed.info()["routing_layers"]) == 12


def test_the_noise_map_is_sent_on_a_range_symmetric_about_zero_and_the_maps_each_on_their_own(synthesis_viewer):
    """The noise map is encoded on [-m, m], m its largest magnitude, so that 0 is the middle grey whatever the draw;
    each first-layer feature map from 0 to its own maximum. Found by mutation testing (2026-11-30): the noise map's
    range from its minimum to its maximum, and one range shared by every feature map, both survived the suite."""
    import numpy as np

    from capsnet.viz import decode

    v = synthesis_viewer
    w = v.walk(v.test_input(index=2), seeds=[1, 5])
    noise = w["noise_map"]
    assert noise is not None
    assert noise["lo"] == -noise["hi"] and noise["hi"] == pytest.approx(float(np.abs(decode(noise)).max()), rel=1e-6)
    fm = w["feature_maps"]
    K = fm["shape"][0]
    assert fm["lo"] == [0.0] * K and len(fm["hi"]) == K
    np.testing.assert_allclose(decode(fm).reshape(K, -1).max(axis=1), fm["hi"], rtol=1e-6, atol=1e-9)
