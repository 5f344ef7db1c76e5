"""PrimaryCaps and DenseCaps: shapes, capsule ordering, votes, no tiled weights."""
from __future__ import annotations

import copy
import itertools
import re

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from capsnet.layers import DenseCaps, PrimaryCaps
from capsnet.routing import DynamicRouting, RoutingResult

DT = torch.float64


def _closed_form_squash(s: torch.Tensor) -> torch.Tensor:
    n2 = (s * s).sum()
    return n2 / (1 + n2) * s / torch.sqrt(n2)  # Eq. 1


@pytest.mark.parametrize("B,C,H,W,types,dim,k,stride", [
    (2, 256, 20, 20, 32, 8, 9, 2),  # the paper's MNIST layer: 32 x 6 x 6 = 1152 capsules
    (3, 5, 11, 9, 4, 6, 3, 2),
    (1, 2, 7, 8, 3, 4, 3, 1),
])
def test_primary_caps_shape(B, C, H, W, types, dim, k, stride):
    layer = PrimaryCaps(C, types=types, dim=dim, kernel_size=k, stride=stride)
    out = layer(torch.rand(B, C, H, W))
    Ho, Wo = (H - k) // stride + 1, (W - k) // stride + 1
    assert out.shape == (B, types * Ho * Wo, dim)
    if (C, H) == (256, 20):
        assert out.shape[1] == 1152
    lengths = torch.linalg.norm(out, dim=-1)
    assert (lengths < 1).all() and torch.isfinite(out).all()


def test_primary_caps_order_is_type_row_column_and_squashed():
    torch.manual_seed(0)
    B, C, H, W, types, dim = 2, 3, 9, 8, 4, 5
    layer = PrimaryCaps(C, types=types, dim=dim, kernel_size=3, stride=2).double()
    with torch.no_grad():
        layer.conv.weight.mul_(5)  # lengths spread over (0, 1), not all near 0
    x = torch.randn(B, C, H, W, dtype=DT)
    y = layer.conv(x)  # (B, types*dim, H', W'): channel t*dim + d is atom d of type t
    Ho, Wo = y.shape[2:]
    out = layer(x)
    assert out.shape == (B, types * Ho * Wo, dim)
    for b, t, r, c in itertools.product(range(B), range(types), range(Ho), range(Wo)):
        i = (t * Ho + r) * Wo + c
        expected = _closed_form_squash(y[b, t * dim:(t + 1) * dim, r, c])
        torch.testing.assert_close(out[b, i], expected, rtol=1e-6, atol=1e-9)
    lengths = torch.linalg.norm(out, dim=-1)
    assert lengths.max() > 0.5 and lengths.max() < 1


def _dense(I=6, Din=4, J=5, Dout=7, **kw) -> DenseCaps:
    torch.manual_seed(1)
    layer = DenseCaps(I, Din, J, Dout, **kw).double()
    with torch.no_grad():
        layer.weight.normal_(0, 0.5)
        if layer.bias is not None:
            layer.bias.normal_(0, 0.2)
    return layer


def test_dense_caps_parameters_and_init():
    layer = DenseCaps(1152, 8, 10, 16)
    assert layer.weight.shape == (8, 1152, 10, 16)
    assert layer.bias.shape == (10, 16) and torch.all(layer.bias == 0.1)  # authors' code
    assert sum(p.numel() for p in layer.parameters()) == 1474560 + 160
    assert isinstance(layer.routing, DynamicRouting) and layer.routing.iterations == 3
    assert DenseCaps(1152, 8, 10, 16, bias=False).bias is None
    assert sum(p.numel() for p in DenseCaps(1152, 8, 10, 16, bias=False).parameters()) == 1474560


def test_dense_caps_votes_are_eq_2():
    layer = _dense()
    u = torch.randn(3, 6, 4, dtype=DT)
    votes = layer.votes(u)
    assert votes.shape == (3, 6, 5, 7)
    for b, i, j in itertools.product(range(3), range(6), range(5)):
        expected = layer.weight[:, i, j, :].T @ u[b, i]  # u_hat_j|i = W_ij u_i
        torch.testing.assert_close(votes[b, i, j], expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("iterations,leaky,detach,bias", list(itertools.product([1, 3], [False, True], [False, True], [False, True])))
def test_dense_caps_factored_and_plain_agree(iterations, leaky, detach, bias):
    layer = _dense(routing=DynamicRouting(iterations, leaky=leaky, detach_agreement=detach), bias=bias)
    u = torch.randn(3, 6, 4, dtype=DT, requires_grad=True)
    results, grads = [], []
    for factored in (True, False):
        layer.factored = factored
        out = layer(u)
        assert isinstance(out, RoutingResult)
        results.append(out)
        loss = out.poses.pow(2).sum() + out.activations.sum() + (out.coupling * torch.arange(5, dtype=DT)).sum()
        grads.append(torch.autograd.grad(loss, [u, *layer.parameters()]))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    # the plain path is votes() then the routing module
    plain = layer.routing(layer.votes(u), None, layer.bias)
    torch.testing.assert_close(results[1].poses, plain.poses, rtol=0, atol=0)


class _LargestTensor(TorchFunctionMode):
    """Records the most elements any torch call returns."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_dense_caps_never_tiles_the_weight():
    B, I, Din, J, Dout = 64, 72, 8, 10, 16
    layer = DenseCaps(I, Din, J, Dout)
    u = torch.randn(B, I, Din)
    votes_numel = B * I * J * Dout  # a tiled weight would be Din times this
    with _LargestTensor() as mode:
        votes = layer.votes(u)
    assert votes.shape == (B, I, J, Dout)
    assert mode.largest <= votes_numel
    torch.testing.assert_close(votes, torch.einsum("bid,dijo->bijo", u, layer.weight), rtol=1e-5, atol=1e-6)
    # the routed forward and its hand-written backward build nothing larger than the votes
    with _LargestTensor() as mode:
        out = layer(u)
        out.poses.sum().backward()
    assert 0 < mode.largest <= votes_numel
    assert layer.weight.shape == (Din, I, J, Dout) and layer.weight.grad.shape == (Din, I, J, Dout)
    assert [p.shape for p in layer.parameters()] == [(Din, I, J, Dout), (J, Dout)]


def test_largest_tensor_probe_can_fail():
    # The probe above does see a weight tiled per example.
    w = torch.zeros(8, 72, 10, 16)
    with _LargestTensor() as mode:
        torch.cat([w.unsqueeze(0)] * 4)
    assert mode.largest == 4 * w.numel()


class _RecordingRouting(nn.Module):
    def forward(self, votes, activations=None, bias=None):
        self.seen = (votes, activations, bias)
        B, I, J, D = votes.shape
        return RoutingResult(votes.mean(1), votes.new_ones(B, J), votes.new_full((B, I, J), 1 / J))


def test_dense_caps_hands_votes_to_any_routing_module():
    routing = _RecordingRouting()
    layer = _dense(routing=routing)
    u = torch.randn(2, 6, 4, dtype=DT)
    a = torch.rand(2, 6, dtype=DT)
    out = layer(u, a)
    votes, activations, bias = routing.seen
    torch.testing.assert_close(votes, layer.votes(u))
    assert activations is a and bias is layer.bias
    torch.testing.assert_close(out.poses, votes.mean(1))


@pytest.mark.parametrize("factored", [True, False])
@pytest.mark.parametrize("shape", [(2, 6, 5), (2, 7, 4), (6, 4), (2, 6, 4, 1)])
def test_dense_caps_rejects_wrong_input_shape(factored, shape):
    layer = _dense(factored=factored)
    with pytest.raises(ValueError, match=r"\(B, 6, 4\)") as info:
        layer(torch.zeros(shape, dtype=DT))
    assert str(tuple(shape)) in str(info.value)
    with pytest.raises(ValueError, match=r"\(B, 6, 4\)"):
        layer.votes(torch.zeros(shape, dtype=DT))


class _FastRouting(_RecordingRouting):
    """Not a DynamicRouting, but it offers the linear fast path: the layer must use it."""

    def route_linear(self, u, weight, bias=None, *, record=False):
        self.fast = (u, weight, bias, record)
        B, I, _ = u.shape
        J, D = weight.shape[2:]
        return RoutingResult(u.new_zeros(B, J, D), u.new_zeros(B, J), u.new_full((B, I, J), 1 / J))


@pytest.mark.parametrize("record", [False, True])
def test_dense_caps_uses_a_fast_path_the_routing_offers_whatever_its_class(record):
    routing = _FastRouting()
    layer = _dense(routing=routing)
    u = torch.randn(2, 6, 4, dtype=DT)
    layer(u, record=record)
    assert routing.fast[0] is u and routing.fast[1] is layer.weight and routing.fast[2] is layer.bias
    assert routing.fast[3] is record
    assert not hasattr(routing, "seen")  # the plain path was not taken
    _dense(routing=routing, factored=False)(u)
    assert hasattr(routing, "seen")


def test_dense_caps_records_every_round_on_both_paths():
    u = torch.randn(2, 6, 4, dtype=DT)
    fast, plain = _dense(), _dense(factored=False)
    plain.load_state_dict(fast.state_dict())
    a, b = fast(u, record=True), plain(u, record=True)
    assert a.rounds.shape == (2, 3, 6, 5)
    torch.testing.assert_close(a.rounds, b.rounds)
    assert fast(u).rounds is None


def test_dense_caps_under_torch_func_transforms_and_forward_ad_takes_the_plain_path():
    """The fast path is one autograd Function without a vmap or jvp rule: before, vmap, jacrev and forward-mode AD
    of a CapsNet raised inside it (EM and inverted routing already fell back to their plain paths there)."""
    layer = _dense()
    u = torch.randn(3, 6, 4, dtype=DT)
    one_by_one = torch.stack([layer(u[i:i + 1]).poses[0] for i in range(3)])
    torch.testing.assert_close(torch.vmap(lambda x: layer(x[None]).poses[0])(u), one_by_one)
    jac = torch.func.jacrev(lambda x: layer(x).activations.sum())(u)
    x = u.clone().requires_grad_(True)
    torch.testing.assert_close(jac, torch.autograd.grad(layer(x).activations.sum(), x)[0])
    tangent = torch.randn(u.shape, dtype=DT)
    out, jvp = torch.func.jvp(lambda x: layer(x).poses, (u,), (tangent,))
    torch.testing.assert_close(out, layer(u).poses)
    eps = 1e-6  # the directional derivative, by central differences
    torch.testing.assert_close(jvp, (layer(u + eps * tangent).poses - layer(u - eps * tangent).poses) / (2 * eps),
                               rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("factored", [True, False])
def test_dense_caps_names_activations_of_the_wrong_shape_on_both_paths(factored):
    """The fast path (dynamic routing, which ignores activations) took (7,) activations for 2 x 6 capsules; the
    plain path refused them by name (a review, 2026-12-01)."""
    layer = _dense(factored=factored)
    u = torch.rand(2, 6, 4, dtype=DT)
    with pytest.raises(ValueError, match=r"activations must be \(B, I\) = \(2, 6\) for .*got shape \(7,\)"):
        layer(u, torch.zeros(7, dtype=DT))
    layer(u, torch.ones(2, 6, dtype=DT))  # the right shape, as before


def test_primary_caps_name_maps_smaller_than_their_kernel():
    """Used alone, maps smaller than the 9x9 kernel met torch's bare RuntimeError (a review; CapsNetConfig refuses
    such inputs itself)."""
    layer = PrimaryCaps(5, types=2, dim=4)
    with pytest.raises(ValueError, match=r"PrimaryCaps takes \(B, C, H, W\) feature maps of at least its 9x9 kernel, "
                                         r"got \(2, 5, 8, 20\)"):
        layer(torch.rand(2, 5, 8, 20))
    assert layer(torch.rand(2, 5, 9, 9)).shape == (2, 2, 4)


def test_primary_and_dense_caps_refuse_integer_boolean_and_complex_inputs_by_name():
    """DenseCaps routed boolean and integer capsules as floats without a word (complex ones met "expected scalar type
    Float but found ComplexFloat"), PrimaryCaps met its convolution's dtype error (a review, 2026-12-02)."""
    u = torch.rand(2, 12, 8)
    for bad in (u > 0.5, (u * 3).long(), u.to(torch.complex64)):
        with pytest.raises(ValueError, match=rf"lower capsules must be floating point, got {bad.dtype}: u.float\(\)"):
            DenseCaps(12, 8, 5, 16)(bad)
        with pytest.raises(ValueError, match=rf"feature maps must be floating point, got {bad.dtype}"):
            PrimaryCaps(12, types=2, dim=4, kernel_size=3)(bad.view(2, 12, 8, 1).expand(2, 12, 8, 8))


def test_primary_caps_take_bfloat16_feature_maps_into_a_float32_layer():
    """bfloat16 maps into a float32 layer met torch's "Input type (c10::BFloat16) and bias type (float)" where
    DenseCaps takes them (a review, 2026-12-02): float32 capsules, the layer's numbers for the maps widened."""
    torch.manual_seed(0)
    layer = PrimaryCaps(5, types=2, dim=4, kernel_size=3)
    x = torch.rand(2, 5, 9, 9).bfloat16()
    out = layer(x)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, layer(x.float()), rtol=0, atol=0)


def test_primary_caps_promote_float64_feature_maps_as_the_capsule_layers_do():
    """float64 maps into a float32 layer met torch's "Input type (double) and bias type (float) should be the same"
    where DenseCaps promotes (a review, 2026-12-01); with and without the authors' output scale."""
    torch.manual_seed(0)
    x = torch.rand(2, 5, 9, 9)
    for scale in (1.0, 0.5):
        layer = PrimaryCaps(5, types=2, dim=4, kernel_size=3, out_scale=scale)
        wide = layer(x.double())
        assert wide.dtype == torch.float64
        # the float64 reference: the layer itself in float64
        torch.testing.assert_close(wide, layer.double()(x.double()), rtol=0, atol=0)
        torch.testing.assert_close(wide.float(), layer.float()(x), rtol=1e-5, atol=1e-6)


def test_every_capsule_layer_keeps_float64_capsules_float64_under_autocast():
    """One rule (_eager.promoted) for every layer: float64 inputs under bf16 autocast, which leaves float64 alone,
    give the float64 layer's own result. ConvMatrixCaps and ClassMatrixCaps met "expected m1 and m2 to have the
    same dtype, but got: double != c10::BFloat16" (their weights were left to autocast), and DenseCaps' plain path
    routed them in float32 (a review of the promotion rule, 2026-12-02)."""
    from capsnet.layers import (ClassMatrixCaps, ConvCaps2d, ConvMatrixCaps, ConvTransposeCaps2d, DenseMatrixCaps,
                                MatrixCaps, PrimaryMatrixCaps)
    from capsnet.routing import EMRouting

    g = torch.Generator().manual_seed(3)
    maps, grid = torch.rand(2, 5, 7, 7, generator=g).double(), torch.randn(2, 3, 4, 5, 5, generator=g).double()
    caps = torch.randn(2, 12, 6, generator=g).double() / 3
    matrix = MatrixCaps(torch.randn(2, 4, 4, 3, 16, generator=g).double(), torch.rand(2, 4, 4, 3, generator=g).double())
    torch.manual_seed(0)
    layers = [(PrimaryCaps(5, types=2, dim=4, kernel_size=3), maps), (DenseCaps(12, 6, 3, 4), caps),
              (DenseCaps(12, 6, 3, 4, factored=False), caps), (ConvCaps2d(3, 4, 2, 5, kernel_size=3), grid),
              (ConvTransposeCaps2d(3, 4, 2, 5), grid), (PrimaryMatrixCaps(5, 3), maps),
              (ConvMatrixCaps(3, 2, kernel_size=3, routing=EMRouting(2)), matrix),
              (ClassMatrixCaps(3, 4, routing=EMRouting(4)), matrix), (DenseMatrixCaps(48, 4, routing=EMRouting(4)), matrix)]
    for layer, inputs in layers:
        name = f"{type(layer).__name__}{'' if getattr(layer, 'factored', True) else ' (plain)'}"
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = layer(inputs)
        reference = copy.deepcopy(layer).double()(inputs)
        for got, want in zip(_tensors(out), _tensors(reference)):
            assert got.dtype == torch.float64, name
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, msg=name)


def _tensors(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, tuple) and isinstance(out[0], torch.Tensor) and len(out) == 2:  # MatrixCaps
        return list(out)
    return [t for t in (out[0], out[1]) if isinstance(t, torch.Tensor)]  # RoutingResult or (grid, result)


def test_the_capsule_layers_refuse_a_routing_that_is_no_module_a_switch_that_is_no_bool_and_a_bad_field():
    """A review of the Python API (2026-12-02): routing="dynamic" built and met "'str' object is not callable" at the
    first forward, the class DynamicRouting an einsum complaint, None in ConvMatrixCaps "'NoneType' object has no
    attribute 'forward'"; bias="no" built a bias; ClassMatrixCaps' receptive field of zero sides made NaN classes."""
    from capsnet.layers import ClassMatrixCaps, ConvCaps2d, ConvMatrixCaps, ConvTransposeCaps2d, DenseMatrixCaps
    from capsnet.routing import EMRouting

    cases = [
        (lambda: DenseCaps(4, 8, 2, 16, routing="dynamic"), TypeError,
         r"routing must be a routing module \(nn.Module\), got str 'dynamic': create_routing\('dynamic', \.\.\.\) "
         r"builds one by name"),
        (lambda: ConvCaps2d(2, 4, 2, 4, routing=DynamicRouting), TypeError,
         r"got the class DynamicRouting itself: pass an instance, e.g. DynamicRouting\(\.\.\.\)"),
        (lambda: ConvTransposeCaps2d(2, 4, 2, 4, routing=3), TypeError, "got int 3"),
        (lambda: ConvMatrixCaps(2, 3, routing=None), TypeError, "got NoneType None"),
        (lambda: ClassMatrixCaps(2, 3, routing="em"), TypeError, "got str 'em'"),
        (lambda: DenseMatrixCaps(4, 3, routing=EMRouting), TypeError, "got the class EMRouting itself"),
        (lambda: DenseCaps(4, 8, 2, 16, bias="no"), ValueError, "bias must be True or False, got 'no'"),
        (lambda: DenseCaps(4, 8, 2, 16, factored=0), ValueError, "factored must be True or False, got 0"),
        (lambda: ConvCaps2d(2, 4, 2, 4, bias="no"), ValueError, "bias must be True or False, got 'no'"),
    ]
    for field in ((1, 0.5, 0, 3), (1, 2), "abcd", (0, 0.5, 3, 3), (1, float("nan"), 3, 3), (1, True, 3, 3),
                  (1, 10**400, 3, 3)):  # past float's range: math.isfinite's OverflowError before
        cases.append((lambda field=field: ClassMatrixCaps(2, 3, routing=EMRouting(3), receptive_field=field),
                      ValueError, r"receptive_field must be \(stride, offset, image height, image width\): a positive "
                                  rf"stride .* got {re.escape(repr(field))}"))
    for make, error, message in cases:
        with pytest.raises(error, match=message):
            make()
    caps = (torch.randn(1, 3, 3, 2, 16), torch.rand(1, 3, 3, 2))
    layer = ClassMatrixCaps(2, 3, routing=EMRouting(3), receptive_field=[4, 8.5, 28, 28])  # a list is taken
    assert torch.isfinite(layer(caps).activations).all()
