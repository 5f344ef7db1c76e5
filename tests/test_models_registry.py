"""Every registered model, through its registry entry: finite, trainable, batch-independent, counted."""
from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
import torch

from capsnet.models import MODELS, CapsNetConfig, create_model, list_models, model_name, num_weights

CLASSIFIERS = [n for n, spec in MODELS.items() if spec.kind == "classification"]  # segmentation: test_models_segmentation


class _Table(dict):
    """Each model's small sizes by name. A model without an entry is built at its registered sizes, with a warning
    (a new model is one file, its test and one registry line: these tables are a speed-up, not a step)."""

    def __missing__(self, name: str) -> Any:
        warnings.warn(f"{name!r} has no entry in tests/test_models_registry.py's SMALL table: the registry tests build "
                      f"it at its registered sizes; add the config fields that make it small if they are slow",
                      stacklevel=2)
        return {}


# Small sizes so each test runs in a moment; a new model may add its entry (without one: its registered sizes).
SMALL = _Table({
    "capsnet": dict(conv1_channels=8, primary_types=2, decoder_hidden=(16, 32)),
    "capsnet-cifar10": dict(conv1_channels=8, primary_types=2, in_channels=1),  # the tests here feed 1x28x28
    "capsnet-svhn": dict(conv1_channels=8, primary_types=2, in_channels=1, decoder_hidden=(16, 32)),
    "baseline": dict(channels=(4, 4), hidden=(8,)),
    "em-capsnet": dict(conv1_channels=8, primary_types=4, caps1_types=4, caps2_types=4),
    "em-capsnet-small": dict(conv1_channels=8, primary_types=2, caps1_types=4, caps2_types=4),
    "efficient-capsnet": dict(decoder_hidden=(16, 32)),
    "inverted-capsnet": dict(backbone_channels=8, primary_types=4, caps_types=4),
    "segcaps": {}, "segcaps-r1": {}, "unet": dict(base_channels=4, depth=2),
    "capspix2pix": dict(noise_dim=8, disc_channels=4), "capspix2pix-deep": dict(noise_dim=8, disc_channels=4),
    "pix2pix": dict(base_channels=4, disc_channels=4),
})


def test_the_small_table_names_registered_models_only():
    stale = sorted(set(SMALL) - set(MODELS))
    assert not stale, f"{stale} are no longer registered: take them out of SMALL"


def test_a_model_without_small_sizes_is_built_at_its_registered_ones_with_a_warning():
    with pytest.warns(UserWarning, match="'not-here' has no entry in tests/test_models_registry.py's SMALL table"):
        assert SMALL["not-here"] == {}


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_registered_model_trains_through_its_own_loss(name):
    torch.manual_seed(0)
    model = create_model(name, **SMALL[name], num_classes=10, input_height=28, input_width=28)
    assert model_name(model.config) == name and MODELS[name].config.from_dict(model.config.to_dict()) == model.config
    images, labels = torch.rand(4, 1, 28, 28), torch.tensor([0, 3, 3, 9])
    loss, scores = MODELS[name].loss(model, images, labels, recon_weight=0.0005, progress=0.5)
    assert scores.shape == (4, 10) and torch.isfinite(scores).all() and torch.isfinite(loss)
    loss.backward()
    for n, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, n
    # the config's own count where it has one (optional: README, "how to add one"), else counted on the meta device
    assert num_weights(model.config) == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_registered_model_scores_an_example_the_same_in_any_batch(name):
    torch.manual_seed(1)
    model = create_model(name, **SMALL[name], num_classes=10, input_height=28, input_width=28).eval()
    images = torch.rand(5, 1, 28, 28)
    with torch.no_grad():
        _, together = MODELS[name].loss(model, images, torch.zeros(5, dtype=torch.long), recon_weight=0.0)
        for k in (0, 3):
            _, alone = MODELS[name].loss(model, images[k:k + 1], torch.zeros(1, dtype=torch.long), recon_weight=0.0)
            torch.testing.assert_close(alone[0], together[k], rtol=1e-4, atol=1e-6)


# the slowest two to trace are slow tests: em-capsnet-small has em-capsnet's layers, and test_fast_paths.py trains
# the CapsNet compiled
COVERED_ELSEWHERE = {"em-capsnet", "capsnet"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in COVERED_ELSEWHERE else n
                                  for n in CLASSIFIERS])
def test_registered_model_compiles_as_one_graph_and_trains_as_eager(name):
    # capsnet train --compile MODE: the training step as one graph (fullgraph fails on any graph break, which CUDA
    # graphs, --compile reduce-overhead, could not take whole), with eager's loss and gradients. aot_eager traces
    # forward and backward as Inductor does, without its C++ build (Inductor itself: the slow tests of
    # test_fast_paths.py and test_models_segmentation.py)
    # At 2 routing rounds where a model's default is more: both kinds of round (with the agreement update or E-step,
    # and the last without) trace as at 3, in a third less time (em-capsnet-small: 7.5 s to about 5 s)
    torch._dynamo.reset()
    torch.manual_seed(0)
    rounds = {"routing_iterations": 2} if getattr(MODELS[name].config(), "routing_iterations", 0) > 2 else {}
    model = create_model(name, **SMALL[name], **rounds, num_classes=10, input_height=28, input_width=28)
    assert getattr(model.config, "routing_iterations", 2) >= 2  # an update round and a last one, each traced
    images, labels = torch.rand(4, 1, 28, 28), torch.tensor([0, 3, 3, 9])
    results = []
    for call in (model, torch.compile(model, backend="aot_eager", fullgraph=True, dynamic=False)):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(1)  # the same dropout masks (the baseline's) for both
        loss, scores = MODELS[name].loss(call, images, labels, recon_weight=0.0005, progress=0.5)
        loss.backward()
        results.append((loss.detach(), scores.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (loss0, scores0, grads0), (loss1, scores1, grads1) = results
    torch.testing.assert_close(loss1, loss0, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(scores1, scores0, rtol=1e-5, atol=1e-6)
    for n in grads0:
        torch.testing.assert_close(grads1[n], grads0[n], rtol=1e-4, atol=1e-6, msg=n)


def test_a_model_with_a_decoder_but_no_reconstruct_method_is_drawn_without_reconstructions():
    """Figures and the viewer took any `decoder` attribute for reconstructions and then called
    `model.reconstruct(...)`: a model of one's own with a decoder and no such method crashed both with an
    AttributeError (an extensibility review, 2026-12-03); and a classifier with neither a routing view nor a
    decoder was refused without a word of what to add."""
    from capsnet import figures as fg
    from capsnet.models import CapsNet, reconstructs
    from capsnet.viz import Viewer

    class NoReconstruct(torch.nn.Module):  # a CapsNet's parts with a decoder of its own use, no reconstruct
        def __init__(self, inner):
            super().__init__()
            self.inner, self.config, self.decoder = inner, inner.config, inner.decoder

        def forward(self, images, labels=None):
            return self.inner(images, labels)

        def routing_view(self, images):
            return self.inner.routing_view(images)

    torch.manual_seed(0)
    model = NoReconstruct(CapsNet(CapsNetConfig(**SMALL["capsnet"]))).eval()
    assert model.decoder is not None and not reconstructs(model)
    assert reconstructs(create_model("capsnet", **SMALL["capsnet"]))
    with pytest.raises(fg.FigureError, match=r"has a decoder but no reconstruct\(poses, index\) method: it cannot "
                                             r"reconstruct"):
        fg.reconstructions(model, torch.rand(2, 1, 28, 28))
    viewer = Viewer(model)
    assert viewer.info()["decoder"] is False
    walk = viewer.walk(viewer.image_input(torch.rand(1, 28, 28), {"kind": "upload"}))
    assert walk.get("reconstruction") is None and len(walk["lengths"]) == 10


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_every_registered_classifier_opens_in_the_viewer_and_draws_its_routing_or_is_refused_by_name(name):
    """Every capsule classifier (one with routing_view) walks an image in the viewer and draws its routing trace,
    its class scores the model's own; the rest are refused by the viewer and the routing figure in words. The
    viewer and figure tests name the shipped models: a model added since opened nowhere in the suite (a review of
    adding a model, 2026-12-02, found one without a convolution that crashed the viewer)."""
    from capsnet import figures as fg
    from capsnet.viz import Viewer, ViewerError, decode

    torch.manual_seed(0)
    model = create_model(name, **SMALL[name], num_classes=10, input_height=28, input_width=28).eval()
    if not hasattr(model, "routing_view"):
        with pytest.raises(ViewerError, match="the viewer looks inside a capsule model"):
            Viewer(model)
        with pytest.raises(fg.FigureError, match="routing maps need a capsule model"):
            fg.routing_trace(model, torch.rand(2, 1, 28, 28))
        return
    viewer = Viewer(model)
    info = viewer.info()
    walk = viewer.walk(viewer.image_input(torch.rand(1, 28, 28), {"kind": "upload"}))
    types, (rows, cols), rounds = info["primary"]["types"], info["primary"]["grid"], info["routing_iterations"]
    assert decode(walk["coupling"]).shape == (rounds, 10, types, rows, cols)
    assert len(walk["lengths"]) == 10 and np.isfinite(walk["lengths"]).all()
    x = torch.rand(3, 1, 28, 28)
    trace = fg.routing_trace(model, x)
    assert trace.coupling.shape == (3, rounds, types * rows * cols, 10) and trace.grid == (types, rows, cols)
    with torch.no_grad():
        torch.testing.assert_close(trace.lengths, model(x).scores)


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_bytes_and_one_hot_labels_are_refused_by_name(name):
    """uint8 images (load_dataset's, PIL's) reached the first convolution as a dtype error; one-hot labels were read
    as MultiMNIST pairs of classes 0 and 1 and trained on without a word."""
    import torch.nn.functional as F

    from capsnet.evaluate import evaluate

    model = create_model(name, **SMALL[name], num_classes=10, input_height=28, input_width=28)
    loss = MODELS[name].loss
    images, labels = torch.rand(4, 1, 28, 28), torch.tensor([0, 3, 3, 9])
    with pytest.raises(ValueError, match=r"images are torch.uint8; the models take floating-point images in \[0, 1\]: "
                                         r"capsnet.data.unit_float\(images\) converts 0-255 bytes"):
        model((images * 255).to(torch.uint8))
    with pytest.raises(ValueError, match=r"labels of shape \(4, 10\) look one-hot; give class indices \(B,\): "
                                         r"labels.argmax\(1\)"):
        loss(model, images, F.one_hot(labels, 10))
    with pytest.raises(ValueError, match=r"labels are torch.float32; give class indices as integers"):
        loss(model, images, labels.float())
    with pytest.raises(ValueError, match=r"labels must be \(4,\) class indices or \(4, 2\) pairs for 4 images, got "
                                         r"shape \(3,\)"):
        loss(model, images, labels[:3])
    loss(model, images, labels)  # indices, and pairs, as before
    loss(model, images, torch.tensor([[0, 1], [3, 4], [5, 9], [2, 8]]))
    # a NumPy array or a list met "'numpy.ndarray' object has no attribute 'dim'" or is_floating_point's TypeError
    with pytest.raises(TypeError, match=r"images must be a torch.Tensor, got numpy.ndarray: pass "
                                        r"torch.from_numpy\(images\)"):
        model(images.numpy())
    with pytest.raises(TypeError, match=r"labels must be a torch.Tensor, got list: pass torch.tensor\(labels\)"):
        loss(model, images, labels.tolist())
    with pytest.raises(TypeError, match=r"labels must be a torch.Tensor, got numpy.ndarray"):
        evaluate(model, images, labels.numpy())
    # a class past the last or below 0: torch's "Target 10 is out of bounds" (baseline, inverted) or "Class values
    # must be smaller than num_classes" (EM) reached the user from the loss and from evaluate

    for bad, got in (([0, 3, 3, 10], "from 0 to 10"), ([0, -1, 3, 9], "from -1 to 9"), ([[0, 1], [3, 10]] * 2, "")):
        said = r"class labels must be in 0\.\.9 for 10 class(es| capsules), got values " + got
        with pytest.raises(ValueError, match=said):
            loss(model, images, torch.tensor(bad))
        with pytest.raises(ValueError, match=said):
            evaluate(model, images, torch.tensor(bad), batch_size=2)


def test_evaluate_refuses_a_split_it_cannot_score():
    """An empty split was reported as 100% error, and mismatched counts, one-hot labels or batch_size 0 failed
    inside the loop with torch's own messages."""
    import torch.nn.functional as F

    from capsnet.evaluate import evaluate, evaluate_pairs, evaluate_segmentation

    model = create_model("capsnet", **SMALL["capsnet"])
    x, y = torch.rand(6, 1, 28, 28), torch.tensor([0, 1, 2, 3, 4, 5])
    for call, message in [
        (lambda: evaluate(model, x[:0], y[:0]), "no images to evaluate: the split is empty"),
        (lambda: evaluate(model, x, y[:4]), "6 images but 4 labels: give one entry of labels per image"),
        (lambda: evaluate(model, x, y, batch_size=0), "batch_size must be a positive integer, got 0"),
        (lambda: evaluate(model, x, F.one_hot(y, 10)), "look one-hot"),
        (lambda: evaluate(model, x, y.float()), "labels are torch.float32"),
        (lambda: evaluate(model, x, torch.stack([y, y], 1)), "are MultiMNIST pairs: score them with evaluate_pairs"),
        (lambda: evaluate_pairs(model, x, y[:2]), "6 images but 2 labels"),
        (lambda: evaluate_segmentation(create_model("unet", **SMALL["unet"]), torch.rand(2, 1, 16, 16),
                                       torch.zeros(3, 1, 16, 16)), "2 images but 3 masks"),
    ]:
        with pytest.raises(ValueError, match=message):
            call()
    r = evaluate(model, x, y, batch_size=4)  # and a good split scores as before: every image counted once
    assert r.confusion.sum() == 6 and r.confusion.sum(1).tolist() == [1, 1, 1, 1, 1, 1, 0, 0, 0, 0]
    with pytest.raises(ValueError, match="labels are torch.float32"):  # the decoder's mask is an index too
        model(x, y.float())
    assert model(x, torch.arange(10).expand(6, 10)).reconstructions.shape == (6, 10, 1, 28, 28)  # K decodes each


@pytest.mark.parametrize("name", [n for n, spec in MODELS.items() if spec.kind != "classification"])
def test_image_to_image_models_refuse_bytes_by_name(name):
    model = create_model(name, **SMALL[name], input_height=32, input_width=32)
    what = "label maps" if MODELS[name].kind == "synthesis" else "images"
    with pytest.raises(ValueError, match=f"{what} are torch.uint8; the models take floating-point {what} in"):
        model(torch.zeros(1, 1, 32, 32, dtype=torch.uint8))


@pytest.mark.parametrize("name", [n for n in MODELS if n in ("capsnet", "baseline", "em-capsnet-small", "unet")])
def test_numpy_numbers_from_a_sweep_are_the_numbers_they_hold(name):
    """np.int64(64) (np.arange, a pandas column) was refused as 'must be a positive integer, got np.int64(64)'."""
    import json

    import numpy as np

    from capsnet.train import TrainConfig

    small = {k: (np.int64(v) if isinstance(v, int) and not isinstance(v, bool) else
                 tuple(np.int64(x) for x in v) if isinstance(v, tuple) else v) for k, v in SMALL[name].items()}
    assert any(type(x).__module__ == "numpy" for v in small.values() for x in (v if isinstance(v, tuple) else (v,)))
    config = create_model(name, **small).config
    assert config == create_model(name, **SMALL[name]).config  # the same model
    assert json.loads(json.dumps(config.to_dict())) == create_model(name, **SMALL[name]).config.to_dict()
    train = TrainConfig(epochs=np.int64(3), lr=np.float32(0.5))
    assert type(train.epochs) is int and train.lr == 0.5 and type(train.lr) is float
    with pytest.raises(ValueError, match="must be"):  # a fraction is still not a count
        create_model(name, **SMALL[name] | {"num_classes": np.float64(3.5)})


def _inputs(model: torch.nn.Module, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Images (label maps for a synthesis model) of ``model``'s size and targets of ``batch`` examples: class
    indices, masks or images."""
    cfg, kind = model.config, MODELS[model_name(model.config)].kind
    H, W = getattr(cfg, "input_height", 64), getattr(cfg, "input_width", 64)
    images = torch.rand(batch, getattr(cfg, "in_channels", 1), H, W)
    targets = (torch.zeros(batch, dtype=torch.long) if kind == "classification" else
               torch.zeros(batch, 1, H, W) if kind == "segmentation" else
               torch.rand(batch, getattr(cfg, "out_channels", 1), H, W))
    return images, targets


@pytest.mark.filterwarnings("ignore:There is a performance drop")  # torch's: no batching rule for unfold's backward
@pytest.mark.parametrize("name", CLASSIFIERS)
def test_per_example_gradients_of_a_registered_loss_by_vmap_are_each_examples_own(name):
    """torch.func's vmap(grad), per-example gradients (DP-SGD, influence): the capsule mask and the margin and spread
    losses made their one-hot rows with F.one_hot, which reads the labels on the host and failed under the transform
    (a review of 2026-11-30); each example's gradient now equals its own, computed alone."""
    from torch.func import functional_call, grad, vmap

    class Loss(torch.nn.Module):  # the registered loss as a module, so functional_call swaps every weight it reads
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, x, y):
            return MODELS[name].loss(self.model, x, y, recon_weight=0.0005, progress=0.5)[0]

    torch.manual_seed(2)
    model = Loss(create_model(name, **SMALL[name], num_classes=10, input_height=28, input_width=28)).eval()
    params = {k: v.detach() for k, v in model.named_parameters()}
    images, labels = torch.rand(3, 1, 28, 28), torch.tensor([1, 7, 4])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the suite's workers run: at 2 threads EM's routing moved the two paths' float32
    try:  # rounding apart by up to 8e-6 in conv1's gradients (a plain `pytest` failed where `-n 2` passed)
        each = vmap(grad(lambda p, x, y: functional_call(model, p, (x[None], y[None]))), in_dims=(None, 0, 0))(
            params, images, labels)
        alone = [torch.autograd.grad(model(images[k:k + 1], labels[k:k + 1]), list(model.parameters()))
                 for k in range(3)]
    finally:
        torch.set_num_threads(threads)
    for k in range(3):
        for (n, g), a in zip(each.items(), alone[k]):
            torch.testing.assert_close(g[k], a, rtol=1e-4, atol=1e-6,
                                       msg=lambda m, n=n, k=k: f"{n}, example {k}: {m}")


@pytest.mark.parametrize("conv_e_step", ["child", "child-type"])
def test_em_capsnet_whose_children_are_shared_takes_no_images(conv_e_step):
    """conv_e_step child / child-type: an empty batch asked the routing to share the children of no images (a count of
    0, refused as "children needs num_children"); it gives empty outputs, as every other model does."""
    model = create_model("em-capsnet-small", **SMALL["em-capsnet-small"], conv_e_step=conv_e_step).eval()
    images, _ = _inputs(model, 0)
    with torch.no_grad():
        out = model(images)
    assert out.activations.shape == (0, model.config.num_classes)


@pytest.mark.parametrize("name", list(MODELS))
def test_no_images_give_no_outputs_and_a_loss_over_none_is_refused_not_nan(name):
    """Every model's forward on an empty batch gives empty outputs (the inverted-dot-product model's class layer
    reshaped with -1 and crashed); a loss over no examples was NaN (a mean of nothing, which an optimizer step
    writes into every weight) or a reshape error, and is now a ValueError."""
    model = create_model(name, **SMALL[name]).eval()
    images, targets = _inputs(model, 0)
    with torch.no_grad():
        out = model(images)
    fields = [out] if isinstance(out, torch.Tensor) else list(out) if isinstance(out, tuple) else vars(out).values()
    tensors = [v for v in fields if isinstance(v, torch.Tensor)]
    assert tensors and all(t.shape[0] == 0 for t in tensors), [tuple(t.shape) for t in tensors]
    # a user's own loss over none: zero gradients (EM's and the inverted model's fused backward reshaped the
    # gradient of no examples with -1 and crashed, a review of 2026-11-30)
    images.requires_grad_()
    out = model(images)
    fields = [out] if isinstance(out, torch.Tensor) else list(out) if isinstance(out, tuple) else vars(out).values()
    sum(v.float().sum() for v in fields if isinstance(v, torch.Tensor) and v.requires_grad).backward()
    assert images.grad is not None and images.grad.shape == images.shape
    with pytest.raises(ValueError, match=r"a loss over an empty batch \(0 examples\) is undefined"):
        if MODELS[name].kind == "synthesis":
            MODELS[name].loss(model, images, targets)
        else:
            MODELS[name].loss(model, images, targets, recon_weight=0.0005, progress=0.5)
    loss = MODELS[name].loss(model, *_inputs(model, 2), **({} if MODELS[name].kind == "synthesis" else
                                                          {"recon_weight": 0.0005}))[0]
    assert torch.isfinite(loss)  # the same call with two examples: a number


@pytest.mark.parametrize("routing", CapsNetConfig.probability_routings())
def test_capsnet_under_any_routing_cast_to_bfloat16_decodes(routing):
    """CapsNet routed by EM, cast with .bfloat16(): EM routes half votes in fp32 and its fp32 poses met the bf16
    decoder in one product (a dtype error); the digit capsules now hand them on in the weights' dtype."""
    torch.manual_seed(3)
    model = create_model("capsnet", conv1_channels=16, primary_types=4, routing=routing).bfloat16()
    images, labels = torch.rand(2, 1, 28, 28, dtype=torch.bfloat16), torch.tensor([3, 7])
    out = model(images, labels)
    assert out.lengths.dtype == torch.bfloat16 and out.reconstructions.dtype == torch.bfloat16
    loss = MODELS["capsnet"].loss(model, images, labels, recon_weight=0.0005)[0]
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad.float()).all() for p in model.parameters()
                                        if p.grad is not None)


# SegCaps on a quarter of its 64x64 pixels here: bfloat16 is slow on a CPU without bfloat16 units, and which dtype
# each layer computes in does not depend on the image's size
BF16_SMALLER = {name: dict(input_height=32, input_width=32) for name in ("segcaps", "segcaps-r1")}


@pytest.mark.parametrize("name", list(MODELS))
def test_a_model_cast_to_bfloat16_runs_on_bfloat16_images(name):
    """model.bfloat16(): the EM models failed in their second capsule layer (fp32 poses out of the fp32 routing
    met bf16 weights in one product). Every model now runs, finite; a classifier scores as its fp32 self does, to
    bf16's precision."""
    torch.manual_seed(2)
    sizes = {**SMALL[name], **BF16_SMALLER.get(name, {})}
    model = create_model(name, **sizes).eval()
    images, _ = _inputs(model, 3)
    half = create_model(name, **sizes).eval()
    half.load_state_dict(model.state_dict())
    half = half.bfloat16()
    with torch.no_grad():
        out = half(images.bfloat16())
    pick = (lambda o: o) if isinstance(out, torch.Tensor) else (lambda o: next(
        v for v in (list(o) if isinstance(o, tuple) else vars(o).values()) if isinstance(v, torch.Tensor)))
    assert torch.isfinite(pick(out).float()).all()
    if MODELS[name].kind == "classification":  # the class scores the loss reads (lengths, activations, logits)
        labels = torch.tensor([1, 4, 2])  # below every default num_classes (smallNORB: 5)
        with torch.no_grad():
            scores = MODELS[name].loss(half, images.bfloat16(), labels, recon_weight=0.0)[1].float()
            expected = MODELS[name].loss(model, images, labels, recon_weight=0.0)[1]
        torch.testing.assert_close(scores, expected, atol=0.02 * expected.abs().max().item() + 1e-3, rtol=0.02)


@pytest.mark.parametrize("name", list_models())
def test_images_of_another_dtype_than_the_weights_are_refused_by_name(name):
    """float16 images met a convolution's 'Input type (c10::Half) and bias type (float) should be the same' (or a
    matmul's dtype error) in every model (a review, 2026-11-30); under autocast they are the autocast's to cast."""
    model = create_model(name).eval()
    c = model.config
    x = torch.rand(2, c.in_channels, c.input_height, c.input_width, dtype=torch.float16)
    synthesis = hasattr(model, "generator")
    what, var = ("label maps", "labels") if synthesis else ("images", "images")
    with pytest.raises(ValueError, match=rf"^{what} are torch.float16 but the model's weights are torch.float32; "
                                         rf"pass {var}.to\(torch.float32\), or convert the model"):
        model.generator(x, torch.zeros(2, getattr(c, "noise_dim", 1))) if synthesis else model(x)
    if synthesis:
        images = torch.rand(2, c.out_channels, c.input_height, c.input_width, dtype=torch.float16)
        with pytest.raises(ValueError, match=r"^images are torch.float16 but the model's weights are torch.float32"):
            model.discriminator(images, x.float())


def test_bfloat16_images_run_under_autocast():
    model = create_model("capsnet", conv1_channels=16, primary_types=4).eval()
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        out = model(torch.rand(2, 1, 28, 28, dtype=torch.bfloat16))
    assert torch.isfinite(out.lengths.float()).all()


@pytest.mark.parametrize("name", list(MODELS))
def test_every_model_runs_forward_and_backward_on_the_meta_device_with_the_cpu_shapes(name):
    """Shape inference on the meta device (``model.to("meta")``, ``with torch.device("meta")``): CapsNet's fast
    routing path turned autocast off for a device type autocast does not know ('unsupported scalarType')."""
    torch.manual_seed(0)
    model = create_model(name, **SMALL[name]).eval()
    images, targets = _inputs(model, 2)
    spec = MODELS[name]
    with torch.no_grad():
        cpu = model(images)
    meta = model.to("meta")
    out = meta(images.to("meta"))
    shapes = [tuple(t.shape) for t in (cpu if isinstance(cpu, tuple) else [cpu] if isinstance(cpu, torch.Tensor)
                                       else vars(cpu).values()) if isinstance(t, torch.Tensor)]
    got = [t for t in (out if isinstance(out, tuple) else [out] if isinstance(out, torch.Tensor)
                       else vars(out).values()) if isinstance(t, torch.Tensor)]
    assert [tuple(t.shape) for t in got] == shapes and all(t.is_meta for t in got)
    if spec.kind == "synthesis":
        return  # a GAN's losses sample noise and labels on the images' device: the forward above is its shape check
    meta.train()
    loss = spec.loss(meta, images.to("meta"), targets.to("meta"), recon_weight=0.0005, progress=0.5)[0]
    loss.backward()
    assert all(p.grad is not None and p.grad.is_meta for p in meta.parameters() if p.requires_grad)


def test_two_models_on_one_config_class_are_refused_by_name(monkeypatch):
    """A checkpoint names its model by the config's class: a second entry on CapsNet's config was saved and rebuilt
    as `capsnet` (a review, 2026-11-30), so eval, figures and export scored another network without a word."""
    from capsnet import models
    from capsnet.models import CapsNet, CapsNetConfig, ModelSpec, capsnet_loss, check_registry

    check_registry()  # the shipped registry holds
    twin = {**MODELS, "capsnet-twin": ModelSpec(CapsNetConfig, CapsNet, capsnet_loss, "twin")}
    with pytest.raises(TypeError, match=r"models 'capsnet' and 'capsnet-twin' are registered with one config class, "
                                        r"CapsNetConfig: .* give 'capsnet-twin' a config class of its own"):
        check_registry(twin)
    monkeypatch.setattr(models, "MODELS", twin)  # added after import: model_name says so rather than guess
    with pytest.raises(TypeError, match="capsnet-twin"):
        models.model_name(CapsNetConfig())
    with pytest.raises(ValueError, match=r"scores='logits'; choose from lengths, activations, probabilities"):
        check_registry({"capsnet": MODELS["capsnet"]._replace(scores="logits")})


def test_the_figures_and_the_viewer_name_a_models_scores_as_its_registry_entry_says(monkeypatch):
    """What the scores are came from lists of model names and classes in the figures and the viewer, so a model
    registered later was drawn as capsule lengths with margin lines whatever it output; it is the entry's word."""
    from capsnet import models
    from capsnet.figures.report import class_scores
    from capsnet.viz.engine import scores_are

    expect = {"capsnet": "lengths", "efficient-capsnet": "lengths", "baseline": "probabilities",
              "em-capsnet": "activations", "em-capsnet-small": "activations", "inverted-capsnet": "probabilities"}
    for name, scores in expect.items():
        assert MODELS[name].scores == scores
        assert scores_are(create_model(name, **SMALL[name])) == scores
    assert class_scores("capsnet") == ("capsule length", (0.9, 0.1))
    assert class_scores("em-capsnet") == ("class capsule activation", None)
    assert class_scores("baseline") == ("class probability", None)
    assert scores_are(create_model("capsnet", **SMALL["capsnet"], routing="em")) == "activations"
    monkeypatch.setitem(models.MODELS, "capsnet", MODELS["capsnet"]._replace(scores="probabilities"))
    assert class_scores("capsnet") == ("class probability", None)
    assert scores_are(create_model("capsnet", **SMALL["capsnet"])) == "probabilities"
    # under any routing the entry's word holds, in both (the figures named EM's activations, a review, 2026-11-30)
    for routing in ("em", "self-attention"):
        assert class_scores("capsnet", routing) == ("class probability", None)
        assert scores_are(create_model("capsnet", **SMALL["capsnet"], routing=routing)) == "probabilities"
    # a CapsNet of one's own config, not registered: the viewer takes it, its scores those of the config it derives
    # from (CapsNetConfig's entry says probabilities here)
    from dataclasses import dataclass

    from capsnet.models import CapsNet, CapsNetConfig

    @dataclass(frozen=True)
    class Unregistered(CapsNetConfig):
        pass

    assert scores_are(CapsNet(Unregistered(**SMALL["capsnet"]))) == "probabilities"
    # and one derived from EM's or the inverted model's config: that config's word (not "lengths")
    for name, word in (("em-capsnet-small", "activations"), ("inverted-capsnet", "probabilities")):
        registered = create_model(name, **SMALL[name])
        own = dataclass(frozen=True)(type("Own", (type(registered.config),), {}))
        model = type(registered)(own(**{f: getattr(registered.config, f) for f in registered.config.__dataclass_fields__}))
        assert scores_are(model) == word


def test_help_on_each_registered_model_names_its_paper():
    """help(capsnet.models.X) gave no paper (they were in the module docstrings alone), and InvertedCapsNet had no
    docstring at all: help() showed torch's "Base class for all neural network modules"."""
    import inspect

    from capsnet import models

    for name, spec in MODELS.items():
        doc = inspect.getdoc(spec.build) or ""
        first_author = spec.paper.split()[0].rstrip(",")
        assert first_author in doc and "Base class for all neural network" not in doc, (name, doc[:80])
        # its class and its output's class are importable from capsnet.models, where the docs name them
        assert getattr(models, spec.build.__name__, None) is spec.build, \
            f"{name}: import {spec.build.__name__} in capsnet/models/__init__.py, beside its registry entry"
        output = inspect.signature(spec.build.forward).return_annotation
        if isinstance(output, str) and output[0].isupper():  # the annotation as written (postponed evaluation)
            assert output in models.__all__, (f"{name}: its forward returns {output}; import it in "
                                              f"capsnet/models/__init__.py and name it in __all__, where the docs "
                                              f"find a model's output class")


@pytest.mark.parametrize("name", [n for n, spec in MODELS.items() if spec.kind == "segmentation"])
def test_segmentation_masks_of_0_and_255_are_refused_by_the_loss_and_evaluate(name):
    """0/255 masks (a PNG's) trained towards 255 and scored a loss of thousands without a word."""
    from capsnet.evaluate import evaluate_segmentation

    torch.manual_seed(0)
    model = create_model(name, **SMALL[name], input_height=16, input_width=16)
    images = torch.rand(2, 1, 16, 16)
    masks = (torch.rand(2, 1, 16, 16) > 0.5).float()
    for bad, said in ((masks * 255, r"got values from 0 to 255: divide 0/255 masks by 255"),
                      ((masks * 255).to(torch.uint8), r"got values from 0 to 255: divide"),
                      (masks - 1, r"got values from -1 to 0: give masks of 0 and 1")):
        with pytest.raises(ValueError, match=r"masks must hold 0 \(background\) and 1 \(foreground\), " + said):
            MODELS[name].loss(model, images, bad, recon_weight=0.0)
        with pytest.raises(ValueError, match=said):
            evaluate_segmentation(model, images, bad)
    for good in (masks, masks.bool(), masks.to(torch.uint8)):  # 0/1 of any dtype, as before
        assert torch.isfinite(MODELS[name].loss(model, images, good, recon_weight=0.0)[0])
    assert 0 <= evaluate_segmentation(model, images, masks).dice <= 1


def test_configs_that_would_build_a_degenerate_or_oversized_model_are_refused_by_name():
    """A review of the config space (2026-11-30): a U-Net of 8e9 weights was taken (every other model is capped);
    SegCaps' and CapsPix2pix's instance norm at 8x8 centred a one-position grid into zeros (three layers carried
    nothing); one class gave the baseline, EM and inverted models a loss of 0 and no gradient; a U-Net's side error
    did not say it comes from its poolings."""
    from capsnet.models import UNetConfig

    with pytest.raises(ValueError, match=r"this UNetConfig would hold 7,962,541,313 weights, more than "
                                         r"2,147,483,648: lower base_channels or depth"):
        UNetConfig(base_channels=256, depth=6)
    with pytest.raises(ValueError, match=r"input_height must be a multiple of 16 \(4 poolings\), got 24"):
        UNetConfig(input_height=24)
    for name in ("segcaps", "capspix2pix"):
        with pytest.raises(ValueError, match=r"capsule_norm='instance' centres every capsule layer over its grid, "
                                             r"and at 8x8 the deepest grid is a single position"):
            create_model(name, input_height=8, input_width=8, capsule_norm="instance")
        create_model(name, input_height=8, input_width=16, capsule_norm="instance")  # a grid of two: centred
    for name in ("baseline", "em-capsnet-small", "inverted-capsnet"):
        with pytest.raises(ValueError, match=r"num_classes must be in 2\.\."):
            create_model(name, num_classes=1)


def test_equal_configs_hash_alike():
    """1 and 1.0 compare equal, and the configs holding them did too, but hashed apart (their JSON differs): equal
    configs counted twice in a set (a review, 2026-11-30)."""
    from capsnet.models import CapsNetConfig, SegCapsConfig

    assert len({SegCapsConfig(width=1), SegCapsConfig(width=1.0)}) == 1
    a = CapsNetConfig(routing="em", routing_options={"final_lambda": 1})
    b = CapsNetConfig(routing="em", routing_options={"final_lambda": 1.0})
    assert a == b and hash(a) == hash(b)
    assert hash(CapsNetConfig(conv1_channels=8)) != hash(CapsNetConfig())


@pytest.mark.parametrize("name,side", [("unet", 16), ("efficient-capsnet", 12)])
def test_a_training_batch_of_one_at_a_one_by_one_batch_norm_is_refused_by_name(name, side):
    """A U-Net whose bottleneck is 1x1 (depth 4 at 16x16) and Efficient-CapsNet at 11-12 pixels train on batches of
    two and more; a last batch of one (training images modulo the batch size) met torch's "Expected more than 1
    value per channel", which named no fix (a review, 2026-11-30)."""
    torch.manual_seed(0)
    model = create_model(name, input_height=side, input_width=side,
                         **({"base_channels": 4} if name == "unet" else {})).train()
    images = torch.rand(2, 1, side, side)
    targets = torch.zeros(2, 1, side, side) if name == "unet" else torch.tensor([1, 2])
    kw = {} if name == "unet" else {"recon_weight": 0.0005}
    assert torch.isfinite(MODELS[name].loss(model, images, targets, **kw)[0])  # two: trains
    with pytest.raises(ValueError, match=r"a training batch of one .* batch norm needs more than one value per "
                                         r"channel: train with a batch size that leaves no last batch of one"):
        MODELS[name].loss(model, images[:1], targets[:1], **kw)
    with torch.no_grad():
        assert model.eval()(images[:1]) is not None  # evaluation reads the running statistics: one is fine


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_a_two_class_models_two_column_labels_and_a_forward_passs_one_hot_rows_are_refused(name):
    """A 2-class model's one-hot labels passed the one-hot check (two columns are MultiMNIST's pairs) and trained
    towards both classes at once (EM's spread loss 0.0); CapsNet's and Efficient-CapsNet's forward pass decoded
    one-hot rows as 10 capsules per image, and the reconstruction loss then named the pixels (a review,
    2026-12-01). A one-class classifier scores 100% whatever it learns: refused by every model."""
    import torch.nn.functional as F

    images, labels = torch.rand(4, 1, 28, 28), torch.tensor([0, 1, 1, 0])
    two = create_model(name, **SMALL[name], num_classes=2, input_height=28, input_width=28)
    with pytest.raises(ValueError, match=r"labels of shape \(4, 2\) for a model of 2 classes: give class indices "
                                         r"\(B,\) \(labels.argmax\(1\) for one-hot rows\); pairs of classes"):
        MODELS[name].loss(two, images, F.one_hot(labels, 2))
    loss, _ = MODELS[name].loss(two, images, labels)  # indices train as before
    assert torch.isfinite(loss) and loss > 0
    with pytest.raises(ValueError, match=r"num_classes must be in 2\.\."):
        create_model(name, **SMALL[name], num_classes=1)
    ten = create_model(name, **SMALL[name], num_classes=10, input_height=28, input_width=28)
    if getattr(ten, "decoder", None) is not None:  # the models that decode (B, K) labels, K capsules per image
        with pytest.raises(ValueError, match=r"labels of shape \(4, 10\) are one-hot rows; give class indices \(B,\): "
                                             r"labels.argmax\(1\)"):
            ten(images, F.one_hot(torch.tensor([0, 3, 3, 9]), 10))
        every = torch.arange(10).expand(4, 10)  # every class's capsule decoded: not one-hot, decoded as before
        assert ten(images, every).reconstructions.shape == (4, 10, 1, 28, 28)
