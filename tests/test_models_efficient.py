"""Efficient-CapsNet (Mazzia et al. 2021): the paper's weight count, its shapes and its loss."""
from __future__ import annotations

import pytest
import torch

from capsnet.losses import margin_loss
from capsnet.models import EfficientCapsNetConfig, create_model, capsnet_loss


def test_exactly_the_papers_161824_weights_and_the_decoders_1411344():
    model = create_model("efficient-capsnet")
    decoder = sum(p.numel() for p in model.decoder.parameters())
    assert sum(p.numel() for p in model.parameters()) - decoder == 161_824
    assert decoder == (160 + 1) * 512 + (512 + 1) * 1024 + (1024 + 1) * 784 == 1_411_344
    # BN running statistics are buffers, not weights: 2 x (32 + 64 + 64 + 128)
    assert sum(b.numel() for n, b in model.named_buffers() if "running" in n) == 576


def test_shapes_and_the_primary_capsules():
    model = create_model("efficient-capsnet").eval()
    out = model(torch.rand(3, 1, 28, 28))
    assert out.poses.shape == (3, 10, 16) and out.lengths.shape == (3, 10) and out.coupling.shape == (3, 16, 10)
    assert out.reconstructions.shape == (3, 1, 28, 28)
    u = model.primary_capsules(torch.rand(3, 1, 28, 28))
    assert u.shape == (3, 16, 8) and (u.norm(dim=-1) < 1).all()
    assert EfficientCapsNetConfig(input_height=32, input_width=32).grid == (11, 11)
    with pytest.raises(ValueError, match="at least 11x11"):
        EfficientCapsNetConfig(input_height=10, input_width=28)


def test_loss_is_margin_plus_0392_times_the_pixel_mean_squared_error():
    torch.manual_seed(0)
    model = create_model("efficient-capsnet").eval()
    images, labels = torch.rand(4, 1, 28, 28), torch.tensor([1, 2, 3, 4])
    loss, _ = capsnet_loss(model, images, labels, recon_weight=0.0005)
    out = model(images, labels)
    mse = (out.reconstructions - images).pow(2).mean()  # Keras 'mse': over pixels and batch
    torch.testing.assert_close(loss, margin_loss(out.lengths, labels) + 0.392 * mse, rtol=1e-5, atol=1e-6)


def test_initial_weights_and_batch_norm_follow_the_keras_defaults_the_paper_used():
    """Found by mutation testing (2026-11-30), where no test noticed a change: the class capsules' he_normal (Keras:
    a normal truncated at 2 sd, rescaled so that its sd is sqrt(2 / fan_in), fan_in = 10 x 16 x 8 here) and
    BatchNormalization's momentum 0.99 (torch's 0.01: the running mean moves 1% of the way to a batch's)."""
    torch.manual_seed(0)
    model = create_model("efficient-capsnet")
    w = model.digits.weight.detach()
    assert w.numel() == 10 * 16 * 8 * 16
    target = (2 / (10 * 16 * 8)) ** 0.5  # 0.0395
    assert w.std().item() == pytest.approx(target, rel=0.03)  # 20,480 draws: the estimate is within about 1%
    assert w.abs().max().item() <= 2 * target / 0.87962566 + 1e-7  # truncated at 2 sd of the untruncated normal
    bn = model.features[2]
    seen = {}
    bn.register_forward_pre_hook(lambda m, inp: seen.update(mean=inp[0].mean(dim=(0, 2, 3)).detach()))
    model.train()(torch.rand(4, 1, 28, 28))
    assert torch.count_nonzero(seen["mean"]) > 0
    torch.testing.assert_close(bn.running_mean, 0.01 * seen["mean"], rtol=1e-5, atol=1e-8)
    assert bn.eps == 1e-3


def test_init_official_starts_the_primary_convolution_and_the_decoder_as_the_official_keras_layers():
    """The official code's depthwise Conv2D(128, 9, groups=128) takes Keras' glorot_uniform over its (9, 9, 1, 128)
    kernel (limit sqrt(6 / (81 + 81 x 128)) = 0.0240) and a zero bias; its decoder's Dense layers he_normal (ReLU)
    and glorot_normal (sigmoid), zero biases. The default keeps PyTorch's start there (bound 1 / sqrt(81))."""
    torch.manual_seed(0)
    default = create_model("efficient-capsnet")
    assert default.primary.weight.abs().max().item() > 0.1 and torch.count_nonzero(default.primary.bias) == 128
    official = create_model("efficient-capsnet", init="official")
    w = official.primary.weight.detach()
    limit = (6 / (81 + 81 * 128)) ** 0.5
    assert w.abs().max().item() <= limit and w.std().item() == pytest.approx(limit / 3 ** 0.5, rel=0.03)
    assert torch.count_nonzero(official.primary.bias) == 0
    linears = [m for m in official.decoder.net if isinstance(m, torch.nn.Linear)]
    for layer, target in zip(linears, ((2 / 160) ** 0.5, (2 / 512) ** 0.5, (2 / (1024 + 784)) ** 0.5)):
        assert layer.weight.std().item() == pytest.approx(target, rel=0.03)
        assert layer.weight.abs().max().item() <= 2 * target / 0.87962566 + 1e-7
        assert torch.count_nonzero(layer.bias) == 0
    # the rest of the network starts from the same draws either way: the option re-draws those two parts after
    torch.manual_seed(1)
    a = create_model("efficient-capsnet").state_dict()
    torch.manual_seed(1)
    b = create_model("efficient-capsnet", init="official").state_dict()
    differ = sorted(k for k in a if not torch.equal(a[k], b[k]))
    assert differ == ["decoder.net.0.bias", "decoder.net.0.weight", "decoder.net.2.bias", "decoder.net.2.weight",
                      "decoder.net.4.bias", "decoder.net.4.weight", "features.0.weight", "features.3.weight",
                      "features.6.weight", "features.9.weight", "primary.bias", "primary.weight"]
    # the four convolutions: Keras' he_normal is a normal truncated at 2 std and rescaled to sqrt(2 / fan_in); the
    # default's kaiming_normal_ is not truncated (its 16,384 draws of the widest layer pass 3 std)
    for key, fan_in in (("features.0.weight", 25), ("features.3.weight", 32 * 9), ("features.6.weight", 64 * 9),
                        ("features.9.weight", 64 * 9)):
        target = (2 / fan_in) ** 0.5
        assert b[key].std().item() == pytest.approx(target, rel=0.06), key
        assert b[key].abs().max().item() <= 2 * target / 0.87962566 + 1e-7, key
    assert a["features.9.weight"].abs().max().item() > 3 * (2 / (64 * 9)) ** 0.5
    with pytest.raises(ValueError, match="init"):
        EfficientCapsNetConfig(init="keras")


def test_primary_capsules_are_squashed_by_the_papers_exponential_squash():
    """Efficient-CapsNet's primary capsules use its own squash, (1 - e^-|s|) s / |s| (Mazzia et al. 2021),
    not Sabour's: only shapes and lengths below 1 were tested, so Sabour's squash there passed (mutation testing,
    2026-12-01). The squash is worked out here from the primary convolution's output."""
    torch.manual_seed(0)
    model = create_model("efficient-capsnet").eval()
    images = torch.rand(3, 1, 28, 28)
    with torch.no_grad():
        s = model.primary(model.features(images)).view(3, model.config.primary_caps, model.config.primary_dim)
        norm = s.double().norm(dim=-1, keepdim=True)
        want = (1 - torch.exp(-norm)) * s.double() / norm
        torch.testing.assert_close(model.primary_capsules(images).double(), want, rtol=1e-5, atol=1e-6)
