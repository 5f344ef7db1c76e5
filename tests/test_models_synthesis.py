"""CapsPix2pix and pix2pix: weight counts, shapes, seeded generation, gradients, losses in closed form, bad input,
batch independence; SegCaps unchanged by the shared capsule stack."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from capsnet.models import (MODELS, CapsPix2pix, CapsPix2pixConfig, CapsPix2pixDeepConfig, Pix2pix, Pix2pixConfig,
                            SegCaps, SegCapsConfig, create_model, model_name, synthesis_losses)
from capsnet.models.capspix2pix import truncate_normal
from capsnet.models.segcaps import capsule_stack, instance_norm_capsules, walk_capsule_stack
from capsnet.synthesis import generate

SYNTHESIS = ["capspix2pix", "pix2pix"]  # capspix2pix-deep: the same model from another start (its own test below)
# Small sizes: CapsPix2pix's capsule layers are SegCaps' (fixed); its noise and discriminator are shrunk
SMALL = {"capspix2pix": dict(noise_dim=8, disc_channels=4), "pix2pix": dict(base_channels=4, disc_channels=4)}


def _model(name: str, H: int = 16, W: int = 16, **kw) -> nn.Module:
    if name == "pix2pix" and min(H, W) < 24:
        kw.setdefault("disc_layers", 2)  # the 3-layer PatchGAN needs sides of 24
    return create_model(name, **{**SMALL[name], **kw}, input_height=H, input_width=W)


def _count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _data(B: int = 3, H: int = 16, W: int = 16, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    labels = (torch.rand(B, 1, H, W, generator=g) > 0.7).float()
    return labels, torch.rand(B, 1, H, W, generator=g)


# -- weight counts -----------------------------------------------------------------------------------------------

def capspix2pix_weights_by_hand(H: int, W: int, c_in: int = 1, c_out: int = 1, noise: int = 100,
                                ndf: int = 64, image_kernel: int = 1) -> tuple[int, int]:
    """(generator, discriminator) counted layer by layer: the noise layer, conv1 over label map + noise channel,
    SegCaps' Figure 2 capsule layers (kernel, in dim, out types, out dim) with routing bias, the image convolution
    (1x1 unless asked); the DCGAN discriminator's bias-free 4x4 convolutions while the smaller side is >= 8."""
    caps = [(5, 16, 2, 16), (5, 16, 4, 16), (5, 16, 4, 32), (5, 32, 8, 32), (5, 32, 8, 64), (5, 64, 8, 32),
            (4, 32, 8, 32), (5, 32, 4, 32), (4, 32, 4, 16), (5, 16, 4, 16), (4, 16, 2, 16), (1, 16, 1, 16)]
    g = (noise + 1) * H * W + ((c_in + 1) * 25 + 1) * 16 + sum(k * k * d * t * o + t * o for k, d, t, o in caps)
    g += 16 * image_kernel ** 2 * c_out + c_out
    d, c, side, k = 0, c_in + c_out, min(H, W), 0
    while side >= 8:
        w = ndf * min(2 ** k, 8)
        d += 16 * c * w + (2 * w if k else 0)
        c, side, k = w, side // 2, k + 1
    return g, d + 16 * c


def test_weight_counts_at_32x32_and_the_tenth():
    caps, pix = CapsPix2pix(CapsPix2pixConfig()), Pix2pix(Pix2pixConfig())
    # pix2pix's U-Net for 32x32: C64-C128-C256-C512-C512 down (no BN on the first and the innermost), up with
    # BN to 512-256-128-64 (the skips doubling the inputs) and 128 -> 1 with bias; the n_layers=3 PatchGAN on
    # 2 channels: 2-64 (bias), 64-128, 128-256, 256-512 (BN), 512-1 (bias)
    pix_g = (16 * 64 + 16 * 64 * 128 + 256 + 16 * 128 * 256 + 512 + 16 * 256 * 512 + 1024 + 16 * 512 * 512  # down
             + 16 * 512 * 512 + 1024 + 16 * 1024 * 256 + 512 + 16 * 512 * 128 + 256 + 16 * 256 * 64 + 128  # up
             + 16 * 128 + 1)
    pix_d = 16 * 2 * 64 + 64 + 16 * 64 * 128 + 256 + 16 * 128 * 256 + 512 + 16 * 256 * 512 + 1024 + 16 * 512 + 1
    assert (_count(pix.generator), _count(pix.discriminator)) == (pix_g, pix_d) == (16_652_929, 2_764_609)
    assert (_count(caps.generator), _count(caps.discriminator)) == capspix2pix_weights_by_hand(32, 32) \
        == (1_519_953, 662_272)
    for model in (caps, pix):
        cfg = model.config
        assert cfg.num_weights == _count(model) and cfg.generator_weights == _count(model.generator)
        assert cfg.discriminator_weights == _count(model.discriminator)
    assert 10 * _count(caps.generator) <= _count(pix.generator)  # the paper's claim: a tenth of the weights or fewer


@pytest.mark.parametrize("kw", [dict(), dict(input_height=24, input_width=40, in_channels=3, out_channels=2),
                                dict(input_height=64, input_width=16, routing_bias=False, init_gain=3.0, noise_dim=7),
                                dict(input_height=256, input_width=256, disc_channels=8),
                                dict(image_kernel=3, out_channels=3), dict(image_kernel=7, input_height=16)])
def test_capspix2pix_num_weights_is_exact(kw):
    cfg = CapsPix2pixConfig(**kw)
    model = CapsPix2pix(cfg)
    assert cfg.num_weights == _count(model)
    if cfg.routing_bias:
        assert (_count(model.generator), _count(model.discriminator)) == capspix2pix_weights_by_hand(
            cfg.input_height, cfg.input_width, cfg.in_channels, cfg.out_channels, cfg.noise_dim, cfg.disc_channels,
            cfg.image_kernel)


def test_capspix2pix_level_widths_move_capsule_types_between_scales_and_are_counted():
    """``level_widths`` (1, 1, 1.5, 0.5): the generator's 1/4-level layers get 1.5 times the paper's types, the 1/8
    level's half, the rest the paper's; its weight count follows (4 x 4 grid at 32 x 32: conv_3_2 and conv_4_1 hold
    half their 25 x 32 x 8 x 64 and 25 x 64 x 8 x 32 kernels and biases), and the deep start takes it too."""
    for name in ("capspix2pix", "capspix2pix-deep"):
        plain, moved = create_model(name), create_model(name, level_widths=[1, 1, 1.5, 0.5])
        with torch.no_grad():
            grids = moved.generator.capsule_grids(torch.rand(2, 1, 32, 32), moved.noise(2))
        assert {k: g.shape[1:3] for k, g in grids.items()} == {
            "conv1": (1, 16), "primary": (2, 16), "conv_2_1": (4, 16), "conv_2_2": (6, 32), "conv_3_1": (12, 32),
            "conv_3_2": (4, 64), "conv_4_1": (4, 32), "deconv_1_1": (12, 32), "deconv_1_2": (6, 32),
            "deconv_2_1": (4, 16), "deconv_2_2": (4, 16), "deconv_3_1": (2, 16), "seg_caps": (1, 16)}
        assert moved.config.generator_weights == _count(moved.generator)
        halved = (25 * 32 * 4 * 64 + 4 * 64) + (25 * 64 * 4 * 32 + 4 * 32)
        grown = sum(k * k * d * j * o + j * o for k, d, j, o in [(5, 16, 2, 32), (5, 32, 4, 32), (4, 32, 4, 32),
                                                                  (5, 32, 2, 32)])  # conv_2_2 ... deconv_1_2's half
        assert moved.config.generator_weights - plain.config.generator_weights == grown - halved
        assert moved.generator(torch.rand(2, 1, 32, 32), moved.noise(2)).shape == (2, 1, 32, 32)


def test_capspix2pix_upsampling_resize_reaches_the_generators_deconvolutions_alone():
    """SegCaps' ``upsampling`` field on the generator: its three deconvolutional capsule layers enlarge and convolve
    (the same generator weights as the paper's transposed convolutions), the images keep their shape, and a saved
    config without the field reads as the transposed convolution it had."""
    from capsnet.layers import ConvTransposeCaps2d

    for name in ("capspix2pix", "capspix2pix-deep"):
        model = create_model(name, upsampling="resize")
        kinds = {n: getattr(m, "upsampling", None) for n, m in model.generator.caps.items()}
        assert {n for n, k in kinds.items() if k == "resize"} == {"deconv_1_1", "deconv_2_1", "deconv_3_1"}
        assert all(isinstance(model.generator.caps[n], ConvTransposeCaps2d) == (k is not None)
                   for n, k in kinds.items())
        assert model.config.generator_weights == _count(model.generator) == create_model(name).config.generator_weights
        with torch.no_grad():
            assert model.eval().generate(torch.rand(2, 1, 32, 32), seed=0).shape == (2, 1, 32, 32)
        saved = {k: v for k, v in model.config.to_dict().items() if k != "upsampling"}
        assert type(model.config).from_saved(saved).upsampling == "deconv"
    with pytest.raises(ValueError, match=r"CapsPix2pixConfig.upsampling must be one of deconv, resize, subpix, got "
                                         r"'x'"):
        CapsPix2pixConfig(upsampling="x")


@pytest.mark.parametrize("kw", [dict(input_height=24, input_width=40, in_channels=3, out_channels=2),
                                dict(input_height=16, input_width=64, disc_layers=2, base_channels=8),
                                dict(input_height=256, input_width=256, base_channels=2, disc_layers=5)])
def test_pix2pix_num_weights_is_exact(kw):
    cfg = Pix2pixConfig(**kw)
    assert cfg.num_weights == _count(Pix2pix(cfg))


# -- shapes ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", SYNTHESIS)
@pytest.mark.parametrize("size", [(16, 16), (32, 32), (24, 40)])
def test_output_shapes_for_several_sizes(name, size):
    torch.manual_seed(0)
    H, W = size
    model = _model(name, H, W)
    labels, real = _data(2, H, W)
    fake = model(labels, model.noise(2, 1))
    assert fake.shape == (2, 1, H, W) and ((fake >= 0) & (fake <= 1)).all()
    logits = model.discriminator(fake, labels)
    if name == "capspix2pix":
        assert logits.shape == (2,)
        grids = model.generator.capsule_grids(labels, model.noise(2, 1))
        assert grids["conv1"].shape == (2, 1, 16, H, W) and grids["conv_3_2"].shape == (2, 8, 64, H // 8, W // 8)
        assert grids["seg_caps"].shape == (2, 1, 16, H, W)
    else:
        n = model.config.disc_layers
        assert logits.shape == (2, 1, (H >> n) - 2, (W >> n) - 2)
    assert torch.isfinite(logits).all()


def test_pix2pix_unet_reaches_1x1_for_a_square_power_of_two():
    model = Pix2pix(Pix2pixConfig(base_channels=4, disc_channels=4))
    assert model.config.levels == 5 and model.config.widths == [4, 8, 16, 32, 32]
    sizes = []
    hooks = [m.register_forward_hook(lambda m, i, o: sizes.append(tuple(o.shape[-2:]))) for m in model.generator.down]
    model.generator(torch.rand(1, 1, 32, 32))
    for h in hooks:
        h.remove()
    assert sizes == [(16, 16), (8, 8), (4, 4), (2, 2), (1, 1)]
    drops = [k for k, up in enumerate(model.generator.up) if any(isinstance(m, nn.Dropout) for m in up)]
    assert drops == [2, 3, 4]  # the three up-layers nearest the bottleneck, the first run


def test_capspix2pix_discriminator_is_the_reference_at_64x64():
    d = CapsPix2pix(CapsPix2pixConfig(input_height=64, input_width=64)).discriminator
    convs = [(m.in_channels, m.out_channels, m.kernel_size, m.stride, m.padding, m.bias is None)
             for m in d.modules() if isinstance(m, nn.Conv2d)]
    assert convs == [(2, 64, (4, 4), (2, 2), (1, 1), True), (64, 128, (4, 4), (2, 2), (1, 1), True),
                     (128, 256, (4, 4), (2, 2), (1, 1), True), (256, 512, (4, 4), (2, 2), (1, 1), True),
                     (512, 1, (4, 4), (1, 1), (0, 0), True)]
    assert [m.num_features for m in d.modules() if isinstance(m, nn.BatchNorm2d)] == [128, 256, 512]


# -- seeded generation -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", SYNTHESIS)
def test_same_seed_same_images_different_seed_different_images(name):
    torch.manual_seed(3)
    model = _model(name).eval()
    labels, _ = _data(2)
    state = torch.get_rng_state()
    a, b, c = model.generate(labels, seed=5), model.generate(labels, seed=5), model.generate(labels, seed=6)
    assert torch.equal(a, b) and (a - c).abs().max() > 1e-6  # an untrained pix2pix stays near 0.5 everywhere
    assert torch.equal(torch.get_rng_state(), state)  # the caller's RNG is untouched
    assert not model.training and not any(m.training for m in model.modules())  # modes restored
    assert not a.requires_grad


def test_capspix2pix_noise_is_a_seeded_standard_normal_and_z_can_be_given():
    model = _model("capspix2pix").eval()
    z = model.noise(4, 11)
    assert torch.equal(z, torch.randn(4, 8, generator=torch.Generator().manual_seed(11)))
    assert torch.equal(model.noise(4, torch.Generator().manual_seed(11)), z)
    labels, _ = _data(4)
    torch.testing.assert_close(model.generate(labels, seed=11), model.generate(labels, z=z), rtol=0, atol=0)
    torch.testing.assert_close(model(labels), model.generate(labels, seed=0), rtol=0, atol=0)  # forward: seed 0
    with pytest.raises(ValueError, match=r"model.noise\(4, seed\)"):
        model(labels, torch.zeros(4, 3))


def test_a_rows_noise_and_image_do_not_depend_on_how_many_are_drawn_with_it():
    # torch's CPU randn draws the last 16 values afresh when a count is not a multiple of 16: unpadded, row 2 of a
    # 3-row draw of 100-d noise (300 values) differed from row 2 of a 1,000-row draw in its last 16 values
    model = _model("capspix2pix", noise_dim=100).eval()
    long = model.noise(1000, 5)
    assert torch.equal(long, torch.randn(1000, 100, generator=torch.Generator().manual_seed(5)))  # 100,000 = 16 k
    for n in (1, 2, 3, 5, 7, 999):
        assert torch.equal(model.noise(n, 5), long[:n]), n
    labels, _ = _data(4)
    torch.testing.assert_close(generate(model, labels[:3], seed=5)[2], generate(model, labels, seed=5)[2],
                               rtol=0, atol=1e-6)


def test_truncated_noise_is_the_truncated_normal_of_the_seeds_own_draw():
    model = _model("capspix2pix", noise_dim=1000)
    # the standard normal truncated to [-1, 1]: its standard deviation in closed form, sqrt(1 - 2 phi(1) / (2 Phi(1)
    # - 1)), with phi(1) = e^-1/2 / sqrt(2 pi) and 2 Phi(1) - 1 = erf(1 / sqrt 2)
    sd1 = math.sqrt(1 - 2 * math.exp(-0.5) / math.sqrt(2 * math.pi) / math.erf(1 / math.sqrt(2)))
    z1 = model.noise(100, 3, truncation=1.0)  # 100,000 values
    assert z1.dtype == torch.float32 and z1.shape == (100, 1000)
    assert z1.abs().max() <= 1.0 and abs(z1.mean().item()) < 0.01
    assert z1.std().item() == pytest.approx(sd1, abs=0.005)  # 0.5396; the untruncated normal's is 1
    # the seed's own draw, cut: each value keeps its sign and order, shrinks as t falls, and comes back for large t
    z = model.noise(100, 3)
    torch.testing.assert_close(model.noise(100, 3, truncation=12.0), z, rtol=1e-6, atol=1e-6)
    z05 = model.noise(100, 3, truncation=0.5)
    assert torch.equal(torch.sign(z1), torch.sign(z)) and torch.equal(torch.sign(z05), torch.sign(z))
    assert (z05.abs() <= z1.abs()).all() and (z1.abs() <= z.abs() + 1e-6).all()
    order = z[0].argsort()
    assert (z05[0][order].diff() >= 0).all() and (z1[0][order].diff() >= 0).all()
    # a value's quantile is kept: Phi(z) = (Phi(z1) - Phi(-1)) / (Phi(1) - Phi(-1)), by the error function
    phi = lambda v: 0.5 * (1 + torch.erf(v.double() / math.sqrt(2)))  # noqa: E731
    low = phi(torch.tensor(-1.0))
    torch.testing.assert_close(phi(z[:5]), (phi(z1[:5]) - low) / (1 - 2 * low), rtol=0, atol=1e-6)
    far = torch.tensor([-9.0, -6.0, 6.0, 9.0], dtype=torch.float64)  # the tails: odd, inside [-2, 2], in order
    cut = truncate_normal(far, 2.0)
    assert cut.dtype == torch.float64 and torch.equal(cut, -cut.flip(0)) and (cut.abs() <= 2).all()
    assert 1.9999999 < cut[2] < 2 and cut[3] >= cut[2]  # 6 lands 2e-8 inside the cut (Phi(-6) = 1e-9)
    assert torch.equal(model.noise(2, 3, truncation=0), torch.zeros(2, 1000))  # the noise's mean
    labels, _ = _data(2)
    small = _model("capspix2pix").eval()
    torch.testing.assert_close(small.generate(labels, z=small.noise(2, 7, truncation=0.0)),
                               small.generate(labels, z=torch.zeros(2, 8)), rtol=0, atol=0)
    np = pytest.importorskip("numpy")
    assert torch.equal(model.noise(2, 3, truncation=np.float32(0.5)), z05[:2])  # numpy scalars are numbers too
    for bad in (-0.5, float("nan"), float("inf"), True, "1", torch.tensor(1.0)):
        with pytest.raises(ValueError, match="truncation must be a finite number >= 0"):
            model.noise(2, 0, truncation=bad)
    with pytest.raises(ValueError, match="pix2pix has no noise vector to truncate"):
        _model("pix2pix").noise(2, 0, truncation=1.0)


def test_pix2pix_generates_with_dropout_on_and_batch_norm_in_eval_mode():
    torch.manual_seed(4)
    model = _model("pix2pix").eval()
    labels, _ = _data(2)
    assert model.noise(2, 0).shape == (2, 0)
    with torch.no_grad():
        plain = model(labels)  # eval: no dropout, deterministic
        torch.testing.assert_close(model(labels), plain, rtol=0, atol=0)
        by_hand = model.generator.eval()
        for m in by_hand.modules():
            if isinstance(m, nn.Dropout):
                m.train()
        torch.manual_seed(9)
        sampled = by_hand(labels)
        model.eval()
    torch.testing.assert_close(model.generate(labels, seed=9), sampled, rtol=0, atol=0)
    assert (sampled - plain).abs().max() > 1e-6


def test_capspix2pix_dropout_drops_whole_capsule_types_in_training_only():
    model = _model("capspix2pix")
    torch.manual_seed(0)
    out = model.generator.dropout(torch.ones(6, 8, 16, 3, 3))
    per_type = out.flatten(2)  # (B, T, D*H*W)
    assert ((per_type == 0).all(2) | (per_type == 2).all(2)).all()  # a type is kept (scaled) or dropped whole
    assert (per_type == 0).any() and (per_type == 2).any()
    calls = []
    stack = capsule_stack(routing_iterations=1, primary_routing_iterations=1, routing_softmax="parents",
                          routing_bias=True)
    grids = walk_capsule_stack(stack, torch.rand(1, 1, 16, 8, 8), lambda x: calls.append(x.shape) or 0 * x)
    assert len(calls) == len(stack) - 1 and grids["conv_4_1"].abs().max() == 0  # all layers but the last
    labels, _ = _data(2)
    z = model.noise(2, 0)
    model.train()
    assert (model(labels, z) - model(labels, z)).abs().max() > 0  # training: dropout on
    model.eval()
    torch.testing.assert_close(model(labels, z), model(labels, z), rtol=0, atol=0)


class _Record(nn.Module):
    """A stand-in for the generator's dropout: passes its input on and records it and its shape."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []
        self.grids: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.shapes.append(tuple(x.shape))
        self.grids.append(x.detach())
        return x


@pytest.mark.parametrize("scale,dropped", [(1, {16: 1, 8: 4, 4: 4, 2: 2}), (4, {4: 4, 2: 2}), (8, {2: 2})])
def test_capspix2pix_dropout_min_scale_drops_out_only_the_deep_grids(scale, dropped):
    """dropout_min_scale s: the dropout sees only the grids at 1/s of the image or smaller. A 16x16 input, the
    layers' grids by side: primary, conv_2_1, deconv_2_1, deconv_2_2 at 8; conv_2_2, conv_3_1, deconv_1_1,
    deconv_1_2 at 4; conv_3_2, conv_4_1 at 2; deconv_3_1 at 16 (seg_caps, the last, never)."""
    model = _model("capspix2pix", dropout_min_scale=scale).train()
    model.generator.dropout = record = _Record()
    labels, _ = _data(2)
    model.generator.capsule_grids(labels, model.noise(2, 0))
    sides = [shape[-1] for shape in record.shapes]
    assert {side: sides.count(side) for side in set(sides)} == dropped
    with pytest.raises(ValueError, match=r"dropout_min_scale must be 1, 2, 4 or 8 .* got 3"):
        CapsPix2pixConfig(dropout_min_scale=3)


def test_conv1_skip_dropout_reaches_only_the_skips_copy_of_conv1():
    """between_conv1_skip: the dropout (here one that zeroes everything) reaches conv1's copy in the last skip, so
    seg_caps no longer sees conv1 (its output is the same for any input), while the primary layer still reads
    conv1 whole (the same grid with the flag or without); the config's conv1_skip_dropout turns it on."""
    stack = capsule_stack(routing_iterations=1, primary_routing_iterations=1, routing_softmax="parents",
                          routing_bias=True)
    a, b = torch.rand(1, 1, 16, 8, 8), torch.rand(1, 1, 16, 8, 8)
    walk = {flag: [walk_capsule_stack(stack, x, lambda g: 0 * g, between_conv1_skip=flag) for x in (a, b)]
            for flag in (False, True)}
    assert not torch.equal(walk[False][0]["seg_caps"], walk[False][1]["seg_caps"])  # the skip carries conv1
    torch.testing.assert_close(walk[True][0]["seg_caps"], walk[True][1]["seg_caps"], rtol=0, atol=0)
    torch.testing.assert_close(walk[True][0]["primary"], walk[False][0]["primary"], rtol=0, atol=0)
    assert walk[True][0]["primary"].abs().max() == 0  # (the zeroing dropout is applied after the primary layer)
    model = _model("capspix2pix", conv1_skip_dropout=True).train()
    model.generator.dropout = record = _Record()
    model.generator.capsule_grids(*_data(2)[:1], model.noise(2, 0))
    assert [shape[1:] for shape in record.shapes].count((1, 16, 16, 16)) == 1  # conv1's copy: one 16D type, full
    # size (deconv_3_1's grid there has 2 types)


def test_capspix2pix_capsule_norm_normalises_what_goes_on_before_the_dropout():
    """capsule_norm="instance": every capsule grid but the last is centred over its positions and scaled to unit
    RMS length per example and type (SegCaps' instance_norm_capsules), conv1 is not, the dropout comes after it,
    the weights are the same as without it, and an example's image does not depend on its batch."""
    torch.manual_seed(1)
    model = _model("capspix2pix", capsule_norm="instance", dropout=0.0).eval()
    plain = _model("capspix2pix", dropout=0.0).eval()
    plain.load_state_dict(model.state_dict())  # the same weights: the norm holds none
    labels = _data(4)[0]
    z = model.noise(4, 0)
    with torch.no_grad():
        grids, plain_grids = model.generator.capsule_grids(labels, z), plain.generator.capsule_grids(labels, z)
    torch.testing.assert_close(grids["conv1"], plain_grids["conv1"], rtol=0, atol=0)
    torch.testing.assert_close(grids["primary"], instance_norm_capsules(plain_grids["primary"]))
    for name in ("primary", "conv_3_2", "deconv_3_1"):  # centred, unit RMS lengths (less the eps of 1e-5)
        assert grids[name].mean(dim=(-2, -1)).abs().max() < 1e-5, name
        ms = grids[name].pow(2).sum(dim=2).mean(dim=(-2, -1))
        assert ((ms > 0.98) & (ms <= 1)).all(), (name, ms)
    assert grids["seg_caps"].pow(2).sum(dim=2).max() < 1  # the last layer's poses go to the image as squashed
    with torch.no_grad():
        images = model(labels, z)
        assert not torch.allclose(images, plain(labels, z))
        torch.testing.assert_close(model(labels[1:2], z[1:2]), images[1:2], rtol=1e-4, atol=1e-6)
    dropped = _model("capspix2pix", capsule_norm="instance").train()  # dropout after the norm: whole types zeroed,
    dropped.generator.dropout = record = _Record()  # the others normalised
    dropped.generator.capsule_grids(labels, z)
    for grid in record.grids[:3]:
        ms = grid.pow(2).sum(dim=2).mean(dim=(-2, -1))
        assert ((ms > 0.98) & (ms <= 1)).all()
    with pytest.raises(ValueError, match=r"capsule_norm must be one of none, instance, got 'batch'"):
        CapsPix2pixConfig(capsule_norm="batch")


def test_capspix2pix_image_kernel_reads_a_neighbourhood_of_poses():
    """image_kernel k: the image convolution is k x k with 'same' padding, so a pixel moves when a pose k // 2 away
    changes and the image keeps its size; its start is scaled by 1/k; an even kernel is refused by name."""
    with pytest.raises(ValueError, match=r"image_kernel must be 1, 3, 5 or 7 .* got 2"):
        CapsPix2pixConfig(image_kernel=2)
    for k in (1, 3):
        g = _model("capspix2pix", image_kernel=k).generator.eval()
        poses = torch.zeros(1, 16, 9, 9, requires_grad=True)
        g.to_image(poses)[0, 0, 4, 4].backward()
        reach = poses.grad.abs().sum(1)[0] > 0  # (9, 9): which poses the centre pixel reads
        assert reach.sum() == k * k and reach[4 - k // 2:5 + k // 2, 4 - k // 2:5 + k // 2].all()
        assert g(*_data(2)[:1], _model("capspix2pix").noise(2, 0)).shape == (2, 1, 16, 16)
    # the start: N(0, image_init_std / k) per weight, so k^2 inputs spread a logit as the 1x1 kernel's one does
    torch.manual_seed(0)
    w = _model("capspix2pix", image_kernel=5, image_init_std=10.0).generator.to_image.weight  # 400 weights
    assert abs(w.std().item() / 2.0 - 1) < 0.15, w.std()


# -- gradients and losses ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", SYNTHESIS)
def test_each_loss_gives_the_gradients_it_should(name):
    torch.manual_seed(5)
    model = _model(name, dropout=0.0)  # dropout zeroes whole capsule types and so, at random, their gradients
    labels, real = _data(3)
    fake = model(labels, model.noise(3, 0))
    d, d_parts = model.d_loss(real, fake, labels)
    d.backward()
    for n, p in model.discriminator.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, n
    assert all(p.grad is None for p in model.generator.parameters())  # D's loss sees the fake detached
    model.zero_grad(set_to_none=True)
    g, g_parts = model.g_loss(real, fake, labels)
    g.backward()
    for n, p in model.generator.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, n
    assert set(d_parts) == {"d_real", "d_fake"} and set(g_parts) == {"g_adv", "l1"}
    assert not any(t.requires_grad for t in (*d_parts.values(), *g_parts.values()))
    # each of G's two terms alone reaches every generator weight: with the L1 term above, a cut adversarial path
    # (the discriminator fed fake.detach()) still passed (a review, 2026-11-30)
    for l1_weight, term in ((0.0, "the adversarial term"), (None, "the L1 term")):
        torch.manual_seed(5)
        alone = _model(name, dropout=0.0, **({} if l1_weight is None else {"l1_weight": l1_weight}))
        fake = alone(labels, alone.noise(3, 0))
        loss = alone.g_loss(real, fake, labels)[0] if l1_weight is not None else (fake - real).abs().mean()
        loss.backward()
        for n, p in alone.generator.named_parameters():
            assert p.grad is not None and p.grad.abs().sum() > 0, (term, n)


def _bce(x: float, t: float) -> float:
    """Binary cross entropy of sigmoid(x) against t, written out."""
    p = 1 / (1 + math.exp(-x))
    return -(t * math.log(p) + (1 - t) * math.log(1 - p))


class _StubD(nn.Module):
    """Known logits: 4 x the image mean - 2 + the label mean, one per image or, with ``patches``, per 2x2 block."""

    def __init__(self, patches: bool) -> None:
        super().__init__()
        self.patches = patches

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = 4 * images - 2 + labels
        return nn.functional.avg_pool2d(x, x.shape[-1] // 2) if self.patches else x.mean((1, 2, 3))


@pytest.mark.parametrize("name", SYNTHESIS)
def test_losses_match_their_closed_forms(name):
    model = _model(name).double()
    model.discriminator = _StubD(patches=name == "pix2pix")
    labels, real = _data(3)
    labels, real = labels.double(), real.double()
    fake = torch.rand(3, 1, 16, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    cfg = model.config
    lr = model.discriminator(real, labels).flatten().tolist()  # every logit (patches of all images): each weighs 1
    lf = model.discriminator(fake, labels).flatten().tolist()
    d_expected = 0.5 * (sum(_bce(x, 0.9) for x in lr) / len(lr) + sum(_bce(x, 0.1) for x in lf) / len(lf))
    l1 = sum(abs(a - b) for a, b in zip(fake.flatten().tolist(), real.flatten().tolist())) / real.numel()
    g_adv = sum(_bce(x, 1.0) for x in lf) / len(lf)
    d, d_parts = model.d_loss(real, fake, labels)
    g, g_parts = model.g_loss(real, fake, labels)
    assert (cfg.real_label, cfg.fake_label, cfg.l1_weight) == (0.9, 0.1, 100.0)
    assert d.item() == pytest.approx(d_expected, rel=1e-12)
    assert g.item() == pytest.approx(g_adv + 100 * l1, rel=1e-12)
    assert g_parts["g_adv"].item() == pytest.approx(g_adv, rel=1e-12) and g_parts["l1"].item() == pytest.approx(l1)
    assert d_parts["d_real"].item() == pytest.approx(sum(1 / (1 + math.exp(-x)) for x in lr) / len(lr), rel=1e-12)
    assert d_parts["d_fake"].item() == pytest.approx(sum(1 / (1 + math.exp(-x)) for x in lf) / len(lf), rel=1e-12)


@pytest.mark.parametrize("name", SYNTHESIS)
def test_registered_loss_is_the_methods_on_one_fake(name):
    torch.manual_seed(6)
    model = _model(name).train()  # dropout on: two generator calls would draw two different fakes
    assert model_name(model.config) == name and MODELS[name].config.from_dict(model.config.to_dict()) == model.config
    labels, real = _data(2)
    z = model.noise(2, 3)
    calls, forward = [], model.forward
    model.forward = lambda *a, **k: calls.append(1) or forward(*a, **k)
    torch.manual_seed(60)
    d, g, parts = MODELS[name].loss(model, labels, real, z)
    assert len(calls) == 1  # one generated batch serves both losses
    with torch.no_grad():
        torch.manual_seed(60)  # the same dropout draws: the very fake the loss judged
        fake = model(labels, z)
        torch.manual_seed(61)
        assert not torch.equal(model(labels, z), fake)  # (so another call would not have matched it)
        assert d.item() == pytest.approx(model.d_loss(real, fake, labels)[0].item(), rel=1e-6)
        assert g.item() == pytest.approx(model.g_loss(real, fake, labels)[0].item(), rel=1e-6)
    assert set(parts) == {"d_real", "d_fake", "g_adv", "l1"} and MODELS[name].loss is synthesis_losses


@pytest.mark.parametrize("name", SYNTHESIS)
def test_an_example_is_generated_and_judged_the_same_in_any_batch(name):
    torch.manual_seed(7)
    model = _model(name).eval()
    labels, real = _data(4)
    z = model.noise(4, 2)
    with torch.no_grad():
        together, judged = model(labels, z), model.discriminator(real, labels)
        for k in (0, 2):
            alone = model(labels[k:k + 1], z[k:k + 1])[0]
            torch.testing.assert_close(alone, together[k], rtol=1e-4, atol=1e-6)
            torch.testing.assert_close(model.discriminator(real[k:k + 1], labels[k:k + 1])[0], judged[k],
                                       rtol=1e-4, atol=1e-5)


# -- bad input and configs ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", SYNTHESIS)
def test_wrong_label_maps_get_one_clear_message(name):
    model = _model(name).eval()
    with pytest.raises(ValueError, match=r"\(B, 1, H, W\).*3 channels\): convert them or build the model with "
                                         r"in_channels 3"):
        model.generate(torch.zeros(2, 3, 16, 16))
    with pytest.raises(ValueError, match=r"\(B, 1, H, W\)"):
        model.generate(torch.zeros(16, 16))
    size = (r"resize or crop them to 16x16" if name == "capspix2pix"
            else r"multiples of 16 \(the generator halves them\), got 20x20: pad or crop them to 32x32 or 16x16")
    with pytest.raises(ValueError, match=size):
        model.generate(torch.zeros(2, 1, 20, 20))
    labels, _ = _data(2)
    with pytest.raises(ValueError, match=r"one 1-channel image per label map"):
        model.d_loss(torch.zeros(2, 3, 16, 16), torch.zeros(2, 1, 16, 16), labels)


@pytest.mark.parametrize("cls", [CapsPix2pixConfig, Pix2pixConfig])
@pytest.mark.parametrize("field,value,message", [
    ("input_height", 20, "multiple of 8"), ("input_width", 4, "input_width must be in 8"),
    ("dropout", 1.0, "dropout must be in 0..1"), ("real_label", 1.5, "real_label must be in 0..1"),
    ("beta1", 1.0, "beta1"), ("l1_weight", -1.0, "l1_weight"), ("in_channels", 0, "in_channels"),
    ("disc_channels", "64", "disc_channels must be an integer"),
    # equal labels gave the discriminator no signal, swapped ones inverted it (a review of the Python API, 2026-12-02)
    ("fake_label", 0.9, r"real_label \(0.9\) must be above fake_label \(0.9\): the discriminator learns"),
    ("real_label", 0.05, r"real_label \(0.05\) must be above fake_label \(0.1\)")])
def test_configs_refuse_bad_values_by_name(cls, field, value, message):
    with pytest.raises(ValueError, match=message):
        cls(**{field: value})


def test_capspix2pix_image_init_std_scales_only_the_image_convolution():
    """image_init_std rescales the 1x1 image convolution's N(0, 0.02) draw: every other weight is the same for the
    same seed, and the generator's first images spread away from 0.5 (a squashed pose has length below 1, so a
    0.02-scale convolution leaves every logit within about +-0.1 of its bias, every pixel within 0.03 of 0.5)."""
    with pytest.raises(ValueError, match=r"image_init_std must be in 0..100, got -1"):
        CapsPix2pixConfig(image_init_std=-1.0)
    models = {}
    for std in (0.02, 1.0):
        torch.manual_seed(0)
        models[std] = CapsPix2pix(CapsPix2pixConfig(input_height=16, input_width=16, noise_dim=8, disc_channels=4,
                                                        image_init_std=std)).eval()
    small, wide = (dict(m.named_parameters()) for m in models.values())
    assert torch.equal(wide["generator.to_image.weight"], 50 * small["generator.to_image.weight"])
    assert all(torch.equal(small[k], wide[k]) for k in small if k != "generator.to_image.weight")
    labels, _ = _data(4)
    z = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        spread = {std: m.generator(labels, z).std().item() for std, m in models.items()}
    assert spread[0.02] < 0.005 and spread[1.0] > 20 * spread[0.02], spread


def test_capspix2pix_conv1_init_std_scales_only_conv1():
    """conv1_init_std rescales conv1's N(0, 0.02) draw (the other weights the same for the same seed); refused
    below 0 by name."""
    with pytest.raises(ValueError, match=r"conv1_init_std must be in 0..100, got -1"):
        CapsPix2pixConfig(conv1_init_std=-1.0)
    params = []
    for std in (0.02, 0.2):
        torch.manual_seed(0)
        params.append(dict(_model("capspix2pix", conv1_init_std=std).named_parameters()))
    small, wide = params
    torch.testing.assert_close(wide["generator.conv1.weight"], 10 * small["generator.conv1.weight"])
    assert all(torch.equal(small[k], wide[k]) for k in small if k != "generator.conv1.weight")
    assert abs(small["generator.conv1.weight"].std().item() / 0.02 - 1) < 0.1  # 816 draws of N(0, 0.02)


def test_the_deep_start_carries_the_label_map_where_the_reference_start_loses_it(data_root):
    """capspix2pix-deep: the same layers and weights, its own start and no dropout; at the reference start two label
    maps give 1/4-level capsules (conv_3_1) that hardly differ, at the deep start they differ by a hundred times more."""
    from capsnet.data.tasks import load_test

    assert {"capspix2pix", "capspix2pix-deep", "pix2pix"} <= {n for n, spec in MODELS.items()
                                                              if spec.kind == "synthesis"}  # (others may join)
    deep = CapsPix2pixDeepConfig()
    assert (deep.dropout, deep.init_gain, deep.bias_init, deep.conv1_init_std) == (0.0, 2.0, 0.01, 0.2)
    assert deep.num_weights == CapsPix2pixConfig().num_weights and model_name(deep) == "capspix2pix-deep"
    labels = load_test("mnist-skeleton", size=8, root=data_root, progress=False).images.float()  # (8, 1, 32, 32)
    spread = {}
    for name in ("capspix2pix", "capspix2pix-deep"):
        torch.manual_seed(0)
        model = create_model(name).eval()
        with torch.no_grad():
            lengths = model.generator.capsule_grids(labels, model.noise(8, 0))["conv_3_1"].norm(dim=2)  # (8, T, h, w)
        spread[name] = lengths.std(0).mean().item()  # across the label maps
    assert spread["capspix2pix-deep"] > 100 * spread["capspix2pix"], spread


def test_a_capspix2pix_saved_before_image_init_std_reads_as_the_start_it_had():
    """Runs saved before the field existed started at DCGAN's 0.02: their checkpoints read so (a resume, a finished
    experiment run compared with today's plan), while a new config takes today's default."""
    from capsnet.checkpoint import Checkpoint
    from capsnet.train import TrainConfig, saved_configs

    old = CapsPix2pixConfig().to_dict()
    del old["image_init_std"]
    ckpt = Checkpoint("capspix2pix", old, TrainConfig().to_dict(), {"epoch": 1, "step": 1}, {})
    assert saved_configs(ckpt)[0].image_init_std == 0.02
    assert CapsPix2pixConfig.from_dict(old).image_init_std == CapsPix2pixConfig().image_init_std == 10.0
    assert CapsPix2pixConfig.from_saved(old | {"image_init_std": 3.0}).image_init_std == 3.0  # a recorded value wins


def test_the_deep_start_resizes_then_convolves_where_runs_saved_before_it_did_kept_the_transposed_convolution():
    """capspix2pix-deep's default is resize-then-convolve (the reference start keeps the paper's transposed
    convolution); a deep-start checkpoint saved before the field existed, and the shipped CapsPix2pix trained with the
    transposed convolution, rebuild as the transposed convolution they trained, while a recorded value wins."""
    from capsnet.checkpoint import Checkpoint
    from capsnet.evaluate import load_model
    from capsnet.train import TrainConfig, saved_configs

    assert (CapsPix2pixDeepConfig().upsampling, CapsPix2pixConfig().upsampling) == ("resize", "deconv")
    assert create_model("capspix2pix-deep").generator.caps["deconv_1_1"].upsampling == "resize"
    old = CapsPix2pixDeepConfig().to_dict()
    del old["upsampling"]
    ckpt = Checkpoint("capspix2pix-deep", old, TrainConfig().to_dict(), {"epoch": 1, "step": 1}, {})
    config = saved_configs(ckpt)[0]
    assert config.upsampling == "deconv"
    assert config.image_init_std == CapsPix2pixDeepConfig().image_init_std  # recorded, not 0.02
    assert CapsPix2pixDeepConfig.from_saved(old | {"upsampling": "subpix"}).upsampling == "subpix"
    shipped, _ = load_model("pretrained:capspix2pix-mnist", which="last")
    assert shipped.config.upsampling == "deconv"
    assert shipped.generator.caps["deconv_3_1"].upsampling == "deconv"


def _assert_each_loss_reaches_its_network(model: nn.Module) -> None:
    """The discriminator's loss gives every discriminator weight a gradient, the generator's every generator weight."""
    labels, real = _data(3)
    fake = model(labels, model.noise(3, 0))
    model.d_loss(real, fake, labels)[0].backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.discriminator.parameters())
    model.zero_grad(set_to_none=True)
    model.g_loss(real, fake, labels)[0].backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.generator.parameters())


def _assert_seed_starts_the_generator_alike(build, build_other) -> None:
    """Two models built under one seed, differing in their discriminators, start their generators alike (the
    generator is built first)."""
    torch.manual_seed(3)
    first = build()
    torch.manual_seed(3)
    other = build_other()
    for a, b in zip(first.generator.parameters(), other.generator.parameters(), strict=True):
        assert torch.equal(a, b)


def test_capspix2pix_can_judge_with_pix2pixs_patchgan():
    """discriminator="patch": the capsule generator unchanged, pix2pix's PatchGAN as its discriminator (the same
    layers, the same logits for the same weights), counted exactly, and both losses reach every weight."""
    torch.manual_seed(0)
    caps = CapsPix2pix(CapsPix2pixDeepConfig(discriminator="patch"))
    pix = Pix2pix(Pix2pixConfig())
    assert _count(caps.generator) == 1_519_953 and _count(caps.discriminator) == _count(pix.discriminator) == 2_764_609
    assert caps.config.num_weights == _count(caps) and caps.config.discriminator_weights == 2_764_609
    caps.discriminator.load_state_dict(pix.discriminator.state_dict())  # the same keys and shapes, or this raises
    labels, real = _data(2, 32, 32)
    caps.eval(), pix.eval()
    assert caps.discriminator(real, labels).shape == (2, 1, 2, 2)  # one logit per (70x70) patch
    torch.testing.assert_close(caps.discriminator(real, labels), pix.discriminator(real, labels), rtol=0, atol=0)
    small = _model("capspix2pix", 16, 16, discriminator="patch", patch_layers=2, dropout=0.0)
    assert small.config.num_weights == _count(small)
    assert small.config.discriminator_weights == Pix2pixConfig(input_height=16, input_width=16, disc_channels=4,
                                                               disc_layers=2).discriminator_weights
    _assert_each_loss_reaches_its_network(small)
    cfg = CapsPix2pixConfig(discriminator="patch", patch_layers=2)
    assert CapsPix2pixConfig.from_dict(cfg.to_dict()) == cfg and CapsPix2pixConfig().discriminator == "dcgan"
    _assert_seed_starts_the_generator_alike(lambda: CapsPix2pix(CapsPix2pixDeepConfig()),
                                            lambda: CapsPix2pix(CapsPix2pixDeepConfig(discriminator="patch")))


def test_pix2pix_can_judge_with_capspix2pixs_dcgan_discriminator():
    """discriminator="dcgan": pix2pix's U-Net unchanged (seed for seed), CapsPix2pix's discriminator as its judge (the
    same layers, the same logit for the same weights), counted exactly, and both losses reach every weight."""
    torch.manual_seed(0)
    pix = Pix2pix(Pix2pixConfig(discriminator="dcgan"))
    caps = CapsPix2pix(CapsPix2pixConfig())
    assert _count(pix.generator) == 16_652_929 and _count(pix.discriminator) == _count(caps.discriminator) == 662_272
    assert pix.config.num_weights == _count(pix) == 16_652_929 + 662_272
    pix.discriminator.load_state_dict(caps.discriminator.state_dict())  # the same keys and shapes, or this raises
    labels, real = _data(2, 32, 32)
    pix.eval(), caps.eval()
    assert pix.discriminator(real, labels).shape == (2,)  # one logit per image
    torch.testing.assert_close(pix.discriminator(real, labels), caps.discriminator(real, labels), rtol=0, atol=0)
    small = _model("pix2pix", 16, 16, discriminator="dcgan")
    assert small.config.num_weights == _count(small)
    _assert_each_loss_reaches_its_network(small)
    cfg = Pix2pixConfig(discriminator="dcgan", input_height=16, input_width=16)  # no PatchGAN, so no patch-size check
    assert Pix2pixConfig.from_dict(cfg.to_dict()) == cfg and Pix2pixConfig().discriminator == "patch"
    _assert_seed_starts_the_generator_alike(lambda: Pix2pix(Pix2pixConfig()),
                                            lambda: Pix2pix(Pix2pixConfig(discriminator="dcgan")))
    with pytest.raises(ValueError, match="Pix2pixConfig.discriminator must be one of dcgan, patch, got 'dcgan2'"):
        Pix2pixConfig(discriminator="dcgan2")


@pytest.mark.parametrize("kw,message", [
    (dict(discriminator="patchgan"), "CapsPix2pixConfig.discriminator must be one of dcgan, patch, got 'patchgan'"),
    (dict(discriminator="patch", input_height=16, input_width=16),
     r"a PatchGAN of patch_layers 3 needs sides of at least 24, got 16x16: use larger images or --model-option patch_layers=2"),
    (dict(patch_layers=0), "patch_layers must be in 1")])
def test_capspix2pix_discriminator_choice_refuses_bad_values_by_name(kw, message):
    with pytest.raises(ValueError, match=message):
        CapsPix2pixConfig(**kw)


def test_patchgan_too_deep_for_the_image_names_the_fix():
    with pytest.raises(ValueError, match=r"needs sides of at least 24, got 16x16: use larger images or --model-option disc_layers=2"):
        Pix2pixConfig(input_height=16, input_width=16)
    # below SSIM's window: the option it named led to the GAN loop's refusal of 8x8 data next (a review, 2026-12-01)
    with pytest.raises(ValueError, match=r"needs sides of at least 24, got 8x8: use images of at least 16x16 "
                                         r"\(training scores SSIM, whose 11x11 window needs them\)$"):
        Pix2pixConfig(input_height=8, input_width=8)
    # maps of another size than the config's (the PatchGAN takes them): smaller ones failed inside a convolution
    patch = Pix2pix(Pix2pixConfig(input_height=16, input_width=16, disc_layers=2)).discriminator
    with pytest.raises(ValueError, match=r"a PatchGAN of disc_layers 2 needs sides of at least 12, got 8x8 maps"):
        patch(torch.zeros(2, 1, 8, 8), torch.zeros(2, 1, 8, 8))
    assert patch(torch.zeros(2, 1, 24, 24), torch.zeros(2, 1, 24, 24)).shape == (2, 1, 4, 4)


def test_a_capspix2pix_of_float64_generates_as_it_samples():
    """generate drew the noise in float32 and handed it to a float64 (or bf16) model: a dtype error in its first
    product, where samples() worked."""
    from capsnet.synthesis import generate, samples

    model = CapsPix2pix(CapsPix2pixConfig(input_height=16, input_width=16)).double()
    labels = torch.zeros(3, 1, 16, 16, dtype=torch.float64)
    labels[:, :, 4:12, 7:9] = 1.0
    images = generate(model, labels)
    assert images.dtype == torch.float64
    torch.testing.assert_close(images[0], samples(model, labels[0], [0])[0], rtol=0, atol=1e-12)  # row 0: seed 0


@pytest.mark.parametrize("cls", [CapsPix2pixConfig, Pix2pixConfig])
def test_config_round_trip_and_unknown_keys(cls):
    cfg = cls(input_height=24, input_width=40, out_channels=3, l1_weight=1)
    assert cls.from_dict(cfg.to_dict()) == cfg and cls.from_dict({}) == cls()
    with pytest.raises(ValueError, match="lambda_L1"):
        cls.from_dict({"lambda_L1": 1})


# -- SegCaps, after sharing its capsule stack ----------------------------------------------------------------------

SEGCAPS_STATE = [  # recorded before the capsule stack was shared: checkpoints of SegCaps runs must still load
    ("conv1.weight", (16, 1, 5, 5)), ("conv1.bias", (16,)), ("caps.primary.bias", (2, 16)),
    ("caps.primary.weight", (32, 16, 5, 5)), ("caps.conv_2_1.bias", (4, 16)), ("caps.conv_2_1.weight", (64, 16, 5, 5)),
    ("caps.conv_2_2.bias", (4, 32)), ("caps.conv_2_2.weight", (128, 16, 5, 5)), ("caps.conv_3_1.bias", (8, 32)),
    ("caps.conv_3_1.weight", (256, 32, 5, 5)), ("caps.conv_3_2.bias", (8, 64)),
    ("caps.conv_3_2.weight", (512, 32, 5, 5)), ("caps.conv_4_1.bias", (8, 32)),
    ("caps.conv_4_1.weight", (256, 64, 5, 5)), ("caps.deconv_1_1.bias", (8, 32)),
    ("caps.deconv_1_1.weight", (32, 256, 4, 4)), ("caps.deconv_1_2.bias", (4, 32)),
    ("caps.deconv_1_2.weight", (128, 32, 5, 5)), ("caps.deconv_2_1.bias", (4, 16)),
    ("caps.deconv_2_1.weight", (32, 64, 4, 4)), ("caps.deconv_2_2.bias", (4, 16)),
    ("caps.deconv_2_2.weight", (64, 16, 5, 5)), ("caps.deconv_3_1.bias", (2, 16)),
    ("caps.deconv_3_1.weight", (16, 32, 4, 4)), ("caps.seg_caps.bias", (1, 16)),
    ("caps.seg_caps.weight", (16, 16, 1, 1)),
    ("decoder.0.weight", (64, 16, 1, 1)), ("decoder.0.bias", (64,)), ("decoder.2.weight", (128, 64, 1, 1)),
    ("decoder.2.bias", (128,)), ("decoder.4.weight", (1, 128, 1, 1)), ("decoder.4.bias", (1,))]


def test_segcaps_keeps_its_weights_and_state_dict_keys():
    model = SegCaps(SegCapsConfig(input_height=16, input_width=16))
    assert [(k, tuple(v.shape)) for k, v in model.state_dict().items()] == SEGCAPS_STATE
    assert _count(model) == 1_425_649 == model.config.num_weights
    caps = CapsPix2pix(CapsPix2pixConfig(input_height=16, input_width=16)).generator
    shared = [k for k, _ in SEGCAPS_STATE if k.startswith("caps.")]  # the generator's capsule layers: the same
    assert [k for k in caps.state_dict() if k.startswith("caps.")] == shared


def test_capspix2pix_routes_by_self_attention_in_every_capsule_layer_when_asked():
    """``routing``: the generator's capsule layers, SegCaps' stack, routed by self-attention (each layer's routing
    over its own types, its learned prior counted: the 373 weights SegCaps' stack gains); every generator weight
    learns from G's loss; an example's image does not depend on its batch; a routing whose activations are not
    lengths is refused with the generator's reason."""
    from capsnet.routing import SelfAttentionRouting

    plain, routed = CapsPix2pixConfig(), CapsPix2pixConfig(routing="self-attention")
    assert routed.generator_weights - plain.generator_weights == 373
    torch.manual_seed(5)
    model = _model("capspix2pix", dropout=0.0, routing="self-attention")
    assert model.config.num_weights == _count(model)
    caps = model.generator.caps
    assert all(type(layer.routing) is SelfAttentionRouting for layer in caps.values())
    assert [(layer.routing.in_caps, layer.routing.out_caps) for layer in caps.values()][:2] == [(1, 2), (2, 4)]
    labels, real = _data(3)
    z = model.noise(3, 0)
    fake = model(labels, z)
    model.g_loss(real, fake, labels)[0].backward()
    for n, p in model.generator.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, n
    model.eval()
    with torch.no_grad():
        assert torch.allclose(model(labels, z)[1:2], model(labels[1:2], z[1:2]), atol=1e-6)
    with pytest.raises(ValueError, match="em routing's activations are not its capsules' lengths as probabilities, "
                                         "and the generator's capsule layers pass on their poses alone"):
        CapsPix2pixConfig(routing="em")
    with pytest.raises(ValueError, match="CapsPix2pixConfig.routing_softmax is an option of dynamic routing"):
        CapsPix2pixConfig(routing="self-attention", routing_softmax="children")


def test_a_large_pix2pix_judged_by_the_dcgan_discriminator_is_not_refused_for_capspix2pixs_noise_layer():
    """Pix2pixConfig(discriminator="dcgan") at 4096x8192 was refused as a CapsPix2pixConfig of 3.4 billion weights
    (CapsPix2pix's 100-number noise layer counted); the pix2pix model holds 1.3e8. The discriminator is the same."""
    big = Pix2pixConfig(input_height=4096, input_width=8192, discriminator="dcgan")
    assert big.num_weights < 2**31 and big.discriminator_weights == big.dcgan_config().discriminator_weights
    small = Pix2pixConfig(input_height=32, input_width=32, discriminator="dcgan")
    assert small.discriminator_weights == sum(p.numel() for p in Pix2pix(small).discriminator.parameters()) == 662_272


def test_generating_in_eval_mode_leaves_torchs_random_stream_alone(monkeypatch):
    """CapsPix2pix's generate seeded torch's global RNG in eval mode too, where no module draws from it: a viewer
    serving in one thread replaced the stream of every other thread (1999 of 2000 draws)."""
    from capsnet.models import capspix2pix as module

    model = _model("capspix2pix").eval()
    labels = torch.rand(2, 1, 16, 16)
    want = model.generate(labels, seed=3)

    def refused(*a, **k):
        raise AssertionError("torch's RNG seeded in eval mode")
    monkeypatch.setattr(module, "_seeded", refused)
    assert torch.equal(model.generate(labels, seed=3), want)  # the noise is seed 3's all the same
    with pytest.raises(AssertionError, match="seeded in eval mode"):  # dropout training: seeded, as before
        model.train().generate(labels, seed=3)


def test_pix2pix_generates_from_two_threads_as_from_one():
    """Two threads generating with one pix2pix ran each other's per-image dropout hooks: one raised "The size of
    tensor a (4) must match the size of tensor b (2)", the other's images were wrong."""
    import threading

    model = _model("pix2pix").eval()
    labels = torch.rand(6, 1, 16, 16)
    want = {4: model.generate(labels[:4], seeds=[1, 2, 3, 4]), 2: model.generate(labels[4:], seeds=[5, 6])}
    got, errors = {}, []

    def go(n, maps, seeds):
        try:
            for _ in range(5):
                got[n] = model.generate(maps, seeds=seeds)
        except Exception as e:
            errors.append(e)
    threads = [threading.Thread(target=go, args=(4, labels[:4], [1, 2, 3, 4])),
               threading.Thread(target=go, args=(2, labels[4:], [5, 6]))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and all(torch.equal(got[n], want[n]) for n in want), errors
    assert all(not m.training for m in model.modules())
