"""benchmarks/speed_variants.py's variants are the shipped model's maths: checked here on the CPU, since the script
itself only checks the forward before it times on a GPU."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from capsnet.layers.primary import PrimaryCaps

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def variants():
    spec = importlib.util.spec_from_file_location("speed_variants", ROOT / "benchmarks" / "speed_variants.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("in_channels,size,kernel,stride", [(256, 20, 9, 2), (3, 11, 3, 1), (5, 12, 4, 3)])
def test_gemm_primary_matches_the_convolution_values_and_gradients(variants, in_channels, size, kernel, stride):
    torch.manual_seed(0)
    layer = PrimaryCaps(in_channels, types=4, dim=8, kernel_size=kernel, stride=stride).double()
    x = torch.randn(3, in_channels, size, size, dtype=torch.float64, requires_grad=True)
    ref = layer(x)
    g = torch.randn_like(ref)
    ref_grads = torch.autograd.grad(ref, [x, layer.conv.weight, layer.conv.bias], g)
    got = variants.gemm_primary(layer, x)
    got_grads = torch.autograd.grad(got, [x, layer.conv.weight, layer.conv.bias], g)
    assert got.shape == ref.shape
    torch.testing.assert_close(got, ref)
    for a, b in zip(got_grads, ref_grads):
        torch.testing.assert_close(a, b)


def test_votes_as_puts_the_primary_product_in_place_and_back(variants):
    original = PrimaryCaps.forward
    with variants.votes_as("gemm-primary"):
        assert PrimaryCaps.forward is variants.gemm_primary
    assert PrimaryCaps.forward is original
    with variants.votes_as("base"):
        assert PrimaryCaps.forward is original


@pytest.mark.parametrize("kw", [dict(kernel_size=9), dict(kernel_size=9, stride=2), dict(kernel_size=3, padding=2),
                                dict(kernel_size=(3, 5), stride=(2, 1), padding=(1, 2), dilation=(1, 2)),
                                dict(kernel_size=3, bias=False)])
def test_gemm_conv2d_matches_the_convolution_values_and_gradients(variants, kw):
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 5, **kw).double()
    x = torch.randn(2, 3, 13, 12, dtype=torch.float64, requires_grad=True)
    params = [x] + list(conv.parameters())
    ref = conv(x)
    g = torch.randn_like(ref)
    ref_grads = torch.autograd.grad(ref, params, g)
    got = variants.gemm_conv2d(conv, x)
    got_grads = torch.autograd.grad(got, params, g)
    torch.testing.assert_close(got, ref)
    for a, b in zip(got_grads, ref_grads):
        torch.testing.assert_close(a, b)


def test_gemm_conv2d_leaves_grouped_and_same_padded_convolutions_to_torch(variants):
    torch.manual_seed(0)
    x = torch.randn(1, 4, 8, 8)
    for conv in (torch.nn.Conv2d(4, 4, 3, groups=2), torch.nn.Conv2d(4, 4, 3, padding="same")):
        torch.testing.assert_close(variants.gemm_conv2d(conv, x), conv(x))


def test_the_convolution_variant_is_put_back(variants):
    original = torch.nn.Conv2d.forward
    with variants.votes_as("gemm-convs"):
        assert torch.nn.Conv2d.forward is variants.gemm_conv2d
    assert torch.nn.Conv2d.forward is original
