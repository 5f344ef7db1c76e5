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
