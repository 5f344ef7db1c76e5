"""CIFAR-10 and SVHN: the readers on small files in the official formats written here (no real files on this
machine, and no internet), checksums, downloads from a local server, bad files, and the two tasks."""
from __future__ import annotations

import hashlib
import json
import io
import struct
import tarfile
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import torch

from capsnet.data import DataError
from capsnet.data import cifar10 as cf
from capsnet.data import svhn as sv
from capsnet.data.affnist import read_mat
from capsnet.data.tasks import TASKS, load_test, load_training
from test_affnist import MI_COMPRESSED, _header, _matrix

# ------------------------------------------------------------------------------------------ CIFAR-10 files


def _batch(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8), rng.integers(0, 10, n)


def _tar_gz(members: dict[str, bytes], *, links: dict[str, str] | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        folder = tarfile.TarInfo("cifar-10-batches-bin")
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return buf.getvalue()


def _cifar_members(n: int = 4) -> tuple[dict[str, bytes], dict[str, tuple[np.ndarray, np.ndarray]]]:
    """The official archive's members, each batch n records; written test batch first and training batches out of
    order, so the loader must order them by name."""
    names = ["test_batch"] + [f"data_batch_{k}" for k in (3, 1, 5, 2, 4)]
    arrays = {name: _batch(n, seed) for seed, name in enumerate(names)}
    members = {f"cifar-10-batches-bin/{name}.bin": cf.encode_cifar_batch(*arrays[name]) for name in names}
    members["cifar-10-batches-bin/batches.meta.txt"] = "\n".join(cf.CIFAR10_CLASSES).encode() + b"\n"
    return members, arrays


@pytest.fixture
def cifar_root(tmp_path, monkeypatch):
    """A data root holding cifar10/cifar-10-binary.tar.gz in the official layout, its MD5 made the expected one."""
    members, arrays = _cifar_members()
    archive = _tar_gz(members)
    (tmp_path / "cifar10").mkdir()
    (tmp_path / "cifar10" / cf.CIFAR10_ARCHIVE).write_bytes(archive)
    monkeypatch.setattr(cf, "CIFAR10_MD5", hashlib.md5(archive).hexdigest())
    return tmp_path, arrays


def test_a_batch_record_is_a_label_byte_then_the_red_green_and_blue_planes_row_by_row():
    images, labels = _batch(3, 0)
    raw = cf.encode_cifar_batch(images, labels)
    assert len(raw) == 3 * 3073
    record = raw[3073:2 * 3073]  # the second image
    assert record[0] == labels[1]
    # byte 1 + 1024 c + 32 r + x is channel c, row r, column x
    for c, r, x in [(0, 0, 0), (0, 0, 31), (1, 5, 7), (2, 31, 31)]:
        assert record[1 + 1024 * c + 32 * r + x] == images[1, c, r, x]
    decoded_images, decoded_labels = cf.decode_cifar_batch(raw)
    assert decoded_images.shape == (3, 3, 32, 32) and decoded_images.dtype == np.uint8
    assert np.array_equal(decoded_images, images) and decoded_labels.tolist() == labels.tolist()


def test_a_truncated_batch_file_is_refused_with_one_clear_message(tmp_path):
    images, labels = _batch(2, 1)
    path = tmp_path / "data_batch_1.bin"
    path.write_bytes(cf.encode_cifar_batch(images, labels)[:-100])
    with pytest.raises(DataError) as info:
        cf.read_cifar_batch(path)
    assert str(info.value) == (f"{path}: truncated or not a CIFAR-10 batch: 6,046 bytes is not a whole number of "
                               "3,073-byte records (a label byte and 3x32x32 pixels), but 1 records and 2,973 bytes "
                               "over; delete it and download CIFAR-10's binary version again")


def test_other_bad_batches_are_refused_by_name(tmp_path):
    with pytest.raises(DataError, match="x.bin: empty"):
        cf.decode_cifar_batch(b"", source="x.bin")
    raw = bytearray(cf.encode_cifar_batch(*_batch(3, 2)))
    raw[2 * 3073] = 12
    with pytest.raises(DataError, match="record 2 has label 12, outside CIFAR-10's 0..9"):
        cf.decode_cifar_batch(bytes(raw))
    big = tmp_path / "big.bin"
    with open(big, "wb") as f:
        f.truncate(10001 * 3073)
    with pytest.raises(DataError, match="more than a CIFAR-10 batch's 30,730,000"):
        cf.read_cifar_batch(big)


def test_load_reads_the_archive_in_batch_order_channels_first(cifar_root):
    root, arrays = cifar_root
    train = cf.load_cifar10("train", root=root)
    assert train.images.shape == (20, 3, 32, 32) and train.images.dtype == torch.uint8
    assert train.labels.dtype == torch.int64 and train.classes[0] == "airplane" and train.classes[9] == "truck"
    expected = [arrays[f"data_batch_{k}"] for k in range(1, 6)]  # 1..5, whatever their order in the archive
    assert np.array_equal(train.images.numpy(), np.concatenate([e[0] for e in expected]))
    assert train.labels.tolist() == np.concatenate([e[1] for e in expected]).tolist()
    test = cf.load_cifar10("test", root=root)
    assert np.array_equal(test.images.numpy(), arrays["test_batch"][0]) and len(test) == 4
    assert sorted(p.name for p in (root / "cifar10").iterdir()) == [cf.CIFAR10_ARCHIVE]  # nothing extracted


def test_a_truncated_batch_inside_the_archive_names_the_archive_and_the_member(tmp_path, monkeypatch):
    members, _ = _cifar_members()
    members["cifar-10-batches-bin/test_batch.bin"] = members["cifar-10-batches-bin/test_batch.bin"][:-1]
    archive = _tar_gz(members)
    (tmp_path / "cifar10").mkdir()
    (tmp_path / "cifar10" / cf.CIFAR10_ARCHIVE).write_bytes(archive)
    monkeypatch.setattr(cf, "CIFAR10_MD5", hashlib.md5(archive).hexdigest())
    with pytest.raises(DataError, match=r"cifar-10-binary.tar.gz:cifar-10-batches-bin/test_batch.bin: truncated or "
                                        r"not a CIFAR-10 batch: 12,291 bytes is not a whole number"):
        cf.load_cifar10("test", root=tmp_path)


def test_an_archive_with_the_wrong_checksum_is_refused_before_it_is_read(cifar_root, monkeypatch):
    root, _ = cifar_root
    monkeypatch.setattr(cf, "CIFAR10_MD5", "c32a1d4ab5d03f1284b67883e8d87530")  # the published one
    path = root / "cifar10" / cf.CIFAR10_ARCHIVE
    digest = hashlib.md5(path.read_bytes()).hexdigest()
    with pytest.raises(DataError) as info:
        cf.load_cifar10("train", root=root)
    assert str(info.value) == (f"{path}: MD5 is {digest}, expected c32a1d4ab5d03f1284b67883e8d87530 for CIFAR-10's "
                               "binary version (cifar-10-binary.tar.gz). The file may be corrupt, truncated or another "
                               "version of CIFAR-10 (the python or MATLAB archive); delete it and download it again")
    assert len(cf.load_cifar10("test", root=root, check=False)) == 4  # check=False reads it anyway


def test_archives_that_are_not_cifar10s_binary_version(tmp_path):
    folder = tmp_path / "cifar10"
    folder.mkdir()
    path = folder / cf.CIFAR10_ARCHIVE
    path.write_bytes(b"not a tar file at all" * 10)
    with pytest.raises(DataError, match="not a readable gzipped tar archive, or cut short"):
        cf.load_cifar10("test", root=tmp_path, check=False)
    whole = _tar_gz(_cifar_members()[0])
    path.write_bytes(whole[:len(whole) // 2])  # a download cut short (the test batch comes first, the rest is cut)
    with pytest.raises(DataError, match="not a readable gzipped tar archive, or cut short"):
        cf.load_cifar10("train", root=tmp_path, check=False)
    path.write_bytes(_tar_gz({"cifar-10-batches-py/test_batch": b"pickle"}))  # the python version's layout
    with pytest.raises(DataError, match=r"holds no cifar-10-batches-bin/test_batch.bin: not CIFAR-10's binary"):
        cf.load_cifar10("test", root=tmp_path, check=False)
    path.write_bytes(_tar_gz({}, links={"cifar-10-batches-bin/test_batch.bin": "/etc/passwd"}))
    with pytest.raises(DataError, match="test_batch.bin is not a regular file in the archive"):
        cf.load_cifar10("test", root=tmp_path, check=False)
    members = {"../../escaped.bin": b"x" * 10, **_cifar_members()[0]}  # read past, never extracted
    path.write_bytes(_tar_gz(members))
    assert len(cf.load_cifar10("train", root=tmp_path, check=False)) == 20
    assert sorted(p.name for p in tmp_path.rglob("*")) == sorted(["cifar10", cf.CIFAR10_ARCHIVE])
    assert not (tmp_path.parent / "escaped.bin").exists()  # where extracting it into cifar10/ would put it


def test_a_missing_archive_says_where_to_put_it(tmp_path):
    with pytest.raises(DataError, match=r"cifar10: cifar-10-binary.tar.gz not found in .*cifar10 \(root from "
                                        r"argument\)\. Download https://www.cs.toronto.edu/~kriz/cifar-10-binary"
                                        r"\.tar\.gz into that folder as it is \(not extracted\)"):
        cf.load_cifar10("train", root=tmp_path, download=False)
    (tmp_path / "cifar10" / "cifar-10-batches-bin").mkdir(parents=True)
    with pytest.raises(DataError, match="cifar-10-batches-bin is there, but capsnet reads the archive itself"):
        cf.load_cifar10("train", root=tmp_path, download=False)
    with pytest.raises(DataError, match="unknown split 'val' of cifar10"):
        cf.load_cifar10("val", root=tmp_path)


# ------------------------------------------------------------------------------------------ downloads


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = self.server.routes.get(self.path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.routes = {}
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv, f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_cifar10_downloads_from_the_next_mirror_and_checks_the_archive(tmp_path, server, monkeypatch):
    srv, url = server
    archive = _tar_gz(_cifar_members()[0])
    monkeypatch.setattr(cf, "CIFAR10_MD5", hashlib.md5(archive).hexdigest())
    bad = bytearray(archive)
    bad[len(bad) // 2] ^= 0xFF
    srv.routes["/bad/cifar-10-binary.tar.gz"] = bytes(bad)  # one byte wrong: refused, on to the next mirror
    srv.routes["/good/cifar-10-binary.tar.gz"] = archive
    hashed = []
    real_md5 = cf._archive_md5
    monkeypatch.setattr(cf, "_archive_md5", lambda path: hashed.append(path) or real_md5(path))
    test = cf.load_cifar10("test", root=tmp_path, download=True, progress=False,
                           mirrors=[f"{url}/missing/", f"{url}/bad/", f"{url}/good/"])
    assert len(test) == 4 and (tmp_path / "cifar10" / cf.CIFAR10_ARCHIVE).read_bytes() == archive
    assert hashed == []  # checked as it came: not hashed a second time (a review of the data paths, 2026-12-03)
    assert len(cf.load_cifar10("test", root=tmp_path, progress=False)) == 4 and len(hashed) == 1  # found: checked
    with pytest.raises(DataError, match=r"could not download cifar-10-binary.tar.gz from any mirror:\n.*/bad/.*MD5"):
        cf.load_cifar10("test", root=tmp_path / "other", download=True, progress=False, mirrors=[f"{url}/bad/"])
    assert list((tmp_path / "other" / "cifar10").iterdir()) == []  # no half-written file under any name


# ------------------------------------------------------------------------------------------ SVHN files


def _svhn_mat(images: np.ndarray, digits: np.ndarray, *, compress: bool = True, order: str = "<",
              y_dtype=np.float64) -> bytes:
    """A cropped-digit file as the site has them: X uint8 32x32x3xN (row, column, channel, digit), y Nx1 with 10 for
    the digit 0, each variable in its own compressed element as MATLAB writes them."""
    X = np.ascontiguousarray(images.transpose(2, 3, 1, 0))  # (N, C, H, W) -> (H, W, C, N)
    y = np.where(digits == 0, 10, digits).astype(y_dtype).reshape(-1, 1)
    out = _header(order)
    for name, value in (("X", X), ("y", y)):
        element = _matrix(name, value, order)
        if compress:
            packed = zlib.compress(element)
            element = struct.pack(order + "II", MI_COMPRESSED, len(packed)) + packed
        out += element
    return out


def _digits(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    digits = np.arange(n) % 10  # every digit, 0 among them
    return rng.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8), rng.permutation(digits)


@pytest.fixture
def svhn_root(tmp_path, monkeypatch):
    """A data root holding svhn/train_32x32.mat and test_32x32.mat, their MD5s made the expected ones."""
    (tmp_path / "svhn").mkdir()
    files, arrays = dict(sv.SVHN_FILES), {}
    for split, n, seed in (("train", 12, 0), ("test", 10, 1)):
        arrays[split] = _digits(n, seed)
        raw = _svhn_mat(*arrays[split])
        (tmp_path / "svhn" / files[split].name).write_bytes(raw)
        files[split] = files[split]._replace(md5=hashlib.md5(raw).hexdigest())
    monkeypatch.setattr(sv, "SVHN_FILES", files)
    return tmp_path, arrays


def test_svhn_pixels_come_out_channels_first_and_label_10_is_the_digit_0(svhn_root):
    root, arrays = svhn_root
    train = sv.load_svhn("train", root=root)
    images, digits = arrays["train"]
    assert train.images.shape == (12, 3, 32, 32) and train.images.dtype == torch.uint8
    assert np.array_equal(train.images.numpy(), images)
    X = read_mat(root / "svhn" / "train_32x32.mat")["X"]  # MATLAB's own indexing: X(row, column, channel, digit)
    assert X.shape == (32, 32, 3, 12) and train.images[7, 2, 5, 30] == X[5, 30, 2, 7] != X[30, 5, 2, 7]
    assert train.labels.dtype == torch.int64 and train.labels.tolist() == digits.tolist()
    zero = int(np.argmax(digits == 0))
    assert read_mat(root / "svhn" / "train_32x32.mat")["y"][zero, 0] == 10 and train.labels[zero] == 0
    assert len(sv.load_svhn("test", root=root)) == 10


@pytest.mark.parametrize("compress, order, y_dtype", [(False, "<", np.float64), (True, ">", np.uint8)])
def test_svhn_files_uncompressed_big_endian_or_with_uint8_labels(tmp_path, compress, order, y_dtype):
    images, digits = _digits(5, 3)
    (tmp_path / "svhn").mkdir()
    (tmp_path / "svhn" / "test_32x32.mat").write_bytes(_svhn_mat(images, digits, compress=compress, order=order,
                                                                 y_dtype=y_dtype))
    test = sv.load_svhn("test", root=tmp_path, check=False)
    assert np.array_equal(test.images.numpy(), images) and test.labels.tolist() == digits.tolist()


def test_an_svhn_file_with_the_wrong_checksum_gets_one_clear_message(svhn_root, monkeypatch):
    root, _ = svhn_root
    monkeypatch.setattr(sv, "SVHN_FILES", {**sv.SVHN_FILES, "train": sv.SVHN_FILES["train"]._replace(
        md5="e26dedcc434d2e4c54c9b2d4a06d8373")})  # the real file's
    path = root / "svhn" / "train_32x32.mat"
    digest = hashlib.md5(path.read_bytes()).hexdigest()
    with pytest.raises(DataError) as info:
        sv.load_svhn("train", root=root)
    assert str(info.value) == (f"{path}: MD5 is {digest}, expected e26dedcc434d2e4c54c9b2d4a06d8373 for SVHN's "
                               "train_32x32.mat (cropped digits). The file may be corrupt, truncated or another SVHN "
                               "file; delete it and download it again from "
                               "http://ufldl.stanford.edu/housenumbers/train_32x32.mat")


def test_svhn_files_that_are_not_cropped_digits(tmp_path):
    (tmp_path / "svhn").mkdir()
    path = tmp_path / "svhn" / "test_32x32.mat"
    images, digits = _digits(4, 4)
    cases = [
        (_header("<") + _matrix("digitStruct", np.zeros((2, 2)), "<"), r"holds \['digitStruct'\], not SVHN's X and y"),
        (_header("<") + _matrix("X", images[:, :, :28, :28].transpose(2, 3, 1, 0).copy(), "<")
         + _matrix("y", np.ones((4, 1)), "<"), r"X should be uint8 32x32x3xN .* got uint8 28x28x3x4"),
        (_svhn_mat(images, digits)[:-50], "runs past the end"),
    ]
    X = images.transpose(2, 3, 1, 0).copy()
    for y in ([[11.0], [1], [2], [3]], [[0.0], [1], [2], [3]], [[1.5], [1], [2], [3]]):
        cases.append((_header("<") + _matrix("X", X, "<") + _matrix("y", np.array(y), "<"),
                      r"SVHN's labels are the whole numbers 1..10 \(10 for the digit 0\), got "))
    cases.append((_header("<") + _matrix("X", X, "<") + _matrix("y", np.ones((3, 1)), "<"),
                  r"y should be 4x1, one label per digit of X, got 3x1"))
    for content, message in cases:
        path.write_bytes(content)
        with pytest.raises(DataError, match=message):
            sv.load_svhn("test", root=tmp_path, check=False)
    with pytest.raises(DataError, match=r"svhn extra file extra_32x32.mat not found in .*svhn .*Download "
                                        r"http://ufldl.stanford.edu/housenumbers/extra_32x32.mat"):
        sv.load_svhn("extra", root=tmp_path, download=False)


def test_read_mat_stops_decompressing_at_max_size(tmp_path):
    bomb = _matrix("X", np.zeros((1000, 1000), np.uint8), "<")  # a megabyte of zeros in a few kilobytes
    packed = zlib.compress(bomb)
    (tmp_path / "bomb.mat").write_bytes(_header("<") + struct.pack("<II", MI_COMPRESSED, len(packed)) + packed)
    with pytest.raises(DataError, match="holds more than 100,000 bytes, more than the file can"):
        read_mat(tmp_path / "bomb.mat", max_size=100_000)
    assert read_mat(tmp_path / "bomb.mat")["X"].shape == (1000, 1000)  # no bound: read whole
    (tmp_path / "cut.mat").write_bytes(_header("<") + struct.pack("<II", MI_COMPRESSED, 20) + packed[:20])
    with pytest.raises(DataError, match="compressed element at byte 128 is cut short"):
        read_mat(tmp_path / "cut.mat")


def test_svhn_downloads_and_checks_the_file(tmp_path, server, monkeypatch):
    srv, url = server
    raw = _svhn_mat(*_digits(6, 5))
    monkeypatch.setattr(sv, "SVHN_FILES", {**sv.SVHN_FILES, "test": sv.SVHN_FILES["test"]._replace(
        md5=hashlib.md5(raw).hexdigest())})
    srv.routes["/svhn/test_32x32.mat"] = raw
    srv.routes["/wrong/test_32x32.mat"] = raw + b"\0"
    hashed = []
    real_md5 = sv._md5
    monkeypatch.setattr(sv, "_md5", lambda path: hashed.append(path) or real_md5(path))
    test = sv.load_svhn("test", root=tmp_path, download=True, progress=False, mirrors=[f"{url}/svhn/"])
    assert len(test) == 6 and (tmp_path / "svhn" / "test_32x32.mat").read_bytes() == raw
    assert hashed == []  # checked as it came: not hashed a second time
    assert len(sv.load_svhn("test", root=tmp_path, progress=False)) == 6 and len(hashed) == 1  # found: checked
    with pytest.raises(DataError, match=r"could not download test_32x32.mat from any mirror:\n.*MD5 of the download"):
        sv.load_svhn("test", root=tmp_path / "other", download=True, progress=False, mirrors=[f"{url}/wrong/"])
    assert list((tmp_path / "other" / "svhn").iterdir()) == []


# ------------------------------------------------------------------------------------------ tasks


def _standardise(x: torch.Tensor) -> torch.Tensor:
    """tf.image.per_image_standardization of the pixels in 0..255, as the authors' pipeline gives it them."""
    flat = x.flatten(1).double() * 255
    std = flat.std(dim=1, unbiased=False).clamp_min(1 / flat.shape[1] ** 0.5)
    return ((flat - flat.mean(dim=1, keepdim=True)) / std[:, None]).view_as(x).to(x.dtype)


def test_the_standardisation_floor_is_the_authors_in_their_pixel_units():
    """The floor of the standard deviation, 1 / sqrt(N), was applied to pixels in [0, 1], where the authors' code
    (tensorflow/models research/capsules, google-research capsule_em) gives tf.image.per_image_standardization pixels
    in 0..255: a low-contrast crop came out with a standard deviation of 0.42 where theirs has 1 (a review,
    2026-12-01). A crop of a few grey levels, one of full contrast and a flat one, against the reference."""
    from capsnet.data.tasks import _standardised

    g = torch.Generator().manual_seed(0)
    low = 0.5 + torch.randint(0, 4, (1, 3, 24, 24), generator=g).float() / 255  # 4 grey levels: sd ~0.004
    full = torch.rand(1, 3, 24, 24, generator=g)
    flat = torch.full((1, 3, 24, 24), 0.3)
    x = torch.cat([low, full, flat])
    got = _standardised(x)
    torch.testing.assert_close(got[:2], _standardise(x)[:2], rtol=1e-5, atol=1e-5)
    assert got[0].std(unbiased=False).item() == pytest.approx(1.0, abs=1e-4)  # their floor does not reach it
    # a flat crop: 0 everywhere but for float32's rounding of its mean, over the floor (0.0003 here)
    assert got[2].abs().max() < 1e-3 and _standardise(x)[2].abs().max() == 0


def test_cifar10_is_tested_on_the_standardised_centre_crop(cifar_root):
    root, arrays = cifar_root
    assert TASKS["cifar10"].input_shape == (3, 24, 24) and TASKS["cifar10"].num_classes == 10
    test = load_test("cifar10", root=root, progress=False)
    raw = torch.from_numpy(arrays["test_batch"][0]).float() / 255
    torch.testing.assert_close(test.images, _standardise(raw[:, :, 4:28, 4:28]))
    assert test.labels.tolist() == arrays["test_batch"][1].tolist()
    _, held, name = load_training("cifar10", root=root, progress=False, test_size=3)
    assert name == "test" and held.images.shape == (3, 3, 24, 24)


def test_cifar10_trains_on_random_flipped_24x24_crops(cifar_root, monkeypatch):
    root, _ = cifar_root
    train, _, _ = load_training("cifar10", root=root, progress=False)
    train = train.to("cpu")
    batch = TASKS["cifar10"].batch
    idx = torch.arange(20)
    x, y, comp = batch(train, idx, torch.Generator().manual_seed(0), None)
    assert x.shape == (20, 3, 24, 24) and comp is None and torch.equal(y, train.labels)
    torch.testing.assert_close(x.mean(dim=(1, 2, 3)), torch.zeros(20), atol=1e-5, rtol=0)
    assert not torch.equal(x, batch(train, idx, torch.Generator().manual_seed(1), None)[0])
    # Without the contrast jitter every image is a standardised 24x24 window of its own image, maybe mirrored:
    # find which, among all 9 x 9 corners and both orientations.
    monkeypatch.setattr("capsnet.data.tasks.CIFAR_CONTRAST", (1.0, 1.0))
    x = batch(train, idx, torch.Generator().manual_seed(0), None)[0]
    found = []
    for k in range(20):
        windows = {(r, c, f): _standardise((w.flip(-1) if f else w)[None])[0]
                   for r in range(9) for c in range(9) for f in (0, 1)
                   for w in [train.images[k, :, r:r + 24, c:c + 24]]}
        match = [key for key, w in windows.items() if torch.allclose(w, x[k], atol=1e-5)]
        assert len(match) == 1, k
        found.append(match[0])
    assert len({(r, c) for r, c, _ in found}) > 5 and {f for *_, f in found} == {0, 1}


def test_svhn_is_a_plain_colour_task_shifted_like_mnist(svhn_root):
    root, arrays = svhn_root
    assert TASKS["svhn"].input_shape == (3, 32, 32) and not TASKS["svhn"].places_digits
    train, held, name = load_training("svhn", root=root, progress=False)
    assert name == "test" and torch.equal(held.images, torch.from_numpy(arrays["test"][0]))
    assert held.labels.tolist() == arrays["test"][1].tolist()
    shifted = TASKS["svhn"].batch(train.to("cpu"), torch.arange(4), torch.Generator().manual_seed(0),
                                  lambda images, g: images.roll(1, dims=-1))[0]
    torch.testing.assert_close(shifted, train.images[:4].float().div(255).roll(1, dims=-1))  # the run's augmentation


def test_capsnet_train_runs_the_cifar10_model_on_cifar10_and_eval_scores_it(cifar_root, capsys):
    from capsnet import cli
    from capsnet.checkpoint import load_checkpoint

    root, arrays = cifar_root
    out = root / "run"
    assert cli.main(["train", "--model", "capsnet-cifar10", "--dataset", "cifar10", "--data-dir", str(root),
                     "--epochs", "1", "--batch-size", "8", "--conv1-channels", "8", "--primary-types", "2",
                     "--device", "cpu", "--out", str(out), "--no-progress"]) == 0
    record = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["epoch"] == 1 and 0.0 <= record["test_accuracy"] <= 1.0
    ckpt = load_checkpoint(out, "last")
    assert ckpt.model_name == "capsnet-cifar10" and ckpt.train_config["dataset"] == "cifar10"
    cfg = ckpt.model_config
    assert (cfg["in_channels"], cfg["input_height"], cfg["padding"], cfg["leaky_routing"], cfg["decoder"]) == \
        (3, 24, "same", True, False)
    capsys.readouterr()
    assert cli.main(["eval", "--checkpoint", str(out), "--data-dir", str(root), "--device", "cpu"]) == 0
    assert "cifar10" in capsys.readouterr().out
    report = json.loads((out / "eval-last.json").read_text())  # no validation split: the final epoch, scored again
    assert report["images"] == len(arrays["test_batch"][1]) and report["dataset"] == "cifar10"
    assert report["accuracy"] == pytest.approx(record["test_accuracy"], abs=1e-9)


def test_a_sigmoid_decoder_on_standardised_inputs_is_warned_before_the_data_loads(tmp_path):
    """CIFAR-10's and smallNORB's inputs are standardised per image (half below 0, a sixth above 1), and CapsNet's
    decoder ends in a sigmoid: its loss could never reach them, with no word (a review, 2026-12-01). Said once, before
    the data loads; not said without the decoder or its loss, nor for a data set in [0, 1]."""
    import warnings

    from capsnet.models import create_model
    from capsnet.train import TrainConfig, fit, input_fields

    def said(dataset, **fields):
        cfg = create_model("capsnet", conv1_channels=8, primary_types=2, decoder_hidden=(8, 8),
                           **input_fields("capsnet", dataset), **fields).config
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(DataError, match="not found"):
                fit(cfg, TrainConfig(dataset=dataset), tmp_path / "run", data_root=tmp_path / "none", progress=False)
        return [str(w.message) for w in caught if "sigmoid" in str(w.message)]

    for dataset in ("cifar10", "smallnorb"):
        got = said(dataset)
        assert len(got) == 1 and got[0].startswith(f"--dataset {dataset}'s inputs are standardised per image") and \
            "train with --no-decoder (the authors' CIFAR-10 model has none) or --recon-weight 0" in got[0], got
    assert said("cifar10", decoder=False) == [] and said("svhn") == []
