"""load_dataset on the real files, its refusals, the shipped sample, split_validation."""
from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from capsnet.data import (DATASETS, DataError, Dataset, load_dataset, read_idx, split_validation,
                          write_idx)
from capsnet.data import sets
from capsnet.data.sets import resolve_root

TEST_FILES = ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def _copy_test_split(src: Path, dest: Path, *, gunzip: bool = False) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for name in TEST_FILES:
        if gunzip:
            (dest / name).write_bytes(gzip.decompress((src / f"{name}.gz").read_bytes()))
        else:
            shutil.copy(src / f"{name}.gz", dest / f"{name}.gz")


@pytest.fixture(scope="module")
def mnist_test(data_root) -> Dataset:
    return load_dataset("mnist", "test", root=data_root)


def test_mnist_train_is_what_the_world_knows(data_root):
    ds = load_dataset("mnist", "train", root=data_root)
    assert len(ds) == 60000 and ds.name == "mnist" and ds.split == "train"
    assert ds.images.shape == (60000, 1, 28, 28) and ds.images.dtype == torch.uint8
    assert ds.labels.shape == (60000,) and ds.labels.dtype == torch.int64
    assert ds.labels[:5].tolist() == [5, 0, 4, 1, 9]
    # Class counts of the MNIST training set (LeCun et al.'s files).
    assert torch.bincount(ds.labels).tolist() == [5923, 6742, 5958, 6131, 5842,
                                                  5421, 5918, 6265, 5851, 5949]
    assert ds.classes == tuple("0123456789")


def test_mnist_test(mnist_test):
    assert mnist_test.images.shape == (10000, 1, 28, 28)
    assert mnist_test.labels[:5].tolist() == [7, 2, 1, 0, 4]
    assert int(mnist_test.images.max()) == 255 and int(mnist_test.images.min()) == 0


@pytest.mark.parametrize("split,n", [("train", 60000), ("test", 10000)])
def test_fashion_mnist(data_root, split, n):
    ds = load_dataset("fashion-mnist", split, root=data_root)
    assert ds.images.shape == (n, 1, 28, 28) and ds.labels.dtype == torch.int64
    assert torch.bincount(ds.labels).tolist() == [n // 10] * 10  # balanced by design
    assert ds.labels[0].item() == 9 and ds.classes[9] == "Ankle boot"


def test_root_from_environment(data_root, monkeypatch, mnist_test):
    monkeypatch.setenv("CAPSNET_DATA", str(data_root))
    assert resolve_root() == (data_root, "CAPSNET_DATA")
    ds = load_dataset("mnist", "test")
    assert torch.equal(ds.labels, mnist_test.labels)


def test_default_root_is_the_user_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("CAPSNET_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert resolve_root() == (tmp_path / "capsnet", "cache")
    assert resolve_root(tmp_path / "x") == (tmp_path / "x", "argument")


def test_raw_copies_are_accepted(data_root, tmp_path, mnist_test):
    _copy_test_split(data_root / "mnist", tmp_path / "mnist", gunzip=True)
    ds = load_dataset("mnist", "test", root=tmp_path)
    assert torch.equal(ds.images, mnist_test.images) and torch.equal(ds.labels, mnist_test.labels)


def test_one_changed_byte_is_refused(data_root, tmp_path):
    _copy_test_split(data_root / "mnist", tmp_path / "mnist")
    path = tmp_path / "mnist" / "t10k-labels-idx1-ubyte.gz"
    content = bytearray(gzip.decompress(path.read_bytes()))
    content[8] = 3  # first label 7 -> 3: still a valid IDX file with labels in range
    path.write_bytes(gzip.compress(bytes(content)))
    with pytest.raises(DataError, match="MD5") as info:
        load_dataset("mnist", "test", root=tmp_path)
    message = str(info.value)
    assert str(path) in message and "corrupt" in message


def test_fashion_files_in_the_mnist_folder_are_recognised(data_root, tmp_path):
    _copy_test_split(data_root / "fashion-mnist", tmp_path / "mnist")
    with pytest.raises(DataError, match="looks like the fashion-mnist files") as info:
        load_dataset("mnist", "test", root=tmp_path)
    assert "t10k-images-idx3-ubyte" in str(info.value)


def test_the_shipped_sample_in_the_mnist_folder_is_named_as_the_sample(tmp_path):
    """It said to keep the files in DATA/mnist-sample/, a folder never read (the sample is read from the package)
    (a review, 2026-11-30)."""
    (tmp_path / "mnist").mkdir()
    for f in sets.SAMPLE_DIR.glob("t10k-*"):
        shutil.copy(f, tmp_path / "mnist" / f.name)
    with pytest.raises(DataError, match=r"its contents are capsnet's shipped sample of MNIST .*copied into the "
                                        r"mnist/ folder\. Put the full mnist files there instead \(or use --dataset "
                                        r"mnist-sample"):
        load_dataset("mnist", "test", root=tmp_path)


def test_a_norb_header_whose_size_overflows_is_a_data_error(tmp_path):
    """Four dimensions of 65536 wrapped the int64 size to 0: a bare reshape ValueError (a review, 2026-11-30)."""
    from capsnet.data.smallnorb import read_norb

    magic = (0x1E3D4C55).to_bytes(4, "little")  # the magic of a byte matrix
    path = tmp_path / "big.mat"
    path.write_bytes(magic + (4).to_bytes(4, "little") + (65536).to_bytes(4, "little") * 4)
    with pytest.raises(DataError, match=str(path)):
        read_norb(path)


def test_missing_file_with_explicit_root(data_root, tmp_path):
    _copy_test_split(data_root / "mnist", tmp_path / "mnist")
    (tmp_path / "mnist" / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DataError) as info:
        load_dataset("mnist", "test", root=tmp_path)  # no download into a named folder
    message = str(info.value)
    assert "t10k-labels-idx1-ubyte" in message and "t10k-images" not in message
    assert str(tmp_path / "mnist") in message and "download=True" in message
    # the offline way it names loads here; the tasks it names beside it are the command line's (it listed all three
    # as data sets, and load_dataset refused two of them as unknown)
    import re

    from capsnet.data.tasks import TASKS

    offline = message.split("Offline:")[1]
    assert len(load_dataset(re.search(r"^ (\S+) holds", offline)[1], "test")) == 500
    named = re.findall(r"mnist-sample-\w+", offline)
    assert named and all(t in TASKS and t not in DATASETS for t in named), offline


def test_a_data_folder_that_is_a_file_is_said_so(tmp_path):
    """--data-dir FILE said "not found in FILE/mnist" (a review, 2026-11-30)."""
    (tmp_path / "afile").write_text("")
    said = f"the data folder {tmp_path / 'afile'} \\(root from argument\\) is a file, not a folder; give the folder"
    with pytest.raises(DataError, match=said):
        load_dataset("mnist", "test", root=tmp_path / "afile")
    from capsnet.data.tasks import load_test

    for name in ("cifar10", "svhn", "smallnorb"):  # every set's loader, from the one place roots are read
        with pytest.raises(DataError, match=said):
            load_test(name, root=tmp_path / "afile", progress=False)


def test_a_png_it_may_not_read_is_said_so_not_called_damaged(tmp_path, monkeypatch):
    """A file without read permission was "not a readable PNG image (PermissionError ...); re-save it as PNG"."""
    from PIL import Image

    from capsnet.data.png import read_png

    Image.fromarray(np.zeros((4, 4), np.uint8)).save(tmp_path / "a.png")

    def denied(*a, **k):
        raise PermissionError(13, "Permission denied", str(tmp_path / "a.png"))
    monkeypatch.setattr(Image, "open", denied)  # as for a chmod 000 file (root reads those anyway)
    with pytest.raises(DataError, match=r"a.png cannot be read: permission denied; make it readable \(chmod a\+r\)"):
        read_png(tmp_path / "a.png")


def test_unknown_names_list_the_valid_ones():
    with pytest.raises(DataError, match="mnist, fashion-mnist, mnist-sample"):
        load_dataset("cifar-10")
    with pytest.raises(DataError, match="train, test"):
        load_dataset("mnist", "validation")
    assert DATASETS == ("mnist", "fashion-mnist", "mnist-sample")


@pytest.mark.parametrize("split,n", [("train", 2000), ("test", 500)])
def test_mnist_sample_offline(monkeypatch, tmp_path, split, n):
    monkeypatch.setenv("CAPSNET_DATA", str(tmp_path / "nothing-here"))
    ds = load_dataset("mnist-sample", split, download=False)
    assert ds.images.shape == (n, 1, 28, 28) and ds.images.dtype == torch.uint8
    assert torch.bincount(ds.labels, minlength=10).tolist() == [n // 10] * 10


@pytest.mark.parametrize("split,per_class", [("train", 200), ("test", 50)])
def test_mnist_sample_is_the_documented_subset(data_root, split, per_class):
    full = load_dataset("mnist", split, root=data_root)
    labels = full.labels.numpy()
    # Independent restatement of the rule: first per_class of each digit, file order.
    keep, seen = [], [0] * 10
    for i, y in enumerate(labels):
        if seen[y] < per_class:
            keep.append(i)
            seen[y] += 1
    sample = load_dataset("mnist-sample", split)
    assert torch.equal(sample.images, full.images[keep])
    assert torch.equal(sample.labels, full.labels[keep])


def test_mnist_sample_checks_its_md5(tmp_path, monkeypatch):
    shutil.copytree(sets.SAMPLE_DIR, tmp_path / "s")
    path = tmp_path / "s" / "t10k-labels-idx1-ubyte.gz"
    labels = read_idx(path)
    labels[0] = (labels[0] + 1) % 10
    write_idx(path, labels)
    monkeypatch.setattr(sets, "SAMPLE_DIR", tmp_path / "s")
    with pytest.raises(DataError, match="MD5"):
        load_dataset("mnist-sample", "test")


def test_subset_and_split_validation():
    ds = load_dataset("mnist-sample", "test")
    sub = ds.subset([3, 1, 4])
    assert sub.labels.tolist() == ds.labels[[3, 1, 4]].tolist() and sub.name == ds.name
    assert len(ds.subset(ds.labels == 7)) == 50

    train, val = split_validation(ds, 100, seed=0)
    assert (len(train), len(val)) == (400, 100) and val.split == "val"
    # Disjoint and covering: identify examples by their pixels (all distinct in MNIST).
    flat = lambda d: {bytes(x.numpy()) for x in d.images.flatten(1)}  # noqa: E731
    assert len(flat(ds)) == 500
    assert flat(train).isdisjoint(flat(val)) and flat(train) | flat(val) == flat(ds)

    again, val_again = split_validation(ds, 100, seed=0)
    assert torch.equal(val.images, val_again.images) and torch.equal(train.labels, again.labels)
    _, val_other = split_validation(ds, 100, seed=1)
    assert not torch.equal(val.images, val_other.images)

    for bad in (500, 501, -1):
        with pytest.raises(ValueError, match=r"--val-size\) must be in 0..499, leaving at least one of the 500"):
            split_validation(ds, bad, seed=0)
    # as the Python API meets them (a review, 2026-12-02: torch's own errors, or a keep past the set taken)
    for kwargs, error, said in [(dict(n_val=10.5, seed=0), TypeError, "n_val must be an int, got 10.5"),
                                (dict(n_val=10, seed=None), TypeError, "seed must be an int, got None"),
                                (dict(n_val=10, seed=0, keep=-5), ValueError, r"keep must be in 0..500 .*got -5"),
                                (dict(n_val=10, seed=0, keep=10**6), ValueError, "keep must be in 0..500")]:
        with pytest.raises(error, match=said):
            split_validation(ds, **kwargs)
    assert len(split_validation(ds, np.int64(10), seed=np.int64(0))[1]) == 10  # numpy's integers are integers


def test_dataset_checks_shapes():
    with pytest.raises(ValueError, match="labels"):
        Dataset("x", "train", torch.zeros(3, 1, 2, 2, dtype=torch.uint8),
                torch.zeros(4, dtype=torch.int64), ("a",))
    assert "n=3" in repr(Dataset("x", "train", torch.zeros(3, 1, 2, 2), torch.zeros(3, dtype=torch.long), ("a",)))


def test_read_numbers_match_independent_decoding(data_root, mnist_test):
    # Decode the first image by hand from the gzip bytes: 16-byte header, then pixels.
    raw = gzip.decompress((data_root / "mnist" / "t10k-images-idx3-ubyte.gz").read_bytes())
    first = np.frombuffer(raw[16:16 + 784], dtype=np.uint8).reshape(28, 28)
    assert torch.equal(mnist_test.images[0, 0], torch.from_numpy(first.copy()))


def test_unit_float_scales_uint8_and_keeps_float_pixels():
    from capsnet.data import unit_float

    raw = np.array([[0, 1, 128, 255]], dtype=np.uint8)
    got = unit_float(torch.from_numpy(raw))
    assert got.dtype == torch.float32 and got.shape == (1, 4)
    np.testing.assert_allclose(got.numpy(), raw.astype(np.float64) / 255, rtol=0, atol=1e-7)
    floats = torch.tensor([[0.0, 0.25, 1.0]], dtype=torch.float64)  # already in [0, 1]: not divided again
    assert unit_float(floats).dtype == torch.float32 and unit_float(floats).tolist() == [[0.0, 0.25, 1.0]]
    # other integers are not 0-255 bytes: 65535 / 255 = 257 and True / 255 = 0.004 were returned (a review)
    for other in (torch.tensor([65535], dtype=torch.int32), torch.tensor([True, False])):
        with pytest.raises(ValueError, match=f"images are {other.dtype}; unit_float takes 0-255 bytes"):
            unit_float(other)


def test_a_data_set_folder_given_in_place_of_the_folder_above_it_is_named(tmp_path, data_root):
    """--data-dir DATA/mnist (the set's own folder) said only 'not found in DATA/mnist/mnist'."""
    import shutil

    from capsnet.data import DataError, load_dataset

    own = tmp_path / "mnist"
    own.mkdir()
    for f in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        shutil.copy(data_root / "mnist" / f, own / f)
    with pytest.raises(DataError, match=rf"{own} itself holds them: give its parent, {tmp_path}, which holds mnist/"):
        load_dataset("mnist", "test", root=own)
    assert len(load_dataset("mnist", "test", root=tmp_path)) == 10000


def test_a_split_loaded_again_is_a_copy_of_the_checked_read_until_its_file_changes(data_root, tmp_path, monkeypatch):
    """The process keeps what it read and checked: the second load of a split reads no file, gives the same
    tensors, and they are the caller's own (a change to one never reaches the next load); a file rewritten since is
    read and checked again, so a damaged one is refused, not served from what was kept."""
    monkeypatch.setattr(sets, "_kept", type(sets._kept)())  # none kept yet (the module's fixture keeps its files)
    _copy_test_split(data_root / "mnist", tmp_path / "mnist")
    reads = []
    real_read = sets.read_idx_bytes
    monkeypatch.setattr(sets, "read_idx_bytes", lambda path, **k: reads.append(Path(path).name) or real_read(path, **k))
    first = load_dataset("mnist", "test", root=tmp_path)
    assert reads == [f"{name}.gz" for name in TEST_FILES]
    first.images[0] = 0  # the caller's tensors: changed in place
    first.labels[:] = 9
    again = load_dataset("mnist", "test", root=tmp_path)
    assert len(reads) == 2  # nothing read from disk
    assert again.labels[:5].tolist() == [7, 2, 1, 0, 4] and int(again.images[0].max()) == 255
    truth = load_dataset("mnist", "test", root=data_root)  # another file: read, and equal
    assert len(reads) == 4 and torch.equal(again.images, truth.images) and torch.equal(again.labels, truth.labels)

    path = tmp_path / "mnist" / "t10k-labels-idx1-ubyte.gz"
    content = bytearray(gzip.decompress(path.read_bytes()))
    content[8] = 3  # first label 7 -> 3
    path.write_bytes(gzip.compress(bytes(content)))
    with pytest.raises(DataError, match="MD5"):
        load_dataset("mnist", "test", root=tmp_path)
    assert reads[-1] == "t10k-labels-idx1-ubyte.gz"  # read again, though its images were kept


def test_the_kept_files_are_bounded_and_let_go_of_when_asked(data_root, monkeypatch):
    from capsnet.data import clear_data_cache

    monkeypatch.setattr(sets, "_KEPT_FILES", 2)
    monkeypatch.setattr(sets, "_kept", type(sets._kept)())
    monkeypatch.setattr(sets, "_OTHER_CACHES", [])  # the user folders other tests read in this process
    load_dataset("mnist", "test", root=data_root)
    load_dataset("fashion-mnist", "test", root=data_root)
    assert [Path(key[0]).parent.name for key in sets._kept] == ["fashion-mnist"] * 2  # the newest two
    assert clear_data_cache() == 2 and not sets._kept and clear_data_cache() == 0
    reads = []
    real_read = sets.read_idx_bytes
    monkeypatch.setattr(sets, "read_idx_bytes", lambda path, **k: reads.append(path) or real_read(path, **k))
    load_dataset("fashion-mnist", "test", root=data_root)
    assert len(reads) == 2  # read and checked again


def test_a_dataset_refuses_labels_indices_and_switches_that_read_as_something_else(tmp_path):
    """A review of the Python API (2026-12-02): subset([0.5, 1.7]) gave examples 0 and 1, a boolean mask of 2 for 4
    examples picked from the first 2; float labels, labels past the classes, classes given as one string, masks of
    another size and numpy arrays all built; load_dataset(download="no") downloaded (a true value)."""
    images, labels = torch.zeros(4, 1, 6, 6, dtype=torch.uint8), torch.tensor([0, 1, 2, 3])
    d = Dataset("x", "train", images, labels, ("a", "b", "c", "d"))
    cases = [
        (lambda: d.subset([0.5, 1.7]), ValueError,
         r"indices must be integers \(or a boolean mask\), got torch.float32"),
        (lambda: d.subset([True, False]), ValueError, r"one entry per example, shape \(4,\), got shape \(2,\)"),
        (lambda: Dataset("x", "train", images, labels.float() + 0.5, ("a",) * 4), ValueError,
         "labels must be integer class indices, got torch.float32"),
        (lambda: Dataset("x", "train", images, labels + 7, ("a", "b")), ValueError,
         r"labels must index the 2 classes \(0..1\), got values from 7 to 10"),
        (lambda: Dataset("x", "train", images, labels, "abcd"), ValueError,
         "classes must be a tuple of class names, got the string 'abcd'"),
        (lambda: Dataset("x", "train", images, torch.zeros(4, 1, 3, 3), ("a",)), ValueError,
         r"masks \(4, 1, 6, 6\), to match the images, got shape \(4, 1, 3, 3\)"),
        (lambda: Dataset("x", "train", images.numpy(), labels, ("a",) * 4), TypeError,
         r"images must be a torch.Tensor, got ndarray: torch.from_numpy\(images\) converts an array"),
        (lambda: load_dataset("mnist", "test", root=tmp_path, download="no"), ValueError,
         r"download must be True, False or None \(download only into the user cache\), got 'no'"),
    ]
    for make, error, message in cases:
        with pytest.raises(error, match=message):
            make()
    assert d.subset(torch.tensor([True, False, True, False])).labels.tolist() == [0, 2]
    assert d.subset(np.array([3, 1])).labels.tolist() == [3, 1]
    assert not list(tmp_path.iterdir())  # nothing fetched, nothing written
