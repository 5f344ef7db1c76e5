"""Label maps for synthesis: skeletons and silhouettes against hand-checked cases and real digits, the
mnist-skeleton and fashion-silhouette tasks, and the user's pairs of label maps and images."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from capsnet.data import DataError, load_dataset
from capsnet.data.sets import unit_float
from capsnet.data.synthesis import load_pair_folder, pad_to, silhouette, skeletonize
from capsnet.data.tasks import held_out_names, input_shape, load_test, load_training, task


def grid(rows: list[str]) -> torch.Tensor:
    """A picture drawn in text ('#' ink, '.' background) as (1, 1, H, W) float."""
    return torch.tensor([[c == "#" for c in r] for r in rows], dtype=torch.float32)[None, None]


def components(x: torch.Tensor) -> int:
    """8-connected components of a (H, W) 0/1 tensor, by a plain flood fill."""
    a = x.bool().tolist()
    H, W = len(a), len(a[0])
    seen, n = set(), 0
    for r in range(H):
        for c in range(W):
            if a[r][c] and (r, c) not in seen:
                n += 1
                stack = [(r, c)]
                seen.add((r, c))
                while stack:
                    y, x_ = stack.pop()
                    for dy in (-1, 0, 1):
                        for dx in (-1, 0, 1):
                            q = (y + dy, x_ + dx)
                            if 0 <= q[0] < H and 0 <= q[1] < W and a[q[0]][q[1]] and q not in seen:
                                seen.add(q)
                                stack.append(q)
    return n


def test_skeleton_of_a_3x3_square_is_its_centre():
    # worked by hand through Zhang and Suen's two sub-iterations: the corners and the right and bottom edges go in
    # the first, the top and left edges in the second; the centre, with two neighbours in two runs, stays
    square = grid([".....", ".###.", ".###.", ".###.", "....."])
    assert skeletonize(square)[0, 0].tolist() == grid([".....", ".....", "..#..", ".....", "....."])[0, 0].int().tolist()


def test_thin_shapes_are_left_alone_and_a_bar_thins_to_its_middle_row():
    for thin in (grid(["......", ".####.", "......"]), grid(["#....", ".#...", "..#..", "...#."]),
                 grid([".#...", ".#...", ".###."])):
        assert torch.equal(skeletonize(thin), thin.to(torch.uint8))
    bar = grid(["..........", ".########.", ".########.", ".########.", ".........."])
    s = skeletonize(bar)[0, 0]
    assert s[[0, 1, 3, 4]].sum() == 0 and s[2].sum() >= 4  # one pixel wide, on the middle row, most of its length


def test_skeletons_of_real_digits_are_thin_inside_the_ink_and_keep_its_pieces(data_root):
    digits = load_dataset("mnist", "test", root=data_root).images[:300]
    ink = digits[:, 0] > 127
    s = skeletonize(digits)[:, 0].bool()
    assert not (s & ~ink).any()  # only ink
    assert s.sum() < 0.45 * ink.sum()  # far thinner than the strokes
    block = (s[:, :-1, :-1] & s[:, 1:, :-1] & s[:, :-1, 1:] & s[:, 1:, 1:]).flatten(1).any(1)
    assert block.float().mean() < 0.06  # a 2x2 knot is Zhang-Suen's known leftover, on few digits
    same = [components(s[k]) == components(ink[k]) for k in range(60)]
    assert sum(same) >= 57  # pieces kept (a 2x2 blob may vanish whole, the algorithm's known flaw)
    assert torch.equal(skeletonize(digits.float() / 255), skeletonize(digits).to(torch.uint8))  # either input type


def test_silhouette_fills_enclosed_background_only():
    ring = grid([".......", ".#####.", ".#...#.", ".#...#.", ".#####.", "......."])
    filled = grid([".......", ".#####.", ".#####.", ".#####.", ".#####.", "......."])
    assert torch.equal(silhouette(ring), filled.to(torch.uint8))
    open_ring = grid([".......", ".#####.", ".#...#.", ".#.....", ".#####.", "......."])  # a gap: the inside leaks
    assert torch.equal(silhouette(open_ring), open_ring.to(torch.uint8))
    diamond = grid([".....", "..#..", ".#.#.", "..#..", "....."])  # closed diagonally: 4-connected fill stays out
    assert silhouette(diamond)[0, 0, 2, 2] == 1
    touching = grid(["###", "#.#", "###"])  # a hole against no border is filled even when the shape fills the frame
    assert silhouette(touching).all()


def test_silhouettes_of_real_items_cover_the_ink_and_fill_it(data_root):
    items = load_dataset("fashion-mnist", "test", root=data_root).images[:200]
    m = silhouette(items)[:, 0].bool()
    ink = items[:, 0] > 0.05 * 255
    assert (m | ~ink).all()  # every item pixel is inside
    holes = m & ~ink
    assert holes.any() and holes.sum() < 0.2 * m.sum()  # some enclosed background filled, not most of the mask


def test_pad_to_centres():
    x = torch.arange(28 * 28, dtype=torch.float32).view(1, 1, 28, 28)
    y = pad_to(x, 32)
    assert y.shape == (1, 1, 32, 32) and torch.equal(y[..., 2:30, 2:30], x) and y[..., :2, :].sum() == 0
    assert pad_to(torch.ones(1, 3, 5, 6), 8)[0, 0].nonzero().min(0).values.tolist() == [1, 1]
    with pytest.raises(ValueError, match="do not fit a 16x16 frame"):
        pad_to(x, 16)


def test_the_synthesis_tasks_pair_label_maps_with_their_images(data_root):
    assert task("mnist-skeleton").kind == "synthesis" and input_shape("fashion-silhouette") == (1, 32, 32)
    test = load_test("mnist-skeleton", size=16, root=data_root, progress=False)
    digits = load_dataset("mnist", "test", root=data_root)
    assert torch.equal(test.labels, digits.labels[:16])  # the classes come along, in order
    assert torch.equal(test.components, pad_to(digits.images[:16].float() / 255, 32))
    assert torch.equal(test.images, pad_to(skeletonize(digits.images[:16]).float(), 32))
    train, held, _ = load_training("fashion-silhouette", train_size=40, test_size=8, root=data_root, progress=False)
    train = train.to("cpu")
    labels, classes, targets = task("fashion-silhouette").batch(train, torch.arange(5), torch.Generator(), None)
    assert labels.shape == targets.shape == (5, 1, 32, 32) and torch.equal(classes, train.labels[:5])
    assert torch.equal(labels, pad_to(silhouette(train.images[:5]).float(), 32))
    assert torch.equal(targets, pad_to(train.images[:5], 32))


def _save(path, array):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)


def _pairs(root, n=5, size=(12, 16), rgb=False):
    rng = np.random.default_rng(0)
    for k in range(n):
        label = (rng.random(size) > 0.5).astype(np.uint8) * 255
        image = rng.integers(0, 256, size + ((3,) if rgb else ()), dtype=np.uint8)
        _save(root / "labels" / f"p{k}.png", label)
        _save(root / "images" / f"p{k}.png", image)


def test_the_users_pairs_round_trip_and_split(tmp_path):
    _pairs(tmp_path / "d", 10, rgb=True)
    labels, images, names = load_pair_folder(tmp_path / "d" / "labels", tmp_path / "d" / "images")
    assert labels.shape == (10, 1, 12, 16) and images.shape == (10, 3, 12, 16) and names[0] == "p0"
    want = np.array(Image.open(tmp_path / "d" / "images" / "p3.png"))
    assert torch.equal(images[3], torch.from_numpy(want).permute(2, 0, 1))
    name = f"pairs:{tmp_path / 'd'}"
    assert task(name).kind == "synthesis" and input_shape(name) == (1, 12, 16) and task(name).target_channels == 3
    train, held, _ = load_training(name, progress=False)
    # the held-out pairs are the ones held_out_names picks (a hash of each name), each pair whole, none in both
    picked = sorted(held_out_names(names))
    assert len(train) + len(held) == 10 and len(held) == len(picked) and held.components.shape[1:] == (3, 12, 16)

    def key(img):  # an image as floats in [0, 1], whether a split holds it as bytes or already as floats
        return tuple(unit_float(img).flatten().tolist())

    test_images = {key(img) for img in held.components}
    assert test_images == {key(images[names.index(n)]) for n in picked}
    trained = {key(img) for img in train.labels}  # a training split's targets ride in labels (task.batch's y)
    assert trained == {key(images[k]) for k, n in enumerate(names) if n not in picked}  # the rest, none in both
    x, y, t = task(name).batch(train.to("cpu"), torch.arange(3), torch.Generator(), None)
    assert x.shape == (3, 1, 12, 16) and t.shape == (3, 3, 12, 16) and 0 <= float(t.min()) and float(t.max()) <= 1
    # a slip in the split's name was the training split, named as asked ("tests" held the 8 training pairs)
    from capsnet.data.tasks import load_folder, load_pairs

    for load, prefix in ((load_pairs, "pairs:"), (load_folder, "folder:")):
        with pytest.raises(DataError, match=rf"unknown split 'tests' of {prefix}.*; valid splits: train, test"):
            load(tmp_path / "d", "tests")
    assert len(load_pairs(tmp_path / "d", "test")) == len(held)


@pytest.mark.parametrize("case", ["unpaired", "size", "mode", "not png", "jpeg beside", "empty"])
def test_bad_pairs_get_one_clear_message(tmp_path, case):
    root = tmp_path / "d"
    _pairs(root)
    if case == "unpaired":
        (root / "images" / "p2.png").unlink()
        match = "label maps with no image: 1 in .*p2.png.*every label map needs an image of the same file name"
    elif case == "size":
        _save(root / "labels" / "p1.png", np.zeros((12, 15), np.uint8))
        match = r"label map .*p1.png is 12x15 \(HxW\) but its image .*p1.png is 12x16"
    elif case == "mode":
        _save(root / "labels" / "p4.png", np.zeros((12, 16, 3), np.uint8))
        match = r"p4.png is RGB \(3 channels\) but .*p0.png is grayscale \(1 channel\); convert all label maps"
    elif case == "not png":
        Image.fromarray(np.zeros((12, 16), np.uint8)).save(root / "images" / "p1.png", format="JPEG")
        match = "p1.png is a JPEG file, not a PNG; convert it to PNG"
    elif case == "jpeg beside":  # paired by name with a label map, it would have been left out without a word
        (root / "labels" / "p1.png").rename(root / "labels" / "p1.jpg")
        (root / "labels" / "notes.txt").write_text("not an image: ignored")
        match = r"labels holds 1 image file\(s\) that are not PNG beside its PNG label maps \(p1.jpg\); capsnet reads " \
                r"PNG only: convert them to PNG, or move them out"
    else:
        for p in (root / "labels").iterdir():
            p.unlink()
        match = "no PNG files in .*labels; put the label maps there"
    with pytest.raises(DataError, match=match):
        load_pair_folder(root / "labels", root / "images")


def test_a_pair_whose_files_differ_in_exif_orientation_is_refused(tmp_path):
    """A label map saved by a phone's editor with EXIF orientation 8 beside its image with none: each was turned by
    its own, and the pair read misaligned (square) or refused for sizes neither file has on disk."""
    stroke = np.zeros((8, 8), np.uint8)
    stroke[2:6, 3] = 255
    exif = Image.Exif()
    exif[0x0112] = 8
    (tmp_path / "labels").mkdir()
    Image.fromarray(stroke).save(tmp_path / "labels" / "a.png", exif=exif)
    _save(tmp_path / "images" / "a.png", stroke)
    with pytest.raises(DataError, match=r"label map .*labels/a.png has EXIF orientation 8 \(shown turned 90 degrees "
                                        r"counter-clockwise\) but its image .*images/a.png has no EXIF orientation; "
                                        r".*: save both as they are displayed, without EXIF orientation$"):
        load_pair_folder(tmp_path / "labels", tmp_path / "images")


def test_pairs_are_read_as_load_pair_folders_docstring_says(tmp_path):
    """Its docstring said "alpha dropped, palettes to RGB": a grey palette reads as grey, a colour one as RGB, and
    an image with a transparent pixel is refused (its alpha is dropped only when opaque everywhere)."""
    stroke = np.zeros((6, 5), np.uint8)
    stroke[1:5, 2] = 255
    for folder, palette, channels in (("grey", [v for i in range(256) for v in (i, i, i)], 1),
                                      ("colour", [v for i in range(256) for v in (i, 0, 255 - i)], 3)):
        for kind in ("labels", "images"):
            p = Image.fromarray(stroke, mode="P")
            p.putpalette(palette)
            (tmp_path / folder / kind).mkdir(parents=True)
            p.save(tmp_path / folder / kind / "a.png")
        labels, images, _ = load_pair_folder(tmp_path / folder / "labels", tmp_path / folder / "images")
        assert labels.shape == images.shape == (1, channels, 6, 5)
    alpha = np.full_like(stroke, 255)
    Image.fromarray(np.stack([stroke, alpha], -1), "LA").save(tmp_path / "grey" / "images" / "a.png")
    assert load_pair_folder(tmp_path / "grey" / "labels", tmp_path / "grey" / "images")[1].shape == (1, 1, 6, 5)
    alpha[0, 0] = 0
    Image.fromarray(np.stack([stroke, alpha], -1), "LA").save(tmp_path / "grey" / "images" / "a.png")
    with pytest.raises(DataError, match=r"image .*a.png has transparent pixels \(3% of them\); an image is read by "
                                        r"its values, not its alpha"):
        load_pair_folder(tmp_path / "grey" / "labels", tmp_path / "grey" / "images")


def test_a_folder_of_0_1_label_maps_is_read_as_0_255(tmp_path):
    """Before: 0/1 label maps (as masks may be) were read as 8-bit grey, all but black, and trained on or generated
    from without a word. Decided per folder: a folder of class maps (0..K) keeps a map that holds only 0s and 1s."""
    rng = np.random.default_rng(3)
    shapes = (rng.random((3, 8, 8)) < 0.3).astype(np.uint8)
    for folder, scales in (("binary", (1, 1, 1)), ("classes", (1, 255, 7))):
        for stem, shape, scale in zip("abc", shapes, scales):
            _save(tmp_path / folder / "labels" / f"{stem}.png", shape * np.uint8(scale))
            _save(tmp_path / folder / "images" / f"{stem}.png", rng.integers(0, 256, (8, 8), dtype=np.uint8))
    labels, _, names = load_pair_folder(tmp_path / "binary" / "labels", tmp_path / "binary" / "images")
    assert names == ["a", "b", "c"] and torch.equal(labels[:, 0], torch.from_numpy(shapes * np.uint8(255)))
    labels, _, _ = load_pair_folder(tmp_path / "classes" / "labels", tmp_path / "classes" / "images")
    assert torch.equal(labels[:, 0], torch.from_numpy(shapes * np.array([1, 255, 7], np.uint8)[:, None, None]))


def test_label_maps_binary_at_two_scales_are_refused_and_class_maps_are_not(tmp_path):
    """Found by a review (2026-11-29): a folder of five 0/1 maps and one 0/255 map read the 0/1 ones as they were,
    1/255 bright (the folder is scaled only when every map is 0/1), and a run trained on all but black maps; a 0/255
    training folder with a 0/1 test/ folder did the same to the test maps."""
    from capsnet.data.tasks import load_pairs

    rng = np.random.default_rng(4)
    shapes = (rng.random((4, 8, 8)) < 0.3).astype(np.uint8)
    for stem, shape, scale in zip("abcd", shapes, (1, 1, 255, 1)):
        _save(tmp_path / "mixed" / "labels" / f"{stem}.png", shape * np.uint8(scale))
        _save(tmp_path / "mixed" / "images" / f"{stem}.png", rng.integers(0, 256, (8, 8), dtype=np.uint8))
    with pytest.raises(DataError, match=r"labels: label map a.png holds 0s and 1s and c.png 0s and 255s; binary label "
                                        r"maps are read as 0/255 only when all of them are 0/1"):
        load_pair_folder(tmp_path / "mixed" / "labels", tmp_path / "mixed" / "images")
    for top, stems, scale in ((tmp_path / "split", "ab", 255), (tmp_path / "split" / "test", "cd", 1)):
        for stem in stems:
            _save(top / "labels" / f"{stem}.png", shapes["abcd".index(stem)] * np.uint8(scale))
            _save(top / "images" / f"{stem}.png", rng.integers(0, 256, (8, 8), dtype=np.uint8))
    with pytest.raises(DataError, match=r"holds 0s and 1s and .*a.png 0s and 255s"):
        load_pairs(tmp_path / "split", "test")
    # class maps: a 0/255 map beside maps of classes 0..7 is class 255, read as it is
    (tmp_path / "mixed" / "labels" / "d.png").unlink()
    _save(tmp_path / "mixed" / "labels" / "d.png", shapes[3] * np.uint8(7))
    labels, _, _ = load_pair_folder(tmp_path / "mixed" / "labels", tmp_path / "mixed" / "images")
    assert [int(m.max()) for m in labels] == [1, 1, 255, 7]


def test_a_label_map_painted_on_transparency_is_refused_and_an_opaque_one_reads_as_its_colours(tmp_path):
    """Found by a review (2026-11-29): strokes whose shape was in the alpha alone (black values, opaque strokes on a
    transparent canvas) read as an all-zero map, and generate and train took it without a word."""
    from capsnet.data.png import label_map_array

    stroke = np.zeros((8, 8), np.uint8)
    stroke[2:6, 3] = 255
    Image.fromarray(np.stack([np.zeros_like(stroke), stroke], -1), "LA").save(tmp_path / "painted.png")
    with pytest.raises(DataError, match=r"label map .*painted.png has transparent pixels \(94% of them\); a label map "
                                        r"is read by its values, not its alpha.*flatten it onto its background"):
        label_map_array(tmp_path / "painted.png")
    Image.fromarray(np.stack([stroke, np.full_like(stroke, 255)], -1), "LA").save(tmp_path / "opaque.png")
    assert np.array_equal(label_map_array(tmp_path / "opaque.png"), stroke[None])
    # a grey PNG whose tRNS entry makes black transparent (no alpha channel): refused too, as the viewer refuses it
    Image.fromarray(stroke).save(tmp_path / "keyed.png", transparency=0)
    with pytest.raises(DataError, match=r"keyed.png has transparent pixels \(94% of them\)"):
        label_map_array(tmp_path / "keyed.png")


def _zhang_suen(ink: list[list[bool]]) -> list[list[int]]:
    """Zhang and Suen's thinning (CACM 1984) as published, one pixel at a time in plain Python: a reference for
    ``skeletonize``. Pixels outside the picture are background."""
    H, W = len(ink), len(ink[0])
    x = [[int(v) for v in row] for row in ink]

    def at(r, c):
        return x[r][c] if 0 <= r < H and 0 <= c < W else 0

    changed = True
    while changed:
        changed = False
        for step in (0, 1):
            remove = []
            for r in range(H):
                for c in range(W):
                    if not x[r][c]:
                        continue
                    # P2 (north) clockwise to P9 (north-west)
                    p = [at(r - 1, c), at(r - 1, c + 1), at(r, c + 1), at(r + 1, c + 1), at(r + 1, c),
                         at(r + 1, c - 1), at(r, c - 1), at(r - 1, c - 1)]
                    b = sum(p)
                    a = sum(1 for k in range(8) if p[k] == 0 and p[(k + 1) % 8] == 1)
                    p2, p4, p6, p8 = p[0], p[2], p[4], p[6]
                    if step == 0:
                        ok = p2 * p4 * p6 == 0 and p4 * p6 * p8 == 0
                    else:
                        ok = p2 * p4 * p8 == 0 and p2 * p6 * p8 == 0
                    if 2 <= b <= 6 and a == 1 and ok:
                        remove.append((r, c))
            for r, c in remove:  # every decision of a sub-iteration reads the picture as it was at its start
                x[r][c] = 0
            changed = changed or bool(remove)
    return x


def test_skeletons_of_real_digits_are_zhang_and_suens_pixel_for_pixel(data_root):
    """Found by mutation testing (2026-11-30): removing pixels with up to 7 neighbours (``B <= 7`` for the published
    ``B <= 6``) thinned real digits differently and no test noticed. The skeletons of 300 test digits must equal a
    plain-Python Zhang-Suen, binarised as the module does (above half intensity, background outside the frame)."""
    digits = load_dataset("mnist", "test", root=data_root).images[:300]
    got = skeletonize(digits)[:, 0]
    ink = (digits[:, 0] > 127).tolist()  # uint8 above 0.5 * 255
    want = torch.tensor([_zhang_suen(d) for d in ink], dtype=torch.uint8)
    differ = [k for k in range(len(digits)) if not torch.equal(got[k], want[k])]
    assert differ == []


def test_silhouette_keeps_background_reached_from_any_one_side_of_the_border():
    """Found by mutation testing (2026-11-30): a flood fill seeded from the left border column alone (not the right
    one) filled a "C" opening to the right, and no test noticed. Each "C" below touches the border on three sides,
    so its inside is background reachable through the fourth side only: it must come back as drawn, on every side;
    a ring that fills the frame must come back filled."""
    opens_right = grid(["######",
                        "#.....",
                        "#.##..",
                        "#.....",
                        "######"])
    opens_left = grid(["######",
                       ".....#",
                       "..##.#",
                       ".....#",
                       "######"])
    opens_top = grid(["#...#",
                      "#...#",
                      "#.#.#",
                      "#.#.#",
                      "#...#",
                      "#####"])
    opens_bottom = grid(["#####",
                         "#...#",
                         "#.#.#",
                         "#.#.#",
                         "#...#",
                         "#...#"])
    for shape in (opens_right, opens_left, opens_top, opens_bottom):
        assert torch.equal(silhouette(shape), shape.to(torch.uint8))
    ring = grid(["######",
                 "#....#",
                 "#.##.#",
                 "#....#",
                 "######"])
    assert silhouette(ring).all()


def test_a_pairs_copies_go_to_one_split(tmp_path):
    """As a class folder's copies (test_data_class_folders): without a test folder a pair saved twice under two
    names was split by each name, into both splits."""
    from capsnet.data.tasks import load_pairs

    _pairs(tmp_path / "d", 12)
    for sub in ("labels", "images"):  # each pair copied under a second name
        for k in range(12):
            (tmp_path / "d" / sub / f"q{k}.png").write_bytes((tmp_path / "d" / sub / f"p{k}.png").read_bytes())
    from pathlib import Path

    train, test = load_pairs(tmp_path / "d", "train"), load_pairs(tmp_path / "d", "test")
    key = lambda split, k: (split.images[k].numpy().tobytes(), split.labels[k].numpy().tobytes())  # noqa: E731
    assert len(test) >= 2 and not {key(test, k) for k in range(len(test))} & {key(train, k) for k in range(len(train))}
    held = held_out_names([f"p{k}" for k in range(12)])  # the first name's draw takes its copy along
    assert sorted(Path(n).stem for n in test.names) == sorted(held | {"q" + n[1:] for n in held})
