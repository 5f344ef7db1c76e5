"""Cluttered digit-segmentation canvases from real MNIST, the user's mask folders, Otsu, Dice and IoU."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from PIL import Image

from capsnet.data import DataError, load_dataset
from capsnet.data.segmentation import (CANVAS, IN_DISTRIBUTION, OUT_OF_DISTRIBUTION, CanvasRule, dice_iou,
                                       draw_canvases, load_mask_folder, make_canvases, otsu_masks, otsu_threshold,
                                       random_canvases, render_canvases, segmentation_test)

CLEAN = dataclasses.replace(IN_DISTRIBUTION, fragments=(0, 0), noise=0.0, gradient=0.0)  # the target alone


@pytest.fixture(scope="module")
def mnist(data_root):
    return load_dataset("mnist", "test", root=data_root)


@pytest.fixture(scope="module")
def pool(mnist):
    return mnist.images[:2000]


def _canvases(pool, n, seed, rule, size=CANVAS):
    return make_canvases(pool, torch.arange(n), torch.Generator().manual_seed(seed), rule=rule, size=size)


def test_shapes_dtypes_and_ranges(pool):
    images, masks = _canvases(pool, 300, 0, IN_DISTRIBUTION)
    assert images.shape == masks.shape == (300, 1, CANVAS, CANVAS)
    assert images.dtype == torch.float32 and masks.dtype == torch.uint8
    assert images.min() >= 0 and images.max() <= 1 and images.max() == 1
    assert set(masks.unique().tolist()) == {0, 1}
    assert (masks.flatten(1).sum(1) >= 20).all()  # every canvas has its target
    f, _ = _canvases(pool.float() / 255, 300, 0, IN_DISTRIBUTION)  # float digits give the same canvases
    assert torch.allclose(f, images, atol=1e-6)


def test_mask_is_the_target_alone_whatever_the_clutter(pool):
    clean, clean_masks = _canvases(pool, 300, 1, CLEAN)
    # with no clutter, noise or ramp the image is the target: the mask is exactly its threshold
    assert torch.equal(clean_masks.bool(), clean > IN_DISTRIBUTION.threshold)
    assert (clean.flatten(1) > 0).sum(1).float().mean() < 0.3 * CANVAS ** 2  # a black background around one digit
    # the target's draws come first: with clutter the same targets land in the same places with the same masks
    cluttered_only = dataclasses.replace(CLEAN, fragments=IN_DISTRIBUTION.fragments)
    cluttered, masks = _canvases(pool, 300, 1, cluttered_only)
    assert torch.equal(masks, clean_masks)
    assert (cluttered >= clean).all()  # composited with max: the target is never dimmed
    outside = (cluttered > 0.5) & (masks == 0)
    assert (outside.flatten(1).sum(1) > 0).float().mean() > 0.8  # clutter visible off the target on most canvases
    assert torch.equal(_canvases(pool, 300, 1, IN_DISTRIBUTION)[1], clean_masks)  # noise and ramp neither


def test_clutter_is_fragments_of_other_digits(pool):
    rule = dataclasses.replace(CLEAN, fragments=(1, 1), scale=(1.0, 1.0))
    g = torch.Generator().manual_seed(2)
    draw = draw_canvases(400, len(pool), g, rule=rule)
    assert ((draw.source_offset >= 1) & (draw.source_offset < len(pool))).all()  # never the target itself
    assert ((draw.side >= 10) & (draw.side <= 16)).all() and draw.side.unique().numel() == 7
    images, masks = render_canvases(pool, torch.arange(400), draw, rule=rule)
    clean, _ = render_canvases(pool, torch.arange(400), dataclasses.replace(draw, count=torch.zeros_like(draw.count)),
                               rule=rule)
    clutter = (images - clean).clamp(min=0).flatten(1)
    # a fragment is a cut square: never more ink than its square holds, far less than a whole digit on average
    square = (draw.side[:, 0].double() * draw.frag_scale[:, 0] + 2) ** 2
    assert ((clutter > 0).sum(1) <= square).all()
    source = (torch.arange(400) + draw.source_offset[:, 0]) % len(pool)
    ink = (pool[source].flatten(1) > 127).sum(1) * draw.frag_scale[:, 0] ** 2  # the whole source digit's ink
    part = (clutter > 0.5).sum(1) / ink
    assert part.mean() < 0.6 and (part > 0.9).float().mean() < 0.1


def _orientation(m: torch.Tensor) -> torch.Tensor:
    """Principal-axis angle in degrees, counter-clockwise as displayed, of each (B, h, w) mask."""
    B, h, w = m.shape
    y, x = torch.meshgrid(-torch.arange(h, dtype=torch.float64), torch.arange(w, dtype=torch.float64), indexing="ij")
    m = m.double()
    n = m.sum((1, 2))
    mx, my = (m * x).sum((1, 2)) / n, (m * y).sum((1, 2)) / n
    cxx = (m * (x - mx[:, None, None]) ** 2).sum((1, 2))
    cyy = (m * (y - my[:, None, None]) ** 2).sum((1, 2))
    cxy = (m * (x - mx[:, None, None]) * (y - my[:, None, None])).sum((1, 2))
    return torch.rad2deg(0.5 * torch.atan2(2 * cxy, cxx - cyy))


def test_target_turns_by_the_drawn_angle(mnist):
    # elongated ones: their principal axis turns with the digit, counter-clockwise for positive angles
    ones = mnist.images[mnist.labels == 1][:300]
    rule = dataclasses.replace(CLEAN, scale=(1.3, 1.3))
    draw = draw_canvases(len(ones), len(ones), torch.Generator().manual_seed(3), rule=rule)
    _, masks = render_canvases(ones, torch.arange(len(ones)), draw, rule=rule)
    before = _orientation(ones[:, 0] > 127)
    turned = (_orientation(masks[:, 0]) - before - draw.rotation_deg + 90) % 180 - 90
    assert turned.abs().median() < 2 and (turned.abs() < 6).float().mean() > 0.9


def test_target_ink_stays_inside_the_canvas(pool):
    for rule in (dataclasses.replace(CLEAN, scale=(1.6, 1.6)), dataclasses.replace(CLEAN, rotation_deg=75, scale=(2.1, 2.1))):
        _, masks = _canvases(pool, 1000, 4, rule)
        s = rule.scale[0]
        border = masks[..., 0, :].any(-1) | masks[..., -1, :].any(-1) | masks[..., 0].any(-1) | masks[..., -1].any(-1)
        assert border.float().mean() < 0.01  # the whole ink box fits (MNIST's ink lies in a 20x20 box)
        ratio = masks.flatten(1).sum(1) / ((pool[:1000].flatten(1) > 127).sum(1) * s ** 2)
        assert 0.85 < ratio.mean() < 1.15 and ratio.min() > 0.6  # area grows as scale^2: nothing large cut off
        _, roomy = _canvases(pool, 1000, 4, rule, size=128)  # the same draws on a canvas no digit can leave
        kept = masks.flatten(1).sum(1) / roomy.flatten(1).sum(1)  # sub-pixel placement moves small areas by ~10%
        assert kept.min() > 0.85 and 0.98 < kept.mean() < 1.02


def test_out_of_distribution_spreads_rotation_and_scale(pool):
    g = torch.Generator().manual_seed(5)
    ind, ood = draw_canvases(4000, len(pool), g, rule=IN_DISTRIBUTION), draw_canvases(4000, len(pool), g, rule=OUT_OF_DISTRIBUTION)
    # uniform in [-30, 30] and [-75, 75] degrees: of 4,000 draws the largest lies within 0.1 degree of the bound
    assert 29.9 < ind.rotation_deg.abs().max() <= 30 and 74.9 < ood.rotation_deg.abs().max() <= 75
    # std = max / sqrt(3), so their ratio is 75 / 30 (each estimated to about 0.6% from 4,000 draws)
    assert (ood.rotation_deg.std() / ind.rotation_deg.std()).item() == pytest.approx(75 / 30, rel=0.04)
    assert ind.scale.min() >= 1.0 and ind.scale.max() <= 1.6 and ood.scale.min() < 0.75 and ood.scale.max() > 2.0
    assert OUT_OF_DISTRIBUTION.fragments == IN_DISTRIBUTION.fragments and OUT_OF_DISTRIBUTION.noise == IN_DISTRIBUTION.noise
    # measured on the masks: the area relative to the digit's own ink spreads wider out of distribution
    ink = (pool[:500].flatten(1) > 127).sum(1).double()
    spread = [(_canvases(pool, 500, 6, r)[1].flatten(1).sum(1) / ink).std() for r in (IN_DISTRIBUTION, OUT_OF_DISTRIBUTION)]
    assert spread[1] > 1.8 * spread[0]


def test_noise_and_background_ramp(pool):
    clean, _ = _canvases(pool, 200, 7, CLEAN)
    noisy, _ = _canvases(pool, 200, 7, dataclasses.replace(CLEAN, noise=0.05))
    mid = (clean > 0.3) & (clean < 0.7)  # no clipping there
    assert abs((noisy - clean)[mid].std().item() - 0.05) < 0.004 and abs((noisy - clean)[mid].mean().item()) < 0.004
    ramped, _ = _canvases(pool, 200, 7, dataclasses.replace(CLEAN, gradient=0.3))
    ramp = (ramped - clean)[:, 0].double()  # (B, S, S): a plane where the target did not clip it
    ok = (ramped < 1)[:, 0]
    rows, cols = torch.meshgrid(torch.arange(CANVAS), torch.arange(CANVAS), indexing="ij")
    X = torch.stack([torch.ones_like(rows), rows, cols], -1).reshape(-1, 3).double()
    for b in range(0, 200, 20):
        keep = ok[b].flatten()
        coef = torch.linalg.lstsq(X[keep], ramp[b].flatten()[keep, None]).solution
        assert (X[keep] @ coef - ramp[b].flatten()[keep, None]).abs().max() < 1e-5
    amplitude = ramp.amax((1, 2)) - ramp.amin((1, 2))
    assert amplitude.max() <= 0.3 and amplitude.max() > 0.25 and ramp.amin((1, 2)).abs().max() < 0.01


def test_test_set_is_fixed_by_its_seed(pool):
    small = pool[:300]
    a = segmentation_test(small, 250, seed=1, batch_size=100)
    b = segmentation_test(small, 250, seed=1, batch_size=100)
    c = segmentation_test(small, 250, seed=2, batch_size=100)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[1], c[1]) and not torch.equal(a[0], c[0])
    prefix = segmentation_test(small, 130, seed=1, batch_size=100)  # a smaller set is a prefix of the larger
    assert torch.equal(prefix[0], a[0][:130]) and torch.equal(prefix[1], a[1][:130])
    cycled = segmentation_test(small[:100], 250, seed=1, batch_size=100)  # targets cycle through the digits
    ink = lambda m: m.flatten(1).sum(1).double()  # noqa: E731
    assert cycled[0].shape == (250, 1, CANVAS, CANVAS) and cycled[0].device.type == "cpu"
    assert torch.corrcoef(torch.stack([ink(cycled[1][:100]), ink(cycled[1][100:200])]))[0, 1] > 0.7
    assert segmentation_test(small, 0, seed=1)[0].shape == (0, 1, CANVAS, CANVAS)


def test_training_canvases_reproducible_from_the_generator(pool):
    idx = torch.randint(0, len(pool), (64,), generator=torch.Generator().manual_seed(0))
    a = random_canvases(pool, idx, torch.Generator().manual_seed(9))
    b = random_canvases(pool, idx, torch.Generator().manual_seed(9))
    c = random_canvases(pool, idx, torch.Generator().manual_seed(10))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and not torch.equal(a[0], c[0])
    # no canvases: empty tensors of the canvases' types (affine_grid's "non-zero output size" before; a review)
    for make in (random_canvases, make_canvases):
        images, masks = make(pool, idx[:0], torch.Generator().manual_seed(9))
        assert (images.shape, images.dtype, masks.shape, masks.dtype) == (
            (0, 1, CANVAS, CANVAS), torch.float32, (0, 1, CANVAS, CANVAS), torch.uint8)


def test_bad_arguments_are_refused(pool):
    with pytest.raises(ValueError, match="targets must index"):
        make_canvases(pool, torch.tensor([0, len(pool)]), None)
    with pytest.raises(ValueError, match="digits must be"):
        make_canvases(pool[:, 0], torch.tensor([0]), None)
    with pytest.raises(ValueError, match="scale"):
        CanvasRule(scale=(2.0, 1.0))
    with pytest.raises(ValueError, match="fragment_size"):
        make_canvases(pool, torch.tensor([0]), None, rule=CanvasRule(fragment_size=(10, 40)))
    # NaN passed every comparison: NaN canvases with empty masks, or (the noise) none added; non-integer counts
    # and sides failed inside torch.randint
    nan, inf = float("nan"), float("inf")
    for field, value in (("rotation_deg", nan), ("rotation_deg", inf), ("noise", nan), ("gradient", nan),
                         ("threshold", nan), ("scale", (1.0, inf)), ("scale", (nan, 1.0)), ("fragment_scale", (1, nan)),
                         ("fragments", (2.5, 4)), ("fragment_size", (10.5, 16)), ("fragments", (True, 2))):
        with pytest.raises(ValueError, match=field):
            CanvasRule(**{field: value})
    assert CanvasRule(fragments=(0, 0), noise=0.0) is not None  # no clutter, no noise: still a rule


def test_a_split_of_one_digit_is_refused_as_its_canvases_clutter_would_be_cut_from_its_own_target(data_root):
    """Each fragment is cut from another digit of the split: with one digit (--train-size 1, or --val-size 1) the
    canvases were cluttered with pieces of their own target, marked background, without a word."""
    from capsnet.data.tasks import load_training

    for sizes, flag in (({"train_size": 1}, "--train-size"), ({"train_size": 3, "val_size": 1}, "--val-size"),
                        ({"train_size": 2, "val_size": 1}, "--train-size")):
        with pytest.raises(DataError, match=f"cut from other digits of their split, and this one holds 1 digit: "
                                            f"give a larger {flag}"):
            load_training("mnist-sample-segmentation", **sizes, test_size=4, root=data_root, progress=False)
    train, held, _ = load_training("mnist-sample-segmentation", train_size=4, val_size=2, root=data_root,
                                   progress=False)
    assert len(train) == 2 and len(held) == 2


@pytest.mark.requires_cuda
def test_generator_and_digits_on_cuda(pool):
    g = torch.Generator(device="cuda").manual_seed(0)
    x, m = random_canvases(pool.cuda(), torch.arange(32, device="cuda"), g)
    assert x.device.type == "cuda" and m.device.type == "cuda" and (m.flatten(1).sum(1) > 0).all()
    x, m = random_canvases(pool, torch.arange(32), torch.Generator(device="cuda").manual_seed(0))
    assert x.device.type == "cpu"


# ------------------------------------------------------------------------------------------- Otsu, Dice and IoU

def _otsu_brute(levels: np.ndarray) -> tuple[float, np.ndarray]:
    """Every split t of the 0..255 levels tried: the highest between-class variance and its upper-class mask."""
    best, best_t = -1.0, None
    for t in range(256):
        low, high = levels[levels <= t], levels[levels > t]
        if len(low) == 0 or len(high) == 0:
            continue
        w0, w1 = len(low) / levels.size, len(high) / levels.size
        var = w0 * w1 * (low.mean() - high.mean()) ** 2
        if var > best + 1e-9 * max(best, 1):
            best, best_t = var, t
    return best, levels > best_t


def test_otsu_matches_a_brute_force_search():
    rng = np.random.default_rng(0)
    images = []
    for _ in range(12):
        fg = rng.random((32, 32)) < rng.uniform(0.1, 0.5)
        a, b = rng.uniform(0.05, 0.45), rng.uniform(0.55, 0.95)
        images.append(np.where(fg, rng.normal(b, 0.08, fg.shape), rng.normal(a, 0.1, fg.shape)).clip(0, 1))
    x = torch.from_numpy(np.stack(images)[:, None]).float()
    levels = (x.double() * 255).round()[:, 0].numpy()
    got = otsu_masks(x)[:, 0].numpy().astype(bool)
    k = np.round(otsu_threshold(x).numpy() * 255 - 0.5)
    for i in range(len(images)):
        best, mask = _otsu_brute(levels[i])
        assert np.array_equal(got[i], mask)
        low, high = levels[i][levels[i] <= k[i]], levels[i][levels[i] > k[i]]
        var = len(low) * len(high) / levels[i].size ** 2 * (low.mean() - high.mean()) ** 2
        assert var == pytest.approx(best, rel=1e-9)
    u8 = (x * 255).round().to(torch.uint8)  # uint8 input: the same levels, the same split
    assert torch.equal(otsu_masks(u8), otsu_masks(x))


def test_otsu_separates_two_levels_and_averages_channels():
    x = torch.full((2, 3, 8, 8), 0.2)
    x[:, :, 2:5, 3:7] = 0.7
    t = otsu_threshold(x)
    assert ((t > 0.2) & (t < 0.7)).all()
    assert torch.equal(otsu_masks(x)[:, 0], (x[:, 0] > 0.5).to(torch.uint8))
    x[:, 0], x[:, 1:] = 0.0, 0.6  # channel mean 0.4 everywhere: one level, nothing above it
    assert otsu_masks(x).sum() == 0
    g = torch.Generator().manual_seed(3)
    x = torch.rand(4, 3, 16, 16, generator=g, dtype=torch.float64)  # channels independent of each other
    grey = x.mean(1, keepdim=True)
    assert torch.equal(otsu_masks(x), otsu_masks(grey)) and torch.equal(otsu_threshold(x), otsu_threshold(grey))
    for one in (x[:, :1], x.amax(1, keepdim=True)):  # neither the first channel nor the brightest is the grey
        assert not torch.equal(otsu_masks(x), otsu_masks(one))


def test_dice_and_iou_by_hand():
    t = torch.zeros(4, 1, 2, 3, dtype=torch.uint8)
    p = torch.zeros(4, 1, 2, 3)
    t[0, 0, 0, :2] = 1  # |T| = 2, |P| = 3, overlap 1: Dice 2/5, IoU 1/4
    p[0, 0, 0, 1:] = 1
    p[0, 0, 1, 2] = 1
    t[1, 0, 1] = 1  # identical
    p[1, 0, 1] = 1
    p[2, 0, 0, 0] = 1  # prediction only: 0
    # 3: both empty: 1
    dice, iou = dice_iou(p, t.bool())
    assert dice.dtype == torch.float64 and dice.tolist() == pytest.approx([0.4, 1, 0, 1])
    assert iou.tolist() == pytest.approx([0.25, 1, 0, 1])
    with pytest.raises(ValueError, match="threshold"):
        dice_iou(p * 0.7, t)
    with pytest.raises(ValueError, match="must both be"):
        dice_iou(p[:, 0], t[:, 0])


# ------------------------------------------------------------------------------------------- the user's folders

def _save(path, array, mode=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    img = Image.fromarray(array)
    (img if mode is None else img.convert(mode)).save(path)


@pytest.fixture
def folder(tmp_path):
    rng = np.random.default_rng(0)
    gray = rng.integers(0, 256, (3, 12, 10), dtype=np.uint8)
    m = rng.random((3, 12, 10)) < 0.4
    _save(tmp_path / "images" / "a.png", gray[0])
    _save(tmp_path / "masks" / "a.png", m[0].astype(np.uint8) * 255)  # 0/255
    _save(tmp_path / "images" / "b.png", gray[1])
    _save(tmp_path / "masks" / "b.png", m[1].astype(np.uint8))  # 0/1
    _save(tmp_path / "images" / "c.png", gray[2])
    _save(tmp_path / "masks" / "c.png", m[2].astype(np.uint8) * 255, mode="1")  # 1-bit
    return tmp_path, gray, m


def test_folder_round_trip_gray(folder):
    root, gray, m = folder
    images, masks, names = load_mask_folder(root / "images", root / "masks")
    assert names == ["a", "b", "c"] and images.dtype == masks.dtype == torch.uint8
    assert torch.equal(images, torch.from_numpy(gray[:, None])) and torch.equal(masks, torch.from_numpy(m[:, None]).to(torch.uint8))


def test_the_held_out_pairs_of_a_folder_are_chosen_by_name_so_new_files_move_no_other_pair():
    """Before, a fifth of randperm(n) was held out: one file added to 100 sent 17 of the 20 new test pairs from the
    old training set, so a run evaluated after the folder grew was scored on pairs it had trained on."""
    from capsnet.data.tasks import held_out_names

    names = [f"img{k:03d}" for k in range(100)]
    held = held_out_names(names)
    assert 10 <= len(held) <= 30 and held <= set(names)  # about one in five
    assert held_out_names(list(reversed(names))) == held  # the order of the files does not matter
    for grown in (names + ["img100", "zz"], names[:60]):  # files added, files removed
        assert held_out_names(grown) & set(names) == held & set(grown)
    big = [f"x{k}" for k in range(5000)]
    assert 0.18 <= len(held_out_names(big)) / 5000 <= 0.22
    for few in (["a", "b"], ["only", "two"], [f"n{k}" for k in range(4)]):
        kept = held_out_names(few)
        assert 1 <= len(kept) < len(few)  # always one pair to test and one to train on


def test_folder_round_trip_rgb_with_alpha_and_empty_mask(tmp_path):
    rng = np.random.default_rng(1)
    rgb = rng.integers(0, 256, (2, 9, 7, 3), dtype=np.uint8)
    _save(tmp_path / "im" / "x.png", rgb[0])
    _save(tmp_path / "im" / "y.png", np.concatenate([rgb[1], np.full((9, 7, 1), 255, np.uint8)], -1))  # RGBA
    _save(tmp_path / "mk" / "x.png", np.zeros((9, 7), np.uint8))  # all background is fine
    mask = (rng.random((9, 7)) < 0.5).astype(np.uint8) * 255
    _save(tmp_path / "mk" / "y.png", np.repeat(mask[..., None], 3, -1))  # RGB with equal channels
    images, masks, names = load_mask_folder(tmp_path / "im", tmp_path / "mk")
    assert names == ["x", "y"] and images.shape == (2, 3, 9, 7)
    assert torch.equal(images, torch.from_numpy(rgb).permute(0, 3, 1, 2))  # an opaque alpha dropped
    assert masks[0].sum() == 0 and torch.equal(masks[1, 0], torch.from_numpy(mask // 255))
    # a half-transparent image: trained on with its alpha dropped, refused by capsnet predict (a review, 2026-11-30)
    _save(tmp_path / "im" / "y.png", np.concatenate([rgb[1], np.full((9, 7, 1), 128, np.uint8)], -1))
    with pytest.raises(DataError, match=r"image .*y\.png has transparent pixels \(100% of them\); an image is read "
                                        r"by its values, not its alpha"):
        load_mask_folder(tmp_path / "im", tmp_path / "mk")


def test_palette_images_that_share_a_palette_read_alike_whatever_colours_each_uses(tmp_path):
    """A file of a colour palette that used only its grey entries read as grey, its siblings as RGB, and the folder
    was refused as of mixed modes (a review, 2026-11-30)."""
    palette = [0, 0, 0, 128, 128, 128, 255, 255, 255, 255, 0, 0]  # black, grey, white, red
    rng = np.random.default_rng(2)
    for name, top in (("a", 4), ("b", 3)):  # b uses no red
        index = rng.integers(0, top, (8, 8), dtype=np.uint8)
        img = Image.fromarray(index, "P")
        img.putpalette(palette)
        (tmp_path / "im").mkdir(exist_ok=True)
        img.save(tmp_path / "im" / f"{name}.png")
        _save(tmp_path / "mk" / f"{name}.png", np.eye(8, dtype=np.uint8))
    images, _, _ = load_mask_folder(tmp_path / "im", tmp_path / "mk")
    assert images.shape == (2, 3, 8, 8)
    look = np.array(palette, np.uint8).reshape(4, 3)
    for k, name in enumerate("ab"):
        index = np.asarray(Image.open(tmp_path / "im" / f"{name}.png"))
        assert np.array_equal(images[k].permute(1, 2, 0).numpy(), look[index])
    grey = Image.fromarray(rng.integers(0, 256, (8, 8), dtype=np.uint8)).convert("P")  # a palette of greys only
    grey.save(tmp_path / "im" / "a.png")
    grey.save(tmp_path / "im" / "b.png")
    assert load_mask_folder(tmp_path / "im", tmp_path / "mk")[0].shape == (2, 1, 8, 8)


def test_an_image_is_refused_as_16_bit_colour_or_too_large_in_words_about_images(tmp_path, monkeypatch):
    """The 16-bit refusal spoke of label maps for images too; a file past Pillow's pixel cap was called unreadable,
    with 're-save it as PNG' for its fix (a review, 2026-11-30)."""
    from PIL import Image as PILImage

    from capsnet.data.png import image_array, label_map_array

    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return len(body).to_bytes(4, "big") + kind + body + zlib.crc32(kind + body).to_bytes(4, "big")
    path = tmp_path / "deep.png"  # 4x4 16-bit RGB, written by hand (Pillow writes RGB as 8-bit)
    raw = b"".join(b"\0" + bytes(4 * 6) for _ in range(4))  # 4 rows of 4 pixels of 3 x 2 bytes, filter 0
    ihdr = (4).to_bytes(4, "big") * 2 + bytes([16, 2, 0, 0, 0])  # width, height, depth 16, colour type 2 (RGB)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw))
                     + chunk(b"IEND", b""))
    with pytest.raises(DataError, match=r"is a 16-bit RGB PNG, which reads as the high byte of each value \(an image "
                                        r"whose values are all below 256 would read as empty\)"):
        image_array(path)
    with pytest.raises(DataError, match=r"\(a 0/1 label map would read as empty\)"):
        label_map_array(path)
    monkeypatch.setattr(PILImage, "MAX_IMAGE_PIXELS", 4)  # a 16-pixel file is then over twice the cap
    _save(tmp_path / "big.png", np.zeros((4, 4), np.uint8))
    with pytest.raises(DataError, match=r"big\.png is too large to read safely \(.*\); scale it down or crop it"):
        image_array(tmp_path / "big.png")


def _break(root, case):
    im, mk = root / "images", root / "masks"
    if case == "no folder":
        return root / "nowhere", mk, "nowhere"
    if case == "a file for a folder":
        (root / "list.txt").write_text("a.png\n")
        return root / "list.txt", mk, "list.txt"
    if case == "no png":
        (root / "empty").mkdir()
        (root / "empty" / "notes.jpg").write_bytes(b"x")
        return root / "empty", mk, "notes.jpg"
    if case == "image without mask":
        _save(im / "d.png", np.zeros((12, 10), np.uint8))
        return im, mk, "d.png"
    if case == "mask without image":
        _save(mk / "e.png", np.zeros((12, 10), np.uint8))
        return im, mk, "e.png"
    if case == "not a png":
        (im / "a.png").write_bytes(b"this is not an image")
        return im, mk, "a.png"
    if case == "jpeg named png":
        Image.fromarray(np.zeros((12, 10), np.uint8)).save(im / "a.png", format="JPEG")
        return im, mk, "JPEG"
    if case == "sizes of a pair":
        _save(mk / "b.png", np.zeros((11, 10), np.uint8))
        return im, mk, "b.png"
    if case == "sizes of images":
        _save(im / "b.png", np.zeros((13, 10), np.uint8))
        _save(mk / "b.png", np.zeros((13, 10), np.uint8))
        return im, mk, "b.png"
    if case == "gray and rgb":
        _save(im / "b.png", np.zeros((12, 10, 3), np.uint8))
        return im, mk, "RGB"
    if case == "mask values":
        _save(mk / "c.png", np.array([[0, 128, 255] * 4] * 10, np.uint8).T[:12, :10].copy())
        return im, mk, "128"
    if case == "mask 1 and 255":
        _save(mk / "c.png", np.array([[0, 1, 255, 0, 1] * 2] * 12, np.uint8))
        return im, mk, "c.png"
    if case == "colour mask":
        _save(mk / "a.png", np.stack([np.zeros((12, 10), np.uint8)] * 2 + [np.full((12, 10), 255, np.uint8)], -1))
        return im, mk, "colour"
    if case == "16-bit image":
        Image.fromarray(np.zeros((12, 10), np.uint16)).save(im / "a.png")
        return im, mk, "has mode 'I"  # I;16 (Pillow 10.3 on) or I (before)
    raise AssertionError(case)


REASONS = {  # what each message says is wrong, beside the file it names
    "no folder": "does not exist; create it", "a file for a folder": "is a file, not a folder", "no png": "no PNG files in", "image without mask": "images with no mask",
    "mask without image": "masks with no image", "not a png": "is not a readable PNG image",
    "jpeg named png": "is a JPEG file, not a PNG", "sizes of a pair": "a mask must match its image pixel for pixel",
    "sizes of images": "images must all be one size", "gray and rgb": "convert all images to one mode",
    "mask values": "holds values [128]; masks must be binary", "mask 1 and 255": "mixes 1 and 255",
    "colour mask": "is in colour (its RGB channels differ)", "16-bit image": "(16/32-bit); save it as an 8-bit",
}
CASES = list(REASONS)


@pytest.mark.parametrize("case", CASES)
def test_folder_errors_name_the_file(folder, case):
    images_dir, masks_dir, named = _break(folder[0], case)
    with pytest.raises(DataError) as err:
        load_mask_folder(images_dir, masks_dir)
    assert named in str(err.value) and REASONS[case] in str(err.value)


def test_folder_lists_unpaired_files_with_counts(folder):
    root = folder[0]
    for i in range(7):
        _save(root / "images" / f"z{i}.png", np.zeros((12, 10), np.uint8))
    with pytest.raises(DataError) as err:
        load_mask_folder(root / "images", root / "masks")
    msg = str(err.value)
    assert "7 in" in msg and "z4.png" in msg and "z5.png" not in msg and "same file name" in msg


def test_a_palette_mask_is_read_by_its_indices(tmp_path):
    """Many segmentation data sets store masks as palette PNGs whose indices are the classes (index 1 drawn in some
    colour). Before: converted to RGB through the palette and refused as 'in colour'."""
    from PIL import Image

    rng = np.random.default_rng(2)
    _save(tmp_path / "im" / "a.png", rng.integers(0, 256, (6, 5), dtype=np.uint8))
    _save(tmp_path / "im" / "b.png", rng.integers(0, 256, (6, 5), dtype=np.uint8))
    truth = (rng.random((2, 6, 5)) < 0.5).astype(np.uint8)
    for name, index, scale in (("a", 0, 1), ("b", 1, 255)):  # indices 0/1 and 0/255
        p = Image.fromarray(truth[index] * np.uint8(scale), mode="P")
        p.putpalette([0, 0, 0, 200, 30, 30] + [0, 0, 0] * 253 + [250, 250, 0])  # 1: red, 255: yellow
        (tmp_path / "mk").mkdir(exist_ok=True)
        p.save(tmp_path / "mk" / f"{name}.png")
    _, masks, _ = load_mask_folder(tmp_path / "im", tmp_path / "mk")
    assert torch.equal(masks[:, 0], torch.from_numpy(truth))
    for palette in ([30, 200, 30, 200, 30, 30], [0, 0, 0, 128, 128, 128]):  # index 0 green; index 1 mid-grey
        p = Image.fromarray(truth[0], mode="P")  # read by the indices too (they were refused: colour; value 128)
        p.putpalette(palette + [0, 0, 0] * 254)
        p.save(tmp_path / "mk" / "a.png")
        _, masks, _ = load_mask_folder(tmp_path / "im", tmp_path / "mk")
        assert torch.equal(masks[0, 0], torch.from_numpy(truth[0]))
    # a grey palette whose index 0 is white: the indices and the greys disagree on the foreground (it was read by
    # its greys, inverting a mask stored by index): refused, naming both
    grey = Image.fromarray(truth[0], mode="P")
    grey.putpalette([255, 255, 255, 0, 0, 0] + [0, 0, 0] * 254)
    grey.save(tmp_path / "mk" / "a.png")
    with pytest.raises(DataError, match=r"a.png is a palette image whose index 0 is lighter \(grey 255\) than its "
                                        r"index 1 \(grey 0\)"):
        load_mask_folder(tmp_path / "im", tmp_path / "mk")
    # index 15 (a VOC class) in colour: it was refused as "in colour; save it as a grayscale (L) PNG", and saved so
    # (grey 38) refused for its values; the indices and their fix are named
    p = Image.fromarray(truth[0] * np.uint8(15), mode="P")
    p.putpalette([0, 0, 0] * 15 + [192, 128, 128] + [0, 0, 0] * 240)
    p.save(tmp_path / "mk" / "a.png")
    with pytest.raises(DataError, match=r"a.png is a palette image in colour whose indices are 0 and 15; capsnet "
                                        r"reads a colour palette mask by its indices, 0/1 or 0/255 with index 0 the "
                                        r"background: remap index 15 to 1 \(or 255\), or save it as an 8-bit "
                                        r"grayscale PNG, the foreground 255 and the background 0$"):
        load_mask_folder(tmp_path / "im", tmp_path / "mk")
    colours = [v for i in range(256) for v in (i, 0, 255 - i)]  # every entry a colour
    p = Image.fromarray(truth[0] * np.uint8(15) + np.uint8(1), mode="P")  # indices 1 and 16: no 0 among them
    p.putpalette(colours)
    p.save(tmp_path / "mk" / "a.png")
    with pytest.raises(DataError, match=r"whose indices are 1 and 16; .*: remap the background's index to 0 and the "
                                        r"object's to 1, or save it"):
        load_mask_folder(tmp_path / "im", tmp_path / "mk")
    p = Image.fromarray(np.arange(30, dtype=np.uint8).reshape(6, 5) % 7, mode="P")  # 7 indices: the first 5 named
    p.putpalette(colours)
    p.save(tmp_path / "mk" / "a.png")
    with pytest.raises(DataError, match=r"whose indices are 0, 1, 2, 3, 4 ... \(7 in all\); .*: remap the "
                                        r"object's indices to 1 and every other index to 0, or save it"):
        load_mask_folder(tmp_path / "im", tmp_path / "mk")
    p = Image.fromarray(truth[0] * np.uint8(15), mode="P")  # indices 0 and 15 of greys: read by the greys
    p.putpalette([0, 0, 0] * 15 + [255, 255, 255] + [0, 0, 0] * 240)
    p.save(tmp_path / "mk" / "a.png")
    _, masks, _ = load_mask_folder(tmp_path / "im", tmp_path / "mk")
    assert torch.equal(masks[0, 0], torch.from_numpy(truth[0]))


def test_a_non_binary_masks_advice_keeps_its_objects(tmp_path):
    """A mask of 0 and one grey (a class value exported as grey, 0/100) was told to threshold at 127, which made it
    all 0; class values (0/1/2/3) and mixed scales (0/1/255) likewise. The midpoint is advised for an antialiased
    edge alone: several greys on fewer pixels than the foreground."""
    _save(tmp_path / "im" / "a.png", np.zeros((8, 8), np.uint8))
    one = np.zeros((8, 8), np.uint8)
    one[2:6, 2:6] = 100
    classes = np.repeat(np.arange(4, dtype=np.uint8), 2)[:, None].repeat(8, 1)  # rows of 0, 1, 2, 3
    mixed = np.repeat(np.array([0, 1, 255], np.uint8), 3)[:8, None].repeat(8, 1)
    edged = np.zeros((8, 8), np.uint8)
    edged[1:7, 1:7] = 255
    edged[1, 1:4] = (60, 128, 200)
    for mask, told in (
            (one, r"holds values \[100\]; masks must be binary, 0/1 or 0/255: make its one value other than 0 the "
                  r"foreground \(for example value == 100 -> 255\) and save it again"),
            (classes, r"holds values \[2, 3\]; masks must be binary, 0/1 or 0/255: make the object's values 255 and "
                      r"the rest 0 \(for example value > 0 -> 255 to keep 1, 2 and 3 as the foreground, or value == 1 "
                      r"-> 255 to keep one class alone\) and save it again"),
            (mixed, r"mixes 1 and 255; masks must be binary, 0/1 or 0/255: make the object's values 255 and the rest "
                    r"0 \(for example value > 0 -> 255 to keep 1 and 255 as the foreground"),
            (edged, r"holds values \[60, 128, 200\]; masks must be binary, 0/1 or 0/255: threshold it \(for example "
                    r"value > 127 -> 255\) and save it again")):
        _save(tmp_path / "mk" / "a.png", mask)
        with pytest.raises(DataError, match=r"a.png " + told):
            load_mask_folder(tmp_path / "im", tmp_path / "mk")


def test_a_pair_whose_files_differ_in_exif_orientation_is_refused(tmp_path):
    """Each file is turned by its own EXIF orientation: a square image with orientation 6 over a mask with none was
    read rotated over the unrotated mask without a word, and a 48x32 pair of the same kind was refused as '48x32 but
    its mask is 32x48', sizes neither file has on disk. The same orientation on both lines them up."""
    rng = np.random.default_rng(6)
    for size in ((8, 8), (48, 32)):
        truth = (rng.random(size) < 0.5).astype(np.uint8)
        exif = Image.Exif()
        exif[0x0112] = 6  # shown turned 90 degrees clockwise
        (tmp_path / "im").mkdir(exist_ok=True)
        Image.fromarray(truth * np.uint8(200)).save(tmp_path / "im" / "a.png", exif=exif)
        _save(tmp_path / "mk" / "a.png", truth * np.uint8(255))
        with pytest.raises(DataError, match=r"image .*im/a.png has EXIF orientation 6 \(shown turned 90 degrees "
                                            r"clockwise\) but its mask .*mk/a.png has no EXIF orientation; each file "
                                            r"is turned as viewers show it, so the two would not line up pixel for "
                                            r"pixel: save both as they are displayed, without EXIF orientation$"):
            load_mask_folder(tmp_path / "im", tmp_path / "mk")
        Image.fromarray(truth * np.uint8(255)).save(tmp_path / "mk" / "a.png", exif=exif)
        images, masks, _ = load_mask_folder(tmp_path / "im", tmp_path / "mk")
        assert torch.equal(masks[0, 0], torch.from_numpy(np.rot90(truth, -1).copy()))  # both turned alike
        assert torch.equal(images[0, 0] > 0, masks[0, 0] > 0)


def test_a_mask_with_transparent_pixels_is_refused_and_an_opaque_alpha_is_read(tmp_path):
    """An alpha channel was dropped: a shape drawn in transparency alone read as an empty mask (one among many: no
    word), white shapes on transparent white as all foreground."""
    from PIL import Image

    rng = np.random.default_rng(4)
    _save(tmp_path / "im" / "a.png", rng.integers(0, 256, (6, 5), dtype=np.uint8))
    truth = (rng.random((6, 5)) < 0.5).astype(np.uint8)
    (tmp_path / "mk").mkdir()
    opaque = np.stack([truth * 255, np.full_like(truth, 255)], -1)
    Image.fromarray(opaque, "LA").save(tmp_path / "mk" / "a.png")
    _, masks, _ = load_mask_folder(tmp_path / "im", tmp_path / "mk")
    assert torch.equal(masks[0, 0], torch.from_numpy(truth))
    drawn_in_alpha = np.stack([np.zeros_like(truth)] * 3 + [truth * 255], -1)
    Image.fromarray(drawn_in_alpha, "RGBA").save(tmp_path / "mk" / "a.png")
    with pytest.raises(DataError, match="a.png has transparent pixels; a mask is read by its values, not its alpha"):
        load_mask_folder(tmp_path / "im", tmp_path / "mk")


def test_a_folder_whose_masks_are_all_empty_is_refused_and_one_empty_mask_is_not(folder):
    """Every mask empty trained to test Dice 1.0000 (nothing predicted, nothing to find): a perfect-looking model."""
    root = folder[0]
    images, masks, names = load_mask_folder(root / "images", root / "masks")
    assert masks.any()
    for name in names:  # the same folder, every mask blanked
        _save(root / "masks" / f"{name}.png", np.zeros(tuple(masks.shape[-2:]), np.uint8))
    with pytest.raises(DataError, match=r"every mask in .*masks is empty \(all 0\): there is nothing to segment"):
        load_mask_folder(root / "images", root / "masks")
    mask = np.zeros(tuple(masks.shape[-2:]), np.uint8)
    mask[1:3, 1:3] = 255
    _save(root / "masks" / f"{names[0]}.png", mask)  # one object in one mask: a folder to learn from
    assert int(load_mask_folder(root / "images", root / "masks")[1].sum()) == 4


def test_broken_links_subfolders_and_a_subfolder_given_as_the_data_set_are_named(tmp_path):
    """A link to nothing was skipped without a word (its pair then 'unpaired', or the set one smaller); PNG files in
    a subfolder were not mentioned; folder:DIR/images asked to create DIR/images/images."""
    from capsnet.data.tasks import load_folder

    rng = np.random.default_rng(6)
    for name in ("a", "b"):
        _save(tmp_path / "d" / "images" / f"{name}.png", rng.integers(0, 256, (6, 5), dtype=np.uint8))
        _save(tmp_path / "d" / "masks" / f"{name}.png", (rng.random((6, 5)) < 0.5).astype(np.uint8) * 255)
    (tmp_path / "d" / "images" / "c.png").symlink_to(tmp_path / "nowhere.png")
    (tmp_path / "d" / "masks" / "c.png").symlink_to(tmp_path / "nowhere.png")
    with pytest.raises(DataError, match=r"images holds 1 link\(s\) to nothing: c.png; point them at their files"):
        load_mask_folder(tmp_path / "d" / "images", tmp_path / "d" / "masks")
    with pytest.raises(DataError, match=r"d/images looks like one of the data set's two folders: give the folder "
                                        r"above it, .*/d$"):
        load_folder(tmp_path / "d" / "images", "train")
    # Images/ and Masks/ (a review, 2026-12-01: "create it" for a folder there under another case), and the other
    # kind of user folder (labels/ beside images/: pairs:DIR's)
    for sub in ("Images", "Masks"):
        (tmp_path / "c" / sub).mkdir(parents=True)
    with pytest.raises(DataError, match=r"images folder .*c/images does not exist, but Images/ does: rename it "
                                        r"images/ \(capsnet reads the lower-case names"):
        load_folder(tmp_path / "c", "train")
    for sub in ("images", "labels"):
        _save(tmp_path / "p" / sub / "a.png", np.zeros((8, 8), np.uint8))
    with pytest.raises(DataError, match=r"masks folder .*p/masks does not exist; .*p holds labels/, the layout of "
                                        r"synthesis pairs \(labels/ and images/\): give --dataset pairs:.*p$"):
        load_folder(tmp_path / "p", "train")
    nested = tmp_path / "n" / "images" / "part1"
    _save(tmp_path / "n" / "images" / "__MACOSX" / "._a.png", np.zeros((6, 5), np.uint8))  # a Mac zip's metadata
    (tmp_path / "n" / "masks").mkdir()
    with pytest.raises(DataError, match=r"no PNG files in .*n/images; put the images there"):  # named __MACOSX/
        load_mask_folder(tmp_path / "n" / "images", tmp_path / "n" / "masks")
    _save(nested / "a.png", rng.integers(0, 256, (6, 5), dtype=np.uint8))
    with pytest.raises(DataError, match=r"no PNG files in .*n/images \(the PNG files in its subfolder part1/ are not "
                                        r"read: put them in .*n/images itself\)"):
        load_mask_folder(tmp_path / "n" / "images", tmp_path / "n" / "masks")


def test_unpaired_files_are_listed_by_their_own_names_and_unicode_forms_pair(tmp_path):
    """An unpaired img.PNG was listed as img.png; 'café' written composed beside decomposed was listed twice as
    unpaired, under names that look alike."""
    import unicodedata

    rng = np.random.default_rng(7)
    composed, decomposed = unicodedata.normalize("NFC", "café"), unicodedata.normalize("NFD", "café")
    _save(tmp_path / "im" / f"{composed}.png", rng.integers(0, 256, (6, 5), dtype=np.uint8))
    _save(tmp_path / "mk" / f"{decomposed}.png", (rng.random((6, 5)) < 0.5).astype(np.uint8) * 255)
    images, masks, names = load_mask_folder(tmp_path / "im", tmp_path / "mk")
    assert names == [composed] and images.shape[0] == masks.shape[0] == 1
    _save(tmp_path / "im" / "Lonely.PNG", rng.integers(0, 256, (6, 5), dtype=np.uint8))
    with pytest.raises(DataError, match=r"images with no mask: 1 in .*im \(Lonely\.PNG\)"):
        load_mask_folder(tmp_path / "im", tmp_path / "mk")


def test_a_palette_image_of_greys_is_a_grey_image():
    """A grey palette PNG among grey PNGs was read as RGB and refused as '3 channels' beside them."""
    import tempfile
    from pathlib import Path

    from PIL import Image

    from capsnet.data.png import image_array

    rng = np.random.default_rng(8)
    grey = rng.integers(0, 256, (6, 5), dtype=np.uint8)
    with tempfile.TemporaryDirectory() as d:
        p = Image.fromarray(grey, mode="P")  # index g drawn as grey g
        p.putpalette([v for g in range(256) for v in (g, g, g)])
        p.save(Path(d) / "g.png")
        a = image_array(Path(d) / "g.png")
        assert a.shape == (1, 6, 5) and np.array_equal(a[0], grey)
        coloured = Image.fromarray(grey % 2, mode="P")
        coloured.putpalette([0, 0, 0, 200, 30, 30] + [0, 0, 0] * 254)
        coloured.save(Path(d) / "c.png")
        assert image_array(Path(d) / "c.png").shape == (3, 6, 5)  # a coloured palette stays RGB


def test_a_16_bit_mask_is_read_by_its_values_and_a_non_binary_one_is_refused(tmp_path):
    """Medical masks are often 16-bit grey (Pillow's I;16); they were refused with "save it as 8-bit". Binary ones
    (0/1, 0/255, 0/65535) are read; others are refused naming their values, as 8-bit ones are."""
    rng = np.random.default_rng(5)
    _save(tmp_path / "im" / "a.png", rng.integers(0, 256, (6, 5), dtype=np.uint8))
    truth = (rng.random((6, 5)) < 0.5).astype(np.uint16)
    for on in (1, 255, 65535):
        _save(tmp_path / "mk" / "a.png", truth * np.uint16(on))
        assert Image.open(tmp_path / "mk" / "a.png").mode in ("I;16", "I")  # I before Pillow 10.3
        _, masks, _ = load_mask_folder(tmp_path / "im", tmp_path / "mk")
        assert masks.dtype == torch.uint8 and torch.equal(masks[0, 0], torch.from_numpy(truth.astype(np.uint8)))
    graded = truth * np.uint16(1000)
    _save(tmp_path / "mk" / "a.png", graded)
    with pytest.raises(DataError, match=r"a.png holds values \[1000\]; masks must be binary, 0/1, 0/255 or 0/65535 "
                                        r"\(16-bit\): make its one value other than 0 the foreground \(for example "
                                        r"value == 1000 -> 65535\) and save it again"):
        load_mask_folder(tmp_path / "im", tmp_path / "mk")
    blurred = truth * np.uint16(65535)  # an antialiased edge: a few greys on fewer pixels than the foreground
    blurred.flat[np.flatnonzero(truth)[:3]] = (20000, 40000, 50000)
    _save(tmp_path / "mk" / "a.png", blurred)
    with pytest.raises(DataError, match=r"a.png holds values \[20000, 40000, 50000\]; masks must be binary, 0/1, 0/255 "
                                        r"or 0/65535 \(16-bit\): threshold it \(for example value > 32767 -> 65535\)"):
        load_mask_folder(tmp_path / "im", tmp_path / "mk")
    mixed = truth * np.uint16(65535)
    mixed[truth == 0] = 0
    mixed.flat[np.flatnonzero(truth)[0]] = 255  # one pixel 255 among 65535s
    _save(tmp_path / "mk" / "a.png", mixed)
    with pytest.raises(DataError, match="a.png mixes 255 and 65535"):
        load_mask_folder(tmp_path / "im", tmp_path / "mk")


def _write_png(path, array: np.ndarray, color_type: int) -> None:
    """A PNG written byte by byte (Pillow cannot write 16-bit colour): big-endian 16-bit samples, filter 0 rows."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    h, w = array.shape[:2]
    rows = b"".join(b"\0" + array[y].astype(">u2").tobytes() for y in range(h))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, color_type, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


@pytest.mark.parametrize("color_type,channels", [(2, 3), (4, 2), (6, 4)])  # RGB, grey + alpha, RGBA
def test_a_16_bit_colour_or_alpha_mask_is_refused_rather_than_read_as_its_high_bytes(tmp_path, color_type, channels):
    """Pillow loads these as 8-bit, keeping each value's high byte: a 0/1 mask read as all background, silently."""
    rng = np.random.default_rng(6)
    _save(tmp_path / "im" / "a.png", rng.integers(0, 256, (6, 5), dtype=np.uint8))
    truth = (rng.random((6, 5)) < 0.5).astype(np.uint16)
    planes = [truth] * (channels - 1 if channels in (2, 4) else channels)
    planes += [np.full_like(truth, 65535)] if channels in (2, 4) else []  # opaque alpha
    _write_png(tmp_path / "mk" / "a.png", np.stack(planes, axis=-1), color_type)
    assert Image.open(tmp_path / "mk" / "a.png").mode in ("RGB", "LA", "RGBA")  # what Pillow makes of it
    with pytest.raises(DataError, match=r"a.png is a 16-bit (RGB|LA|RGBA) PNG, which reads as the high byte of each "
                                        r"value \(a 0/1 mask would read as empty\); save it as 8-bit grayscale"):
        load_mask_folder(tmp_path / "im", tmp_path / "mk")
    from capsnet.data.png import image_array
    with pytest.raises(DataError, match=r"a.png is a 16-bit (RGB|LA|RGBA) PNG, which reads as the high byte"):
        image_array(tmp_path / "mk" / "a.png")  # an image or a label map: the same refusal
    _write_png(tmp_path / "mk" / "a.png", truth * np.uint16(255), 0)  # 16-bit grey, the same mask: read
    _, masks, _ = load_mask_folder(tmp_path / "im", tmp_path / "mk")
    assert torch.equal(masks[0, 0], torch.from_numpy(truth.astype(np.uint8)))


def test_a_changed_folder_is_read_afresh_and_its_old_copy_let_go(tmp_path, mask_pairs):
    """A file rewritten is seen on the next read; the copy read before is dropped, where a cache keyed by the
    folder's stamp kept up to four whole stale copies of one folder (4.9 GB after five edits of 3,000 pairs)."""
    import os
    import time

    from capsnet.data import tasks

    mask_pairs(tmp_path / "d", 6)
    name = f"folder:{tmp_path / 'd'}"
    first = tasks.load_test(name, progress=False)
    for k in range(3):
        image = tmp_path / "d" / "images" / "p00.png"
        os.utime(image, ns=(time.time_ns(), time.time_ns() + (k + 1) * 10**9))  # rewritten, as far as a stamp knows
        again = tasks.load_test(name, progress=False)
        assert torch.equal(again.images, first.images)  # the same pixels, read afresh
    held = [key for key in tasks._FOLDERS.items if str(tmp_path / "d") in key[1]]
    assert len(held) == 1 and len([k for k in tasks._BOTH_SPLITS.items if str(tmp_path / "d") in k[0]]) == 1


def test_placement_uniforms_span_the_whole_unit_interval():
    """Found by mutation testing (2026-11-30): placement uniforms drawn from [0.25, 0.75) (targets kept to the middle
    half of their range) passed every test. Of 4,000 draws of each axis the least must lie within 0.01 of 0 and the
    largest within 0.01 of 1 (a miss has probability 0.99^4000, about 4e-18)."""
    draw = draw_canvases(4000, 100, torch.Generator().manual_seed(12), rule=CLEAN)
    for axis in (0, 1):
        assert draw.place[:, axis].min() < 0.01 and draw.place[:, axis].max() > 0.99


def test_with_two_digits_every_fragment_comes_from_the_other_one():
    """Found by mutation testing (2026-11-30): fragment source offsets drawn from 0..N-1 (offset 0 cuts the fragment
    from the target itself) passed, as the old test's pool of 2,000 rarely drew 0. With a pool of two digits the
    only offset that names the other digit is 1."""
    draw = draw_canvases(500, 2, torch.Generator().manual_seed(13), rule=IN_DISTRIBUTION)
    assert draw.source_offset.shape == (500, IN_DISTRIBUTION.fragments[1])
    assert (draw.source_offset == 1).all()


def test_a_target_placed_at_either_end_of_its_range_stays_one_pixel_inside_the_canvas(pool):
    """Found by mutation testing (2026-11-30): the least position lacking its 1 px margin (``lo = -half - min``)
    passed every test, though it puts a target placed at 0 on the canvas's first row and column. Unturned and
    unscaled, a target placed at 0 (or 1) has its ink box's top-left (bottom-right) pixel at (1, 1) (at
    (side - 2, side - 2)), its mask the digit's pixels above half intensity; turned and scaled as drawn, its mask
    never reaches the outermost rows and columns."""
    digits = pool[:300]
    still = dataclasses.replace(CLEAN, rotation_deg=0.0, scale=(1.0, 1.0))
    draw = draw_canvases(300, len(digits), torch.Generator().manual_seed(14), rule=still)
    for end in (0.0, 1.0):
        at_end = dataclasses.replace(draw, place=torch.full_like(draw.place, end))
        _, masks = render_canvases(digits, torch.arange(300), at_end, rule=still)
        for k in range(0, 300, 7):
            d = digits[k, 0]
            rows, cols = d.any(1).nonzero().flatten(), d.any(0).nonzero().flatten()  # the ink box, any ink at all
            t, l, h, w = int(rows[0]), int(cols[0]), int(rows[-1] - rows[0] + 1), int(cols[-1] - cols[0] + 1)
            top, left = (1, 1) if end == 0 else (CANVAS - 1 - h, CANVAS - 1 - w)
            want = torch.zeros(CANVAS, CANVAS, dtype=torch.uint8)
            want[top:top + h, left:left + w] = (d[t:t + h, l:l + w] > 127).to(torch.uint8)
            assert torch.equal(masks[k, 0], want), k
    draw = draw_canvases(300, len(digits), torch.Generator().manual_seed(14), rule=CLEAN)  # turned and scaled
    for end in (0.0, 1.0):
        at_end = dataclasses.replace(draw, place=torch.full_like(draw.place, end))
        _, masks = render_canvases(digits, torch.arange(300), at_end, rule=CLEAN)
        m = masks[:, 0].bool()
        assert not (m[:, 0].any() or m[:, -1].any() or m[:, :, 0].any() or m[:, :, -1].any())


def test_the_targets_turn_both_ways_over_the_rules_whole_range():
    """The rule's rotation is drawn from -rotation_deg..rotation_deg: targets drawn turning one way only passed every
    test (mutation testing, 2026-12-01). 2,000 draws spread over the whole range, about half each way."""
    draw = draw_canvases(2000, 10, torch.Generator().manual_seed(0))
    rot = draw.rotation_deg
    assert rot.min() < -29 and rot.max() > 29 and rot.abs().max() <= IN_DISTRIBUTION.rotation_deg
    assert 0.45 < (rot < 0).double().mean() < 0.55


def test_a_lower_mask_threshold_takes_more_of_the_targets_pixels():
    """CanvasRule.threshold decides which of the transformed target's pixels are the mask: a canvas drawn with
    0.2 has a mask holding the default 0.5's and more (a mask ignoring the rule passed: mutation testing)."""
    digits = load_dataset("mnist-sample", "test").images[:20].float() / 255
    images, default = make_canvases(digits, torch.arange(5), torch.Generator().manual_seed(0))
    _, low = make_canvases(digits, torch.arange(5), torch.Generator().manual_seed(0),
                           rule=dataclasses.replace(IN_DISTRIBUTION, threshold=0.2))
    assert torch.equal(low | default, low) and (low.sum((1, 2, 3)) > default.sum((1, 2, 3))).all()
