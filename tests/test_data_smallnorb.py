"""smallNORB: the binary matrix reader on files in the same format written here (no real files on this machine)."""
from __future__ import annotations

import gzip
import hashlib

import numpy as np
import pytest
import torch

from capsnet.data import DataError
from capsnet.data import smallnorb as sn
from capsnet.data.tasks import TASKS, load_test, load_training


def _fake(folder, split="train", n=6, seed=0, gz=False):
    """n examples in smallNORB's format under folder/smallnorb/, with the table's MD5s replaced by theirs."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (n, 2, 96, 96), dtype=np.uint8)
    labels = rng.integers(0, 5, n).astype(np.int32)
    d = folder / "smallnorb"
    d.mkdir(parents=True, exist_ok=True)
    files = sn.SMALLNORB_FILES[split]
    md5 = {}
    for key, array in (("dat", images), ("cat", labels)):
        path = sn.write_norb(d / files[key].name, array)
        md5[key] = hashlib.md5(path.read_bytes()).hexdigest()
        if gz:
            (d / (files[key].name + ".gz")).write_bytes(gzip.compress(path.read_bytes()))
            path.unlink()
    return images, labels, md5


@pytest.fixture
def fake_root(tmp_path, monkeypatch):
    table = {}
    for split, seed in (("train", 0), ("test", 1)):
        _, _, md5 = _fake(tmp_path, split, seed=seed, gz=split == "test")
        files = sn.SMALLNORB_FILES[split]
        table[split] = {k: files[k]._replace(md5=md5.get(k, files[k].md5)) for k in files}
    monkeypatch.setattr(sn, "SMALLNORB_FILES", table)
    return tmp_path


def test_header_layout_and_round_trip(tmp_path):
    a = np.arange(2 * 3 * 4 * 5, dtype=np.uint8).reshape(2, 3, 4, 5)
    raw = sn.write_norb(tmp_path / "a.mat", a).read_bytes()
    assert raw[:4] == bytes([0x55, 0x4C, 0x3D, 0x1E]) and np.frombuffer(raw[4:24], "<i4").tolist() == [4, 2, 3, 4, 5]
    labels = np.array([4, 0, 3], dtype=np.int32)
    raw = sn.write_norb(tmp_path / "b.mat", labels).read_bytes()
    # rank 1: three dimension slots all the same, the unused two padding (1)
    assert raw[:4] == bytes([0x54, 0x4C, 0x3D, 0x1E]) and np.frombuffer(raw[4:20], "<i4").tolist() == [1, 3, 1, 1]
    assert len(raw) == 20 + 12
    assert np.array_equal(sn.read_norb(tmp_path / "a.mat"), a) and np.array_equal(sn.read_norb(tmp_path / "b.mat"), labels)
    (tmp_path / "c.mat.gz").write_bytes(gzip.compress((tmp_path / "a.mat").read_bytes()))
    assert np.array_equal(sn.read_norb(tmp_path / "c.mat.gz"), a)


@pytest.mark.parametrize("damage,message", [
    (lambda b: np.array([0x1E3D4C51], "<i4").tobytes() + b[4:], "a float32 matrix"),
    (lambda b: b"\x00\x01\x02\x03" + b[4:], "not a NORB matrix"),
    (lambda b: b[:-5], "truncated, 115 of the 120 data bytes"),
    (lambda b: b + b"\x00", "longer than the 120 data bytes"),
    (lambda b: b[:10], "header is cut short"),
])
def test_bad_files_are_refused_by_name(tmp_path, damage, message):
    good = sn.write_norb(tmp_path / "x.mat", np.zeros((2, 3, 4, 5), np.uint8)).read_bytes()
    (tmp_path / "x.mat").write_bytes(damage(good))
    with pytest.raises(DataError, match=message):
        sn.read_norb(tmp_path / "x.mat")


def test_a_tiny_matrix_with_trailing_bytes_is_refused_by_name(tmp_path):
    """Found by a review (2026-11-29): a header declaring fewer data bytes than the first read takes (2 of 4) asked
    f.read for a negative length, read the rest of the file and failed with a plain ValueError."""
    raw = sn.write_norb(tmp_path / "t.mat", np.array([7, 8], np.uint8)).read_bytes()
    (tmp_path / "t.mat").write_bytes(raw + bytes(1000))
    with pytest.raises(DataError, match="t.mat: longer than the 2 data bytes its header declares"):
        sn.read_norb(tmp_path / "t.mat")
    (tmp_path / "t.mat").write_bytes(raw)
    assert sn.read_norb(tmp_path / "t.mat").tolist() == [7, 8]


def test_a_header_declaring_more_than_smallnorb_holds_is_refused_before_reading(tmp_path):
    (tmp_path / "big.mat").write_bytes(np.array([0x1E3D4C55, 4, 10**6, 2, 96, 96], "<i4").tobytes())
    with pytest.raises(DataError, match="more than any smallNORB file"):
        sn.read_norb(tmp_path / "big.mat", max_size=24300 * 2 * 96 * 96)


def test_load_checks_checksums_and_reads_raw_and_gzipped(fake_root, monkeypatch):
    train = sn.load_smallnorb("train", root=fake_root)
    assert train.images.shape == (6, 2, 96, 96) and train.images.dtype == torch.uint8
    assert train.labels.dtype == torch.int64 and train.classes == sn.SMALLNORB_CLASSES
    assert len(sn.load_smallnorb("test", root=fake_root)) == 6  # the gzipped copy
    files = sn.SMALLNORB_FILES["train"]
    monkeypatch.setitem(sn.SMALLNORB_FILES["train"], "dat", files["dat"]._replace(md5="0" * 32))
    with pytest.raises(DataError, match="MD5 of the uncompressed contents is .* expected 00000000"):
        sn.load_smallnorb("train", root=fake_root)


def test_each_file_is_read_once_its_checksum_taken_on_the_way(fake_root, monkeypatch):
    """The checksum pass decompressed each file once more before the reader did (smallNORB's 450 MB data file twice
    a load: a review of the data paths, 2026-12-03); the MD5 is now taken as the reader reads."""
    opened = []
    real = sn.open_maybe_gzipped
    monkeypatch.setattr(sn, "open_maybe_gzipped", lambda path: opened.append(str(path)) or real(path))
    assert len(sn.load_smallnorb("test", root=fake_root)) == 6
    assert len(opened) == len(set(opened)) == 2  # the data file and the labels, once each
    dat = sn._find(fake_root / "smallnorb", sn.SMALLNORB_FILES["test"]["dat"].name)
    raw = dat.read_bytes()
    whole = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    assert sn.read_norb(dat, md5=hashlib.md5(whole).hexdigest()).shape == (6, 2, 96, 96)
    with pytest.raises(DataError, match=r"MD5 of the uncompressed contents is [0-9a-f]{32}, expected 0{32}"):
        sn.read_norb(dat, md5="0" * 32)


@pytest.mark.parametrize("check", [True, False])
def test_a_cut_short_or_misnamed_gzip_file_is_a_clear_error_or_read_by_its_contents(fake_root, check):
    """gzip is told by the file's first bytes, not its name, in the checksum pass as in the reader; a gzip stream
    cut short (an interrupted copy) is a DataError naming the file, not a raw EOFError traceback."""
    d = fake_root / "smallnorb"
    dat = sn.SMALLNORB_FILES["test"]["dat"].name
    whole = (d / (dat + ".gz")).read_bytes()
    (d / (dat + ".gz")).write_bytes(whole[:len(whole) // 2])
    with pytest.raises(DataError, match=r"testing-dat.mat.gz: corrupt or truncated gzip file .*download or copy it"):
        sn.load_smallnorb("test", root=fake_root, check=check)
    (d / (dat + ".gz")).unlink()
    (d / dat).write_bytes(whole)  # gzipped, under the raw name
    assert sn.load_smallnorb("test", root=fake_root, check=check).images.shape == (6, 2, 96, 96)
    raw = gzip.decompress(whole)
    (d / dat).unlink()
    (d / (dat + ".gz")).write_bytes(raw)  # raw, under the .gz name
    assert sn.load_smallnorb("test", root=fake_root, check=check).images.shape == (6, 2, 96, 96)


def test_missing_files_say_where_to_put_them(tmp_path):
    with pytest.raises(DataError, match=r"smallnorb train file\(s\) .*-training-dat.mat and .*-training-cat.mat not "
                                        r"found in .*smallnorb .*cs.nyu.edu"):
        sn.load_smallnorb("train", root=tmp_path, download=False)
    assert sn.SMALLNORB_FILES["train"]["dat"].name == "smallnorb-5x46789x9x18x6x2x96x96-training-dat.mat"
    assert sn.SMALLNORB_FILES["test"]["cat"].name == "smallnorb-5x01235x9x18x6x2x96x96-testing-cat.mat"


def test_the_task_standardises_crops_and_jitters(fake_root):
    test = load_test("smallnorb", root=fake_root, progress=False)
    assert test.images.shape == (6, 2, 32, 32) and TASKS["smallnorb"].input_shape == (2, 32, 32)
    raw = sn.load_smallnorb("test", root=fake_root).images.float() / 255
    small = torch.nn.functional.interpolate(raw, size=(48, 48), mode="area")
    z = (small - small.mean(dim=(1, 2, 3), keepdim=True)) / small.std(dim=(1, 2, 3), keepdim=True, unbiased=False)
    torch.testing.assert_close(test.images, z[:, :, 8:40, 8:40])  # the centre crop of the standardised image
    train, held, name = load_training("smallnorb", root=fake_root, progress=False)
    assert name == "test" and held.images.shape == (6, 2, 32, 32)
    train = train.to("cpu")
    idx = torch.arange(6)
    a = TASKS["smallnorb"].batch(train, idx, torch.Generator().manual_seed(0), None)[0]
    b = TASKS["smallnorb"].batch(train, idx, torch.Generator().manual_seed(1), None)[0]
    assert a.shape == (6, 2, 32, 32) and not torch.equal(a, b)


def test_a_tiny_file_declaring_a_huge_matrix_is_said_truncated_without_allocating_it(tmp_path):
    """read_norb on a 20-byte file whose header declares 2**20 x 2**20 bytes: read(n) took the n bytes at once, a
    MemoryError (found by fuzzing, 2026-11-30)."""
    import resource
    import struct

    path = tmp_path / "huge.mat"
    path.write_bytes(struct.pack("<5i", 0x1E3D4C55, 3, 1 << 20, 1 << 20, 1))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(DataError, match=r"truncated, 0 of the 1,099,511,627,776 data bytes"):
        sn.read_norb(path)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 200_000  # KiB
