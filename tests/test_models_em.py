"""Matrix capsule layers and the EM capsule networks (Hinton et al. 2018), checked against plain loops and counts."""
from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
import torch

from capsnet.layers import ClassMatrixCaps, ConvMatrixCaps, MatrixCaps, PrimaryMatrixCaps
from capsnet.losses import spread_loss
from capsnet.models import MODELS, EMCapsNet, EMCapsNetConfig, EMCapsNetSmallConfig, create_model, em_capsnet_loss
from capsnet.routing import EMRouting, InvertedDotProductRouting, RoutingResult

DT = torch.float64


class _Mean(torch.nn.Module):
    """A stand-in routing: the activation-weighted mean vote, so the layer's votes can be read back."""

    def forward(self, votes, activations=None, bias=None, *, record=False):
        self.votes, self.activations = votes, activations
        B, I, J, D = votes.shape
        return RoutingResult(votes.mean(1), votes.new_ones(B, J), votes.new_full((B, I, J), 1 / J))


def _caps(N, H, W, T, seed=0):
    g = torch.Generator().manual_seed(seed)
    return MatrixCaps(torch.randn(N, H, W, T, 16, generator=g, dtype=DT), torch.rand(N, H, W, T, generator=g, dtype=DT))


def test_conv_matrix_caps_votes_are_pose_times_transform_for_every_window():
    caps = _caps(2, 5, 6, 3)
    layer = ConvMatrixCaps(3, 4, kernel_size=3, stride=2, routing=_Mean()).double()
    out = layer(caps)
    Ho, Wo = 2, 2
    assert out.poses.shape == (2, Ho, Wo, 4, 16) and out.activations.shape == (2, Ho, Wo, 4)
    votes, acts = layer.routing.votes, layer.routing.activations  # (N*Ho*Wo, 9*3, 4, 16), (N*Ho*Wo, 27)
    for n, h, w, k, l, i, j in itertools.product(range(2), range(Ho), range(Wo), range(3), range(3), range(3), [0, 3]):
        row, child = (n * Ho + h) * Wo + w, (k * 3 + l) * 3 + i  # windows folded into the batch, children (k, l, i)
        M = caps.poses[n, 2 * h + k, 2 * w + l, i].view(4, 4)
        torch.testing.assert_close(votes[row, child, j].view(4, 4), M @ layer.weight[k, l, i, j])
        assert acts[row, child] == caps.activations[n, 2 * h + k, 2 * w + l, i]


def test_conv_matrix_caps_float32_votes_and_gradients_match_the_einsum():
    """In float32 the votes are laid out by the block copy (capsnet._eager.permute_contiguous): the same votes and
    gradients as one einsum over the unfolded windows."""
    g = torch.Generator().manual_seed(3)
    poses = torch.randn(2, 5, 6, 3, 16, generator=g, requires_grad=True)
    caps = MatrixCaps(poses, torch.rand(2, 5, 6, 3, generator=g))
    layer = ConvMatrixCaps(3, 4, kernel_size=3, stride=2, routing=_Mean())
    layer(caps)
    votes = layer.routing.votes  # (N*Ho*Wo, 27, 4, 16)
    p = poses.unfold(1, 3, 2).unfold(2, 3, 2).permute(0, 1, 2, 5, 6, 3, 4).reshape(2, 2, 2, 3, 3, 3, 4, 4)
    expected = torch.einsum("nhwklixy,klijyz->nhwklijxz", p, layer.weight).reshape(8, 27, 4, 16)
    torch.testing.assert_close(votes, expected)
    weights = torch.randn(votes.shape, generator=g)
    got = torch.autograd.grad((votes * weights).sum(), [poses, layer.weight])
    want = torch.autograd.grad((expected * weights).sum(), [poses, layer.weight])
    for x, y in zip(got, want):
        torch.testing.assert_close(x, y)


def test_class_caps_share_transforms_over_positions_and_add_coordinates():
    caps = _caps(1, 2, 3, 2, seed=1)
    layer = ClassMatrixCaps(2, 5, routing=_Mean()).double()
    layer(caps)
    votes = layer.routing.votes  # (1, 2*3*2, 5, 16), children ordered (row, column, type)
    for r, c, i, j in itertools.product(range(2), range(3), range(2), range(5)):
        expected = (caps.poses[0, r, c, i].view(4, 4) @ layer.weight[i, j]).flatten()
        expected[3] += (r + 0.5) / 2  # section 4: scaled row and column in the right-hand column's first two entries
        expected[7] += (c + 0.5) / 3
        torch.testing.assert_close(votes[0, (r * 3 + c) * 2 + i, j], expected)
    plain = ClassMatrixCaps(2, 5, routing=_Mean(), coordinate_addition=False).double()
    plain.load_state_dict(layer.state_dict())
    plain(caps)
    diff = layer.routing.votes - plain.routing.votes
    assert set(diff.nonzero()[:, -1].tolist()) == {3, 7}


def test_dense_matrix_caps_votes_are_pose_times_its_own_transform():
    """DenseMatrixCaps (the inverted model's and CapsNet-under-EM's fully connected matrix layer): child i's vote for
    parent j is its 4x4 pose times W_ij, M W as the paper writes it; the transposed product passed every test (found
    by mutation testing, 2026-11-30)."""
    from capsnet.layers import DenseMatrixCaps

    caps = _caps(2, 2, 3, 2, seed=5)  # 12 children
    torch.manual_seed(0)
    layer = DenseMatrixCaps(12, 4, routing=_Mean()).double()
    layer(caps)
    votes, weight = layer.routing.votes.detach().numpy(), layer.weight.detach().numpy()
    poses = caps.poses.reshape(2, 12, 4, 4).numpy()
    assert votes.shape == (2, 12, 4, 16)
    for n, i, j in itertools.product(range(2), range(12), range(4)):
        expected = [sum(poses[n, i, x, y] * weight[i, j, y, z] for y in range(4)) for x in range(4) for z in range(4)]
        assert votes[n, i, j] == pytest.approx(expected, rel=1e-12, abs=1e-12)
    torch.testing.assert_close(layer.routing.activations, caps.activations.reshape(2, 12))


def test_primary_matrix_caps_shapes_and_range():
    layer = PrimaryMatrixCaps(6, 4)
    out = layer(torch.randn(2, 6, 5, 7))
    assert out.poses.shape == (2, 5, 7, 4, 16) and out.activations.shape == (2, 5, 7, 4)
    assert ((out.activations > 0) & (out.activations < 1)).all()
    with pytest.raises(ValueError, match=r"expects poses \(N, H, W, 4, 16\)"):
        ConvMatrixCaps(4, 2, routing=_Mean())(MatrixCaps(out.poses[..., :8], out.activations))


def test_matrix_capsule_layers_refuse_bad_sizes_by_name():
    """A kernel of 0 gave a larger grid of zero poses, a stride of 0 a ZeroDivisionError, share_children with a
    routing that takes no child ids a TypeError at the first forward (a review, 2026-12-01)."""
    from capsnet.layers import DenseMatrixCaps
    from capsnet.routing import DynamicRouting

    for make, message in [(lambda: ConvMatrixCaps(3, 4, kernel_size=0, routing=_Mean()), "kernel_size must be a "
                                                                                          "positive integer, got 0"),
                          (lambda: ConvMatrixCaps(3, 4, stride=0, routing=_Mean()), "stride must be a positive"),
                          (lambda: ConvMatrixCaps(3, 4, kernel_size=-1, routing=_Mean()), "kernel_size must be"),
                          (lambda: ConvMatrixCaps(3, 4, routing=_Mean(), std=0), "std must be a positive finite"),
                          (lambda: ConvMatrixCaps(3, 4, routing=DynamicRouting(2), share_children=True),
                           "share_children=True hands the routing each vote's child ids, which DynamicRouting does "
                           "not take \\(EMRouting does\\): leave it False"),
                          (lambda: ConvMatrixCaps(3, 4, routing=_Mean(), share_children="no"), "share_children must "
                                                                                                "be True or False"),
                          (lambda: PrimaryMatrixCaps(8, 0), "types must be a positive integer, got 0"),
                          (lambda: ClassMatrixCaps(0, 10, routing=_Mean()), "in_types must be a positive integer"),
                          (lambda: DenseMatrixCaps(4, 0, routing=_Mean()), "out_caps must be a positive integer")]:
        with pytest.raises(ValueError, match=message):
            make()
    assert ConvMatrixCaps(3, 4, routing=_Shared(), share_children=True).share_children  # a routing that takes them


def test_matrix_capsule_layers_take_float64_capsules_as_the_other_capsule_layers_do():
    """float64 capsules into a float32 layer met torch's "expected scalar type Float but found Double" (and its
    convolution's "Input type (double) and bias type (float)") where DenseCaps and ConvCaps2d promote; float32 ones
    into a bfloat16 layer likewise (a review, 2026-12-02). Checked against each layer itself in float64."""
    from capsnet.layers import DenseMatrixCaps

    torch.manual_seed(0)
    caps = _caps(2, 5, 5, 3, seed=7)
    x = torch.rand(2, 6, 5, 5, dtype=DT)
    layers = [(PrimaryMatrixCaps(6, 3), x), (ConvMatrixCaps(3, 4, kernel_size=3, routing=EMRouting(4)), caps),
              (ClassMatrixCaps(3, 5, routing=EMRouting(5)), caps), (DenseMatrixCaps(75, 5, routing=EMRouting(5)), caps)]
    for layer, inputs in layers:
        wide = layer(inputs)
        reference = layer.double()(inputs)
        assert wide.poses.dtype == wide.activations.dtype == DT, type(layer).__name__
        torch.testing.assert_close(wide.poses, reference.poses, rtol=0, atol=0)
        torch.testing.assert_close(wide.activations, reference.activations, rtol=0, atol=0)
        half = layer.bfloat16()(tuple(t.float() for t in inputs) if isinstance(inputs, tuple) else inputs.float())
        assert half.poses.dtype == torch.float32, type(layer).__name__  # promoted to float32, not bfloat16


def test_matrix_capsule_layers_refuse_what_is_no_capsule_grid_by_name():
    """A bare tensor met "'Tensor' object has no attribute 'poses'", integer poses torch's dtype errors, a 3-D map
    "not enough values to unpack", and DenseMatrixCaps routed activations laid out type-first (N, T, H, W) against
    the wrong poses without a word (a review, 2026-12-02); a plain (poses, activations) pair is taken."""
    from capsnet.layers import DenseMatrixCaps

    caps = _caps(2, 4, 4, 3, seed=2)
    conv = ConvMatrixCaps(3, 4, kernel_size=3, routing=_Mean()).double()
    torch.testing.assert_close(conv(tuple(caps)).poses, conv(caps).poses, rtol=0, atol=0)
    with pytest.raises(TypeError, match=r"ConvMatrixCaps takes a MatrixCaps\(poses, activations\) capsule grid, "
                                        r"got Tensor"):
        conv(caps.poses)
    with pytest.raises(ValueError, match=r"poses must be floating point, got torch.int64: poses.float\(\) takes them"):
        conv(MatrixCaps(caps.poses.long(), caps.activations))
    with pytest.raises(ValueError, match="activations must be floating point, got torch.bool"):
        ClassMatrixCaps(3, 5, routing=_Mean()).double()(MatrixCaps(caps.poses, caps.activations > 0.5))
    dense = DenseMatrixCaps(48, 5, routing=_Mean()).double()
    with pytest.raises(ValueError, match=r"poses \(N, \.\.\., 16\) and activations \(N, \.\.\.\) of the same grid, got "
                                         r"poses \(2, 4, 4, 3, 16\) and activations \(2, 3, 4, 4\)"):
        dense(MatrixCaps(caps.poses, caps.activations.permute(0, 3, 1, 2)))
    primary = PrimaryMatrixCaps(6, 3)
    for bad in (torch.rand(6, 5, 5), torch.rand(2, 5, 5, 5)):
        with pytest.raises(ValueError, match=rf"PrimaryMatrixCaps takes \(N, 6, H, W\) feature maps, got "
                                             rf"{re.escape(str(tuple(bad.shape)))}"):
            primary(bad)
    with pytest.raises(ValueError, match="feature maps must be floating point, got torch.int64"):
        primary(torch.ones(2, 6, 5, 5, dtype=torch.long))
    with pytest.raises(TypeError, match="as a tensor, got list"):
        primary([[0.0]])


def _formula(A, B, C, D, K, in_channels=1):
    """Weights of Figure 1's network, layer by layer (16 per 4x4 transform, a beta_u and beta_a per type)."""
    conv1 = 25 * in_channels * A + A
    primary = A * 16 * B + 16 * B + A * B + B  # 1x1 pose and activation convolutions with biases
    caps1, caps2, classes = 9 * B * C * 16 + 2 * C, 9 * C * D * 16 + 2 * D, D * K * 16 + 2 * K
    return conv1 + primary + caps1 + caps2 + classes


@pytest.mark.parametrize("name,sizes,paper", [("em-capsnet", (32, 32, 32, 32), 310_000),
                                              ("em-capsnet-small", (64, 8, 16, 16), 68_000)])
def test_weight_counts_against_the_architecture_and_the_paper(name, sizes, paper):
    model = create_model(name)
    n = sum(p.numel() for p in model.parameters())
    assert n == _formula(*sizes, K=5) == model.config.num_weights
    # Section 5 rounds: 316,394 is 2.1% over "310K" (the capsule layers alone exceed it); 67,154 is 1.2% under "68K".
    assert abs(n - paper) / paper < 0.025


@pytest.mark.parametrize("name", ["em-capsnet", "em-capsnet-small"])
@pytest.mark.parametrize("side,classes", [(28, 10), (32, 5)])
def test_em_models_run_train_and_are_batch_independent(name, side, classes):
    torch.manual_seed(0)
    small = {"conv1_channels": 8, "primary_types": 4, "caps1_types": 4, "caps2_types": 4}  # the structure, quickly
    model = create_model(name, input_height=side, input_width=side, num_classes=classes, **small)
    images, labels = torch.rand(3, 1, side, side), torch.tensor([0, 1, 2])
    out = model(images)
    grid = model.config.grids[-1]
    assert out.poses.shape == (3, classes, 16) and out.activations.shape == (3, classes)
    assert out.coupling.shape == (3, grid[0] * grid[1] * 4, classes)
    loss, scores = em_capsnet_loss(model, images, labels, progress=0.3)
    assert torch.isfinite(loss) and torch.equal(scores, out.activations)
    loss.backward()
    for n, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, n
    # in float64, so a real dependence on the batch (differences near the values' size) stands out from the
    # float32 rounding of differently shaped batched products (a few 1e-6 on some CPUs)
    model.double()
    together, alone = model(images.double()), model(images[1:2].double())
    for a, b in zip(alone, together):
        torch.testing.assert_close(a[0], b[1], rtol=1e-9, atol=1e-12)


def test_conv1_batch_norm_option_counts_normalises_and_is_batch_independent_in_eval():
    torch.manual_seed(2)
    small = {"conv1_channels": 8, "primary_types": 4, "caps1_types": 4, "caps2_types": 4}
    plain = create_model("em-capsnet-small", input_height=28, input_width=28, num_classes=10, **small)
    model = create_model("em-capsnet-small", input_height=28, input_width=28, num_classes=10, conv1_batch_norm=True,
                         **small)
    count = sum(p.numel() for p in model.parameters())
    assert count == model.config.num_weights == sum(p.numel() for p in plain.parameters()) + 2 * 8
    images, labels = 3 * torch.rand(4, 1, 28, 28) + 1, torch.tensor([0, 1, 2, 3])
    # training mode: conv1's output reaches the ReLU standardised per channel over the batch and the grid
    seen = {}
    model.conv1_norm.register_forward_hook(lambda m, i, o: seen.update(out=o.detach()))  # returns None: output kept
    loss, _ = em_capsnet_loss(model, images, labels, progress=0.5)
    mean, var = seen["out"].mean((0, 2, 3)), seen["out"].var((0, 2, 3), unbiased=False)
    torch.testing.assert_close(mean, torch.zeros(8), atol=1e-5, rtol=0)
    torch.testing.assert_close(var, torch.ones(8), atol=1e-3, rtol=0)
    loss.backward()
    assert model.conv1_norm.weight.grad.abs().sum() > 0 and model.conv1_norm.bias.grad.abs().sum() > 0
    # eval mode: the running statistics, so one example's output does not depend on the rest of its batch
    model.eval().double()
    together, alone = model(images.double()), model(images[2:3].double())
    torch.testing.assert_close(alone.activations[0], together.activations[2], rtol=1e-9, atol=1e-12)
    assert not torch.allclose(model.conv1_norm.running_mean, torch.zeros(8, dtype=DT))  # it learned the statistics


def test_em_model_under_bf16_autocast_is_finite():
    torch.manual_seed(1)
    model = create_model("em-capsnet-small", input_height=28, input_width=28, num_classes=10)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = em_capsnet_loss(model, torch.rand(2, 1, 28, 28), torch.tensor([3, 4]))
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_spread_loss_against_hand_values():
    a = torch.tensor([[0.9, 0.2, 0.85]], dtype=DT)
    # target 0: wrong classes 1 (gap 0.7) and 2 (gap 0.05); margin 0.2: only class 2 inside it, (0.2 - 0.05)^2
    assert spread_loss(a, torch.tensor([0]), 0.2).item() == pytest.approx(0.15 ** 2)
    assert spread_loss(a, torch.tensor([0]), 0.9).item() == pytest.approx(0.2 ** 2 + 0.85 ** 2)
    two = spread_loss(a, torch.tensor([[1.0, 0.0, 1.0]], dtype=DT), 0.2)  # targets 0 and 2 against class 1
    assert two.item() == pytest.approx(0.0)  # both sit 0.65 or more above it
    with pytest.raises(ValueError, match=r"targets must be \(B,\) indices or \(B, J\)"):
        spread_loss(a, torch.zeros(1, 4), 0.2)


def test_margin_grows_linearly_from_start_to_end_over_the_warm_up():
    cfg = EMCapsNetConfig()
    assert [cfg.margin(p) for p in (0.0, 0.25, 0.5, 1.0)] == pytest.approx([0.2, 0.55, 0.9, 0.9])


def test_configs_refuse_bad_sizes_by_name():
    with pytest.raises(ValueError, match="at least 17x17"):
        EMCapsNetConfig(input_height=16, input_width=17)
    assert EMCapsNetConfig(input_height=17, input_width=17).grids[-1] == (1, 1)  # the smallest the message names
    with pytest.raises(ValueError, match="routing_iterations must be in 1..100"):
        EMCapsNetSmallConfig(routing_iterations=0)
    with pytest.raises(ValueError, match="coordinate_addition must be true or false"):
        EMCapsNetConfig(coordinate_addition="yes")
    assert type(MODELS["em-capsnet-small"].build(EMCapsNetSmallConfig())) is EMCapsNet


def test_transform_std_var_floor_and_beta_inits_reach_every_capsule_layer():
    torch.manual_seed(3)
    small = {"conv1_channels": 8, "primary_types": 4, "caps1_types": 4, "caps2_types": 4}
    model = create_model("em-capsnet-small", input_height=28, input_width=28, num_classes=10, transform_std=2.0,
                         var_floor=1e-9, beta_u_init=2.5, beta_a_init=-7.0, class_beta_a_init=3.0, **small)
    default = create_model("em-capsnet-small", input_height=28, input_width=28, num_classes=10, **small)
    for layer, ref in ((model.caps1, default.caps1), (model.caps2, default.caps2), (model.classes, default.classes)):
        assert layer.routing.var_floor == 1e-9 and ref.routing.var_floor == 5e-4
        assert set(layer.routing.beta_u.tolist()) == {2.5} and set(ref.routing.beta_u.tolist()) == {0.0}
        start, official = (3.0, -12.5) if layer is model.classes else (-7.0, -25.0)  # the class layer's apart
        assert set(layer.routing.beta_a.tolist()) == {start} and set(ref.routing.beta_a.tolist()) == {official}
        # truncated at two standard deviations: std ~0.88 of the scale; the ratio of the two spreads is the scales'
        assert layer.weight.abs().max() <= 4.0 and ref.weight.abs().max() <= 0.6  # the default 0.3
        assert 5.5 < layer.weight.std().item() / ref.weight.std().item() < 8.0  # 2 / 0.3
    assert sum(p.numel() for p in model.parameters()) == model.config.num_weights  # no new weights
    # the floor is what the class routing adds to each variance: two equal votes -> variance = the floor
    votes = torch.ones(1, 2, 10, 16, dtype=DT)
    _, var, _ = model.classes.routing.double().m_step(votes, torch.ones(1, 2, dtype=DT),
                                                      torch.full((1, 2, 10), 0.1, dtype=DT), 0.01)
    torch.testing.assert_close(var, torch.full((1, 10, 16), 1e-9, dtype=DT), rtol=1e-6, atol=0)
    with pytest.raises(ValueError, match="transform_std"):
        EMCapsNetSmallConfig(transform_std=0.0)
    with pytest.raises(ValueError, match=r"class_transform_std must be in 1e-06\.\.100, got -0\.1"):
        EMCapsNetSmallConfig(class_transform_std=-0.1)
    with pytest.raises(ValueError, match="var_floor"):
        EMCapsNetSmallConfig(var_floor=-1.0)


def test_class_transform_std_sets_the_class_layer_alone():
    torch.manual_seed(4)
    small = {"conv1_channels": 8, "primary_types": 4, "caps1_types": 8, "caps2_types": 8}
    model = create_model("em-capsnet-small", input_height=28, input_width=28, num_classes=10, transform_std=0.3,
                         class_transform_std=0.01, **small)
    same = create_model("em-capsnet-small", input_height=28, input_width=28, num_classes=10, transform_std=0.3,
                        **small)
    # a truncated normal at +-2 std keeps ~0.88 of the scale as its standard deviation, and nothing beyond 2 std
    assert model.classes.weight.abs().max() <= 0.02 and 0.008 < model.classes.weight.std().item() < 0.0095
    assert same.classes.weight.abs().max() > 0.1 and 0.24 < same.classes.weight.std().item() < 0.29
    for layer in (model.caps1, model.caps2):
        assert layer.weight.abs().max() <= 0.6 and 0.24 < layer.weight.std().item() < 0.29
    # a tiny class transform gives tiny votes but finite class activations and gradients
    images = torch.rand(2, 1, 28, 28)
    out = model(images)
    assert torch.isfinite(out.activations).all() and out.activations.shape == (2, 10)
    out.activations.sum().backward()
    assert torch.isfinite(model.classes.weight.grad).all() and model.classes.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("conv_e_step", ["window", "child-type"])
def test_the_official_cost_and_damping_reach_every_layer_and_train_finitely(conv_e_step):
    torch.manual_seed(5)
    small = {"conv1_channels": 8, "primary_types": 4, "caps1_types": 4, "caps2_types": 4}
    model = create_model("em-capsnet-small", input_height=28, input_width=28, num_classes=10, cost_scale=2.0,
                         mean_momentum=0.1, beta_u_init=0.709, class_beta_u_init=2.838, conv_e_step=conv_e_step,
                         **small)
    for layer in (model.caps1, model.caps2, model.classes):
        assert (layer.routing.cost_scale, layer.routing.mean_momentum) == (2.0, 0.1)
        start = 2.838 if layer is model.classes else 0.709
        assert layer.routing.beta_u.tolist() == pytest.approx([start] * layer.routing.out_caps)
    default = create_model("em-capsnet-small", input_height=28, input_width=28, num_classes=10, beta_u_init=1.5,
                           **small)
    assert default.classes.routing.beta_u.tolist() == [1.5] * 10  # None: the class layer follows beta_u_init
    assert (default.caps1.routing.cost_scale, default.caps1.routing.mean_momentum) == (None, 0.0)
    images = torch.rand(3, 1, 28, 28)
    out = model(images)
    assert torch.isfinite(out.activations).all() and torch.isfinite(out.poses).all()
    loss, _ = em_capsnet_loss(model, images, torch.tensor([1, 4, 7]))
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    for bad, match in (({"cost_scale": -1.0}, "cost_scale must be in"), ({"mean_momentum": 1.0}, "mean_momentum must be"),
                       ({"class_beta_u_init": "x"}, "class_beta_u_init must be a finite number or null")):
        with pytest.raises(ValueError, match=match):
            EMCapsNetSmallConfig(**bad)


def test_the_softer_e_step_options_reach_every_layer_and_train_finitely():
    """e_step_temperature and e_step_var_floor (2026-12-03) reach the three routings (a config that dropped them
    would route as Procedure 1 and say otherwise); a config saved before them reads as Procedure 1."""
    torch.manual_seed(6)
    small = {"conv1_channels": 8, "primary_types": 4, "caps1_types": 4, "caps2_types": 4}
    model = create_model("em-capsnet-small", input_height=28, input_width=28, num_classes=10,
                         e_step_temperature=0.5, e_step_var_floor=0.05, **small)
    for layer in (model.caps1, model.caps2, model.classes):
        assert (layer.routing.e_step_temperature, layer.routing.e_step_var_floor) == (0.5, 0.05)
    images = torch.rand(3, 1, 28, 28)
    loss, _ = em_capsnet_loss(model, images, torch.tensor([1, 4, 7]))
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    saved = {k: v for k, v in model.config.to_dict().items() if not k.startswith("e_step")}
    older = EMCapsNetSmallConfig.from_dict(saved)
    assert (older.e_step_temperature, older.e_step_var_floor) == (1.0, 0.0)
    for bad, match in (({"e_step_temperature": 0.0}, "e_step_temperature must be in"),
                       ({"e_step_var_floor": -1.0}, "e_step_var_floor must be in")):
        with pytest.raises(ValueError, match=match):
            EMCapsNetSmallConfig(**bad)


def test_the_unset_options_are_null_and_their_first_spelling_0_reads_as_null():
    """class_transform_std and cost_scale were unset at 0 when they came in; now null, as class_beta_u_init: a
    config (or checkpoint) that says 0 reads as null, and builds the model null builds."""
    small = {"conv1_channels": 8, "primary_types": 4, "caps1_types": 4, "caps2_types": 4}
    unset = EMCapsNetSmallConfig(**small)
    assert (unset.class_transform_std, unset.cost_scale, unset.class_beta_u_init) == (None, None, None)
    old = EMCapsNetSmallConfig.from_saved(unset.to_dict() | {"class_transform_std": 0.0, "cost_scale": 0})
    assert old == unset and old.to_dict() == unset.to_dict()
    assert EMCapsNetSmallConfig.from_dict(unset.to_dict()) == unset  # null round-trips through JSON's None
    torch.manual_seed(7)
    a = create_model("em-capsnet-small", input_height=28, input_width=28, num_classes=10, cost_scale=0,
                     class_transform_std=0.0, **small)
    torch.manual_seed(7)
    b = create_model("em-capsnet-small", input_height=28, input_width=28, num_classes=10, **small)
    assert a.caps1.routing.cost_scale is None and a.classes.routing.cost_scale is None
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), name  # the class layer drew its transforms at transform_std, as null says
    set_ = EMCapsNetSmallConfig(class_transform_std=0.01, cost_scale=2.0, **small)
    assert (set_.class_transform_std, set_.cost_scale) == (0.01, 2.0)


def test_the_official_primary_start_sets_conv1_and_the_primary_capsules():
    torch.manual_seed(6)
    model = create_model("em-capsnet-small", input_height=28, input_width=28, num_classes=10,
                         primary_init="official")
    default = create_model("em-capsnet-small", input_height=28, input_width=28, num_classes=10)
    # truncated at 2 std: nothing beyond, and ~0.88 of the scale as the standard deviation
    for weight, std in ((model.conv1.weight, 0.05), (model.primary.pose.weight, 0.5),
                        (model.primary.activation.weight, 0.5)):
        assert weight.abs().max() <= 2 * std and 0.8 * std < weight.std().item() < 0.95 * std
    torch.testing.assert_close(model.conv1.bias, torch.full((64,), 0.1))
    assert set(model.primary.pose.bias.tolist()) == {0.0}
    assert set(model.primary.activation.bias.tolist()) == {-1.0}
    assert default.conv1.bias.abs().max() < 0.21 and default.primary.activation.bias.std() > 0  # PyTorch's uniform
    assert model.config.num_weights == sum(p.numel() for p in model.parameters())  # the same weights, started apart
    images = torch.zeros(2, 1, 28, 28)  # a blank image: conv1 gives its bias, the activations sigmoid(-1 + ...)
    caps = model.primary(torch.relu(model.conv1(images)))
    expected = torch.sigmoid(model.primary.activation.weight.sum(dim=(1, 2, 3)) * 0.1 - 1.0)
    torch.testing.assert_close(caps.activations[0, 0, 0], expected)
    assert torch.isfinite(model(images).activations).all()
    with pytest.raises(ValueError, match="primary_init must be one of torch, official, got 'tf'"):
        EMCapsNetSmallConfig(primary_init="tf")
    # "torch", as CapsNet's, Efficient-CapsNet's and the U-Net's init spell PyTorch's start; "pytorch", the spelling
    # of older checkpoints (the shipped em-capsnet-mnist's), still reads (a README walkthrough, 2026-12-03)
    assert EMCapsNetSmallConfig().primary_init == EMCapsNetSmallConfig(primary_init="pytorch").primary_init == "torch"


def test_conv_matrix_caps_child_ids_name_the_child_behind_every_vote_row():
    layer = ConvMatrixCaps(3, 2, kernel_size=3, stride=2, routing=_Mean())
    N, H, W, I, Ho, Wo = 2, 5, 7, 3, 2, 3
    ids = layer.child_ids(N, H, W)
    assert ids.shape == (N * Ho * Wo, 9 * I)
    for n, h, w, k, l, i in itertools.product(range(N), range(Ho), range(Wo), range(3), range(3), range(I)):
        row, child = (n * Ho + h) * Wo + w, (k * 3 + l) * I + i  # forward's folding (the votes test above)
        assert ids[row, child] == ((n * H + 2 * h + k) * W + 2 * w + l) * I + i


class _Shared(_Mean):
    """_Mean that also keeps the child ids it is given."""

    def forward(self, votes, activations=None, bias=None, *, record=False, children=None, num_children=None):
        self.children, self.num_children = children, num_children
        return super().forward(votes, activations)


@pytest.mark.parametrize("conv_e_step,norm", [("window", None), ("child", "all"), ("child-type", "type")])
def test_conv_e_step_option_shares_children_in_both_conv_layers_and_stays_batch_independent(conv_e_step, norm):
    torch.manual_seed(4)
    small = {"conv1_channels": 8, "primary_types": 4, "caps1_types": 4, "caps2_types": 4}
    model = create_model("em-capsnet-small", input_height=28, input_width=28, num_classes=10,
                         conv_e_step=conv_e_step, **small)
    for layer in (model.caps1, model.caps2):
        assert layer.share_children == (norm is not None)
        if norm:
            assert layer.routing.child_norm == norm
    probe = ConvMatrixCaps(4, 4, stride=1, routing=_Shared(), share_children=model.caps2.share_children).double()
    probe(_caps(2, 5, 5, 4))
    if norm:
        torch.testing.assert_close(probe.routing.children, probe.child_ids(2, 5, 5))
        assert probe.routing.num_children == 2 * 5 * 5 * 4
    else:
        assert probe.routing.children is None
    images, labels = torch.rand(3, 1, 28, 28), torch.tensor([0, 1, 2])
    loss, _ = em_capsnet_loss(model, images, labels, progress=0.3)
    loss.backward()
    for n, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, n
    model.double()  # ids are offset per example: an example's children never meet another's
    together, alone = model(images.double()), model(images[1:2].double())
    for a, b in zip(alone, together):
        torch.testing.assert_close(a[0], b[1], rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match="conv_e_step must be one of window, child, child-type"):
        EMCapsNetSmallConfig(conv_e_step="children")


@pytest.mark.parametrize("routing", ["em", "inverted"])
def test_a_gradient_penalty_through_conv_matrix_caps_with_the_plain_routing(routing, monkeypatch):
    """Double backward (create_graph=True) through the votes' block copy and a routing built with
    fused_backward=False, in float32: the same second-order gradient as with PyTorch's own copy."""
    from capsnet import _eager

    results = []
    for blocks in (dict(_eager._BLOCKS), {}):
        monkeypatch.setattr(_eager, "_BLOCKS", blocks)
        torch.manual_seed(0)
        route = (EMRouting(4, 2, fused_backward=False) if routing == "em"
                 else InvertedDotProductRouting(16, 2, fused_backward=False))
        layer = ConvMatrixCaps(3, 4, kernel_size=3, stride=1, routing=route)
        poses = torch.randn(2, 4, 4, 3, 16, requires_grad=True)
        out = layer(MatrixCaps(poses, torch.rand(2, 4, 4, 3)))
        first, = torch.autograd.grad(out.poses.pow(2).sum() + out.activations.sum(), poses, create_graph=True)
        results.append(torch.autograd.grad(first.pow(2).sum(), [poses, layer.weight]))
    for x, y in zip(*results):
        assert torch.isfinite(x).all()
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name, small", [
    ("inverted-capsnet", dict(backbone_channels=8, primary_types=2, caps_types=2)),
    ("em-capsnet-small", dict(conv1_channels=4, primary_types=2, caps1_types=2, caps2_types=2, input_height=28,
                              input_width=28, num_classes=10))])
def test_models_with_large_votes_are_evaluated_32_at_a_time_with_the_same_result(name, small):
    """At the default evaluation batch of 256 these models' forwards peaked at 11-13 GB (10x their training step at
    batch 32); evaluate runs them 32 at a time, and the scores are those of any other batching."""
    from capsnet.evaluate import eval_batch, evaluate
    from capsnet.models import create_model

    torch.manual_seed(0)
    model = create_model(name, **small)
    seen = []
    model.register_forward_pre_hook(lambda module, args: seen.append(args[0].shape[0]))
    images, labels = torch.rand(70, 1, 28, 28), torch.arange(70) % 10
    whole = evaluate(model, images, labels, batch_size=256)
    assert seen == [32, 32, 6] and eval_batch(model, 256) == 32 and eval_batch(model, 8) == 8
    seen.clear()
    by_eight = evaluate(model, images, labels, batch_size=8)
    assert seen == [8] * 8 + [6]
    assert torch.equal(whole.confusion, by_eight.confusion) and abs(whole.loss - by_eight.loss) < 1e-5
    assert eval_batch(create_model("capsnet", conv1_channels=8, primary_types=2), 256) == 256  # no limit set


@pytest.mark.parametrize("routing", ["em", "inverted", "dynamic"])
def test_a_gradient_penalty_under_plain_routing_is_plain_autograd_and_outside_it_refused(routing):
    """plain_routing() promises plain autograd throughout (README: a gradient of a gradient); EM's and inverted
    attention's fused backward ran inside it all the same, and its once_differentiable let
    torch.autograd.grad skip the routing's second-order term: wrong gradients (0.96 relative), some None, without a
    word (a review, 2026-11-30). Inside it the penalty's gradients are those of the routing built with
    fused_backward=False (float64); outside it, the hand-written backward refuses create_graph by name."""
    from capsnet.layers import DenseCaps
    from capsnet.routing import DynamicRouting, plain_routing

    def build(fused: bool):
        torch.manual_seed(0)
        route = (EMRouting(3, 3, fused_backward=fused) if routing == "em" else
                 InvertedDotProductRouting(8, 3, fused_backward=fused) if routing == "inverted" else
                 DynamicRouting(iterations=3))
        return DenseCaps(6, 8, 3, 16 if routing == "em" else 8, routing=route, bias=routing != "em").double()

    u = torch.randn(2, 6, 8, dtype=torch.float64)

    def penalty(layer):
        x = u.clone().requires_grad_()
        out = layer(x, torch.rand(2, 6, dtype=torch.float64)) if routing == "em" else layer(x)
        g, = torch.autograd.grad(out.poses.pow(2).sum() + out.activations.sum(), x, create_graph=True)
        return torch.autograd.grad(g.pow(2).sum(), list(layer.parameters()), allow_unused=True)

    with plain_routing():
        plain = penalty(build(True))
    reference = penalty(build(False)) if routing != "dynamic" else None
    if reference is not None:
        for a, b in zip(plain, reference):
            assert a is not None and b is not None
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
    with pytest.raises(RuntimeError, match=r"hand-written backward is first-order: .* run the model inside "
                                           r"`with capsnet.routing.plain_routing\(\):`"):
        penalty(build(True))


@pytest.mark.parametrize("config", [EMCapsNetConfig, EMCapsNetSmallConfig])
def test_an_em_run_saved_before_its_start_fields_reads_as_the_start_it_had(config):
    """Runs saved before transform_std (0.5 then) and beta_a_init / class_beta_a_init (0 then) existed read back
    with today's 0.3, -25 and -12.5: an experiment took such a run as finished under today's plan, and a resume
    typed with the README's `--model-option beta_a_init=0` was refused as differing from -25."""
    from capsnet.checkpoint import Checkpoint
    from capsnet.train import TrainConfig, resume_configs, saved_configs

    old = config().to_dict()
    for name in ("transform_std", "beta_a_init", "class_beta_a_init"):
        del old[name]
    name = next(n for n, spec in MODELS.items() if spec.config is config)
    ckpt = Checkpoint(name, old, TrainConfig().to_dict(), {"epoch": 1, "step": 1}, {}, path=Path("/r/last.safetensors"))
    read = saved_configs(ckpt)[0]
    assert (read.transform_std, read.beta_a_init, read.class_beta_a_init) == (0.5, 0.0, 0.0)
    assert read.class_transform_std is None  # the class layer at transform_std, as it was
    assert resume_configs(ckpt, model_changes={"beta_a_init": 0.0, "class_beta_a_init": 0.0,
                                               "transform_std": 0.5})[0] == read
    new = config.from_dict(old)  # a config typed today takes today's defaults
    assert (new.transform_std, new.beta_a_init, new.class_beta_a_init) == (0.3, -25.0, -12.5)
    assert config.from_saved(old | {"transform_std": 0.3}).transform_std == 0.3  # a recorded value wins


@pytest.mark.parametrize("side", [28, 32])
def test_coordinate_addition_in_the_receptive_fields_frame_is_each_childs_field_centre_over_the_image(side):
    """coordinate_frame="receptive-field" adds what section 4 says, the scaled centre of each ConvCaps2 capsule's
    receptive field in the image (counted by hand: conv1 5x5 stride 2, the 1x1 primaries, 3x3 stride 2, 3x3 stride
    1, no padding: position q sees pixels 4q..4q+16, centred on pixel 4q+8, coordinate 4q+8.5); "grid", the
    default, the cell's centre in the 3x3 or 4x4 grid."""
    class Votes(torch.nn.Module):
        def forward(self, votes, a):
            self.votes = votes
            return None

    for frame, centre in (("grid", lambda q, n: (q + 0.5) / n), ("receptive-field", lambda q, n: (4 * q + 8.5) / side)):
        model = create_model("em-capsnet-small", input_height=side, input_width=side, num_classes=3,
                             coordinate_frame=frame)
        with torch.no_grad():
            grid = model._conv_capsules(torch.zeros(1, 1, side, side)).poses.shape[1]
            model.classes.routing = seen = Votes()
            I = model.config.caps2_types
            model.classes(MatrixCaps(torch.zeros(1, grid, grid, I, 16), torch.ones(1, grid, grid, I)))
        votes = seen.votes.view(1, grid, grid, I, 3, 16)  # zero poses: the votes are the coordinates alone
        expected = torch.tensor([centre(q, grid) for q in range(grid)])
        assert grid == {28: 3, 32: 4}[side]
        torch.testing.assert_close(votes[0, :, 0, 0, 0, 3], expected)  # rows down the first column
        torch.testing.assert_close(votes[0, 0, :, 0, 0, 7], expected)  # columns along the first row
        assert votes[..., [0, 1, 2, 4, 5, 6] + list(range(8, 16))].abs().max() == 0
    with pytest.raises(ValueError, match="coordinate_frame"):
        create_model("em-capsnet-small", coordinate_frame="image")


def test_coordinate_addition_in_the_receptive_fields_frame_scales_rows_by_the_height_and_columns_by_the_width():
    """On a 28x40 image the rows' centres are over 28 and the columns' over 40 (square images could not tell)."""
    class Votes(torch.nn.Module):
        def forward(self, votes, a):
            self.votes = votes
            return None

    model = create_model("em-capsnet-small", input_height=28, input_width=40, num_classes=3,
                         coordinate_frame="receptive-field")
    with torch.no_grad():
        H, W = model._conv_capsules(torch.zeros(1, 1, 28, 40)).poses.shape[1:3]
        model.classes.routing = seen = Votes()
        I = model.config.caps2_types
        model.classes(MatrixCaps(torch.zeros(1, H, W, I, 16), torch.ones(1, H, W, I)))
    votes = seen.votes.view(1, H, W, I, 3, 16)
    assert (H, W) == (3, 6)
    torch.testing.assert_close(votes[0, :, 0, 0, 0, 3], torch.tensor([(4 * q + 8.5) / 28 for q in range(H)]))
    torch.testing.assert_close(votes[0, 0, :, 0, 0, 7], torch.tensor([(4 * q + 8.5) / 40 for q in range(W)]))


def test_the_em_loss_refuses_a_progress_outside_training_and_a_negative_recon_weight():
    """progress -3 made a margin of -4 and a loss of exactly 0 (no gradient), NaN read as the end of training, and
    recon_weight -1 was taken where capsnet_loss refuses it (a review of the Python API, 2026-12-02)."""
    torch.manual_seed(0)
    model = create_model("em-capsnet-small", input_height=28, input_width=28, num_classes=10)
    x, y = torch.rand(2, 1, 28, 28), torch.tensor([3, 4])
    for bad in (-3, 1.5, float("nan"), "0.5", True):
        with pytest.raises(ValueError, match=rf"progress must be a number from 0 \(start of training\) to 1 \(end\), "
                                             rf"got {re.escape(repr(bad))}"):
            em_capsnet_loss(model, x, y, progress=bad)
    with pytest.raises(ValueError, match="recon_weight must be a finite number >= 0"):
        em_capsnet_loss(model, x, y, recon_weight=-1)
    start, end = (em_capsnet_loss(model, x, y, progress=p)[0] for p in (0, 1))
    assert end > start  # the margin grows over training, and with it the loss of the same scores
