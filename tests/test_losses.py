"""Margin loss (Eq. 4) and reconstruction loss against hand-computed values."""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from capsnet.losses import margin_loss, reconstruction_loss

DT = torch.float64


def _t(x) -> torch.Tensor:
    return torch.tensor(x, dtype=DT)


@pytest.mark.parametrize("lengths,target,expected", [
    ([[0.9, 0.1, 0.1]], 0, 0.0),  # exactly at the margins
    ([[0.95, 0.0, 0.05]], 0, 0.0),  # beyond the margins
    ([[0.5, 0.6, 0.1]], 0, 0.4**2 + 0.5 * 0.5**2),  # 0.16 + 0.125 = 0.285
    ([[0.5, 0.6, 0.1]], 1, 0.5 * 0.4**2 + 0.3**2),  # 0.08 + 0.09 = 0.17
    ([[0.0, 1.0, 1.0]], 2, 0.0 + 0.5 * 0.9**2 + 0.0),  # 0.405: class 0 below m-, class 2 above m+
    ([[0.0, 0.0, 0.0]], 1, 0.81),
])
def test_margin_loss_hand_cases(lengths, target, expected):
    loss = margin_loss(_t(lengths), torch.tensor([target]))
    assert loss.shape == ()
    assert loss.item() == pytest.approx(expected, abs=1e-12)


def test_margin_loss_is_summed_over_classes_and_averaged_over_the_batch():
    lengths = _t([[0.5, 0.6, 0.1], [0.9, 0.1, 0.1], [0.0, 0.0, 0.0]])
    # rows: 0.285, 0.0, 0.81 (see the hand cases) -> mean 0.365
    assert margin_loss(lengths, torch.tensor([0, 0, 1])).item() == pytest.approx((0.285 + 0.0 + 0.81) / 3, abs=1e-12)


def test_margin_loss_multi_hot_two_labels():
    lengths = _t([[0.8, 0.7, 0.3, 0.05]])
    targets = _t([[1, 1, 0, 0]])
    # present: (0.9-0.8)^2 + (0.9-0.7)^2 = 0.01 + 0.04; absent: 0.5 * (0.3-0.1)^2 = 0.02; 0.05 < 0.1 gives 0
    assert margin_loss(lengths, targets).item() == pytest.approx(0.07, abs=1e-12)
    assert margin_loss(lengths, targets.bool()).item() == pytest.approx(0.07, abs=1e-12)
    assert margin_loss(lengths, targets.long()).item() == pytest.approx(0.07, abs=1e-12)


@pytest.mark.parametrize("seed", range(3))
def test_index_targets_equal_one_hot_targets(seed):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.rand(16, 10, generator=g, dtype=DT)
    idx = torch.randint(0, 10, (16,), generator=g)
    a = margin_loss(lengths, idx)
    b = margin_loss(lengths, F.one_hot(idx, 10).to(DT))
    torch.testing.assert_close(a, b, rtol=1e-12, atol=0)
    # and both equal Eq. 4 written out elementwise
    expected = 0.0
    for n in range(16):
        for k in range(10):
            T, v = float(idx[n] == k), float(lengths[n, k])
            expected += T * max(0.0, 0.9 - v) ** 2 + 0.5 * (1 - T) * max(0.0, v - 0.1) ** 2
    assert a.item() == pytest.approx(expected / 16, rel=1e-12)


def test_margin_loss_honours_m_plus_m_minus_lam():
    lengths = _t([[0.5, 0.6, 0.1]])
    got = margin_loss(lengths, torch.tensor([0]), m_plus=0.95, m_minus=0.05, lam=0.25)
    # (0.95-0.5)^2 + 0.25 * ((0.6-0.05)^2 + (0.1-0.05)^2) = 0.2025 + 0.25 * 0.305 = 0.27875
    assert got.item() == pytest.approx(0.27875, abs=1e-12)
    assert margin_loss(lengths, torch.tensor([0]), lam=1.0).item() == pytest.approx(0.16 + 0.25, abs=1e-12)
    assert margin_loss(lengths, torch.tensor([0]), m_plus=0.5).item() == pytest.approx(0.125, abs=1e-12)
    assert margin_loss(lengths, torch.tensor([0]), m_minus=0.6).item() == pytest.approx(0.16, abs=1e-12)


def test_margin_loss_gradient():
    lengths = _t([[0.5, 0.6, 0.05]]).requires_grad_(True)
    margin_loss(lengths, torch.tensor([0])).backward()
    # d/dv: -2 (0.9 - 0.5) = -0.8; 0.5 * 2 (0.6 - 0.1) = 0.5; inside the margin: 0
    torch.testing.assert_close(lengths.grad, _t([[-0.8, 0.5, 0.0]]), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("targets, message", [
    (torch.tensor([0, 1]), r"targets \(B,\) must match lengths' batch 3, got shape \(2,\)"),
    (torch.tensor([0, 1, 10]), r"class indices must lie in \[0, 10\), got min 0 max 10"),
    (torch.tensor([0, -1, 2]), r"class indices must lie in \[0, 10\), got min -1 max 2"),
    (torch.zeros(3, 9), r"\(B, J\) = \(3, 10\) multi-hot, got shape \(3, 9\)"),  # multi-hot of the wrong width
    (torch.zeros(2, 10), r"\(B, J\) = \(3, 10\) multi-hot, got shape \(2, 10\)"),
    (torch.zeros(3, 10, 1), r"\(B, J\) = \(3, 10\) multi-hot, got shape \(3, 10, 1\)"),
])
def test_margin_loss_rejects_bad_targets(targets, message):
    with pytest.raises(ValueError, match=message):
        margin_loss(torch.rand(3, 10), targets)


def test_margin_loss_rejects_bad_lengths():
    with pytest.raises(ValueError, match=r"\(B, J\)"):
        margin_loss(torch.rand(3, 10, 16), torch.tensor([0, 1, 2]))


def test_margin_loss_rejects_multi_hot_outside_unit_interval():
    with pytest.raises(ValueError, match=r"multi-hot targets must lie in \[0, 1\]"):
        margin_loss(torch.rand(2, 3), torch.tensor([[0.0, 2.0, 0.0], [1.0, 0.0, -1.0]]))


def test_reconstruction_loss_hand_example():
    recon = _t([[0.5, 0.0, 1.0, 0.25], [0.0, 0.0, 0.0, 0.0]])
    images = _t([[1.0, 0.0, 0.0, 0.25], [1.0, 1.0, 1.0, 1.0]])
    # per image: 0.25 + 0 + 1 + 0 = 1.25 and 4; mean 2.625; times 0.0005
    assert reconstruction_loss(recon, images).item() == pytest.approx(0.0005 * 2.625, abs=1e-15)
    assert reconstruction_loss(recon, images, scale=1.0).item() == pytest.approx(2.625, abs=1e-12)
    # 0-255 bytes against the sigmoid's [0, 1] scored without a word (152 for an error of 0.15; a review)
    with pytest.raises(ValueError, match=r"images are torch.uint8 from 0 to 255; the reconstruction is compared with "
                                         r"images in \[0, 1\]: capsnet.data.unit_float"):
        reconstruction_loss(recon, (images * 255).to(torch.uint8))
    with pytest.raises(ValueError, match=r"images are torch.int8 from -1 to 1"):
        reconstruction_loss(recon, torch.tensor([[-1, 0, 1, 0], [0, 0, 0, 0]], dtype=torch.int8))


def test_reconstruction_loss_is_a_sum_over_pixels_not_a_mean():
    g = torch.Generator().manual_seed(0)
    recon, images = torch.rand(5, 784, generator=g, dtype=DT), torch.rand(5, 1, 28, 28, generator=g, dtype=DT)
    expected = 0.0005 * ((recon - images.reshape(5, 784)) ** 2).sum() / 5
    got = reconstruction_loss(recon, images)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=0)
    # the decoder's (B, 1, 28, 28) layout and flat (B, 784) give the same
    torch.testing.assert_close(reconstruction_loss(recon.reshape(5, 1, 28, 28), images), got, rtol=0, atol=0)
    torch.testing.assert_close(reconstruction_loss(recon, images.reshape(5, 784)), got, rtol=0, atol=0)


def test_reconstruction_loss_casts_uint8_images():
    images = torch.tensor([[0, 1], [1, 1]], dtype=torch.uint8)
    recon = _t([[0.5, 0.5], [1.0, 0.0]])
    assert reconstruction_loss(recon, images).item() == pytest.approx(0.0005 * (0.5 + 1.0) / 2, abs=1e-15)


@pytest.mark.parametrize("recon_shape,image_shape", [
    ((4, 784), (4, 1, 28, 27)),
    ((4, 1, 28, 28), (4, 3, 28, 28)),
    ((4, 784), (2, 1, 28, 28)),  # batch mismatch
    ((2, 784), (4, 784)),
])
def test_reconstruction_loss_rejects_mismatch(recon_shape, image_shape):
    with pytest.raises(ValueError, match="differ|images but images hold"):
        reconstruction_loss(torch.zeros(recon_shape), torch.zeros(image_shape))


def test_reconstruction_loss_rejects_batch_mismatch_even_when_pixel_totals_agree():
    # Reshaping by the images' batch size alone would let
    # 4 reconstructions of 392 pixels pass as 2 images of 784.
    with pytest.raises(ValueError, match="reconstructions hold 4 images but images hold 2"):
        reconstruction_loss(torch.zeros(4, 392), torch.zeros(2, 784))


def test_reconstruction_loss_sums_half_precision_outputs_in_fp32():
    # Under bf16 autocast the decoder hands over bf16 images; their 784
    # squared errors are summed in fp32, not in bf16's 8-bit mantissa.
    g = torch.Generator().manual_seed(2)
    r = torch.rand(4, 784, generator=g).bfloat16()
    x = torch.rand(4, 1, 28, 28, generator=g)
    loss = reconstruction_loss(r, x)
    assert loss.dtype == torch.float32
    expected = 0.0005 * (r.double() - x.double().reshape(4, -1)).pow(2).sum(1).mean()
    assert abs(loss.item() - expected.item()) < 1e-6 * expected.item() + 1e-9


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind", ["bce", "weighted-bce", "bce+dice", "weighted-margin"])
def test_segmentation_losses_of_half_precision_probabilities_are_finite_at_sure_pixels(dtype, kind):
    """In bf16 and fp16 the clamp's 1 - 1e-7 rounds to 1, and a sure foreground pixel gave 0 * log1p(-1) = NaN."""
    from capsnet.losses import segmentation_loss

    p = torch.tensor([0.0, 0.3, 1.0, 1.0]).view(1, 1, 2, 2)
    m = torch.tensor([0.0, 1.0, 1.0, 0.0]).view(1, 1, 2, 2)
    half = p.to(dtype).requires_grad_(True)
    loss = segmentation_loss(half, m, kind)
    (grad,) = torch.autograd.grad(loss, half)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    torch.testing.assert_close(loss.float(), segmentation_loss(p, m, kind), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("kind", ["weighted-bce", "weighted-margin"])
def test_slices_of_a_batch_weighted_as_the_whole_batch_sum_to_its_weighted_cross_entropy(kind):
    """Under torchrun each process computes its slice's loss; the weighted cross-entropy's foreground weight was
    counted on the slice, so the average of the processes' gradients was not the one-process gradient (53% apart
    for two slices). Within batch_foreground_weight(whole batch) the slices' share-weighted losses add up to it."""
    from capsnet.distributed import shard, share_weight
    from capsnet.losses import batch_foreground_weight, segmentation_loss

    g = torch.Generator().manual_seed(3)
    masks = (torch.rand(5, 1, 6, 6, generator=g) < torch.linspace(0.05, 0.6, 5).view(5, 1, 1, 1)).float()
    p = torch.rand(5, 1, 6, 6, generator=g, dtype=torch.float64).requires_grad_(True)
    whole = segmentation_loss(p, masks, kind)
    (expected,) = torch.autograd.grad(whole, p)
    grads = []
    for rank in range(2):
        lo, hi = shard(5, rank, 2)
        with batch_foreground_weight(masks):
            part = segmentation_loss(p[lo:hi], masks[lo:hi], kind) * share_weight(lo, hi, 5, 2)
        grads.append(torch.autograd.grad(part, p)[0])
    torch.testing.assert_close((grads[0] + grads[1]) / 2, expected)  # what DDP averages
    alone = [segmentation_loss(p[lo:hi], masks[lo:hi], kind) * share_weight(lo, hi, 5, 2)
             for lo, hi in (shard(5, r, 2) for r in range(2))]
    assert not torch.allclose(sum(torch.autograd.grad(a, p)[0] for a in alone) / 2, expected)  # without it: not


def test_the_papers_losses_refuse_float_indices_and_empty_batches():
    """Found by a review (2026-11-29): margin_loss truncated class 2.9 to 2 silently, and both losses gave NaN (or a
    reshape error) over no examples, which an optimizer step writes into every weight."""
    lengths = torch.full((1, 10), 0.5)
    with pytest.raises(ValueError, match="class indices must be integers, got torch.float32"):
        margin_loss(lengths, torch.tensor([2.9]))
    assert margin_loss(lengths, torch.tensor([[0.0, 0, 1, 0, 0, 0, 0, 0, 0, 0]])) == margin_loss(lengths,
                                                                                                   torch.tensor([2]))
    with pytest.raises(ValueError, match=r"a loss over an empty batch \(0 examples\) is undefined"):
        margin_loss(torch.rand(0, 10), torch.zeros(0, dtype=torch.long))
    with pytest.raises(ValueError, match=r"a loss over an empty batch \(0 examples\) is undefined"):
        reconstruction_loss(torch.rand(0, 1, 28, 28), torch.rand(0, 1, 28, 28))


def test_capsnet_refuses_labels_of_another_batch_and_routing_results_keep_their_rounds_when_replaced():
    """model(x, labels) with one label for four images decoded all four from that label's capsule; a routing
    result's _replace lost rounds (AttributeError on reading it); the plain path refused float64 capsules into a
    float32 layer, which the fast path takes (an exported model, on the plain path, failed where eager ran)."""
    from capsnet import CapsNet, CapsNetConfig
    from capsnet.layers.dense import DenseCaps
    from capsnet.routing import DynamicRouting, plain_routing

    model = CapsNet(CapsNetConfig(conv1_channels=8, primary_types=2)).eval()
    with pytest.raises(ValueError, match=r"index must be \(B,\) = \(4,\), one class per example, got shape \(1,\)"):
        model(torch.rand(4, 1, 28, 28), torch.tensor([3]))
    r = DynamicRouting(3)(torch.randn(2, 5, 3, 4), record=True)
    replaced = r._replace(poses=r.poses * 2)
    assert replaced.rounds is r.rounds and torch.equal(replaced.poses, r.poses * 2)
    assert r._replace(rounds=None).rounds is None and type(r)._make(list(r)).rounds is None
    layer, u = DenseCaps(40, 8, 10, 16), torch.randn(2, 40, 8, dtype=torch.float64)
    fast = layer(u).poses
    with plain_routing():
        plain = layer(u).poses
    assert fast.dtype == plain.dtype == torch.float64
    torch.testing.assert_close(fast, plain)


def test_spread_loss_refuses_no_examples_and_float_class_indices_as_margin_loss_does():
    """spread_loss over an empty batch was NaN (a mean of nothing) and float targets were truncated (1.9 read as
    class 1); margin_loss refused both, spread_loss now too. Its value on integer targets is eq. 3 by hand."""
    from capsnet.losses import spread_loss

    with pytest.raises(ValueError, match=r"a loss over an empty batch \(0 examples\) is undefined"):
        spread_loss(torch.empty(0, 10), torch.empty(0, dtype=torch.long), 0.2)
    with pytest.raises(ValueError, match="class indices must be integers, got torch.float32"):
        spread_loss(torch.rand(3, 10), torch.tensor([1.9, 2.2, 3.7]), 0.2)
    for bad in ([0, 3], [-1, 0]):  # F.one_hot's bare RuntimeError before (a review, 2026-11-30)
        with pytest.raises(ValueError, match=r"class indices must lie in \[0, 3\), got min"):
            spread_loss(torch.rand(2, 3), torch.tensor(bad), 0.2)
    a = torch.tensor([[0.9, 0.5, 0.1], [0.2, 0.3, 0.25]])
    # example 0: both gaps (0.4, 0.8) past the margin, 0; example 1: 0.2 - 0.1 and 0.2 - 0.05, squared
    by_hand = (0.0 + (0.2 - (0.3 - 0.2)) ** 2 + (0.2 - (0.3 - 0.25)) ** 2) / 2
    assert spread_loss(a, torch.tensor([0, 1]), 0.2).item() == pytest.approx(by_hand)


@pytest.mark.parametrize("kind", ["bce", "weighted-bce", "bce+dice", "margin", "weighted-margin"])
def test_the_segmentation_loss_keeps_float64_and_passes_a_gradient_check(kind):
    """Its BCE ran in float32 whatever the probabilities' dtype (.float() lowers float64): the loss carried float32
    error and gradcheck failed in float64 (a review, 2026-11-30)."""
    from capsnet.losses import segmentation_loss

    torch.manual_seed(0)
    p = torch.rand(2, 1, 4, 4, dtype=torch.float64).clamp(0.05, 0.95).requires_grad_()
    m = (torch.rand(2, 1, 4, 4) > 0.5).to(torch.float64)
    assert segmentation_loss(p, m, kind=kind).dtype == torch.float64
    assert torch.autograd.gradcheck(lambda q: segmentation_loss(q, m, kind=kind), (p,))


def test_a_right_answer_costs_nothing_even_where_a_weighted_out_term_would_overflow():
    """margin_loss and spread_loss multiplied each class's (or pair's) term by its 0/1 weight after squaring it: a
    weighted-out term past ~1e19 (float32; a gap of 256 in float16) squared to inf, and 0 x inf made the loss of a
    right answer NaN (a review, 2026-11-30). The terms that count are as before, and so are the gradients."""
    from capsnet.losses import margin_loss, spread_loss

    for scores, dtype in (([[2e19, 0.05]], torch.float32), ([[300.0, 0.0]], torch.float16)):
        x = torch.tensor(scores, dtype=dtype, requires_grad=True)
        for loss in (margin_loss(x, torch.tensor([0])), spread_loss(x, torch.tensor([0]), 0.2)):
            assert float(loss.detach()) == 0.0
            (grad,) = torch.autograd.grad(loss, x)
            assert torch.isfinite(grad).all() and not grad.any()
    x = torch.tensor([[0.3, 0.8, 0.1], [0.9, 0.2, 0.6]], requires_grad=True)  # ordinary scores: the formulas
    y = torch.tensor([1, 0])
    T = torch.nn.functional.one_hot(y, 3).float()
    by_hand = (T * torch.relu(0.9 - x) ** 2 + 0.5 * (1 - T) * torch.relu(x - 0.1) ** 2).sum(1).mean()
    torch.testing.assert_close(margin_loss(x, y), by_hand)
    gap = x.unsqueeze(1) - x.unsqueeze(2)
    spread_by_hand = (T.unsqueeze(2) * (1 - T).unsqueeze(1) * torch.relu(0.5 + gap) ** 2).sum((1, 2)).mean()
    torch.testing.assert_close(spread_loss(x, y, 0.5), spread_by_hand)


def test_the_public_segmentation_losses_refuse_0_255_masks_as_the_models_loss_does():
    """segmentation_loss and soft_dice took 0/255 masks without a word (0.697 and a Dice of 0.996, where the
    registry's segmentation loss refused them; a review, 2026-12-01)."""
    from capsnet.losses import segmentation_loss, soft_dice

    p = torch.full((1, 1, 2, 2), 0.5)
    m = torch.tensor([[[[0.0, 1.0], [1.0, 0.0]]]])
    fix = r"masks must hold 0 \(background\) and 1 \(foreground\), got values from 0 to 255: divide 0/255 masks by 255"
    with pytest.raises(ValueError, match=fix):
        segmentation_loss(p, m * 255)
    with pytest.raises(ValueError, match=fix):
        soft_dice(p, m * 255)
    # 0/1 masks as before: Dice by hand, (2 * 1 + 1) / (2 + 2 + 1)
    assert soft_dice(p, m).item() == pytest.approx(3 / 5)


def test_a_reconstruction_weight_below_0_or_not_finite_is_refused_by_the_losses_that_take_one():
    """capsnet_loss dropped a negative or NaN recon_weight's term without a word (recon_weight > 0); the segmentation
    loss added it: -158.6 with -1, a loss training lowers by reconstructing worse, and NaN with NaN (a review,
    2026-12-01)."""
    from capsnet.models import MODELS, create_model

    cases = {"capsnet": (create_model("capsnet", conv1_channels=8, primary_types=2, decoder_hidden=(16, 32)),
                         torch.rand(2, 1, 28, 28), torch.tensor([1, 7])),
             "segcaps-r1": (create_model("segcaps-r1", input_height=16, input_width=16), torch.rand(2, 1, 16, 16),
                            (torch.rand(2, 1, 16, 16) > 0.5).float())}
    for name, (model, x, y) in cases.items():
        for bad in (-1.0, float("nan"), float("inf")):
            with pytest.raises(ValueError, match=r"recon_weight must be a finite number >= 0 \(0: no reconstruction "
                                                 r"loss; the paper's 0.0005\), got " + re.escape(repr(bad))):
                MODELS[name].loss(model, x, y, recon_weight=bad)
        plain, _ = MODELS[name].loss(model, x, y, recon_weight=0.0)
        weighted, _ = MODELS[name].loss(model, x, y, recon_weight=0.0005)
        assert torch.isfinite(weighted) and weighted > plain  # a positive weight adds its term


def test_spread_loss_refuses_multi_hot_targets_outside_0_1_and_multi_hot_names_a_class_out_of_range():
    """spread_loss took 2 * eye (each gap held at 2m, loss 0.72) where margin_loss refused values outside [0, 1];
    multi_hot's out-of-range index met scatter's bare "index 12 is out of bounds" (a review, 2026-12-01)."""
    from capsnet.losses import multi_hot, spread_loss

    a = torch.tensor([[0.9, 0.5, 0.1], [0.2, 0.3, 0.25]])
    with pytest.raises(ValueError, match=r"multi-hot targets must lie in \[0, 1\], got min 0.0 max 2.0"):
        spread_loss(a, 2 * torch.eye(3)[:2], 0.2)
    # multi-hot 0/1 rows: the (B,) indices' loss
    assert spread_loss(a, torch.eye(3)[:2], 0.2).item() == pytest.approx(spread_loss(a, torch.tensor([0, 1]), 0.2).item())
    with pytest.raises(ValueError, match=r"class indices must lie in \[0, 10\), got min 1 max 12"):
        multi_hot(torch.tensor([[1, 12], [3, 4]]), 10)
    with pytest.raises(ValueError, match=r"labels must be \(B, K\) class indices, K of them per example, got shape "
                                         r"\(2,\)"):
        multi_hot(torch.tensor([1, 2]), 10)
    assert multi_hot(torch.tensor([[1, 2], [0, 0]]), 3).tolist() == [[0, 1, 1], [1, 0, 0]]


def test_soft_dice_uses_the_smoothing_it_is_given():
    """Every test called soft_dice with smooth=1, so an option dropped on the way in went unnoticed (mutation
    testing, 2026-12-01): checked against the formula by hand at 0.5 and 0."""
    from capsnet.losses import soft_dice

    p = _t([[[[0.2, 0.9], [0.6, 0.0]]]])
    m = _t([[[[0.0, 1.0], [1.0, 0.0]]]])
    # sum(p m) = 0.9 + 0.6 = 1.5; sum(p) = 1.7; sum(m) = 2
    assert soft_dice(p, m, smooth=0.5).item() == pytest.approx((3.0 + 0.5) / (3.7 + 0.5), rel=1e-12)
    assert soft_dice(p, m, smooth=0.0).item() == pytest.approx(3.0 / 3.7, rel=1e-12)


def test_a_sure_wrong_pixel_costs_the_clamps_log():
    """The cross-entropy of probabilities clamps them to [1e-6, 1 - 1e-6]: a foreground pixel given 0 costs
    -log(1e-6), a background pixel given 0 costs -log(1 - 1e-6); the mean over the two pixels, by hand."""
    import math

    from capsnet.losses import segmentation_loss

    p = _t([[[[0.0, 0.0]]]])
    m = _t([[[[1.0, 0.0]]]])
    expected = (-math.log(1e-6) - math.log1p(-1e-6)) / 2
    assert segmentation_loss(p, m, "bce").item() == pytest.approx(expected, rel=1e-12)


def test_fractional_multi_hot_targets_weigh_both_terms_of_eq_4():
    """Targets in (0, 1) weigh the present term by T and the absent one by 1 - T (Eq. 4 as written); every test
    used 0/1 targets. Worked with scalars: T = (0.3, 0.7), |v| = (0.5, 0.2)."""
    lengths, targets = _t([[0.5, 0.2]]), _t([[0.3, 0.7]])
    present = 0.3 * (0.9 - 0.5) ** 2 + 0.7 * (0.9 - 0.2) ** 2
    absent = 0.5 * (0.7 * (0.5 - 0.1) ** 2 + 0.3 * (0.2 - 0.1) ** 2)
    assert margin_loss(lengths, targets).item() == pytest.approx(present + absent, rel=1e-12)


def test_fractional_multi_hot_targets_weigh_the_spread_losss_pairs():
    """Spread loss with T = (0.3, 0.7): each ordered pair (t, i), t != i, weighs T_t (1 - T_i)
    max(0, m - (a_t - a_i))^2; a pair with itself weighs T_t (1 - T_t) m^2. Worked with scalars, m = 0.2."""
    from capsnet.losses import spread_loss

    a, T, m = [0.6, 0.5], [0.3, 0.7], 0.2
    expected = sum(T[t] * (1 - T[i]) * max(0.0, m - (a[t] - a[i])) ** 2 for t in range(2) for i in range(2))
    assert spread_loss(_t([a]), _t([T]), m).item() == pytest.approx(expected, rel=1e-12)


def test_the_foreground_weight_is_background_pixels_per_foreground_one_at_least_1():
    """By hand: 3 foreground pixels of 16 weigh 13/3; a mask mostly foreground weighs 1, not below (pinned only by a
    closed-form test in another file before: mutation testing, 2026-12-01)."""
    from capsnet.losses import foreground_weight

    m = torch.zeros(1, 1, 4, 4)
    m.view(-1)[:3] = 1
    assert foreground_weight(m).item() == pytest.approx(13 / 3, rel=1e-6)
    assert foreground_weight(1 - m).item() == 1.0  # 13 foreground, 3 background: at least 1


def test_weighted_bce_weighs_foreground_pixels_by_the_batchs_ratio():
    """-(w m log p + (1 - m) log(1 - p)) averaged over pixels, w = background / foreground pixels of the batch,
    worked by hand on four pixels: one foreground (w = 3)."""
    import math

    from capsnet.losses import segmentation_loss

    p = _t([[[[0.6, 0.2, 0.1, 0.3]]]])
    m = _t([[[[1.0, 0.0, 0.0, 0.0]]]])
    expected = -(3 * math.log(0.6) + math.log(0.8) + math.log(0.9) + math.log(0.7)) / 4
    assert segmentation_loss(p, m, "weighted-bce").item() == pytest.approx(expected, rel=1e-12)


def test_the_losses_refuse_constants_and_indices_that_made_silent_nonsense():
    """A review of the Python API (2026-12-02): soft Dice broadcast mismatched masks (one prediction scored against
    two masks) and a negative smooth; multi_hot and the losses read 2.9 as class 2 and
    True as class 1; a negative margin, scale or lam made a loss of exactly 0 or one that training lowers by getting
    worse; a string constant met torch's bare TypeError."""
    from capsnet.losses import multi_hot, soft_dice, spread_loss

    lengths, targets = torch.rand(4, 3, dtype=DT), torch.tensor([0, 1, 2, 0])
    p, m = torch.rand(2, 1, 8, 8), (torch.rand(2, 1, 8, 8) > 0.5).float()
    cases = [
        (lambda: soft_dice(p, m[:, :, :1, :1]), r"probabilities \(2, 1, 8, 8\) and masks \(2, 1, 1, 1\) must have the "
                                                r"same shape"),
        (lambda: soft_dice(p[:1], m), r"probabilities \(1, 1, 8, 8\) and masks \(2, 1, 8, 8\)"),
        (lambda: soft_dice(p, m, smooth=-1), r"smooth must be a finite number >= 0 \(0: the exact Dice, .* got -1$"),
        (lambda: soft_dice(p, m, smooth="1"), "smooth must be a finite number >= 0"),
        (lambda: multi_hot(torch.tensor([[2.9, 1.0]]), 10), "labels must be integer class indices, got torch.float32"),
        (lambda: multi_hot(torch.tensor([[True, False]]), 10), "got torch.bool"),
        (lambda: multi_hot(torch.tensor([[2, 1]]), 2.5), "num_classes must be a positive integer, got 2.5"),
        (lambda: reconstruction_loss(torch.rand(2, 4), torch.rand(2, 4), scale=-1), "scale must be a finite number >= 0"),
        (lambda: reconstruction_loss(torch.rand(2, 4), torch.rand(2, 4), scale=float("nan")), "got nan"),
        (lambda: spread_loss(lengths, targets, -1), r"margin must be a finite number >= 0 .* got -1"),
        (lambda: spread_loss(lengths, targets.bool(), 0.2), "class indices must be integers, got torch.bool"),
        (lambda: margin_loss(lengths, targets.bool()), "class indices must be integers, got torch.bool"),
        (lambda: margin_loss(lengths, targets, lam=-1), r"lam must be a finite number >= 0 \(the paper's 0.5\), got -1"),
        (lambda: margin_loss(lengths, targets, m_plus="0.9"), "m_plus must be a finite number, got '0.9'"),
        (lambda: margin_loss(lengths, targets, m_minus=float("inf")), "m_minus must be a finite number, got inf"),
        (lambda: margin_loss(lengths, targets, validate="no"), "validate must be True or False, got 'no'"),
    ]
    for make, message in cases:
        with pytest.raises(ValueError, match=message):
            make()
    # what stays allowed: smooth 0 and above, a zero scale or margin, negative m_minus (a constant, not a weight)
    torch.testing.assert_close(soft_dice(torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 2), smooth=0.5), torch.ones(1))
    assert reconstruction_loss(torch.rand(2, 4), torch.rand(2, 4), scale=0) == 0
    assert margin_loss(lengths, targets, m_minus=-0.1) > margin_loss(lengths, targets)
    assert spread_loss(lengths, targets, 0.0) >= 0


def test_the_segmentation_losses_dice_term_is_the_mean_over_the_batch_by_hand():
    """Mutation testing (2026-12-03): the Dice term summed over the batch (B times too heavy against the
    cross-entropy) passed every test, all of batch 1. Two examples, Dice by hand with the smoothing of 1."""
    from capsnet.losses import segmentation_loss

    p = torch.tensor([[[[0.9, 0.2], [0.6, 0.1]]], [[[0.5, 0.5], [0.5, 0.5]]]], dtype=torch.float64)
    m = torch.tensor([[[[1.0, 0.0], [1.0, 0.0]]], [[[0.0, 0.0], [0.0, 0.0]]]], dtype=torch.float64)
    # example 1: (2 * 1.5 + 1) / (1.8 + 2 + 1) = 4 / 4.8; example 2: (0 + 1) / (2 + 0 + 1) = 1 / 3
    dice_loss = ((1 - 4 / 4.8) + (1 - 1 / 3)) / 2
    assert segmentation_loss(p, m, "dice").item() == pytest.approx(dice_loss, rel=1e-12)
    assert segmentation_loss(p, m, "bce+dice").item() == pytest.approx(
        segmentation_loss(p, m, "bce").item() + dice_loss, rel=1e-12)


def test_the_segmentation_margin_loss_is_segcaps_codes_by_hand():
    """SegCaps' code's 'mar' and 'w_mar' (margin 0.4 about 0.5, downweight 0.5, per pixel, averaged): a foreground
    pixel costs 0.5 w (0.9 - p)^2 below 0.9, a background one 0.25 (p - 0.1)^2 above 0.1, worked by hand on two
    examples of four pixels (two foreground of eight: w = 3)."""
    from capsnet.losses import segmentation_loss

    p = torch.tensor([[[[0.95, 0.5], [0.05, 0.3]]], [[[0.9, 0.1], [0.7, 0.0]]]], dtype=torch.float64)
    m = torch.tensor([[[[1.0, 1.0], [0.0, 0.0]]], [[[0.0, 0.0], [0.0, 0.0]]]], dtype=torch.float64)
    fg = [0.0, 0.4 ** 2]  # 0.95 (past 0.9: nothing), 0.5
    bg = [0.0, 0.2 ** 2, 0.8 ** 2, 0.0, 0.6 ** 2, 0.0]  # 0.05, 0.3, 0.9, 0.1 (at the margin), 0.7, 0.0
    for kind, w in (("margin", 1.0), ("weighted-margin", 3.0)):
        expected = (0.5 * w * sum(fg) + 0.25 * sum(bg)) / 8
        assert segmentation_loss(p, m, kind).item() == pytest.approx(expected, rel=1e-12), kind
    # a right answer on every pixel costs nothing; the U-Net's logits are not read (its probabilities are)
    sure = torch.tensor([[[[0.9, 0.1], [0.95, 0.0]]]], dtype=torch.float64)
    truth = torch.tensor([[[[1.0, 0.0], [1.0, 0.0]]]], dtype=torch.float64)
    assert segmentation_loss(sure, truth, "margin").item() == 0
    assert segmentation_loss(p, m, "margin", logits=torch.zeros_like(p)).item() == pytest.approx(
        (0.5 * sum(fg) + 0.25 * sum(bg)) / 8, rel=1e-12)
