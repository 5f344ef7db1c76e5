"""ConvCaps2d and ConvTransposeCaps2d against independent references: DenseCaps, a loop over positions, shifts."""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from capsnet.layers import ConvCaps2d, ConvTransposeCaps2d, DenseCaps
from capsnet.layers.conv import resize_conv2d, same_padding
from capsnet.ops import squash
from capsnet.routing import DynamicRouting, SelfAttentionRouting, create_routing


def procedure1(votes: torch.Tensor, bias: torch.Tensor | None, iterations: int, over: str = "parents") -> torch.Tensor:
    """Sabour et al.'s Procedure 1 for ONE example, written with loops: votes (I, J, D) -> v (J, D)."""
    I, J, D = votes.shape
    b = torch.zeros(I, J, dtype=votes.dtype)
    for r in range(iterations):
        c = torch.softmax(b, dim=1 if over == "parents" else 0)
        s = torch.stack([sum(c[i, j] * votes[i, j] for i in range(I)) for j in range(J)])
        if bias is not None:
            s = s + bias
        v = squash(s)
        if r < iterations - 1:
            b = b + torch.stack([torch.stack([votes[i, j] @ v[j] for j in range(J)]) for i in range(I)])
    return v


def test_same_padding_is_tensorflows():
    assert same_padding(64, 5, 2) == (1, 2)  # out 32: 31 * 2 + 5 - 64 = 3
    assert same_padding(64, 5, 1) == (2, 2)
    assert same_padding(7, 5, 2) == (2, 2)  # out 4: 3 * 2 + 5 - 7 = 4
    assert same_padding(8, 1, 1) == (0, 0)


def test_kernel_1_on_a_1x1_grid_is_dense_caps_with_the_weight_shared_by_the_child_types():
    torch.manual_seed(0)
    T, Din, J, Dout = 3, 4, 5, 6
    conv = ConvCaps2d(T, Din, J, Dout, kernel_size=1, routing=DynamicRouting(3))
    with torch.no_grad():
        conv.bias.normal_()
    dense = DenseCaps(T, Din, J, Dout, routing=DynamicRouting(3))
    w = conv.weight.detach()[:, :, 0, 0].view(J, Dout, Din).permute(2, 0, 1)  # (Din, J, Dout)
    with torch.no_grad():
        dense.weight.copy_(w.unsqueeze(1).expand(Din, T, J, Dout))
        dense.bias.copy_(conv.bias)
    u = torch.randn(7, T, Din)
    grid = u.view(7, T, Din, 1, 1)
    got = conv(grid)[..., 0, 0]  # (7, J, Dout)
    torch.testing.assert_close(got, dense(u).poses, rtol=1e-5, atol=1e-6)
    dense.factored = False
    torch.testing.assert_close(got, dense(u).poses, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("stride, K, H, Wd", [(1, 3, 5, 5), (2, 3, 5, 5), (2, 5, 6, 9), (1, 3, 4, 7)])
@pytest.mark.parametrize("over", ["parents", "children"])
def test_conv_caps_equals_a_loop_over_positions_with_procedure_1(stride, K, H, Wd, over):
    """Square grids and grids wider than tall (every test grid was square, so padding the rows by the columns'
    amounts passed: mutation testing, 2026-12-01)."""
    torch.manual_seed(1)
    T, Din, J, Dout = 2, 3, 3, 4
    layer = ConvCaps2d(T, Din, J, Dout, kernel_size=K, stride=stride, routing=DynamicRouting(3, softmax=over))
    x = torch.randn(2, T, Din, H, Wd)
    got = layer(x)
    top, bottom = same_padding(H, K, stride)
    left, right = same_padding(Wd, K, stride)
    xp = F.pad(x, (left, right, top, bottom))
    Ho, Wo = -(-H // stride), -(-Wd // stride)
    assert got.shape == (2, J, Dout, Ho, Wo)
    W = layer.weight.detach().view(J, Dout, Din, K, K)
    for n in range(2):
        for r in range(Ho):
            for c in range(Wo):
                window = xp[n, :, :, r * stride:r * stride + K, c * stride:c * stride + K]  # (T, Din, K, K)
                votes = torch.einsum("tdkl,jodkl->tjo", window, W)  # each child type's vote: kernel window summed
                want = procedure1(votes, layer.bias.detach(), 3, over)
                torch.testing.assert_close(got[n, :, :, r, c], want, rtol=1e-4, atol=1e-5)


def test_shifting_the_input_by_the_stride_shifts_the_output_by_one_away_from_the_borders():
    torch.manual_seed(2)
    layer = ConvCaps2d(2, 4, 3, 5, kernel_size=5, stride=2)
    x = torch.randn(1, 2, 4, 24, 24)
    shifted = torch.roll(x, shifts=(2, 4), dims=(3, 4))  # 2 rows and 4 columns: 1 and 2 output positions
    a, b = layer(x), layer(shifted)
    # away from the borders (and from the rows the roll wrapped), output (r, c) moved to (r + 1, c + 2)
    torch.testing.assert_close(b[..., 4:10, 5:10], a[..., 3:9, 3:8], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(b[..., 4:10, 5:10], a[..., 4:10, 5:10])  # it did move


def test_transposed_layer_doubles_the_grid_and_shifts_by_two_for_a_shift_by_one():
    torch.manual_seed(3)
    layer = ConvTransposeCaps2d(3, 4, 2, 5)  # kernel 4, stride 2: SegCaps' deconvolutional capsules
    x = torch.randn(2, 3, 4, 8, 8)
    y = layer(x)
    assert y.shape == (2, 2, 5, 16, 16)
    y2 = layer(torch.roll(x, shifts=(1, 1), dims=(3, 4)))
    torch.testing.assert_close(y2[..., 4:12, 4:12], y[..., 2:10, 2:10], rtol=1e-5, atol=1e-6)
    # against a loop: each output pixel's votes are the transposed convolution's, routed by Procedure 1
    votes = F.conv_transpose2d(x.flatten(0, 1), layer.weight.detach(), stride=2, padding=1).view(2, 3, 2, 5, 16, 16)
    for n, r, c in [(0, 0, 0), (1, 7, 9), (0, 15, 3)]:
        want = procedure1(votes[n, :, :, :, r, c], layer.bias.detach(), 3)
        torch.testing.assert_close(y[n, :, :, r, c], want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("layer_cls", [ConvCaps2d, ConvTransposeCaps2d])
def test_an_example_does_not_depend_on_the_rest_of_its_batch(layer_cls):
    torch.manual_seed(4)
    layer = layer_cls(3, 4, 2, 6)
    x = torch.randn(5, 3, 4, 6, 6)
    together = layer(x)
    for k in (0, 3):
        torch.testing.assert_close(layer(x[k:k + 1])[0], together[k], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("layer_cls", [ConvCaps2d, ConvTransposeCaps2d])
def test_finite_outputs_and_gradients_at_zero_input_and_under_bf16_autocast(layer_cls):
    torch.manual_seed(5)
    layer = layer_cls(2, 4, 3, 8)
    for x, ctx in [(torch.zeros(2, 2, 4, 6, 6), torch.autocast("cpu", enabled=False)),
                   (torch.randn(2, 2, 4, 6, 6) * 10, torch.autocast("cpu", dtype=torch.bfloat16))]:
        x.requires_grad_(True)
        layer.zero_grad()
        with ctx:
            y = layer(x)
        assert torch.isfinite(y).all()
        y.float().square().sum().backward()
        assert torch.isfinite(x.grad).all() and torch.isfinite(layer.weight.grad).all()
        assert torch.isfinite(layer.bias.grad).all() and layer.bias.grad.abs().sum() > 0


@pytest.mark.parametrize("layer_cls", [ConvCaps2d, ConvTransposeCaps2d])
@pytest.mark.parametrize("options", [dict(), dict(softmax="children"), dict(squash="exp"), dict(leaky=True),
                                     dict(detach_agreement=True, iterations=2), dict(iterations=1), "self-attention"])
@pytest.mark.parametrize("bias", [True, False])
def test_the_grid_layout_routes_as_the_positions_folded_into_the_batch(layer_cls, options, bias):
    """forward routes the votes in the convolution's layout (DynamicRouting.route_grid, SelfAttentionRouting's);
    route() folds the positions into the batch and calls the routing's forward: the same poses and the same
    gradients, for every option (self-attention's prior included)."""
    torch.manual_seed(8)
    if options == "self-attention":
        routing = SelfAttentionRouting(3, 2)
        with torch.no_grad():
            routing.prior.normal_(0, 0.5)  # zero at the start: a prior that matters
    else:
        routing = DynamicRouting(**{"iterations": 3} | options)
    layer = layer_cls(3, 4, 2, 5, kernel_size=4 if layer_cls is ConvTransposeCaps2d else 3, stride=2,
                      routing=routing, bias=bias)
    if bias:
        with torch.no_grad():
            layer.bias.normal_()
    x = torch.randn(2, 3, 4, 5, 5, requires_grad=True)
    outputs, grads = [], []
    weights = (x, layer.weight, *([layer.bias] if bias else []), *routing.parameters())
    for path in (layer, lambda x: layer.route(x)[0]):
        y = path(x)
        (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
        outputs.append(y.detach())
        grads.append([t.grad.clone() for t in weights])
        for t in weights:
            t.grad = None
    torch.testing.assert_close(outputs[0], outputs[1], rtol=1e-5, atol=1e-6)
    for a, b in zip(*grads, strict=True):  # self-attention's sums over the grid round apart a little more
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5 if options == "self-attention" else 1e-6)


@pytest.mark.parametrize("routing", [DynamicRouting(2), SelfAttentionRouting(3, 4)], ids=["dynamic", "self-attention"])
def test_route_grid_names_a_wrong_shape(routing):
    with pytest.raises(ValueError, match=r"votes must be a grid \(B, I, J, D, H, W\), got shape \(2, 3, 4, 5\)"):
        routing.route_grid(torch.randn(2, 3, 4, 5))
    with pytest.raises(ValueError, match=r"bias must be \(J, D\) = \(4, 5\)"):
        routing.route_grid(torch.randn(2, 3, 4, 5, 6, 6), torch.zeros(5, 4))
    if isinstance(routing, SelfAttentionRouting):
        with pytest.raises(ValueError, match=r"do not fit this routing's \(I, J\) = \(3, 4\)"):
            routing.route_grid(torch.randn(2, 2, 4, 5, 6, 6))


def test_routing_options_coupling_sums_and_bias_off():
    torch.manual_seed(6)
    x = torch.randn(2, 3, 4, 5, 5)
    for over, dim in (("parents", 2), ("children", 1)):
        layer = ConvCaps2d(3, 4, 2, 5, kernel_size=3, routing=DynamicRouting(2, softmax=over), bias=False)
        assert layer.bias is None
        _, result = layer.route(x, record=True)
        assert result.coupling.shape == (2 * 25, 3, 2) and result.rounds.shape == (2 * 25, 2, 3, 2)
        torch.testing.assert_close(result.coupling.sum(dim), torch.ones(2 * 25, 2 if dim == 1 else 3))


def test_any_routing_of_the_shared_call_shape_routes_locally():
    torch.manual_seed(7)
    layer = ConvCaps2d(3, 4, 2, 16, kernel_size=3, routing=create_routing("em", out_caps=2), bias=False)
    x, a = torch.randn(2, 3, 4, 5, 5), torch.rand(2, 3, 5, 5)
    with torch.no_grad():
        y = layer(x, a)
    assert y.shape == (2, 2, 16, 5, 5) and torch.isfinite(y).all()
    # each position alone: its 3x3 window's votes, written out as products (zero outside the grid), and its
    # children's activations, routed by the same module
    padded = F.pad(x, (1, 1, 1, 1))  # (B, T, Din, H + 2, W + 2)
    for n, r, c in [(0, 0, 0), (0, 2, 3), (1, 4, 4), (1, 1, 0)]:
        window = padded[n, :, :, r:r + 3, c:c + 3]  # (T, Din, 3, 3)
        votes = torch.einsum("oikl,tikl->to", layer.weight, window).view(1, 3, 2, 16)  # (1, T, J, D)
        with torch.no_grad():
            alone = layer.routing(votes, a[n, :, r, c][None], None).poses[0]  # (J, D)
        torch.testing.assert_close(y[n, :, :, r, c], alone, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("layer_cls", [ConvCaps2d, ConvTransposeCaps2d])
def test_a_half_precision_grid_routed_by_em_hands_on_its_weights_dtype(layer_cls):
    """EM routes half votes in float32; the grid layers handed its float32 on, so a second bf16 layer's convolution
    refused it (DenseCaps and ConvMatrixCaps cast it back; a review of 2026-11-30)."""
    torch.manual_seed(8)
    net = torch.nn.Sequential(*[layer_cls(2, 8, 2, 8, kernel_size=3 if layer_cls is ConvCaps2d else 4,
                                          routing=create_routing("em", out_caps=2), bias=False) for _ in range(2)])
    x = torch.randn(1, 2, 8, 5, 5)
    want = net(x)
    net = net.bfloat16()
    assert net[0](x.bfloat16()).dtype == torch.bfloat16
    got = net(x.bfloat16())
    assert got.dtype == torch.bfloat16 and got.shape == want.shape
    torch.testing.assert_close(got.float(), want, rtol=0.1, atol=0.1)  # bf16's 8 bits of mantissa, two layers


def test_bad_shapes_and_sizes_are_named():
    layer = ConvCaps2d(2, 4, 3, 5)
    with pytest.raises(ValueError, match=r"expected a child capsule grid \(B, 2, 4, H, W\).*got shape \(1, 3, 4, 5, 5\)"):
        layer(torch.randn(1, 3, 4, 5, 5))
    with pytest.raises(ValueError, match="kernel_size - stride must be even"):
        ConvTransposeCaps2d(2, 4, 3, 5, kernel_size=3, stride=2)
    with pytest.raises(ValueError, match="out_types must be a positive integer"):
        ConvCaps2d(2, 4, 0, 5)
    with pytest.raises(ValueError, match="softmax must be 'parents' or 'children'"):
        DynamicRouting(3, softmax="rows")


def test_self_attention_routes_a_grid_of_huge_and_ordinary_votes_as_its_forward_does():
    """route_grid scales each position's votes on its own (as forward scales each example's): a position of votes of
    1e25, whose scores overflow float32, beside ordinary ones; each position routed as forward routes it alone."""
    g = torch.Generator().manual_seed(5)
    routing = SelfAttentionRouting(3, 2)
    with torch.no_grad():
        routing.prior.normal_(0, 0.5, generator=g)
    votes = torch.randn(2, 3, 2, 4, 2, 3, generator=g)  # (B, I, J, D, H, W)
    votes[:, :, :, :, 0, 1] *= 1e25
    grid = routing.route_grid(votes)  # (B, J, D, H, W)
    assert torch.isfinite(grid).all()
    folded = votes.permute(0, 4, 5, 1, 2, 3).reshape(12, 3, 2, 4)  # (B * H * W, I, J, D)
    alone = routing(folded).poses.view(2, 2, 3, 2, 4).permute(0, 3, 4, 1, 2)
    torch.testing.assert_close(grid, alone, rtol=1e-5, atol=1e-6)


def test_children_activations_of_the_wrong_grid_and_primary_capsules_of_no_size_are_named():
    """A ConvCaps2d took activations of any shape on its grid path (ignored) and failed inside a permute or a view on
    the other; PrimaryCaps built with 0 types failed at its first forward, and out_scale NaN made NaN capsules."""
    from capsnet.layers import PrimaryCaps
    from capsnet.routing import create_routing

    x = torch.randn(2, 3, 4, 6, 6)
    layer = ConvCaps2d(3, 4, 2, 5, kernel_size=3)
    em = ConvCaps2d(3, 4, 2, 5, kernel_size=3, stride=2, routing=create_routing("em", out_caps=2), bias=False)
    for call, want in ((lambda a: layer(x, a), (2, 3, 6, 6)), (lambda a: layer.route(x, a), (2, 3, 6, 6)),
                       (lambda a: em(x, a), (2, 3, 3, 3))):
        with pytest.raises(ValueError, match=r"activations must be \(B, T, H', W'\) = " + re.escape(str(want))):
            call(torch.rand(7, 7))
        call(torch.rand(*want))  # the right grid still routes
    for kw, message in ((dict(types=0), "types must be a positive integer, got 0"),
                        (dict(out_scale=float("nan")), "out_scale must be a positive finite number, got nan"),
                        (dict(stride=0), "stride must be a positive integer, got 0")):
        with pytest.raises(ValueError, match=message):
            PrimaryCaps(8, kernel_size=3, **kw)


def test_a_deconvolutional_capsule_layer_starts_at_he_scale_for_the_inputs_that_reach_an_output():
    """ConvTransposeCaps2d's weights start at sd sqrt(2 / fan_in), fan_in = (K / S)^2 x Din = 4 x 16 (of a 4x4
    kernel at stride 2, a quarter of its taps reach each output); SegCaps' deconvolutional layers scale it by
    init_gain. A fan-in of K^2 x Din (half the sd) passed every test (found by mutation testing, 2026-11-30)."""
    torch.manual_seed(0)
    layer = ConvTransposeCaps2d(1, 16, 1, 16)
    assert layer.weight.numel() == 4096
    assert layer.weight.std().item() == pytest.approx((2 / (4 * 16)) ** 0.5, rel=0.03)


@pytest.mark.parametrize("layer_cls", [ConvCaps2d, ConvTransposeCaps2d])
def test_float64_capsules_are_promoted_as_dense_caps_promotes_them(layer_cls):
    """float64 child capsules into a float32 layer met torch's "expected scalar type Double but found Float" where
    DenseCaps promotes (a review, 2026-12-01): now float64 out, the layer's own float64 copy's numbers."""
    torch.manual_seed(0)
    layer = layer_cls(2, 4, 3, 8, kernel_size=3 if layer_cls is ConvCaps2d else 4)
    x = torch.rand(2, 2, 4, 6, 6, dtype=torch.float64)
    wide = layer(x)
    assert wide.dtype == torch.float64
    torch.testing.assert_close(wide, layer.double()(x), rtol=0, atol=0)


@pytest.mark.parametrize("layer_cls", [ConvCaps2d, ConvTransposeCaps2d])
def test_integer_boolean_and_complex_grids_are_refused_by_name(layer_cls):
    """Boolean and integer child capsules were routed as floats without a word and complex ones met torch's softmax
    "not implemented for 'ComplexFloat'" after a squash warning, where the routings themselves refuse such votes by
    name (a review, 2026-12-02)."""
    layer = layer_cls(2, 4, 3, 8, kernel_size=3 if layer_cls is ConvCaps2d else 4)
    x = torch.rand(2, 2, 4, 6, 6)
    for bad in (x > 0.5, (x * 3).long(), x.to(torch.complex64)):
        with pytest.raises(ValueError, match=rf"a child capsule grid must be floating point, got {bad.dtype}: "
                                             r"x.float\(\) routes it"):
            layer(bad)


@pytest.mark.parametrize("K, S", [(1, 1), (3, 1), (2, 2), (4, 2), (6, 2), (3, 3), (5, 3)])
def test_transposed_layer_output_is_stride_times_the_grid_for_any_allowed_kernel(K, S):
    """The grid grows exactly S times for every kernel with K - S even (only K 4, S 2 was tested, so a padding fixed
    at 1 passed: K 2 gave 8x8 for 10x10; mutation testing, 2026-12-01), on a grid wider than tall."""
    layer = ConvTransposeCaps2d(2, 3, 2, 4, kernel_size=K, stride=S)
    assert layer(torch.randn(1, 2, 3, 5, 7)).shape == (1, 2, 4, 5 * S, 7 * S)


def test_a_convolutional_capsule_layer_starts_at_he_scale():
    """Mutation testing (2026-12-03): ConvCaps2d's vote kernels at sqrt(1 / fan_in) passed every test (the
    deconvolution's start had a test, this one none). He-normal over K * K * Din, as the reference code."""
    torch.manual_seed(0)
    layer = ConvCaps2d(2, 16, 4, 16, kernel_size=5)
    assert layer.weight.shape == (64, 16, 5, 5)
    assert layer.weight.std().item() == pytest.approx((2 / (5 * 5 * 16)) ** 0.5, rel=0.03)
    assert abs(layer.weight.mean().item()) < 0.003


def test_resize_upsampling_votes_are_a_convolution_of_the_grid_enlarged_by_repeating_each_capsule():
    """upsampling="resize" (SegCaps' reference upsamp_type 'resize'): each child capsule copied into an S x S block
    (written here with repeat_interleave), the 4x4 kernel run over it at stride 1 with TensorFlow's "same" padding
    written by hand (3 pixels: 1 before, 2 after), then each position routed by Procedure 1; a shift by one child
    moves the output by S."""
    torch.manual_seed(11)
    layer = ConvTransposeCaps2d(3, 4, 2, 5, upsampling="resize")
    assert layer.weight.shape == (2 * 5, 4, 4, 4)  # a plain convolution's kernel: as many weights as the deconv's
    assert layer.weight.numel() == ConvTransposeCaps2d(3, 4, 2, 5).weight.numel()
    x = torch.randn(2, 3, 4, 6, 7)
    y = layer(x)
    assert y.shape == (2, 2, 5, 12, 14)
    big = x.flatten(0, 1).repeat_interleave(2, dim=-2).repeat_interleave(2, dim=-1)  # (6, 4, 12, 14)
    votes = F.conv2d(F.pad(big, (1, 2, 1, 2)), layer.weight.detach()).view(2, 3, 2, 5, 12, 14)
    for n, r, c in [(0, 0, 0), (1, 7, 9), (0, 11, 13), (1, 5, 0)]:
        want = procedure1(votes[n, :, :, :, r, c], layer.bias.detach(), 3)
        torch.testing.assert_close(y[n, :, :, r, c], want, rtol=1e-4, atol=1e-5)
    y2 = layer(torch.roll(x, shifts=(1, 1), dims=(3, 4)))
    torch.testing.assert_close(y2[..., 4:10, 4:12], y[..., 2:8, 2:10], rtol=1e-5, atol=1e-6)
    assert "upsampling='resize'" in repr(layer) and "upsampling" not in repr(ConvTransposeCaps2d(3, 4, 2, 5))


@pytest.mark.parametrize("K, S", [(1, 2), (3, 2), (4, 2), (5, 3), (2, 1)])
def test_resize_upsampling_takes_any_kernel_and_starts_at_he_scale_of_its_convolution(K, S):
    """The transposed convolution needs K - S even for an output of exactly S times the grid; resize-then-convolve
    pads its stride-1 convolution "same" and takes any kernel. Its kernel starts He-normal over K K Din, the fan of
    a plain convolution (the reference code's he_normal of its (K, K, Din, J Dout) kernel)."""
    torch.manual_seed(0)
    layer = ConvTransposeCaps2d(2, 16, 4, 16, kernel_size=K, stride=S, upsampling="resize")
    assert layer(torch.randn(1, 2, 16, 5, 7)).shape == (1, 4, 16, 5 * S, 7 * S)
    assert layer.weight.std().item() == pytest.approx((2 / (K * K * 16)) ** 0.5, rel=0.05 if K > 1 else 0.1)


@pytest.mark.parametrize("K, S", [(1, 2), (2, 2), (3, 2), (4, 2), (5, 2), (4, 3), (3, 4), (6, 3), (4, 1), (3, 1)])
def test_resize_votes_made_over_the_grid_equal_the_enlarged_grids_convolution(K, S):
    """resize_conv2d makes resize-then-convolve as one transposed convolution of stride S over the child grid itself
    (its kernel the K x K one flipped and summed over every S x S shift). The reference enlarges the grid with
    repeat_interleave and pads "same" by hand ((K - 1) // 2 before, the rest after): in float64 the values and both
    gradients agree to rounding, for odd and even kernels, strides 1-4, odd, even and one-pixel sides, and an empty
    batch."""
    g = torch.Generator().manual_seed(10 * K + S)
    before, after = (K - 1) // 2, K - 1 - (K - 1) // 2
    for N, H, W in [(2, 1, 1), (2, 3, 5), (2, 4, 4), (2, 1, 4), (0, 3, 2)]:
        c = torch.randn(N, 3, H, W, dtype=torch.float64, generator=g, requires_grad=True)
        w = torch.randn(5, 3, K, K, dtype=torch.float64, generator=g, requires_grad=True)
        big = c.repeat_interleave(S, dim=-2).repeat_interleave(S, dim=-1)  # (N, 3, S H, S W)
        want = F.conv2d(F.pad(big, (before, after, before, after)), w)
        got = resize_conv2d(c, w, S)
        assert got.shape == want.shape == (N, 5, S * H, S * W)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        up = torch.randn(want.shape, dtype=torch.float64, generator=g)  # a random upstream gradient
        for a, b in zip(torch.autograd.grad((got * up).sum(), (c, w)), torch.autograd.grad((want * up).sum(), (c, w))):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_a_resize_layer_compiles_as_one_graph_and_runs_under_bf16_autocast():
    """The transposed form builds its kernel in the graph (flip, pad, sums of slices): one graph under
    fullgraph=True, the same output and gradients as eager; under bf16 autocast, votes within bf16's rounding."""
    torch.manual_seed(3)
    layer = ConvTransposeCaps2d(3, 8, 2, 8, upsampling="resize", routing=DynamicRouting(1))  # the votes are the point
    x = torch.randn(2, 3, 8, 5, 6)
    want = layer(x)
    want.square().mean().backward()
    grads = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    got = torch.compile(layer, backend="aot_eager", fullgraph=True, dynamic=False)(x)
    got.square().mean().backward()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for p, g in zip(layer.parameters(), grads):
        torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-6)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        half, votes = layer(x), layer.votes(x)
    assert torch.isfinite(half).all() and votes.dtype == torch.bfloat16
    with torch.no_grad():  # the votes to bf16's rounding (8 bits: 0.4%, summed over 8 x 25 taps)
        full = layer.votes(x)
    torch.testing.assert_close(votes.float(), full, rtol=0.02, atol=0.02 * full.abs().max().item())


@pytest.mark.slow  # Inductor compiles C++ kernels before it fails: about 15 s here
@pytest.mark.parametrize("upsampling", ["deconv", "resize"])
def test_inductor_with_every_dimension_dynamic_still_fails_on_the_deconvolutional_layer(upsampling):
    """The README (Speed paths) tells users that ``torch.compile(model, dynamic=True)`` fails in Inductor on these
    layers (torch 2.13: its ordering of symbolic strides). When a torch compiles them, this test fails: the README's
    sentence is then out of date, and a dynamic-shape compile of SegCaps and the capsule generators worth a test."""
    torch.manual_seed(0)
    layer = ConvTransposeCaps2d(2, 4, 2, 4, upsampling=upsampling, routing=DynamicRouting(1))
    x = torch.randn(2, 2, 4, 6, 6, requires_grad=True)
    torch._dynamo.reset()
    try:
        with pytest.raises(Exception, match="cannot determine truth value of Relational"):
            torch.compile(layer, dynamic=True)(x).square().sum().backward()
    finally:
        torch._dynamo.reset()


def test_an_unknown_upsampling_is_refused_by_name():
    with pytest.raises(ValueError, match=r"upsampling must be one of 'deconv', 'resize', 'subpix', got 'bilinear'"):
        ConvTransposeCaps2d(2, 4, 3, 5, upsampling="bilinear")
    with pytest.raises(ValueError, match=r"kernel_size - stride must be even.*upsampling='resize' or 'subpix' takes "
                                         r"any kernel"):
        ConvTransposeCaps2d(2, 4, 3, 5, kernel_size=3, stride=2)


def test_subpix_upsampling_votes_are_a_convolution_to_s2_groups_laid_out_as_s_by_s_blocks():
    """upsampling="subpix" (SegCaps' reference upsamp_type 'subpix', a sub-pixel convolution): the 4x4 kernel at
    stride 1 with TensorFlow's "same" padding written by hand (1 before, 2 after) makes S^2 = 4 groups of the J Dout
    vote channels at every child position; group i S + j of channel c (kernel row c S^2 + i S + j) is the vote at
    row i, column j of the position's 2x2 block, written out here by indexing; then each position routed by
    Procedure 1; a shift by one child moves the output by S; 4 times the weights of the other two."""
    torch.manual_seed(12)
    layer = ConvTransposeCaps2d(3, 4, 2, 5, upsampling="subpix")
    assert layer.weight.shape == (2 * 5 * 4, 4, 4, 4)
    assert layer.weight.numel() == 4 * ConvTransposeCaps2d(3, 4, 2, 5).weight.numel()
    x = torch.randn(2, 3, 4, 6, 7)
    y = layer(x)
    assert y.shape == (2, 2, 5, 12, 14)
    conv = F.conv2d(F.pad(x.flatten(0, 1), (1, 2, 1, 2)), layer.weight.detach())  # (6, 40, 6, 7)
    votes = torch.empty(6, 10, 12, 14)
    for h in range(6):
        for w in range(7):
            for i in range(2):
                for j in range(2):
                    votes[:, :, 2 * h + i, 2 * w + j] = conv[:, [c * 4 + i * 2 + j for c in range(10)], h, w]
    votes = votes.view(2, 3, 2, 5, 12, 14)
    for n, r, c in [(0, 0, 0), (1, 7, 9), (0, 11, 13), (1, 5, 0), (0, 2, 3)]:
        want = procedure1(votes[n, :, :, :, r, c], layer.bias.detach(), 3)
        torch.testing.assert_close(y[n, :, :, r, c], want, rtol=1e-4, atol=1e-5)
    y2 = layer(torch.roll(x, shifts=(1, 1), dims=(3, 4)))  # away from the borders: a kernel reaches 2 children on
    torch.testing.assert_close(y2[..., 4:8, 4:10], y[..., 2:6, 2:8], rtol=1e-5, atol=1e-6)
    assert "upsampling='subpix'" in repr(layer)


@pytest.mark.parametrize("K, S", [(1, 2), (3, 2), (4, 2), (3, 3), (2, 1)])
def test_subpix_upsampling_takes_any_kernel_and_starts_at_he_scale_of_its_convolution(K, S):
    """Its convolution has stride 1 and "same" padding at any kernel; its kernel (S^2 J Dout, Din, K, K) starts
    He-normal over K K Din (the reference code's he_normal of its (K, K, Din, S^2 J Dout) kernel)."""
    torch.manual_seed(0)
    layer = ConvTransposeCaps2d(2, 16, 4, 16, kernel_size=K, stride=S, upsampling="subpix")
    assert layer.weight.shape == (S * S * 64, 16, K, K)
    assert layer(torch.randn(1, 2, 16, 5, 7)).shape == (1, 4, 16, 5 * S, 7 * S)
    assert layer.weight.std().item() == pytest.approx((2 / (K * K * 16)) ** 0.5, rel=0.05)
