"""capsnet.viz.segmentation: the segmentation views against the model's own output, computed again here."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from capsnet import CapsNet
from capsnet.data.segmentation import dice_iou
from capsnet.data.tasks import load_test
from capsnet.models import SegCaps, SegCapsR1Config
from capsnet.viz import SegmentationViewer, Viewer, ViewerError, decode, load_viewer

STEP = 0.5 / 255 + 1e-6  # encode's rounding on a [0, 1] range
SEGMENTATION_TEST_SIZE = 16  # the test canvases of the segmentation_viewer fixture (tests/viz/conftest.py)


def test_the_walk_is_the_models_output_thresholded_and_scored(segmentation_viewer, data_root):
    v = segmentation_viewer
    model: SegCaps = v.model
    inp = v.test_input(index=3)
    w = v.walk(inp)
    test = load_test("mnist-segmentation", size=SEGMENTATION_TEST_SIZE, extras=False, root=data_root, progress=False)
    x, truth = test.images[3:4].float(), test.labels[3:4]  # (1, 1, 64, 64) each: the canvas as capsnet eval sees it
    with torch.no_grad():
        out = model(x)
        maps = F.relu(F.conv2d(x, model.conv1.weight, model.conv1.bias, padding=2))[0]  # (16, 64, 64)
    prob = out.probabilities  # (1, 1, 64, 64)
    mask = (prob > 0.5).to(torch.uint8)
    assert w["source"] == {"kind": "test", "index": 3}
    np.testing.assert_allclose(decode(w["input"]), x[0].numpy(), atol=STEP)
    np.testing.assert_allclose(decode(w["probability"]), prob[0].numpy(), atol=STEP)
    np.testing.assert_array_equal(decode(w["mask"]), mask[0].numpy())  # exactly the threshold: 0 and 1 encode exactly
    np.testing.assert_array_equal(decode(w["truth"]), truth[0].numpy())
    dice, iou = dice_iou(mask, truth)
    assert w["dice"] == pytest.approx(dice.item()) and w["iou"] == pytest.approx(iou.item())
    assert w["pixels"] == {"predicted": int(mask.sum()), "truth": int(truth.sum())}
    # the reconstruction the model makes without a mask: the segmentation capsules masked by the prediction
    np.testing.assert_allclose(decode(w["reconstruction"]), out.reconstructions[0].numpy(), atol=STEP)
    fm = decode(w["feature_maps"])
    np.testing.assert_allclose(fm, maps.numpy(), atol=maps.amax().item() / 255)
    assert w["routing"] is None


def test_each_layer_is_the_length_of_its_capsule_grid(segmentation_viewer):
    v = segmentation_viewer
    inp = v.test_input(index=5)
    w = v.walk(inp)
    with torch.no_grad():
        grids = v.model.capsule_grids(inp.image[None])
    assert [layer["name"] for layer in w["layers"]] == list(grids) == [layer["name"] for layer in v.info()["layers"]]
    assert list(grids)[:3] == ["conv1", "primary", "conv_2_1"] and list(grids)[-1] == "seg_caps"
    for layer, (name, g) in zip(w["layers"], grids.items()):
        lengths = g[0].pow(2).sum(dim=1).sqrt()  # (T, H', W')
        e = layer["lengths"]
        assert e["lo"] == 0.0 and e["hi"] == pytest.approx(lengths.max().item())
        np.testing.assert_allclose(decode(e), lengths.numpy(), atol=e["hi"] / 255 + 1e-6, err_msg=name)
    # the segmentation capsule's length is the probability map
    np.testing.assert_allclose(decode(w["layers"][-1]["lengths"]), decode(w["probability"]), atol=2 / 255)


@pytest.mark.parametrize("layer, children", [
    ("conv_2_1", lambda g: g["primary"]),
    ("deconv_1_2", lambda g: torch.cat([g["deconv_1_1"], g["conv_3_1"]], dim=1)),  # SegCaps' skip: 4 + 4 types
])
def test_routing_at_a_layer_is_that_layers_recorded_coupling(segmentation_viewer, layer, children):
    v = segmentation_viewer
    inp = v.test_input(index=1)
    w = v.walk(inp, routing=layer)
    with torch.no_grad():
        grids = v.model.capsule_grids(inp.image[None])
        parents, result = v.model.caps[layer].route(children(grids), record=True)
    torch.testing.assert_close(parents, grids[layer])  # the children given are the ones the model routed
    P, R, T, J = result.rounds.shape
    H, W = grids[layer].shape[-2:]
    expected = result.rounds.reshape(H, W, R, T, J).permute(2, 4, 3, 0, 1).numpy()  # (R, J, T, H', W')
    r = w["routing"]
    assert r["layer"] == layer and r["coupling"]["shape"] == [R, J, T, H, W]
    c = decode(r["coupling"])
    np.testing.assert_allclose(c, expected, atol=r["coupling"]["hi"] / 255 + 1e-6)
    # the last round is the layer's own coupling, and each child type's coefficients sum to 1 over the parent types
    np.testing.assert_allclose(c[-1], result.coupling.reshape(H, W, T, J).permute(3, 2, 0, 1).numpy(),
                               atol=r["coupling"]["hi"] / 255 + 1e-6)
    np.testing.assert_allclose(c.sum(axis=1), 1.0, atol=J * r["coupling"]["hi"] / 255)
    assert r["softmax"] == "parents"
    info_layer = next(layer_ for layer_ in v.info()["layers"] if layer_["name"] == layer)
    assert info_layer["routing"] == {"rounds": R, "children": T, "parents": J}


def test_a_layer_whose_softmax_runs_over_the_children_says_so():
    """The shipped SegCaps routes with its softmax over the child types: each parent's coefficients sum to 1 over
    them, so the mean over child types the page drew was 1/T at every position and round, its 8-bit rounding
    stretched black to white (a review of the page, 2026-12-02). The walk names the softmax; the page then draws
    each position's largest child share."""
    from capsnet.models import SegCapsConfig

    torch.manual_seed(0)
    v = SegmentationViewer(SegCaps(SegCapsConfig(routing_softmax="children", input_height=16, input_width=16)))
    w = v.walk(v.image_input(torch.rand(1, 16, 16), {"kind": "upload"}), routing="conv_2_1")
    r = w["routing"]
    assert r["softmax"] == "children"
    c = decode(r["coupling"])  # (R, J, T, H', W')
    np.testing.assert_allclose(c.sum(axis=2), 1.0, atol=c.shape[2] * r["coupling"]["hi"] / 255)  # over the children
    assert np.ptp(c.mean(axis=2)) <= 2 * r["coupling"]["hi"] / 255  # the mean: constant within rounding
    assert np.ptp(c.max(axis=2)) > 0.01  # the largest share is what varies


def test_info_and_the_json_of_a_walk_stay_small(segmentation_viewer):
    v = segmentation_viewer
    info = v.info()
    assert info["kind"] == "segmentation" and info["model_name"] == "segcaps-r1" and info["classes"] == []
    assert info["trained"] and info["dataset"] == "mnist-segmentation" and info["test_size"] == SEGMENTATION_TEST_SIZE
    assert info["decoder"] is True and info["input"] == [1, 64, 64] and info["threshold"] == 0.5
    assert info["upload_style"] == "as-is"  # its uploads are its input as they are ("mnist" before: a review)
    assert info["routing_layers"] == [layer["name"] for layer in info["layers"][1:]]  # all but conv1 route
    assert info["conv1"] == {"name": "conv1", "channels": 16, "kernel": 5, "map": [64, 64], "batch_norm": False}
    k = v.kernels()["kernels"]
    w = v.model.conv1.weight.detach()
    assert k["shape"] == [16, 1, 5, 5]
    np.testing.assert_allclose(decode(k), w.numpy(), atol=w.abs().max().item() / 255 + 1e-6)
    biggest = max((layer for layer in info["layers"] if layer["routing"]),  # the most coupling coefficients
                  key=lambda layer: np.prod([*layer["routing"].values(), *layer["grid"]]))
    w = v.walk(v.test_input(index=0), routing=biggest["name"])
    assert np.prod(w["routing"]["coupling"]["shape"]) == np.prod([*biggest["routing"].values(), *biggest["grid"]])
    assert len(json.dumps(w)) < 2_000_000


def test_a_paper_sized_segcaps_r3_walk_is_small_too():
    """The R3 paper model (3 rounds at every layer but the primary one), untrained: its largest walk under 2 MB."""
    torch.manual_seed(0)
    from capsnet.models import SegCapsConfig

    v = SegmentationViewer(SegCaps(SegCapsConfig()))
    w = v.walk(v.image_input(torch.rand(1, 64, 64), {"kind": "upload"}), routing="deconv_3_1")
    assert w["routing"]["coupling"]["shape"] == [3, 2, 4, 64, 64] and w["truth"] is None and w["dice"] is None
    assert len(json.dumps(w)) < 2_000_000
    assert v.info()["routing"] == "dynamic"
    routed = SegmentationViewer(SegCaps(SegCapsConfig(routing="self-attention", input_height=16, input_width=16)))
    w = routed.walk(routed.image_input(torch.rand(1, 16, 16), {"kind": "upload"}), routing="deconv_3_1")
    assert routed.info()["routing"] == "self-attention" and w["routing"]["coupling"]["shape"] == [1, 2, 4, 16, 16]


def test_a_walk_at_a_size_not_walked_before_gives_freed_memory_back(segmentation_viewer, monkeypatch):
    """Uploads of ever new sizes grew the viewer's RSS from 357 to 2,039 MB over 80 sizes, freed memory malloc kept
    (a review, 2026-12-02): a walk at a new size now releases it (memory.release_freed), one at a size seen before
    does not (the same size again costs no page faults)."""
    from capsnet import memory
    from capsnet.viz import segmentation

    calls = []
    monkeypatch.setattr(segmentation, "release_freed", lambda: calls.append(1) or True)
    v = segmentation_viewer
    new = {(side, side) for side in (16, 24, 32)} - v._sizes_seen  # (a session's viewer: other tests walked it)
    for side in (24, 32, 24, 16, 32, 16):
        v.walk(v.image_input(torch.rand(1, side, side), {"kind": "upload"}))
    assert len(calls) == len(new) and {(16, 16), (24, 24), (32, 32)} <= v._sizes_seen
    v._sizes_seen.discard((40, 40))
    v.walk(v.image_input(torch.rand(1, 40, 40), {"kind": "upload"}))
    v.walk(v.image_input(torch.rand(1, 40, 40), {"kind": "upload"}))
    assert len(calls) == len(new) + 1
    assert memory.release_freed() is True  # glibc here: applied


def test_the_unet_shows_its_first_convolution_and_prediction(unet_viewer):
    v = unet_viewer
    info = v.info()
    assert info["model_name"] == "unet" and info["layers"] == [] and info["routing_layers"] == []
    assert info["routing"] is None
    assert info["conv1"] == {"name": "down.0.0", "channels": 4, "kernel": 3, "map": [16, 16], "batch_norm": True}
    assert info["decoder"] is False and info["dataset"].startswith("folder:") and info["test_size"] == 3
    inp = v.test_input(index=1)
    w = v.walk(inp)
    x = inp.image[None]  # (1, 1, 16, 16)
    conv, bn = v.model.down[0][0], v.model.down[0][1]
    with torch.no_grad():
        prob = v.model(x).probabilities
        maps = F.relu(F.batch_norm(F.conv2d(x, conv.weight, conv.bias, padding=1), bn.running_mean, bn.running_var,
                                   bn.weight, bn.bias, eps=bn.eps))[0]  # (4, 16, 16): what the next layer sees
    np.testing.assert_allclose(decode(w["probability"]), prob[0].numpy(), atol=STEP)
    np.testing.assert_array_equal(decode(w["mask"]), (prob[0] > 0.5).numpy().astype(np.float32))
    np.testing.assert_allclose(decode(w["feature_maps"]), maps.numpy(), atol=maps.amax().item() / 255)
    dice, iou = dice_iou((prob > 0.5).to(torch.uint8), v.test_masks[1:2])
    assert w["dice"] == pytest.approx(dice.item()) and w["iou"] == pytest.approx(iou.item())
    assert w["layers"] == [] and w["routing"] is None and w["reconstruction"] is None
    assert v.kernels()["kernels"]["shape"] == [4, 1, 3, 3]
    with pytest.raises(ViewerError, match="UNet has no capsule layers; leave routing out"):
        v.walk(inp, routing="conv_2_1")


@pytest.mark.parametrize("call, fragment", [
    (lambda v: v.test_input(label=1), "no classes to pick from"),
    (lambda v: v.test_input(index=SEGMENTATION_TEST_SIZE), "out of range: the test set has 16 images, 0..15"),
    (lambda v: v.test_input(index="3"), "test index must be an integer, got '3'"),
    (lambda v: v.walk(v.test_input(index=0), routing="nope"), "unknown routing layer 'nope': the capsule layers "
                                                               "that route are primary, conv_2_1"),
    (lambda v: v.walk(v.test_input(index=0), routing=3), "unknown routing layer '3'"),
    (lambda v: v.walk(v.test_input(index=0), routing="conv1"), "unknown routing layer 'conv1'"),  # no routing there
    (lambda v: v.image_input(torch.rand(1, 28, 28), {}), r"image must be \(1, 64, 64\)"),
    (lambda v: v.image_input(torch.full((1, 64, 64), float("nan")), {}), "NaN"),
    (lambda v: v.reconstruct([0.0] * 16, 0), "segments images: it has no digit capsules to move"),
])
def test_bad_requests_are_named(segmentation_viewer, call, fragment):
    with pytest.raises(ViewerError, match=fragment):
        call(segmentation_viewer)


def test_each_viewer_refuses_the_other_kind_of_model():
    with pytest.raises(ViewerError, match="got SegCaps: a segmentation model opens in SegmentationViewer"):
        Viewer(SegCaps(SegCapsR1Config()))
    with pytest.raises(ViewerError, match="got CapsNet: a classification model opens in Viewer"):
        SegmentationViewer(CapsNet())
    with pytest.raises(ViewerError, match=r"test images are \(1, 32, 32\) but the model takes \(1, 64, 64\)"):
        SegmentationViewer(SegCaps(SegCapsR1Config()), test_images=torch.zeros(2, 1, 32, 32),
                           test_masks=torch.zeros(2, 1, 32, 32))
    with pytest.raises(ViewerError, match="one mask"):
        SegmentationViewer(SegCaps(SegCapsR1Config()), test_images=torch.zeros(2, 1, 64, 64))


def test_load_viewer_opens_the_data_set_of_the_right_kind(segmentation_run, trained_run, data_root, monkeypatch):
    with pytest.raises(ViewerError, match="segcaps-r1 is a segmentation model but mnist is a classification data set: "
                                          "open it on mnist-segmentation, mnist-sample-segmentation \\(offline\\) or "
                                          "folder:DIR"):
        load_viewer(segmentation_run, dataset="mnist", data_dir=data_root, progress=False)
    with pytest.raises(ViewerError, match="capsnet is a classification model but mnist-segmentation is a segmentation "
                                          "data set: open it on the data set it was trained on"):
        load_viewer(trained_run, dataset="mnist-segmentation", data_dir=data_root, progress=False)
    # by default the first SEGMENTATION_TEST_SIZE canvases of the fixed test set, numbered as capsnet eval numbers them
    monkeypatch.setattr("capsnet.viz.segmentation.SEGMENTATION_TEST_SIZE", 20)
    v = load_viewer(segmentation_run, data_dir=data_root, progress=False)
    assert isinstance(v, SegmentationViewer) and v.info()["test_size"] == 20
    test = load_test("mnist-segmentation", size=SEGMENTATION_TEST_SIZE, extras=False, root=data_root, progress=False)
    assert torch.equal(v.test_images[:SEGMENTATION_TEST_SIZE], test.images)


def test_the_first_convolutions_maps_are_sent_each_on_its_own_range(segmentation_viewer, unet_viewer):
    """Each feature map of the first convolution is encoded from 0 to its own maximum (one range per map, as the
    classifier's viewer sends them), so a weak map is not drawn dim beside the strongest: its largest value decodes
    exactly to its hi. Found by mutation testing (2026-11-30): one range shared by every map survived the suite."""
    import numpy as np

    from capsnet.viz import decode

    for v in (segmentation_viewer, unet_viewer):
        fm = v.walk(v.test_input(index=1))["feature_maps"]
        K = fm["shape"][0]
        assert isinstance(fm["hi"], list) and fm["lo"] == [0.0] * K and len(fm["hi"]) == K
        values = decode(fm).reshape(K, -1)
        np.testing.assert_allclose(values.max(axis=1), fm["hi"], rtol=1e-6, atol=1e-9)
