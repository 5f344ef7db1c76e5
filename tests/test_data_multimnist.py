"""MultiMNIST pairs (Sabour et al. 2017, section 6) from the real MNIST test split."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from capsnet.data import load_dataset
from capsnet.data.multimnist import bounding_boxes, box_overlap, make_pairs, place, top2_correct


@pytest.fixture(scope="module")
def mnist_test(data_root):
    return load_dataset("mnist", "test", root=data_root)


@pytest.fixture(scope="module")
def batch(mnist_test):
    return make_pairs(mnist_test.images, mnist_test.labels, 4000, generator=torch.Generator().manual_seed(1))


def test_shapes_labels_and_shifts(batch):
    assert batch.images.shape == (4000, 1, 36, 36) and batch.components.shape == (4000, 2, 1, 36, 36)
    assert batch.images.dtype == torch.float32 and len(batch) == 4000
    assert (batch.labels[:, 0] != batch.labels[:, 1]).all()  # two different classes, always
    assert batch.shifts.abs().max() == 4 and batch.shifts.shape == (4000, 2, 2)
    assert set(batch.shifts.unique().tolist()) == set(range(-4, 5))  # every shift occurs


def test_each_component_is_its_source_digit_padded_and_shifted(batch, mnist_test):
    for n in range(0, 4000, 397):
        for k in range(2):
            digit = mnist_test.images[batch.sources[n, k]].float() / 255  # (1, 28, 28)
            dy, dx = batch.shifts[n, k].tolist()
            expected = torch.roll(F.pad(digit, (4, 4, 4, 4)), shifts=(dy, dx), dims=(1, 2))  # the border absorbs |shift| <= 4
            assert torch.equal(batch.components[n, k], expected)
            assert batch.labels[n, k] == mnist_test.labels[batch.sources[n, k]]


def test_image_is_the_clipped_sum_of_its_components(batch):
    total = batch.components.sum(1)
    assert torch.equal(batch.images, total.clamp(max=1.0))
    assert (total > 1).any() and batch.images.max() == 1.0  # overlapping strokes were clipped
    assert batch.images.min() == 0.0


def test_reproducible_from_the_seed(mnist_test):
    a = make_pairs(mnist_test.images, mnist_test.labels, 50, generator=torch.Generator().manual_seed(7))
    b = make_pairs(mnist_test.images, mnist_test.labels, 50, generator=torch.Generator().manual_seed(7))
    c = make_pairs(mnist_test.images, mnist_test.labels, 50, generator=torch.Generator().manual_seed(8))
    assert torch.equal(a.images, b.images) and torch.equal(a.sources, b.sources) and torch.equal(a.shifts, b.shifts)
    assert not torch.equal(a.sources, c.sources)


def test_bounding_box_overlap_matches_the_shift_distribution(batch):
    # The paper: a digit sits in a 20x20 box; with both shifted uniformly in -4..4, the boxes overlap by
    # (1 - E|dy|/20)(1 - E|dx|/20) on average, E|d| = (9^2 - 1) / (3 * 9) for the difference of two such shifts.
    expected = (1 - (80 / 27) / 20) ** 2  # 0.726; the paper rounds its figure to "80%"
    boxes = bounding_boxes(batch.components)  # (n, 2, 4)
    overlap = box_overlap(boxes[:, 0], boxes[:, 1])
    assert overlap.mean().item() == pytest.approx(expected, abs=0.02)
    assert (overlap > 0).float().mean() > 0.98  # nearly every pair overlaps (a thin 1 can miss)


def test_bounding_boxes_and_overlap_on_hand_made_boxes():
    img = torch.zeros(1, 10, 10)
    img[0, 2:5, 3:8] = 1.0
    assert bounding_boxes(img).tolist() == [2, 3, 4, 7]
    a, b = torch.tensor([0, 0, 3, 3]), torch.tensor([2, 2, 5, 9])  # 4x4 and 4x8 boxes sharing a 2x2 corner
    assert box_overlap(a, b).item() == pytest.approx(4 / 16)
    assert box_overlap(a, torch.tensor([5, 5, 6, 6])).item() == 0.0


def test_multi_hot_targets(batch):
    t = batch.multi_hot()
    assert t.shape == (4000, 10) and (t.sum(1) == 2).all()
    assert (t.gather(1, batch.labels) == 1).all()


def test_bad_input_is_refused(mnist_test):
    with pytest.raises(ValueError, match="at least two classes"):
        make_pairs(mnist_test.images[:5], torch.zeros(5, dtype=torch.long), 3)
    with pytest.raises(ValueError, match=r"need images \(N, C, H, W\) and labels \(N,\)"):
        make_pairs(mnist_test.images[:5], mnist_test.labels[:4], 3)
    with pytest.raises(ValueError, match="inside the 36x36 canvas"):
        place(torch.ones(1, 1, 28, 28), torch.tensor([[0, 9]]), 36)


def test_top2_metric_on_hand_made_cases():
    scores = torch.tensor([
        [0.9, 0.1, 0.8, 0.0],  # top two {0, 2}
        [0.9, 0.1, 0.8, 0.0],
        [0.2, 0.95, 0.3, 0.94],  # top two {1, 3}
        [0.5, 0.6, 0.7, 0.1],  # top two {1, 2}: one of them wrong for labels {0, 2}
    ])
    labels = torch.tensor([[0, 2], [2, 0], [3, 1], [0, 2]])
    assert top2_correct(scores, labels).tolist() == [True, True, True, False]
    with pytest.raises(ValueError, match=r"labels \(n, 2\)"):
        top2_correct(scores, torch.tensor([0, 1, 2, 3]))


def test_the_second_digit_is_drawn_afresh_from_the_other_classes(mnist_test):
    """Found by mutation testing (2026-11-30): a second digit taken as the one after the first in the split
    (``(first + 1) % N``, redrawn only on a class clash) passed every test. Over 400,000 draws the second digit must
    not follow from the first, and given the first's class c, the second's class j must come up in proportion to
    the digits of class j among those of the other classes (uniform over the other classes' digits, as the paper)."""
    from capsnet.data.multimnist import draw_pairs

    labels = mnist_test.labels
    N, n = len(labels), 400_000
    sources, _ = draw_pairs(labels, n, generator=torch.Generator().manual_seed(11))
    first, second = sources.unbind(1)
    assert (second == (first + 1) % N).float().mean() < 0.01  # 1 / N = 0.0001 when drawn afresh
    per_class = [labels.tolist().count(c) for c in range(10)]
    a, b = labels[first].tolist(), labels[second].tolist()
    seen = [[0] * 10 for _ in range(10)]
    for c, j in zip(a, b):
        seen[c][j] += 1
    worst = 0.0
    for c in range(10):
        drawn = sum(seen[c])
        assert seen[c][c] == 0
        for j in range(10):
            if j != c:
                expected = drawn * per_class[j] / (N - per_class[c])  # about 4,400 a cell: 1.5% standard error
                worst = max(worst, abs(seen[c][j] / expected - 1))
    assert worst < 0.1
