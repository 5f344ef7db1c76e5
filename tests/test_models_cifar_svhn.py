"""Section 7's CapsNets: CIFAR-10's (3 channels, 64 primary types, SAME padding, none-of-the-above routing, 24x24)
and SVHN's smaller one: configs, weight counts worked out here, padding, the none-of-the-above share, training."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from capsnet.losses import margin_loss
from capsnet.models import (MODELS, CapsNet, CapsNetCifar10Config, CapsNetConfig, CapsNetSvhnConfig, capsnet_loss,
                            create_model, model_name)
from capsnet.ops import squash

SMALL = dict(conv1_channels=8, primary_types=3)


def _count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_the_cifar10_model_is_the_authors_command():
    cfg = CapsNetCifar10Config()
    assert MODELS["capsnet-cifar10"].config is CapsNetCifar10Config and MODELS["capsnet-cifar10"].build is CapsNet
    assert (cfg.in_channels, cfg.input_height, cfg.input_width) == (3, 24, 24)
    assert cfg.primary_types == 64 and cfg.leaky_routing and cfg.padding == "same" and not cfg.decoder
    assert (cfg.conv1_channels, cfg.conv1_kernel, cfg.primary_dim, cfg.digit_dim, cfg.routing_iterations) == \
        (256, 9, 8, 16, 3)  # the rest is the MNIST model's
    assert cfg.primary_grid == (12, 12) and cfg.num_primary == 64 * 12 * 12
    assert model_name(cfg) == "capsnet-cifar10" and model_name(CapsNetConfig()) == "capsnet"
    assert CapsNetCifar10Config.from_dict(cfg.to_dict()) == cfg


def test_the_cifar10_model_holds_22_476_448_weights():
    conv1 = (3 * 9 * 9 + 1) * 256  # 24x24x3 -> 24x24x256 (SAME)
    primary = (256 * 9 * 9 + 1) * 64 * 8  # -> 12x12 grid of 64 types of 8D (SAME, stride 2)
    digits = 8 * (64 * 12 * 12) * 10 * 16 + 10 * 16  # W_ij for 9,216 x 10 pairs, and the routing bias
    assert conv1 + primary + digits == 22_476_448 == CapsNetCifar10Config().num_weights
    assert _count(create_model("capsnet-cifar10")) == 22_476_448
    decoder = (160 + 1) * 512 + (512 + 1) * 1024 + (1024 + 1) * 3 * 24 * 24  # if turned on: 24x24x3 out
    assert CapsNetCifar10Config(decoder=True).num_weights == 22_476_448 + decoder == 24_855_392


def test_the_svhn_model_is_section_7s_smaller_network():
    cfg = CapsNetSvhnConfig()
    assert (cfg.in_channels, cfg.input_height, cfg.conv1_channels, cfg.primary_types, cfg.primary_dim,
            cfg.digit_dim) == (3, 32, 64, 16, 6, 8)
    assert cfg.padding == "valid" and cfg.primary_grid == (8, 8) and not cfg.leaky_routing and cfg.decoder
    conv1 = (3 * 81 + 1) * 64
    primary = (64 * 81 + 1) * 16 * 6
    digits = 6 * (16 * 8 * 8) * 10 * 8 + 10 * 8
    decoder = (80 + 1) * 512 + (512 + 1) * 1024 + (1024 + 1) * 3 * 32 * 32
    assert conv1 + primary + digits + decoder == 4_720_560 == cfg.num_weights == _count(create_model("capsnet-svhn"))


def test_existing_configs_keep_valid_padding_and_load_without_the_field():
    old = CapsNetConfig().to_dict()
    del old["padding"]  # a config saved before the field existed
    assert CapsNetConfig.from_dict(old) == CapsNetConfig() and CapsNetConfig().primary_grid == (6, 6)
    with pytest.raises(ValueError, match="CapsNetConfig.padding must be one of valid, same, got 'full'"):
        CapsNetConfig(padding="full")


@pytest.mark.parametrize("n, kernel, stride, expected", [
    # TensorFlow's SAME: out = ceil(n / stride), pad = max((out - 1) * stride + kernel - n, 0), pad // 2 before
    (24, 9, 1, (4, 4)),  # Conv1 keeps 24
    (24, 9, 2, (3, 4)),  # primary: out 12 needs 11 * 2 + 9 - 24 = 7, the odd one after
    (25, 9, 2, (4, 4)),  # out 13 needs 12 * 2 + 9 - 25 = 8
    (8, 1, 2, (0, 0)),  # out 4 needs 3 * 2 + 1 - 8 = -1: none
])
def test_same_padding_is_tensorflows(n, kernel, stride, expected):
    assert CapsNetConfig().same_padding((n, n), kernel, stride) == expected * 2  # (left, right, top, bottom)
    assert CapsNetConfig().same_padding((n, 24), kernel, stride)[2:] == expected  # F.pad's order: W first, then H


def test_same_padding_pads_with_zeros_before_each_convolution():
    torch.manual_seed(0)
    model = create_model("capsnet-cifar10", **SMALL)
    x = torch.rand(2, 3, 24, 24)
    h = F.relu(F.conv2d(x, model.conv1.weight, model.conv1.bias, padding=4))  # 24x24, symmetric for stride 1
    y = F.conv2d(F.pad(h, (3, 4, 3, 4)), model.primary.conv.weight, model.primary.conv.bias, stride=2)  # (2, 24, 12, 12)
    assert y.shape == (2, 3 * 8, 12, 12)
    u = squash(y.view(2, 3, 8, 12, 12).permute(0, 1, 3, 4, 2).reshape(2, 3 * 144, 8))
    torch.testing.assert_close(model.primary_capsules(x), u)


def test_none_of_the_above_takes_a_share_of_every_coupling_and_no_score():
    """Routing by hand from the votes, with the extra category as the authors' code has it: a zero logit put before
    the class logits, softmaxed with them, its share then dropped."""
    torch.manual_seed(0)
    model = create_model("capsnet-cifar10", **SMALL, num_classes=5)
    with torch.no_grad():
        model.digits.weight.mul_(300)  # votes large enough for the agreement to move the coupling
    x = torch.rand(3, 3, 24, 24)
    out = model(x)
    assert out.poses.shape == (3, 5, 16) and out.lengths.shape == (3, 5) and out.scores.shape == (3, 5)
    assert out.coupling.shape == (3, 3 * 144, 5) and out.reconstructions is None
    with torch.no_grad():
        u_hat = model.digits.votes(model.primary_capsules(x))  # (B, I, J, D)
        b = torch.zeros(3, 3 * 144, 5)
        for r in range(3):
            c_all = torch.softmax(torch.cat([torch.zeros(3, 3 * 144, 1), b], dim=-1), dim=-1)  # (B, I, 1 + J)
            c = c_all[..., 1:]
            v = squash((c.unsqueeze(-1) * u_hat).sum(1) + model.digits.bias)
            b = b + (u_hat * v.unsqueeze(1)).sum(-1)
    torch.testing.assert_close(out.coupling, c, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(out.poses, v, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out.coupling.sum(-1) + c_all[..., 0], torch.ones(3, 3 * 144))  # all 1 + J sum to one
    share = c_all[..., 0]
    assert share.min() > 0 and share.std() > 0.01  # every child keeps some share there, and routing moved it
    assert out.coupling.sum(-1).max() < 1
    loss, scores = capsnet_loss(model, x, torch.tensor([0, 4, 2]))
    assert torch.equal(scores, out.lengths)  # the classes only: the extra category has no capsule and no score


def test_cifar10_model_trains_on_24x24_colour_images():
    torch.manual_seed(1)
    model = create_model("capsnet-cifar10", **SMALL)
    x, y = torch.randn(4, 3, 24, 24), torch.tensor([1, 9, 0, 3])  # standardised images: any sign
    loss, scores = capsnet_loss(model, x, y)
    assert scores.shape == (4, 10) and torch.isfinite(loss)
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name
    with pytest.raises(ValueError, match=r"expected images \(B, 3, 24, 24\), got \(4, 3, 32, 32\)"):
        model(torch.rand(4, 3, 32, 32))


def test_the_decoder_turned_on_reconstructs_24x24_colour_images():
    torch.manual_seed(2)
    model = create_model("capsnet-cifar10", **SMALL, decoder=True, decoder_hidden=(16, 32))
    x, y = torch.rand(2, 3, 24, 24), torch.tensor([3, 7])
    out = model(x, y)
    assert out.reconstructions.shape == (2, 3, 24, 24)
    assert 0 <= out.reconstructions.min() and out.reconstructions.max() <= 1
    loss, _ = capsnet_loss(model, x, y, recon_weight=0.0005)
    assert loss > margin_loss(out.lengths, y)  # the reconstruction term is in
    loss.backward()
    assert model.decoder.net[-2].weight.grad.abs().sum() > 0


def test_svhn_model_trains_on_32x32_colour_digits():
    torch.manual_seed(3)
    model = create_model("capsnet-svhn", conv1_channels=8, primary_types=2, decoder_hidden=(16, 32))
    x, y = torch.rand(2, 3, 32, 32), torch.tensor([0, 5])
    out = model(x, y)
    assert out.poses.shape == (2, 10, 8) and out.coupling.shape == (2, 2 * 8 * 8, 10)
    assert out.reconstructions.shape == (2, 3, 32, 32)
    torch.testing.assert_close(out.coupling.sum(-1), torch.ones(2, 128))  # no extra category here
    loss, _ = capsnet_loss(model, x, y)
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name
