"""SegCaps and the U-Net: the papers' weight counts, shapes, losses, gradients, batch independence, bad input."""
from __future__ import annotations

import collections
import json
import math
import warnings

import pytest
import torch

from capsnet.losses import segmentation_loss, soft_dice
from capsnet.models import MODELS, SegCaps, SegCapsConfig, UNetConfig, create_model, is_segmentation
from capsnet.models.segcaps import stack_routings
from routing_names import STACK_TEXT

SEGMENTATION = [n for n, spec in MODELS.items() if spec.kind == "segmentation"]
# small sizes; a segmentation model registered without an entry is built at its own (one file, its test and a
# registry line: these tables are a speed-up, not a step)
SMALL = collections.defaultdict(dict, {"segcaps": {}, "segcaps-r1": {}, "unet": dict(base_channels=4, depth=3)})


def paper_segcaps_weights(in_channels: int = 1) -> int:
    """SegCaps R3 counted from the paper's Figure 2 layer by layer: (kernel, in dim, out types, out dim) of each
    capsule layer, kernel^2 x in_dim x types x dim weights plus the routing bias types x dim; conv1 5x5x16;
    the reconstruction's 1x1 convolutions 16-64-128-C."""
    layers = [(5, 16, 2, 16), (5, 16, 4, 16), (5, 16, 4, 32), (5, 32, 8, 32), (5, 32, 8, 64), (5, 64, 8, 32),
              (4, 32, 8, 32), (5, 32, 4, 32), (4, 32, 4, 16), (5, 16, 4, 16), (4, 16, 2, 16), (1, 16, 1, 16)]
    caps = sum(k * k * d * t * o + t * o for k, d, t, o in layers)
    return (25 * in_channels + 1) * 16 + caps + 17 * 64 + 65 * 128 + 129 * in_channels


def test_segcaps_weight_count_is_the_papers_1_4m():
    for c in (1, 3):
        model = SegCaps(SegCapsConfig(in_channels=c))
        n = sum(p.numel() for p in model.parameters())
        assert n == paper_segcaps_weights(c) == model.config.num_weights
    assert sum(p.numel() for p in SegCaps().parameters()) == 1_425_649  # the README's figure


def _ronneberger_weights(batch_norm: bool) -> int:
    """The U-Net of Ronneberger et al.'s Fig. 1 (one input channel, one output map), counted layer by layer."""
    convs = [(1, 64), (64, 64), (64, 128), (128, 128), (128, 256), (256, 256), (256, 512), (512, 512),
             (512, 1024), (1024, 1024),  # the contracting path: two 3x3 convolutions a level
             (1024, 512), (512, 512), (512, 256), (256, 256), (256, 128), (128, 128), (128, 64), (64, 64)]  # expanding
    n = sum((a * 9 + 1) * b + (2 * b if batch_norm else 0) for a, b in convs)
    n += sum((a * 4 + 1) * b for a, b in [(1024, 512), (512, 256), (256, 128), (128, 64)])  # 2x2 up-convolutions
    return n + 64 + 1  # the final 1x1 convolution


def test_unet_weight_count_is_the_papers_31m():
    for bn, expected in ((False, _ronneberger_weights(False)), (True, _ronneberger_weights(True))):
        model = create_model("unet", batch_norm=bn)
        assert sum(p.numel() for p in model.parameters()) == expected == model.config.num_weights
    assert _ronneberger_weights(False) == 31_030_593 and _ronneberger_weights(True) == 31_042_369  # the README's
    assert UNetConfig().num_weights > 10 * SegCapsConfig().num_weights  # the "a tenth of its weights"


@pytest.mark.parametrize("name", SEGMENTATION)
@pytest.mark.parametrize("size", [(16, 24), (32, 32)])
def test_output_shapes_for_several_input_sizes(name, size):
    torch.manual_seed(0)
    H, W = size
    model = create_model(name, **SMALL[name], input_height=H, input_width=W)
    out = model(torch.rand(2, 1, H, W))
    assert out.probabilities.shape == (2, 1, H, W)
    assert ((out.probabilities >= 0) & (out.probabilities <= 1)).all()
    if name.startswith("segcaps"):
        assert out.poses.shape == (2, 1, 16, H, W) and out.reconstructions.shape == (2, 1, H, W)
        x = torch.rand(1, 1, H, W)
        grids = model.capsule_grids(x)
        assert grids["primary"].shape == (1, 2, 16, H // 2, W // 2) and grids["conv_3_2"].shape == (1, 8, 64, H // 8, W // 8)
        # the viewer's one pass: the output and the grids as the two calls give them
        both, both_grids = model.forward_with_grids(x)
        alone = model(x)
        assert all(torch.equal(getattr(both, f), getattr(alone, f)) for f in ("probabilities", "poses",
                                                                               "reconstructions"))
        assert both_grids.keys() == grids.keys() and all(torch.equal(both_grids[k], grids[k]) for k in grids)


@pytest.mark.parametrize("name", SEGMENTATION)
def test_every_weight_gets_a_gradient_from_the_registered_loss(name):
    torch.manual_seed(1)
    model = create_model(name, **SMALL[name], input_height=16, input_width=16)
    images = torch.rand(3, 1, 16, 16)
    masks = (images > 0.6).to(torch.uint8)
    loss, probs = MODELS[name].loss(model, images, masks, recon_weight=0.0005)
    assert probs.shape == (3, 1, 16, 16) and torch.isfinite(loss)
    loss.backward()
    for n, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, n
    assert is_segmentation(name) and is_segmentation(model.config)


@pytest.mark.parametrize("name", SEGMENTATION)
def test_an_image_is_segmented_the_same_in_any_batch(name):
    torch.manual_seed(2)
    model = create_model(name, **SMALL[name], input_height=16, input_width=16).eval()
    images = torch.rand(4, 1, 16, 16)
    with torch.no_grad():
        together = model(images).probabilities
        for k in (0, 2):
            torch.testing.assert_close(model(images[k:k + 1]).probabilities[0], together[k], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", ["segcaps", "unet"])
def test_finite_at_all_zero_input_and_under_bf16_autocast(name):
    torch.manual_seed(3)
    model = create_model(name, **SMALL[name], input_height=16, input_width=16)
    for images, ctx in ((torch.zeros(2, 1, 16, 16), torch.autocast("cpu", enabled=False)),
                        (torch.rand(2, 1, 16, 16), torch.autocast("cpu", dtype=torch.bfloat16))):
        model.zero_grad()
        with ctx:
            loss, probs = MODELS[name].loss(model, images, torch.zeros(2, 1, 16, 16), recon_weight=0.0005)
        assert torch.isfinite(probs).all() and torch.isfinite(loss)
        loss.backward()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_reconstruction_targets_the_input_masked_by_the_ground_truth():
    torch.manual_seed(4)
    model = create_model("segcaps", input_height=16, input_width=16)
    images = torch.rand(2, 1, 16, 16)
    masks = (torch.rand(2, 1, 16, 16) > 0.5).float()
    with_recon, _ = MODELS["segcaps"].loss(model, images, masks, recon_weight=0.0005)
    without, _ = MODELS["segcaps"].loss(model, images, masks, recon_weight=0.0)
    recon = model(images, masks).reconstructions
    expected = 0.0005 * (recon - images * masks).pow(2).sum() / 2  # sum over pixels, mean over the batch
    torch.testing.assert_close(with_recon - without, expected, rtol=1e-4, atol=1e-7)
    # the capsule masked by the ground truth is what the decoder sees (the paper's regulariser), not the prediction:
    # the loss above compares with the model's own output, so a model masking by its prediction passed it (found by
    # mutation testing, 2026-11-30)
    with torch.no_grad():
        out = model(images, masks)
        torch.testing.assert_close(out.reconstructions, model.decoder(out.poses[:, 0] * masks))
        predicted = (out.probabilities > 0.5).float()
        assert not torch.equal(predicted, masks)  # the two maskings differ here
        torch.testing.assert_close(model(images).reconstructions, model.decoder(out.poses[:, 0] * predicted))


def test_segmentation_losses_against_closed_forms():
    p = torch.tensor([[[[0.9, 0.2], [0.6, 0.1]]]])
    m = torch.tensor([[[[1.0, 0.0], [1.0, 0.0]]]])
    bce = -(torch.log(torch.tensor([0.9, 0.6])).sum() + torch.log(torch.tensor([0.8, 0.9])).sum()) / 4
    torch.testing.assert_close(segmentation_loss(p, m, "bce"), bce)
    dice = (2 * 1.5 + 1) / (1.8 + 2 + 1)
    torch.testing.assert_close(soft_dice(p, m), torch.tensor([dice]))
    torch.testing.assert_close(segmentation_loss(p, m, "bce+dice"), bce + 1 - dice)
    weighted = -(torch.log(torch.tensor([0.9, 0.6])).sum() * 1.0 + torch.log(torch.tensor([0.8, 0.9])).sum()) / 4
    torch.testing.assert_close(segmentation_loss(p, m, "weighted-bce"), weighted)  # 2 of 4 foreground: weight 1
    logits = torch.logit(p)
    torch.testing.assert_close(segmentation_loss(p, m, "bce", logits=logits), bce, rtol=1e-5, atol=1e-6)
    # one foreground pixel of four: it weighs 3 (background pixels per foreground one), from probabilities and logits
    one = torch.tensor([[[[1.0, 0.0], [0.0, 0.0]]]])
    weighted = -(3 * math.log(0.9) + math.log(0.8) + math.log(0.4) + math.log(0.9)) / 4
    torch.testing.assert_close(segmentation_loss(p, one, "weighted-bce"), torch.tensor(weighted))
    torch.testing.assert_close(segmentation_loss(p, one, "weighted-bce", logits=logits), torch.tensor(weighted),
                               rtol=1e-5, atol=1e-6)
    # three of four: the weight is clamped at 1, never below (the background is not weighted up instead)
    three = torch.tensor([[[[1.0, 1.0], [1.0, 0.0]]]])
    plain = -(math.log(0.9) + math.log(0.2) + math.log(0.6) + math.log(0.9)) / 4
    torch.testing.assert_close(segmentation_loss(p, three, "weighted-bce"), torch.tensor(plain))
    with pytest.raises(ValueError, match="unknown segmentation loss 'iou'"):
        segmentation_loss(p, m, "iou")


def test_bad_input_is_named_with_its_fix():
    model = create_model("segcaps", input_height=16, input_width=16)
    with pytest.raises(ValueError, match=r"image sides must be multiples of 8.*got 20x16: pad or crop them to 24x16"):
        model(torch.rand(1, 1, 20, 16))
    with pytest.raises(ValueError, match=r"1-channel images, got \(1, 3, 16, 16\).*train a model with in_channels 3"):
        model(torch.rand(1, 3, 16, 16))
    with pytest.raises(ValueError, match="must be a multiple of 8"):
        SegCapsConfig(input_height=60)
    with pytest.raises(ValueError, match="masks \\(B, 1, H, W\\)"):
        MODELS["segcaps"].loss(model, torch.rand(2, 1, 16, 16), torch.tensor([1, 2]))


@pytest.mark.parametrize("name", ["segcaps", "capspix2pix"])
def test_init_gain_and_bias_init_set_the_hidden_capsule_layers_start(name):
    torch.manual_seed(0)
    plain = create_model(name)
    torch.manual_seed(0)
    scaled = create_model(name, init_gain=3.0, bias_init=0.01)
    caps_a = plain.caps if name == "segcaps" else plain.generator.caps
    caps_b = scaled.caps if name == "segcaps" else scaled.generator.caps
    for layer, (a, b) in enumerate(zip(caps_a.values(), caps_b.values())):
        if layer == len(caps_a) - 1:  # seg_caps keeps the reference start
            assert torch.equal(a.weight, b.weight) and torch.equal(b.bias, torch.full_like(b.bias, 0.1))
        else:
            torch.testing.assert_close(b.weight, 3 * a.weight, rtol=1e-6, atol=0)
            assert torch.equal(a.bias, torch.full_like(a.bias, 0.1)) and torch.equal(b.bias, torch.full_like(b.bias, 0.01))
    with pytest.raises(ValueError, match="init_gain must be in"):
        create_model(name, init_gain=0.0)


def test_deconv_init_reference_starts_the_deconvolutions_at_the_reference_codes_keras_fan():
    """The reference code's DeconvCapsuleLayer kernel is (K, K, J Dout, Din), He-normal under Keras' fan in of
    shape[-2] K K = 16 J Dout; the default's fan is the (K / 2)^2 Din inputs that reach each output. The
    convolutional layers' starts are the reference's either way (K K Din)."""
    torch.manual_seed(0)
    plain = create_model("segcaps")
    torch.manual_seed(0)
    ref = create_model("segcaps", deconv_init="reference")
    for name, j, dout, din in (("deconv_1_1", 8, 32, 32), ("deconv_2_1", 4, 16, 32), ("deconv_3_1", 2, 16, 16)):
        w_plain, w_ref = plain.caps[name].weight.detach(), ref.caps[name].weight.detach()
        torch.testing.assert_close(w_ref, w_plain * ((4 * din) / (16 * j * dout)) ** 0.5, rtol=1e-6, atol=0)
        assert w_ref.std().item() == pytest.approx((2 / (16 * j * dout)) ** 0.5, rel=0.05)  # 0.0221, 0.0442, 0.0625
        assert w_plain.std().item() == pytest.approx((2 / (4 * din)) ** 0.5, rel=0.05)  # 0.125, 0.125, 0.177
    same = [n for n in plain.caps if not n.startswith("deconv") or not n.endswith("_1")]
    assert all(torch.equal(plain.caps[n].weight, ref.caps[n].weight) for n in same)
    with pytest.raises(ValueError, match="deconv_init"):
        create_model("segcaps", deconv_init="keras")


def test_unet_init_paper_draws_every_convolution_at_sqrt_2_over_n():
    """Ronneberger et al., section 3: weights Gaussian with sd sqrt(2 / N), N the inputs of one neuron (a 3x3
    convolution of 64 channels: N = 576); PyTorch's start (the default) is a uniform of a third of that variance."""
    torch.manual_seed(0)
    model = create_model("unet", batch_norm=False, init="paper")
    convs = [m for m in model.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.ConvTranspose2d))]
    assert len(convs) == 23  # "in total the network has 23 convolutional layers": 18 3x3, 4 up, one 1x1
    for m in convs:
        n = m.in_channels * (1 if isinstance(m, torch.nn.ConvTranspose2d) else m.kernel_size[0] * m.kernel_size[1])
        if m.weight.numel() > 1000:  # the sample sd of the small first and last layers is too loose to test
            assert m.weight.std().item() == pytest.approx((2 / n) ** 0.5, rel=0.05)
        assert torch.count_nonzero(m.bias) == 0
    default = create_model("unet", batch_norm=False)
    assert default.down[0][0].weight.abs().max().item() <= 1 / 3  # kaiming_uniform(a=sqrt(5)): bound 1/sqrt(9)
    assert torch.count_nonzero(default.down[0][0].bias) > 0
    with pytest.raises(ValueError, match="init"):
        create_model("unet", init="he")


def test_without_the_routing_bias_the_reference_start_is_dead_and_warns():
    """Without the bias, He-normal kernels let the squash shrink the capsules to zero within a few layers: the
    deep layers get exactly no gradient. The model says so, and init_gain=3 gives every layer a gradient."""
    images = torch.rand(2, 1, 32, 32, generator=torch.Generator().manual_seed(0))
    masks = (torch.rand(2, 1, 32, 32, generator=torch.Generator().manual_seed(1)) > 0.8).to(torch.uint8)

    def dead_layers(floor=0.0, **kw):
        torch.manual_seed(0)
        model = create_model("segcaps", routing_bias=False, input_height=32, input_width=32, **kw)
        MODELS["segcaps"].loss(model, images, masks)[0].backward()
        return [name for name, layer in model.caps.items() if layer.weight.grad.abs().max() <= floor]

    with pytest.warns(UserWarning, match="without the routing bias at init_gain 1: from this start the capsules shrink "
                                         "to zero within a few layers and the deep layers get no gradient; set "
                                         "init_gain=3"):
        assert "conv_3_2" in dead_layers()
    with pytest.warns(UserWarning, match="init_gain 2"):
        create_model("capspix2pix", routing_bias=False, init_gain=2.0)  # the generator shares the layers
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert dead_layers(init_gain=3.0) == []
        create_model("segcaps", init_gain=1.0)  # with the bias: no warning
        # linear near zero: at gain 1 the capsules do not fade, so no warning, and every layer's gradient is
        # far above rounding (the sabour squash's reaches exactly zero)
        assert dead_layers(squash="exp", floor=1e-8) == []
    with pytest.warns(UserWarning, match=r"init_gain 0.5: from this start the capsules shrink layer by layer and "
                                         r"the deep layers' gradients fall 100-1000 times; set init_gain=1 "):
        create_model("segcaps", routing_bias=False, squash="exp", init_gain=0.5)
    # self-attention squashes by the exp squash: the same rule (at gain 1 every layer learns, below it warns)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert dead_layers(routing="self-attention", floor=1e-8) == []
    with pytest.warns(UserWarning, match=r"init_gain 0.5: .* gradients fall 100-1000 times"):
        create_model("segcaps", routing="self-attention", routing_bias=False, init_gain=0.5)


@pytest.mark.parametrize("name", ["segcaps", "capspix2pix"])
def test_exp_squash_is_every_capsule_layers_and_trains_every_weight(name):
    torch.manual_seed(2)
    model = create_model(name, squash="exp", input_height=16, input_width=16)
    caps = model.caps if name == "segcaps" else model.generator.caps
    assert [layer.routing.squash for layer in caps.values()] == ["exp"] * len(caps)
    assert type(model.config).from_dict(model.config.to_dict()) == model.config
    if name == "segcaps":
        images = torch.rand(2, 1, 16, 16)
        loss, _ = MODELS[name].loss(model, images, (images > 0.6).to(torch.uint8), recon_weight=0.0005)
        loss.backward()
        for n, p in model.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, n
    with pytest.raises(ValueError, match=r"squash must be one of sabour, exp, got 'tanh'"):
        create_model(name, squash="tanh")


@pytest.mark.parametrize("name", ["segcaps", pytest.param("segcaps-r1", marks=pytest.mark.slow),  # SegCaps' layers
                                  pytest.param("unet", marks=pytest.mark.slow)])
def test_compiled_training_step_is_one_graph_and_matches_eager(name):
    # capsnet train --compile (benchmarks/segmentation.py --compile): SegCaps' many small routing kernels are what
    # compiling (and CUDA graphs, which need the step as one graph) speed up. fullgraph=True fails on any graph break;
    # aot_eager traces forward and backward as Inductor would, without its C++ build (that is the slow test below).
    torch.manual_seed(5)
    # SegCaps at 2 routing rounds, not its 3: both kinds of round (with the agreement update, and the last without)
    # trace as at 3, in a third less time (segcaps-r1 routes once)
    rounds = {"routing_iterations": 2} if name == "segcaps" else {}
    model = create_model(name, input_height=16, input_width=16, **rounds)
    images = torch.rand(2, 1, 16, 16)
    masks = (torch.rand(2, 1, 16, 16) > 0.6).float()
    grads = []
    for call in (model, torch.compile(model, backend="aot_eager", fullgraph=True, dynamic=False)):
        model.zero_grad(set_to_none=True)
        loss, probs = MODELS[name].loss(call, images, masks, recon_weight=0.0005)
        loss.backward()
        grads.append((loss.detach(), probs.detach(), [p.grad.clone() for p in model.parameters()]))
    (l0, p0, g0), (l1, p1, g1) = grads
    torch.testing.assert_close(l1, l0, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(p1, p0, rtol=1e-5, atol=1e-6)
    for a, b in zip(g1, g0):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.slow  # Inductor builds C++ kernels: about 70 s for SegCaps on a 2-core machine with a cold cache
def test_inductor_compiled_segcaps_matches_eager():
    torch.manual_seed(6)
    model = create_model("segcaps", input_height=16, input_width=16)
    images = torch.rand(2, 1, 16, 16)
    masks = (torch.rand(2, 1, 16, 16) > 0.6).float()
    out = []
    for call in (model, torch.compile(model, dynamic=False)):  # forward and backward, as --compile trains
        model.zero_grad(set_to_none=True)
        loss, probs = MODELS["segcaps"].loss(call, images, masks, recon_weight=0.0005)
        loss.backward()
        out.append((loss.detach(), probs.detach(), [p.grad.clone() for p in model.parameters()]))
    (l0, p0, g0), (l1, p1, g1) = out
    torch.testing.assert_close(l1, l0, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(p1, p0, rtol=1e-4, atol=1e-5)
    for a, b in zip(g1, g0, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-5)


def _check_normed_segcaps(model, images, over):
    """A SegCaps under a capsule norm: what went on from three layers centred over the dims ``over`` with unit
    lengths (less the eps of 1e-5 beside grids varying by about 1e-3); an image's output in evaluation independent
    of its batch; finite outputs and a gradient for every weight at all-zero input and under bf16."""
    grids = model.capsule_grids(images)
    for name in ("primary", "conv_3_2", "deconv_3_1"):
        assert grids[name].mean(dim=over).abs().max() < 1e-5, name
        ms = grids[name].pow(2).sum(dim=2).mean(dim=over)
        assert ((ms > 0.98) & (ms <= 1)).all(), (name, ms)
    model.eval()
    with torch.no_grad():
        together = model(images).probabilities
        torch.testing.assert_close(model(images[2:3]).probabilities[0], together[2], rtol=1e-4, atol=1e-6)
    model.train()
    for batch, ctx in ((torch.zeros(2, 1, 16, 16), torch.autocast("cpu", enabled=False)),
                       (images, torch.autocast("cpu", dtype=torch.bfloat16))):
        model.zero_grad()
        with ctx:
            loss, probs = MODELS["segcaps"].loss(model, batch, (batch > 0.6).to(torch.uint8), recon_weight=0.0005)
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(probs).all()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    assert all(p.grad.abs().sum() > 0 for p in model.parameters())  # the bf16 step reached every weight


def test_capsule_norm_centres_and_scales_each_type_per_example_and_keeps_segcaps_batch_independent():
    from capsnet.models.segcaps import instance_norm_capsules

    torch.manual_seed(4)
    x = torch.randn(3, 2, 4, 5, 6) * 3 + 7  # (B, J, D, H, W)
    y = instance_norm_capsules(x)
    for b in range(3):
        for j in range(2):  # one type of one example, by hand
            centred = x[b, j] - x[b, j].mean(dim=(1, 2), keepdim=True)
            lengths_squared = (centred ** 2).sum(dim=0)  # (H, W)
            torch.testing.assert_close(y[b, j], centred / torch.sqrt(lengths_squared.mean() + 1e-5))
    assert instance_norm_capsules(torch.full((1, 1, 4, 3, 3), 5.0)).abs().max() == 0  # a constant grid: nothing on
    model = create_model("segcaps", capsule_norm="instance", input_height=16, input_width=16)
    assert type(model.config).from_dict(model.config.to_dict()) == model.config
    images = torch.rand(4, 1, 16, 16)
    _check_normed_segcaps(model, images, over=(-2, -1))  # per example
    with pytest.raises(ValueError, match=r"capsule_norm must be one of none, instance, batch, got 'group'"):
        create_model("segcaps", capsule_norm="group")


def test_batch_capsule_norm_uses_the_batch_in_training_and_its_running_averages_in_evaluation():
    """capsule_norm="batch" (stop 94's untried probe 3): each type centred and scaled over the batch and the grid
    while training, by running averages after it; checked against the formula by hand, and SegCaps under it
    batch-independent in evaluation, finite with a gradient for every weight at all-zero input and under bf16."""
    from capsnet.models.segcaps import BatchNormCapsules

    torch.manual_seed(5)
    norm = BatchNormCapsules(2, 4)
    xs = [torch.randn(3, 2, 4, 5, 6) * 3 + 7, torch.randn(2, 2, 4, 5, 6) - 1]  # (B, J, D, H, W)
    run_mean, run_square = torch.zeros(2, 4), torch.ones(2)
    for x in xs:
        y = norm(x)
        mean = x.mean(dim=(0, 3, 4))  # (J, D), by hand below
        square = torch.stack([((x[:, j] - mean[j][None, :, None, None]) ** 2).sum(dim=1).mean() for j in range(2)])
        torch.testing.assert_close(y, (x - mean[:, :, None, None]) / torch.sqrt(square + 1e-5)[:, None, None, None])
        run_mean, run_square = 0.9 * run_mean + 0.1 * mean, 0.9 * run_square + 0.1 * square
        torch.testing.assert_close(norm.running_mean, run_mean)
        torch.testing.assert_close(norm.running_square, run_square)
    norm.eval()
    torch.testing.assert_close(norm(xs[0]), (xs[0] - run_mean[:, :, None, None]) / torch.sqrt(run_square + 1e-5)
                               [:, None, None, None])
    torch.testing.assert_close(norm.running_mean, run_mean)  # evaluation leaves them as they are

    model = create_model("segcaps", capsule_norm="batch", input_height=16, input_width=16)
    assert sum(p.numel() for p in model.parameters()) == model.config.num_weights == 1_425_649  # buffers only
    images = torch.rand(4, 1, 16, 16)
    _check_normed_segcaps(model, images, over=(0, -2, -1))  # over the batch too
    norm.train()
    before = norm.running_mean.clone()
    assert norm(torch.zeros(0, 2, 4, 5, 6)).shape == (0, 2, 4, 5, 6)  # an empty batch: the averages as they were
    torch.testing.assert_close(norm.running_mean, before)
    for dtype in (torch.float64, torch.bfloat16):  # a converted model trains (lerp_ met fp32 statistics: a review)
        wide = BatchNormCapsules(2, 4).to(dtype)
        assert wide(xs[0].to(dtype)).dtype == dtype and wide.running_mean.dtype == dtype
        torch.testing.assert_close(wide.running_mean.float(), 0.1 * xs[0].mean(dim=(0, 3, 4)), rtol=1e-2, atol=1e-2)
    saved = {k: v.clone() for k, v in model.state_dict().items()}  # the running averages travel with the weights
    fresh = create_model("segcaps", capsule_norm="batch", input_height=16, input_width=16)
    fresh.load_state_dict(saved)
    fresh.eval(), model.eval()
    with torch.no_grad():
        torch.testing.assert_close(fresh(images).probabilities, model(images).probabilities)


@pytest.mark.parametrize("routing", stack_routings())
def test_segcaps_and_the_capsule_generator_train_under_every_routing_their_stack_takes(routing):
    """Every registered routing that SegCaps' capsule layers take (``stack_routings``, read from the registry, so a
    routing added since is checked too: the tests named dynamic and self-attention): the layers route by it, every
    weight of SegCaps and of CapsPix2pix's generator learns, one image's output does not depend on its batch, and
    zero input stays finite (a review of adding a routing, 2026-12-02)."""
    from capsnet.routing import ROUTINGS

    torch.manual_seed(6)
    for name in ("segcaps", "capspix2pix"):
        model = create_model(name, routing=routing, input_height=16, input_width=16,
                             **({"dropout": 0.0, "noise_dim": 8, "disc_channels": 4} if name == "capspix2pix" else {}))
        net = model.generator if name == "capspix2pix" else model
        assert net.caps and all(type(layer.routing) is ROUTINGS[routing] for layer in net.caps.values())
        assert type(model.config).from_dict(model.config.to_dict()) == model.config
        images = torch.rand(3, 1, 16, 16)
        if name == "segcaps":
            loss = MODELS[name].loss(model, images, (images > 0.6).to(torch.uint8), recon_weight=0.0005)[0]
            run = lambda x: model(x).probabilities  # noqa: E731
        else:
            z = model.noise(3, 0)
            loss = model.g_loss(images, model(images, z), images)[0]
            run = lambda x: model(x, z[: len(x)])  # noqa: E731
        loss.backward()
        for n, p in net.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, (name, n)
        model.eval()
        with torch.no_grad():
            torch.testing.assert_close(run(images[:1])[0], run(images)[0], rtol=1e-4, atol=1e-6)
            assert torch.isfinite(run(torch.zeros(2, 1, 16, 16))).all()


def test_segcaps_routes_by_self_attention_in_every_capsule_layer_when_asked():
    """SegCapsConfig.routing: each layer's routing built by name over its own child and parent types (self-attention's
    prior is (T, J) at every position), its weights counted, every weight trained, one image's mask independent of
    its batch, finite at zero input and under bf16 autocast; the config round-trips."""
    from capsnet.models.segcaps import _LAYERS
    from capsnet.routing import DynamicRouting, SelfAttentionRouting

    torch.manual_seed(4)
    model = create_model("segcaps", routing="self-attention", input_height=16, input_width=16)
    layers = list(model.caps.values())
    assert all(type(layer.routing) is SelfAttentionRouting for layer in layers)
    assert [(layer.routing.in_caps, layer.routing.out_caps) for layer in layers] == [(t, j) for _, _, t, _, j, *_ in _LAYERS]
    priors = sum(t * j for _, _, t, _, j, *_ in _LAYERS)  # 373
    assert sum(p.numel() for p in model.parameters()) == model.config.num_weights == 1_425_649 + priors
    assert type(model.config).from_dict(model.config.to_dict()) == model.config and hash(model.config)
    images = torch.rand(3, 1, 16, 16)
    loss, probs = MODELS["segcaps"].loss(model, images, (images > 0.6).to(torch.uint8), recon_weight=0.0005)
    loss.backward()
    for n, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, n
    model.eval()
    with torch.no_grad():
        together = model(images).probabilities
        torch.testing.assert_close(model(images[1:2]).probabilities[0], together[1], rtol=1e-4, atol=1e-6)
        assert torch.isfinite(model(torch.zeros(2, 1, 16, 16)).probabilities).all()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert torch.isfinite(model(images).probabilities).all()
    # the default is still the paper's dynamic routing, and its options reach every layer
    leaky = create_model("segcaps", routing_options={"leaky": True}, input_height=16, input_width=16)
    assert all(type(layer.routing) is DynamicRouting and layer.routing.leaky for layer in leaky.caps.values())


@pytest.mark.parametrize("overrides, message", [
    (dict(routing="em"), "SegCapsConfig.routing: em routing's activations are not its capsules' lengths as "
                         "probabilities, and the segmentation capsule's length is the foreground's probability; use "
                         f"one of {STACK_TEXT}"),
    (dict(routing="inverted"), "inverted routing's activations are not its capsules' lengths"),
    (dict(routing="nope"), f"SegCapsConfig.routing must be one of {STACK_TEXT}, got 'nope'"),
    (dict(routing="self-attention", squash="exp"), "SegCapsConfig.squash is an option of dynamic routing; "
                                                   "self-attention routing does not take it: leave it at 'sabour'"),
    (dict(routing="self-attention", routing_softmax="children"), "SegCapsConfig.routing_softmax is an option of "
                                                                 "dynamic routing"),
    (dict(routing_options={"iterations": 2}), "routing_options: iterations is set by routing_iterations"),
    (dict(routing_options={"in_caps": 2}), "routing_options: in_caps is set by the layer's sizes"),
    (dict(routing_options={"foo": 1}), "dynamic routing takes no option foo"),
    (dict(routing="self-attention", routing_options={"leaky": True}), "self-attention routing takes no option leaky"),
    (dict(routing="self-attention", routing_options={"iterations": 2}), "self-attention routing makes one pass and "
                                                                         "takes no iterations"),
    (dict(routing="self-attention", routing_options={"softmax": "children"}), "self-attention routing takes no option "
                                                                              "softmax"),
    (dict(routing="self-attention", routing_options={"out_caps": 2}), "out_caps is set by the layer's sizes"),
    (dict(routing="self-attention", routing_iterations=2), "SegCapsConfig.routing_iterations sets the rounds of a "
                                                           "routing that iterates; self-attention routing makes one "
                                                           "pass: leave it at 3"),
    (dict(routing="self-attention", primary_routing_iterations=2), "SegCapsConfig.primary_routing_iterations sets "
                                                                   "the rounds of a routing that iterates"),
])
def test_a_segcaps_routing_it_cannot_use_is_refused_by_name(overrides, message):
    with pytest.raises(ValueError) as info:
        create_model("segcaps", **overrides)
    assert message in str(info.value)


def test_a_saved_run_with_rounds_its_one_pass_routing_never_used_still_loads():
    """Runs saved before those rounds were refused (an experiment's --routing-iterations reached
    segcaps:self-attention) read back with the rounds at their defaults, which routed nothing; under dynamic
    routing the saved rounds stand."""
    from capsnet.models import CapsPix2pixConfig, SegCapsR1Config

    saved = {"routing": "self-attention", "routing_iterations": 2, "primary_routing_iterations": 4}
    assert (SegCapsConfig.from_saved(saved).routing_iterations, SegCapsConfig.from_saved(saved).primary_routing_iterations,
            SegCapsR1Config.from_saved(saved).routing_iterations, CapsPix2pixConfig.from_saved(saved).routing_iterations) \
        == (3, 1, 1, 3)
    assert SegCapsConfig.from_saved({"routing": "dynamic", "routing_iterations": 2}).routing_iterations == 2
    with pytest.raises(ValueError, match="leave it at 3"):  # built anew, not read back: refused
        SegCapsConfig.from_dict(saved)


# the authors' capsnet.py (lalonderodney/SegCaps): the routings= argument of each capsule layer, read by hand
_CAPSNET_R3_ROUNDS = dict(primary=1, conv_2_1=3, conv_2_2=3, conv_3_1=3, conv_3_2=3, conv_4_1=3, deconv_1_1=3,
                          deconv_1_2=3, deconv_2_1=3, deconv_2_2=3, deconv_3_1=3, seg_caps=3)
_CAPSNET_R1_ROUNDS = dict(primary=1, conv_2_1=1, conv_2_2=3, conv_3_1=1, conv_3_2=3, conv_4_1=1, deconv_1_1=3,
                          deconv_1_2=1, deconv_2_1=3, deconv_2_2=1, deconv_3_1=3, seg_caps=1)


@pytest.mark.parametrize("name, rounds", [("segcaps", _CAPSNET_R3_ROUNDS), ("segcaps-r1", _CAPSNET_R1_ROUNDS)])
def test_each_capsule_layer_routes_the_rounds_of_the_authors_network(name, rounds):
    """R3 and R1 route as the authors' CapsNetR3 and CapsNetR1, layer by layer (R1 routes 3 rounds in the layers
    after the primary one that change the resolution, not 1 everywhere); the field moves those layers alone."""
    model = create_model(name, input_height=16, input_width=16)
    assert {n: layer.routing.iterations for n, layer in model.caps.items()} == rounds
    moved = create_model(name, input_height=16, input_width=16, strided_routing_iterations=2).caps
    assert {n: layer.routing.iterations for n, layer in moved.items()} == \
        {n: 2 if n in ("conv_2_2", "conv_3_2", "deconv_1_1", "deconv_2_1", "deconv_3_1") else r
         for n, r in rounds.items()}
    create_model(name, input_height=16, input_width=16, strided_routing_iterations=100)  # the bounds: 1..100
    for bad in (0, 101):
        with pytest.raises(ValueError, match="strided_routing_iterations"):
            create_model(name, strided_routing_iterations=bad)


def test_an_r1_run_saved_before_its_strided_rounds_reads_back_with_one_round_everywhere():
    """Its weights are the same either way; what it routed is what it was trained and scored with."""
    from capsnet.models import SegCapsR1Config

    saved = SegCapsR1Config().to_dict()
    del saved["strided_routing_iterations"]
    model = SegCaps(SegCapsR1Config.from_saved(saved))
    assert {layer.routing.iterations for layer in model.caps.values()} == {1}
    assert SegCapsConfig.from_saved({k: v for k, v in saved.items() if k != "routing_iterations"}) \
        .strided_routing_iterations is None  # R3's saved runs route its 3 rounds there, as before


def test_segcaps_r1_under_self_attention_keeps_its_own_rounds_default():
    """The rounds refused above are the ones moved from the config's own default (R1's is 1, R3's 3)."""
    assert create_model("segcaps-r1", routing="self-attention").config.routing_iterations == 1
    with pytest.raises(ValueError, match="leave it at 1"):
        create_model("segcaps-r1", routing="self-attention", routing_iterations=3)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_seg_kernel_widens_the_segmentation_capsules_window_and_is_counted(k):
    """``seg_kernel`` K: each pixel's votes for its segmentation capsule are made from the children in the K x K
    window around it (the paper's 1: its own position's alone), so a change to one child position moves exactly the
    K x K parents around it; the weights grow by (K^2 - 1) x 16 x 16 over the paper's count."""
    model = SegCaps(SegCapsConfig(seg_kernel=k))
    assert sum(p.numel() for p in model.parameters()) == model.config.num_weights \
        == paper_segcaps_weights() + (k * k - 1) * 16 * 16
    layer = model.caps["seg_caps"]
    g = torch.Generator().manual_seed(0)
    grid = torch.randn(1, 3, 16, 9, 9, generator=g)
    moved = grid.clone()
    moved[0, :, :, 4, 4] += torch.randn(3, 16, generator=g)
    with torch.no_grad():
        changed = (layer(moved) - layer(grid)).abs().amax(dim=(0, 1, 2)) > 1e-6  # (9, 9)
    window = torch.zeros(9, 9, dtype=torch.bool)
    window[4 - k // 2:5 + k // 2, 4 - k // 2:5 + k // 2] = True
    assert torch.equal(changed, window)


# each capsule layer's grid: the image's side over the grid's (the paper's Figure 2)
_SCALE = {"primary": 2, "conv_2_1": 2, "conv_2_2": 4, "conv_3_1": 4, "conv_3_2": 8, "conv_4_1": 8, "deconv_1_1": 4,
          "deconv_1_2": 4, "deconv_2_1": 2, "deconv_2_2": 2, "deconv_3_1": 1, "seg_caps": 1}


@pytest.mark.parametrize("width, level_widths", [(0.5, None), (1.25, None), (1.5, None), (2, None),
                                                 (1, (1, 2, 1.5, 0.5)), (2, (0.5, 1, 0.75, 0.25)),
                                                 (1, (3, 0.25, 1, 1))])  # 1.25: 2 types x 1.25 = 2.5 goes up to 3
def test_width_multiplies_every_hidden_layers_capsule_types_and_is_counted(width, level_widths):
    """``width`` w: each hidden capsule layer has round(w x its paper's types) types (conv1's one type and the one
    segmentation capsule stay), times ``level_widths``' entry for its grid's scale (1, 1/2, 1/4, 1/8), so the
    weights are the paper's layer list with those types, and each layer's grid carries them; the skips stack the
    widened types."""
    paper = {"primary": 2, "conv_2_1": 4, "conv_2_2": 4, "conv_3_1": 8, "conv_3_2": 8, "conv_4_1": 8,
             "deconv_1_1": 8, "deconv_1_2": 4, "deconv_2_1": 4, "deconv_2_2": 4, "deconv_3_1": 2, "seg_caps": 1}
    level = dict(zip((1, 2, 4, 8), level_widths or (1, 1, 1, 1)))
    types = {name: t if name == "seg_caps" else max(1, int(t * width * level[_SCALE[name]] + 0.5))
             for name, t in paper.items()}
    widths = {} if level_widths is None else {"level_widths": level_widths}
    layers = [(5, 16, 16), (5, 16, 16), (5, 16, 32), (5, 32, 32), (5, 32, 64), (5, 64, 32), (4, 32, 32),
              (5, 32, 32), (4, 32, 16), (5, 16, 16), (4, 16, 16), (1, 16, 16)]  # (kernel, in dim, out dim)
    caps = sum(k * k * d * t * o + t * o for (k, d, o), t in zip(layers, types.values()))
    model = SegCaps(SegCapsConfig(width=width, **widths))
    assert sum(p.numel() for p in model.parameters()) == model.config.num_weights \
        == paper_segcaps_weights() - sum(k * k * d * t * o + t * o for (k, d, o), t in zip(layers, paper.values())) \
        + caps
    with torch.no_grad():
        grids = model.capsule_grids(torch.rand(2, 1, 16, 24))
    assert {name: grid.shape[1] for name, grid in grids.items() if name != "conv1"} == types
    assert grids["seg_caps"].shape == (2, 1, 16, 16, 24)
    assert model.caps["deconv_1_2"].in_types == 2 * types["conv_3_1"]  # deconv_1_1's types and conv_3_1's
    assert model.caps["seg_caps"].in_types == types["deconv_3_1"] + 1  # and conv1's one
    attending = SegCaps(SegCapsConfig(width=width, routing="self-attention", **widths))  # a (T, J) prior per layer
    w = types
    children = [1, w["primary"], w["conv_2_1"], w["conv_2_2"], w["conv_3_1"], w["conv_3_2"], w["conv_4_1"],
                w["deconv_1_1"] + w["conv_3_1"], w["deconv_1_2"], w["deconv_2_1"] + w["conv_2_1"], w["deconv_2_2"],
                w["deconv_3_1"] + 1]  # each layer's input types, the skips stacked
    prior = sum(t * j for t, j in zip(children, types.values()))
    assert sum(p.numel() for p in attending.parameters()) == attending.config.num_weights \
        == model.config.num_weights + prior


def test_a_width_out_of_range_is_refused():
    for bad in (0.25, 9):
        with pytest.raises(ValueError, match="SegCapsConfig.width"):
            SegCapsConfig(width=bad)


def test_level_widths_read_from_json_and_are_refused_when_malformed():
    """A JSON list (a saved config, ``--model-option level_widths=[...]``) becomes the tuple the config holds, and
    reads back equal; a list of the wrong length, an entry out of 0.25..8, or a comma list given as a string are
    refused naming the field and the fix."""
    cfg = SegCapsConfig.from_dict({**SegCapsConfig().to_dict(), "level_widths": [1, 2, 1.5, 0.5]})
    assert cfg.level_widths == (1, 2, 1.5, 0.5) and isinstance(cfg.level_widths, tuple)
    assert SegCapsConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    with pytest.raises(ValueError, match=r"level_widths must be 4 numbers.*got \[1, 2\]: e\.g\. level_widths=\["):
        SegCapsConfig(level_widths=(1, 2))
    for bad in (0.2, 9):
        with pytest.raises(ValueError, match=r"SegCapsConfig.level_widths must be in 0.25..8"):
            SegCapsConfig(level_widths=(1, 1, bad, 1))
    with pytest.raises(ValueError, match=r"level_widths must be a list of finite numbers, got '1,2,1.5,0.5'; give a "
                                         r"JSON list, e.g. level_widths=\[1,2,1.5,0.5\]"):
        SegCapsConfig(level_widths="1,2,1.5,0.5")
    with pytest.raises(ValueError, match="a list of finite numbers"):
        SegCapsConfig(level_widths=(1, 1, True, 1))  # a bool is not a width


@pytest.mark.parametrize("deconv_init", ["fan-in", "reference"])
def test_resize_upsampling_makes_the_three_deconvolutions_votes_and_keeps_every_weight_count(deconv_init):
    """upsampling="resize" (the reference code's other upsamp_type): deconv_1_1, deconv_2_1 and deconv_3_1 enlarge
    their grids by nearest neighbour and convolve, the other layers unchanged; the same weight count (and num_weights
    says it); their kernels start He-normal over K K Din under either deconv_init (the reference's fan of a plain
    convolution is that too); a saved config reads back; another value is refused with the choices."""
    from capsnet.layers import ConvTransposeCaps2d

    torch.manual_seed(0)
    cfg = SegCapsConfig(input_height=16, input_width=16, upsampling="resize", deconv_init=deconv_init)
    model = SegCaps(cfg)
    deconvs = {n: m for n, m in model.caps.items() if isinstance(m, ConvTransposeCaps2d)}
    assert sorted(deconvs) == ["deconv_1_1", "deconv_2_1", "deconv_3_1"]
    assert all(m.upsampling == "resize" for m in deconvs.values())
    assert sum(p.numel() for p in model.parameters()) == cfg.num_weights == SegCapsConfig().num_weights == 1_425_649
    for m in deconvs.values():  # (J Dout, Din, 4, 4): sd sqrt(2 / (16 Din)), 0.125 / 0.177 here
        assert m.weight.shape[1:] == (m.in_dim, 4, 4)
        assert m.weight.std().item() == pytest.approx((2 / (16 * m.in_dim)) ** 0.5, rel=0.05)
    out = model.eval()(torch.rand(2, 1, 16, 16))
    assert out.probabilities.shape == (2, 1, 16, 16) and torch.isfinite(out.probabilities).all()
    assert SegCapsConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    assert SegCapsConfig.from_dict({k: v for k, v in cfg.to_dict().items() if k != "upsampling"}).upsampling == "deconv"
    with pytest.raises(ValueError, match=r"SegCapsConfig.upsampling must be one of deconv, resize, subpix, got "
                                         r"'bilinear'"):
        SegCapsConfig(upsampling="bilinear")


def test_subpix_upsampling_makes_the_three_deconvolutions_votes_with_four_times_their_weights():
    """upsampling="subpix" (the reference code's third upsamp_type): deconv_1_1, deconv_2_1 and deconv_3_1 convolve
    to 4 times their vote channels (stride 2: 2 x 2 blocks), the other layers unchanged. Their kernels, counted by
    hand from the paper's layer list (K K Din J Dout): deconv_1_1 4 4 32 (8 32), deconv_2_1 4 4 32 (4 16),
    deconv_3_1 4 4 16 (2 16), 172,032 in all, each 4 times over: 1,425,649 + 3 x 172,032 = 1,941,745, which
    num_weights and generator_weights say too."""
    from capsnet.layers import ConvTransposeCaps2d

    assert 16 * 32 * 8 * 32 + 16 * 32 * 4 * 16 + 16 * 16 * 2 * 16 == 172_032
    torch.manual_seed(0)
    cfg = SegCapsConfig(input_height=16, input_width=16, upsampling="subpix")
    model = SegCaps(cfg)
    deconvs = {n: m for n, m in model.caps.items() if isinstance(m, ConvTransposeCaps2d)}
    assert sorted(deconvs) == ["deconv_1_1", "deconv_2_1", "deconv_3_1"]
    assert all(m.upsampling == "subpix" and m.weight.shape == (4 * m.out_types * m.out_dim, m.in_dim, 4, 4)
               for m in deconvs.values())
    assert sum(p.numel() for p in model.parameters()) == cfg.num_weights == 1_425_649 + 3 * 172_032
    out = model.eval()(torch.rand(2, 1, 16, 16))
    assert out.probabilities.shape == (2, 1, 16, 16) and torch.isfinite(out.probabilities).all()
    assert SegCapsConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    from capsnet.models import CapsPix2pixConfig, create_model

    gan = create_model("capspix2pix", upsampling="subpix")
    assert gan.config.generator_weights == sum(p.numel() for p in gan.generator.parameters()) == \
        CapsPix2pixConfig().generator_weights + 3 * 172_032


def test_an_even_seg_kernel_is_refused_with_the_nearest_odd_ones():
    with pytest.raises(ValueError, match=r"SegCapsConfig.seg_kernel must be odd .* got 4: use 3 or 5"):
        SegCapsConfig(seg_kernel=4)
    with pytest.raises(ValueError, match="seg_kernel"):
        SegCapsConfig(seg_kernel=0)


def test_segmentation_inputs_the_review_found_unchecked():
    """Found by a review (2026-11-29): SegCaps.forward broadcast a (B, H, W) mask over its 16 pose entries (at B = 16
    a wrong reconstruction, silently) and one mask over the batch; soft Dice summed in bf16 under autocast (about 3
    digits); a loss over no examples was NaN; a depth-1 U-Net's side message said it halved them 3 times."""
    from capsnet.models import UNet

    torch.manual_seed(0)
    model = SegCaps(SegCapsConfig(input_height=16, input_width=16)).eval()
    x, y = torch.rand(16, 1, 16, 16), (torch.rand(16, 1, 16, 16) > 0.5).float()
    for bad in (y[:, 0], y[:1], torch.ones(16, 2, 16, 16)):
        with pytest.raises(ValueError, match=r"masks must be \(B, 1, H, W\) = \(16, 1, 16, 16\), one per image, got"):
            model(x, bad)
    assert model(x, y).reconstructions.shape == (16, 1, 16, 16)
    # soft Dice in float32 at least: a bf16 U-Net's probabilities scored as their float32 copy
    u = UNet(UNetConfig(base_channels=4, depth=2, input_height=64, input_width=64))
    images, masks = torch.rand(2, 1, 64, 64), (torch.rand(2, 1, 64, 64) > 0.9).float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        p = u(images).probabilities
    assert p.dtype == torch.bfloat16 and soft_dice(p, masks).dtype == torch.float32
    torch.testing.assert_close(segmentation_loss(p, masks, "dice"), segmentation_loss(p.float(), masks, "dice"))
    for kind in ("bce", "weighted-bce", "dice", "bce+dice"):
        with pytest.raises(ValueError, match=r"a loss over an empty batch \(0 examples\) is undefined"):
            segmentation_loss(torch.zeros(0, 1, 8, 8), torch.zeros(0, 1, 8, 8), kind)
    shallow = UNet(UNetConfig(depth=1, base_channels=4, input_height=8, input_width=8))
    with pytest.raises(ValueError, match=r"multiples of 8 \(SegCaps' multiple, so both take the same images; this "
                                         r"U-Net halves them 1 time\), got 12x12"):
        shallow(torch.rand(1, 1, 12, 12))


def test_a_pixel_is_foreground_when_its_probability_exceeds_one_half_not_at_it(monkeypatch):
    """evaluate_segmentation's mask is probability > 0.5, as README and predict say: a pixel at exactly 0.5 is
    background. >= 0.5 passed every test (found by mutation testing, 2026-11-30)."""
    from capsnet import evaluate as ev

    masks = torch.zeros(2, 1, 4, 4)
    masks[0, 0, :2, :2] = 1  # 4 pixels
    masks[1, 0, 1:, 1:] = 1  # 9 pixels
    at_half = masks * 0.5  # exactly 0.5 on every mask pixel, 0 elsewhere
    just_over = masks * 0.5000001
    for probabilities, dice in ((at_half, 0.0), (just_over, 1.0)):
        monkeypatch.setattr(ev, "_loss_of", lambda model, p=probabilities: (
            lambda m, x, y, recon_weight: (torch.tensor(0.0), p[:len(y)])))
        got = ev.evaluate_segmentation(torch.nn.Identity(), torch.rand(2, 1, 4, 4), masks, batch_size=2)
        assert got.dice == dice and got.iou == dice
        assert got.pixel_accuracy == pytest.approx(1 - (1 - dice) * 13 / 32)


def test_a_half_segcaps_sums_its_reconstruction_and_measures_its_probabilities_in_float32():
    """A .half() SegCaps: the reconstruction term summed its squared errors in float16, inf past 65,504 (a 512 x 512
    CT slice, or images of 100 here); the probabilities (capsule lengths) were float16, whose steps of 5e-4 below 1
    the cross-entropy of sure pixels magnified (the shipped model's loss 4.9% off on two digits: a review,
    2026-11-30). The loss of the half model is now the float32 model's, near enough."""
    from capsnet.evaluate import load_model
    from capsnet.data import load_dataset

    torch.manual_seed(0)
    model = create_model("segcaps-r1", input_height=16, input_width=16).eval()
    images = torch.rand(2, 1, 16, 16) * 100
    masks = (torch.rand(2, 1, 16, 16) > 0.5).to(torch.uint8)
    full = MODELS["segcaps-r1"].loss(model, images, masks, recon_weight=0.0005)[0]
    half = MODELS["segcaps-r1"].loss(_half_copy(model), images.half(), masks, recon_weight=0.0005)[0]
    assert torch.isfinite(half) and half.item() == pytest.approx(full.item(), rel=1e-2)
    shipped, _ = load_model("pretrained:segcaps-mnist")
    shipped = shipped.float().eval()
    digits = load_dataset("mnist-sample", "test").images[:1].float() / 255
    canvases = torch.nn.functional.pad(digits, (18,) * 4)  # a test digit on 64 x 64
    masks = (canvases > 0.5).to(torch.uint8)
    full = MODELS["segcaps"].loss(shipped, canvases, masks)[0].item()
    half, probabilities = MODELS["segcaps"].loss(_half_copy(shipped), canvases.half(), masks)
    assert probabilities.dtype == torch.float32 and half.item() == pytest.approx(full, rel=0.01)
    wide = create_model("segcaps-r1", input_height=16, input_width=16).double().eval()  # widened, never narrowed
    assert wide(torch.rand(1, 1, 16, 16, dtype=torch.float64)).probabilities.dtype == torch.float64


def _half_copy(model):
    import copy

    return copy.deepcopy(model).half().eval()


def test_segcaps_probability_is_the_segmentation_capsules_length():
    """The probability of each pixel is the length of its segmentation capsule (LaLonde and Bagci 2018),
    not its square: nothing but ranges tested it (mutation testing, 2026-12-01)."""
    torch.manual_seed(0)
    model = create_model("segcaps-r1", input_height=32, input_width=32).eval()
    with torch.no_grad():
        out = model(torch.rand(2, 1, 32, 32))
    torch.testing.assert_close(out.probabilities, out.poses.double().norm(dim=2).to(out.probabilities.dtype),
                               rtol=1e-5, atol=1e-7)


def test_the_unet_concatenates_each_levels_features_with_the_upsampled_ones():
    """Ronneberger et al.'s skip connections, written out: each decoder level merges the upsampled map with the
    encoder's map of its size (concatenated, up-sampled first). Skips of zeros passed every test (mutation
    testing, 2026-12-01)."""
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = create_model("unet", input_height=32, input_width=32).eval()
    images = torch.rand(2, 1, 32, 32)
    with torch.no_grad():
        levels, x = [], images
        for k, block in enumerate(model.down):
            x = block(x if k == 0 else F.max_pool2d(x, 2))
            levels.append(x)
        for up, merge, skip in zip(model.up, model.merge, reversed(levels[:-1])):
            x = merge(torch.cat([up(x), skip], dim=1))
        torch.testing.assert_close(model(images).logits, model.out(x))
        zeroed = list(levels)
        x = levels[-1]
        for up, merge, skip in zip(model.up, model.merge, reversed(zeroed[:-1])):
            x = merge(torch.cat([up(x), torch.zeros_like(skip)], dim=1))
        assert not torch.allclose(model(images).logits, model.out(x))  # the skips carry something
