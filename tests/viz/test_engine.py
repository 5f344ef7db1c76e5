"""capsnet.viz.engine: the per-layer views against the model's own forward pass."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from capsnet import CapsNet
from capsnet.viz import SWEEP_HALF_RANGE, Viewer, ViewerError, decode, encode


def test_encode_round_trip_within_one_step():
    x = torch.randn(3, 5, 7)
    e = encode(x)
    assert e["shape"] == [3, 5, 7]
    step = (x.max() - x.min()).item() / 255
    np.testing.assert_allclose(decode(e), x.numpy(), atol=step / 2 + 1e-6)
    # one range per entry of the first axis
    e = encode(x, (-x.abs().amax(dim=(1, 2))).tolist(), x.abs().amax(dim=(1, 2)).tolist())
    assert len(e["lo"]) == 3 and e["lo"][0] == -e["hi"][0]
    for k in range(3):
        np.testing.assert_allclose(decode(e)[k], x[k].numpy(), atol=x[k].abs().max().item() / 255 + 1e-6)
    # values outside a given range are clipped, a constant array does not divide by zero
    assert decode(encode(torch.tensor([-1.0, 0.5, 2.0]), 0.0, 1.0)).tolist() == pytest.approx([0, 128 / 255, 1])
    assert decode(encode(torch.full((4,), 3.0))).tolist() == [3.0] * 4


@pytest.mark.parametrize("name, options", [("capsnet", {"padding": "same", "conv1_channels": 8, "primary_types": 2,
                                                           "decoder_hidden": (16,)}),
                                            ("em-capsnet-small", {"conv1_batch_norm": True})])
def test_conv1_maps_are_the_ones_the_primary_capsules_read(name, options):
    """A review (2026-12-01): the viewer drew ReLU(conv1(x)) for every model, where CapsNet under padding "same" pads
    the input first (20x20 maps drawn where the network makes 28x28) and EM's conv1 may have a batch norm."""
    from capsnet.models import create_model

    torch.manual_seed(0)
    model = create_model(name, num_classes=10, input_height=28, input_width=28, **options).eval()
    if name == "em-capsnet-small":  # a batch norm off its start (running statistics of 0 and 1 change nothing)
        with torch.no_grad():
            model.conv1_norm.running_mean.uniform_(-0.5, 0.5)
            model.conv1_norm.running_var.uniform_(0.5, 2.0)
    seen = []
    hook = model.primary.register_forward_pre_hook(lambda m, args: seen.append(args[0].detach().clone()))
    v = Viewer(model)
    inp = v.image_input(torch.rand(1, 28, 28), {"kind": "upload"})
    w = v.walk(inp)
    hook.remove()
    seen.clear()
    model.primary.register_forward_pre_hook(lambda m, args: seen.append(args[0].detach().clone()))
    with torch.no_grad():
        model(inp.image[None])
    want = seen[0][0]  # what the primary capsules read
    if name == "capsnet":  # padded again for the primary capsules' 9x9 at stride 2: the maps inside that border
        left, right, top, bottom = model._pads[1]
        want = want[:, top:want.shape[1] - bottom, left:want.shape[2] - right]
        assert tuple(want.shape[1:]) == (28, 28)
    fm = decode(w["feature_maps"])
    assert fm.shape == tuple(want.shape) and list(fm.shape[1:]) == v.info()["conv1"]["map"]
    np.testing.assert_allclose(fm, want.numpy(), atol=want.amax().item() / 255 + 1e-6)


def test_walk_matches_the_model(viewer: Viewer):
    model: CapsNet = viewer.model
    cfg = model.config
    inp = viewer.test_input(index=7)
    w = viewer.walk(inp)
    x = inp.image.unsqueeze(0)
    with torch.no_grad():
        out = model(x)
        maps = torch.relu(model.conv1(x))[0]
        u = model.primary(torch.relu(model.conv1(x)))[0]
    rows, cols = cfg.primary_grid
    R = cfg.routing_iterations
    assert w["predicted"] == int(out.lengths.argmax())
    np.testing.assert_allclose(w["lengths"], out.lengths[0].numpy(), atol=1e-5)
    np.testing.assert_allclose(w["poses"], out.poses[0].numpy(), atol=1e-5)
    np.testing.assert_allclose(decode(w["reconstruction"]), out.reconstructions[0].numpy(), atol=0.5 / 255 + 1e-6)
    np.testing.assert_allclose(decode(w["input"]), inp.image.numpy(), atol=0.5 / 255 + 1e-6)
    fm = decode(w["feature_maps"])
    assert fm.shape == (cfg.conv1_channels, 20, 20)
    np.testing.assert_allclose(fm, maps.numpy(), atol=maps.max().item() / 255)
    pl = decode(w["primary_lengths"])
    np.testing.assert_allclose(pl, u.norm(dim=-1).reshape(cfg.primary_types, rows, cols).numpy(), atol=1 / 255)
    # coupling: (rounds, J, types, rows, cols), numbered as capsnet figures numbers them: round r + 1 used c[r],
    # round 1 is uniform and the last round's is the model's own coupling
    c = decode(w["coupling"])
    assert c.shape == (R, cfg.num_classes, cfg.primary_types, rows, cols)
    used_in_last_round = out.coupling[0].T.reshape(cfg.num_classes, cfg.primary_types, rows, cols).numpy()
    np.testing.assert_allclose(c[R - 1], used_in_last_round, atol=w["coupling"]["hi"] / 255)
    np.testing.assert_allclose(c[0], 1 / cfg.num_classes, atol=w["coupling"]["hi"] / 255)
    np.testing.assert_allclose(c.sum(axis=1), 1.0, atol=cfg.num_classes * w["coupling"]["hi"] / 255)  # softmax over J
    assert w["source"] == {"kind": "test", "index": 7, "label": int(viewer.test_labels[7]),
                           "label_name": viewer.classes[int(viewer.test_labels[7])]}


def test_reconstruct_moves_only_with_the_pose(viewer: Viewer):
    w = viewer.walk(viewer.test_input(index=3))
    j = w["predicted"]
    same = viewer.reconstruct(w["poses"][j], j)  # the poses as sent: rounded to 6 decimals, so a pixel may
    np.testing.assert_allclose(decode(same["reconstruction"]), decode(w["reconstruction"]), atol=1 / 255 + 1e-6)  # step
    pose = list(w["poses"][j])
    pose[5] += SWEEP_HALF_RANGE
    moved = decode(viewer.reconstruct(pose, j)["reconstruction"])
    with torch.no_grad():
        p = torch.zeros(1, 10, 16)
        p[0, j] = torch.tensor(pose)
        expected = viewer.model.reconstruct(p, torch.tensor([j]))[0].numpy()
        p[0, j] = torch.tensor(w["poses"][j])
        unmoved = viewer.model.reconstruct(p, torch.tensor([j]))[0].numpy()
    assert np.abs(expected - unmoved).max() > 1e-4  # the decoder does respond to dimension 5
    np.testing.assert_allclose(moved, expected, atol=0.5 / 255 + 1e-6)


def test_kernels_are_conv1_weights(viewer: Viewer):
    k = viewer.kernels()["kernels"]
    w = viewer.model.conv1.weight.detach()
    assert k["shape"] == list(w.shape)
    assert k["lo"] == pytest.approx((-w.abs().amax(dim=(1, 2, 3))).tolist())
    np.testing.assert_allclose(decode(k), w.numpy(), atol=w.abs().max().item() / 255 + 1e-6)


def test_pick_by_class(viewer: Viewer):
    labels = viewer.test_labels
    for k in (0, 4, 9):
        where = (labels == k).nonzero().flatten()
        assert viewer.test_input(label=k).source["index"] == int(where[0])
        assert viewer.test_input(label=k, nth=1).source["index"] == int(where[1])
        assert viewer.test_input(label=k, nth=len(where)).source["index"] == int(where[0])  # wraps around


@pytest.mark.parametrize("kwargs, fragment", [
    ({"index": 10**6}, "out of range"), ({"index": -1}, "out of range"),
    ({"index": True}, "test index must be an integer, got True"), ({"index": "3"}, "must be an integer, got '3'"),
    ({"label": 10}, "unknown class"), ({"label": 2.0}, "unknown class"),
    ({"label": 1, "nth": -1}, "nth must be"),
])
def test_bad_picks(viewer: Viewer, kwargs, fragment):
    with pytest.raises(ViewerError, match=fragment):
        viewer.test_input(**kwargs)


@pytest.mark.parametrize("pose, capsule, fragment", [
    ([0.0] * 15, 1, "list of 16 numbers, got 15"), ([0.0] * 17, 1, "got 17"), ("0" * 16, 1, "got str"),
    ([float("nan")] + [0.0] * 15, 1, "finite"), ([float("inf")] + [0.0] * 15, 1, "finite"),
    (["a"] + [0.0] * 15, 1, "finite"), ([None] * 16, 1, "finite"), ([True] * 16, 1, "finite"),
    ([0.0] * 16, 10, "unknown capsule"), ([0.0] * 16, -1, "unknown capsule"), ([0.0] * 16, "1", "unknown capsule"),
])
def test_bad_poses(viewer: Viewer, pose, capsule, fragment):
    with pytest.raises(ViewerError, match=fragment):
        viewer.reconstruct(pose, capsule)


def test_test_images_must_fit_the_model():
    model = CapsNet()
    with pytest.raises(ViewerError, match=r"test images are \(1, 36, 36\) but the model takes \(1, 28, 28\)"):
        Viewer(model, test_images=torch.zeros(2, 1, 36, 36, dtype=torch.uint8), test_labels=torch.zeros(2))


def test_a_capsule_model_without_a_convolution_is_refused_by_name_not_a_stopiteration():
    """The viewer draws the first nn.Conv2d's kernels and maps; a registered capsule model without one was a
    StopIteration traceback from the viewer's constructor (a review of adding a model, 2026-12-02)."""
    import torch.nn.functional as F
    from torch import nn

    class Convolving(nn.Module):  # the same convolution, not an nn.Conv2d
        def __init__(self, conv: nn.Conv2d) -> None:
            super().__init__()
            self.weight, self.bias = conv.weight, conv.bias
            self.kernel_size, self.stride, self.padding = conv.kernel_size, conv.stride, conv.padding

        def forward(self, x):
            return F.conv2d(x, self.weight, self.bias, self.stride, self.padding)

    model = CapsNet()
    for name, module in list(model.named_modules()):
        if isinstance(module, nn.Conv2d):
            parent, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(parent), leaf, Convolving(module))
    assert model(torch.zeros(1, 1, 28, 28)).poses.shape == (1, 10, 16)  # the model itself still runs
    with pytest.raises(ViewerError, match="the viewer draws the first convolution's kernels and feature maps, and "
                                          "CapsNet has no nn.Conv2d; give the model a convolution"):
        Viewer(model)


def test_a_routing_view_whose_grid_does_not_cover_the_routed_capsules_is_refused_when_the_viewer_opens():
    """It was a reshape error from the first walk, far from the model's routing_view (a review, 2026-12-02)."""
    model = CapsNet()
    own = model.routing_view
    model.routing_view = lambda images: own(images)._replace(grid=(32, 1, 1))
    with pytest.raises(ViewerError, match=r"CapsNet.routing_view: grid \(32, 1, 1\) must be \(types, rows, columns\) "
                                          r"of the 1152 capsules routed"):
        Viewer(model)


def test_other_input_sizes_and_class_names(data_root):
    """A 36x36 model (MultiMNIST's canvas) on real digits padded to 36x36, with its own class names."""
    from capsnet import CapsNetConfig
    from capsnet.data import load_dataset
    from capsnet.viz.images import mnist_style

    from PIL import Image

    torch.manual_seed(0)
    cfg = CapsNetConfig(input_height=36, input_width=36, conv1_channels=8, primary_types=2, decoder_hidden=(16,))
    test = load_dataset("mnist", "test", root=data_root, progress=False).subset(range(20))
    images = torch.nn.functional.pad(test.images, (4, 4, 4, 4))  # (20, 1, 36, 36)
    names = [f"digit {k}" for k in range(10)]
    viewer = Viewer(CapsNet(cfg), test_images=images, test_labels=test.labels, classes=names, dataset="padded")
    info = viewer.info()
    assert info["input"] == [1, 36, 36] and info["primary"]["grid"] == [10, 10] and info["classes"] == names
    assert info["trained"] is False and info["conv1"]["map"] == [28, 28]
    w = viewer.walk(viewer.test_input(index=3))
    assert w["feature_maps"]["shape"] == [8, 28, 28] and w["primary_lengths"]["shape"] == [2, 10, 10]
    assert w["coupling"]["shape"] == [3, 10, 2, 10, 10] and w["reconstruction"]["shape"] == [1, 36, 36]
    assert w["source"]["label_name"] == names[int(test.labels[3])]
    drawn = Image.fromarray(test.images[3, 0].numpy())
    x = mnist_style(drawn, viewer.shape)
    assert x.shape == (1, 36, 36)
    assert viewer.walk(viewer.image_input(x, {"kind": "upload"}))["input"]["shape"] == [1, 36, 36]


@pytest.mark.parametrize("bad", [10**400, 1e39, -2e9, float("nan")])
def test_reconstruct_refuses_numbers_a_float32_pose_cannot_hold(viewer, bad):
    pose = [0.0] * viewer.config.digit_dim
    pose[3] = bad
    with pytest.raises(ViewerError, match="finite numbers within"):
        viewer.reconstruct(pose, 0)


@pytest.mark.parametrize("name,small", [
    ("em-capsnet-small", dict(conv1_channels=8, primary_types=2, caps1_types=4, caps2_types=4)),
    ("efficient-capsnet", dict(decoder_hidden=(16, 32))),
    ("inverted-capsnet", dict(backbone_channels=8, primary_types=4, caps_types=4)),
    ("capsnet:em", dict(conv1_channels=8, primary_types=2, decoder_hidden=(16, 32), routing="em")),
])
def test_the_viewer_walks_every_capsule_model(name, small):
    from capsnet.models import create_model

    torch.manual_seed(0)
    model = create_model(name.partition(":")[0], num_classes=10, input_height=28, input_width=28, **small)
    v = Viewer(model)
    info = v.info()
    inp = v.image_input(torch.rand(1, 28, 28), {"kind": "upload"})
    w = v.walk(inp)
    T, rows, cols = info["primary"]["types"], *info["primary"]["grid"]
    R = info["routing_iterations"]
    assert info["routing"] == {"em-capsnet-small": "em", "efficient-capsnet": "self-attention",
                               "inverted-capsnet": "inverted", "capsnet:em": "em"}[name]
    c = decode(w["coupling"])
    assert c.shape == (R, 10, T, rows, cols) and decode(w["primary_lengths"]).shape == (T, rows, cols)
    assert w["primary_are"] == {"em-capsnet-small": "activations", "inverted-capsnet": "largest couplings"}.get(
        name, "lengths")  # the page's words
    with torch.no_grad():  # the model's own outputs for the image walked
        out = model.eval()(inp.image[None])
    np.testing.assert_allclose(w["lengths"], out.scores[0].numpy(), rtol=1e-5, atol=1e-6)
    own = out.coupling[0]  # (I, 10); the last round, the children reordered to (type, row, column)
    if name in ("em-capsnet-small", "inverted-capsnet"):  # their class layers flatten (row, column, type)
        own = own.view(rows, cols, T, 10).permute(2, 0, 1, 3)
    np.testing.assert_allclose(c[-1], own.reshape(T, rows, cols, 10).permute(3, 0, 1, 2).numpy(),
                               atol=w["coupling"]["hi"] / 255 + 1e-6)
    assert decode(w["feature_maps"]).shape == (info["conv1"]["channels"], *info["conv1"]["map"])
    if R > 1:  # iterative routings start uniform; self-attention's one round is its softmax
        np.testing.assert_allclose(c[0], 1 / 10, atol=w["coupling"]["hi"] / 255)
    assert len(w["lengths"]) == 10 and w["predicted"] == int(np.argmax(w["lengths"]))
    assert (w["reconstruction"] is not None) == info["decoder"] == (name in ("efficient-capsnet", "capsnet:em"))
    if not info["decoder"]:
        with pytest.raises(ViewerError, match="has no decoder"):
            v.reconstruct([0.0] * info["digit_dim"], 0)


def test_the_viewer_says_which_save_of_its_checkpoint_it_shows(viewer: Viewer, trained_run, data_root):
    """A run training on replaces its files while a viewer shows the one it read: the page named the file alone
    (a review, 2026-11-30); info() and the header give the save point read (epoch, or epoch + batches)."""
    from capsnet.checkpoint import load_checkpoint, saved_point
    from capsnet.viz import load_viewer

    assert viewer.info()["saved"] == saved_point(load_checkpoint(trained_run, "best").state)
    last = load_viewer(trained_run, which="last", data_dir=data_root, progress=False, test_size=10)
    assert last.info()["saved"] == saved_point(load_checkpoint(trained_run, "last").state) == "epoch 2"
    assert load_viewer(None, progress=False, test_size=10).info()["saved"] is None  # untrained: no save


def test_the_viewer_says_when_its_checkpoint_file_has_been_saved_again(trained_run, data_root, tmp_path):
    """A run training on saves its checkpoint again while a viewer shows the weights it read: nothing said so (a
    review's suggestion, 2026-11-30); info() now does ("changed"), and the page shows it."""
    import os
    import shutil

    from capsnet.viz import load_viewer

    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    viewer = load_viewer(run, data_dir=data_root, progress=False, test_size=10)
    assert "changed" not in viewer.info() and viewer.file_changed() is None
    os.utime(run / "best.safetensors", ns=(0, 0))
    assert viewer.file_changed() == (f"best.safetensors has been saved again since the viewer read it "
                                     f"({viewer.saved}); the page shows the weights it read: restart capsnet viz "
                                     f"to see the new ones")
    assert viewer.info()["changed"] == viewer.file_changed()
    fresh = load_viewer(run, data_dir=data_root, progress=False, test_size=10)  # restarted: the file as it is now
    assert fresh.file_changed() is None
    shutil.copy(run / "last.safetensors", tmp_path / "saved")
    os.replace(tmp_path / "saved", run / "best.safetensors")  # as capsnet saves: a new file renamed over the old
    assert fresh.file_changed().startswith("best.safetensors has been saved again")
    (run / "best.safetensors").unlink()
    assert fresh.info()["changed"] == ("best.safetensors is no longer on disk; the page shows the weights the viewer "
                                       "read from it")
    for untouched in (load_viewer(None, progress=False, test_size=10),  # no file; a shipped one is the install's
                      load_viewer("pretrained:capsnet-mnist-small", progress=False, test_size=10)):
        assert untouched.file_changed() is None and "changed" not in untouched.info()


def test_walk_sends_each_feature_map_on_its_own_range_and_the_coupling_from_zero(viewer: Viewer):
    """The arrays' ranges as the page reads them (value = lo + byte / 255 * (hi - lo)): one range per feature map,
    0 to that map's own maximum (a weak map is not drawn dim against the strongest), and the coupling from 0 to its
    largest coefficient. Found by mutation testing (2026-11-30): one range shared by every map, and the coupling's
    range from its minimum, both survived the suite (its tolerances absorb either)."""
    model: CapsNet = viewer.model
    inp = viewer.test_input(index=7)
    w = viewer.walk(inp)
    with torch.no_grad():
        maps = torch.relu(model.conv1(inp.image.unsqueeze(0)))[0]
    fm = w["feature_maps"]
    assert fm["lo"] == [0.0] * maps.shape[0]
    np.testing.assert_allclose(fm["hi"], maps.flatten(1).amax(dim=1).clamp_min(1e-12).numpy(), rtol=1e-6)
    c = w["coupling"]
    assert c["lo"] == 0.0 and c["hi"] == pytest.approx(float(decode(c).max()), rel=1e-6)


def test_reconstruct_decodes_the_pose_from_the_capsule_asked_for(viewer: Viewer):
    """The sliders' call: the pose goes into the chosen digit capsule, the others zero, and the decoder reads that
    capsule (CapsNet's reconstruction masks all but the label's). Found by mutation testing (2026-11-30): a pose
    written into capsule 0 whatever capsule was asked for survived the suite."""
    model: CapsNet = viewer.model
    inp = viewer.test_input(index=7)
    pose = viewer.walk(inp)["poses"][3]
    got = decode(viewer.reconstruct(pose, 3)["reconstruction"])
    poses = torch.zeros(1, model.config.num_classes, len(pose))
    poses[0, 3] = torch.tensor(pose)
    with torch.no_grad():
        expected = model.reconstruct(poses, torch.tensor([3]))[0].numpy()
    np.testing.assert_allclose(got, expected, atol=0.5 / 255 + 1e-6)
    assert np.abs(got - decode(viewer.reconstruct(pose, 0)["reconstruction"])).max() > 2 / 255  # another capsule


def test_the_pose_sliders_span_the_papers_plus_minus_0_25(viewer: Viewer):
    """Figure 4 of Sabour et al. 2017 moves each dimension within [-0.25, 0.25]; the page's sliders read
    info()["sweep_half_range"]. Found by mutation testing (2026-11-30): the tests compared with the constant itself,
    so another range survived."""
    assert SWEEP_HALF_RANGE == 0.25 and viewer.info()["sweep_half_range"] == 0.25
    from capsnet.figures.arrays import DEFAULT_DELTAS

    assert (DEFAULT_DELTAS[0], DEFAULT_DELTAS[-1], len(DEFAULT_DELTAS)) == (-0.25, 0.25, 11)


def test_a_run_without_best_is_opened_from_its_last_with_one_warning(trained_run, data_root, tmp_path):
    """A run folder without best.safetensors (stopped before its first evaluation): the viewer falls back to its
    last save and says so once, not twice (the viewer resolved the folder, then load_model again: a review,
    2026-12-01)."""
    import shutil
    import warnings

    from capsnet.viz import load_viewer

    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    (run / "best.safetensors").unlink()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        load_viewer(run, data_dir=data_root, progress=False, test_size=10)
    fallback = [w for w in said if "holds no best.safetensors" in str(w.message)]
    assert len(fallback) == 1, [str(w.message) for w in said]
