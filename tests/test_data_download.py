"""download_file and load_dataset's download path against a real local HTTP server.

The server serves real MNIST files (the small test split), so the checksums
are the published ones; it also serves a corrupt copy, a broken gzip, a 404
and a connection that drops half-way through the file.
"""
from __future__ import annotations

import collections
import gzip
import hashlib
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from capsnet.data import DataError, load_dataset
from capsnet.data import download as download_module
from capsnet.data.download import download_file

LABELS = "t10k-labels-idx1-ubyte"
LABELS_MD5 = "27ae3e4e09519cfbb04c329615203637"  # published, of the uncompressed file


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.server.hits[self.path] += 1
        kind, body = self.server.routes.get(self.path, ("404", b""))
        if kind == "404":
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if kind == "drop":
            self.wfile.write(body[: len(body) // 2])  # then the connection closes
            self.wfile.flush()
            self.close_connection = True
        else:
            self.wfile.write(body)

    def log_message(self, *args) -> None:  # keep pytest output clean
        pass


@pytest.fixture(scope="module")
def served(data_root):
    """Base URL of a local server and the bytes it serves, by path."""
    good_gz = (data_root / "mnist" / f"{LABELS}.gz").read_bytes()
    content = gzip.decompress(good_gz)
    changed = bytearray(content)
    changed[8] = (changed[8] + 1) % 10  # one label off: valid IDX, wrong MD5
    broken = bytearray(good_gz)
    broken[len(broken) // 2] ^= 0xFF
    routes = {
        f"/good/{LABELS}.gz": ("ok", good_gz),
        f"/raw/{LABELS}.gz": ("ok", content),
        f"/corrupt/{LABELS}.gz": ("ok", gzip.compress(bytes(changed))),
        f"/badgzip/{LABELS}.gz": ("ok", bytes(broken)),
        f"/drop/{LABELS}.gz": ("drop", good_gz),
    }
    for name in (LABELS, "t10k-images-idx3-ubyte"):
        routes[f"/mnist/{name}.gz"] = ("ok", (data_root / "mnist" / f"{name}.gz").read_bytes())
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.routes = routes
    server.hits = collections.Counter()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch):
    monkeypatch.setattr(download_module, "BACKOFF_S", 0.001)


def _url(server, path: str) -> str:
    return f"http://127.0.0.1:{server.server_port}{path}"


def _refused_url() -> str:
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/{LABELS}.gz"


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_good_download(served, tmp_path):
    dest = tmp_path / "d" / f"{LABELS}.gz"
    body = served.routes[f"/good/{LABELS}.gz"][1]
    out = download_file(_url(served, f"/good/{LABELS}.gz"), dest, md5_uncompressed=LABELS_MD5,
                        md5=hashlib.md5(body).hexdigest(), progress=False)
    assert out == dest and dest.read_bytes() == body
    assert _names(dest.parent) == [dest.name]


def test_uncompressed_checksum_accepts_a_raw_download(served, tmp_path):
    dest = tmp_path / LABELS
    download_file([_url(served, f"/raw/{LABELS}.gz")], dest, md5_uncompressed=LABELS_MD5,
                  progress=False)
    assert hashlib.md5(dest.read_bytes()).hexdigest() == LABELS_MD5


@pytest.mark.parametrize("bad", ["missing", "corrupt", "badgzip", "drop", "refused"])
def test_first_mirror_bad_second_good(served, tmp_path, bad):
    first = _refused_url() if bad == "refused" else _url(served, f"/{bad}/{LABELS}.gz")
    dest = tmp_path / f"{LABELS}.gz"
    before = served.hits.copy()
    download_file([first, _url(served, f"/good/{LABELS}.gz")], dest,
                  md5_uncompressed=LABELS_MD5, retries=2, progress=False)
    assert gzip.decompress(dest.read_bytes())[:8] == bytes([0, 0, 8, 1, 0, 0, 0x27, 0x10])
    assert _names(tmp_path) == [dest.name]
    tries = served.hits[f"/{bad}/{LABELS}.gz"] - before[f"/{bad}/{LABELS}.gz"]
    # Network failures are retried; a 404 or a wrong checksum moves on at once.
    assert tries == {"missing": 1, "corrupt": 1, "badgzip": 1, "drop": 3, "refused": 0}[bad]


def test_all_mirrors_bad_names_every_url_and_leaves_nothing(served, tmp_path):
    urls = [_url(served, f"/{kind}/{LABELS}.gz") for kind in ("missing", "corrupt", "drop")]
    urls.append(_refused_url())
    dest = tmp_path / f"{LABELS}.gz"
    with pytest.raises(DataError) as info:
        download_file(urls, dest, md5_uncompressed=LABELS_MD5, retries=1, progress=False)
    message = str(info.value)
    for url in urls:
        assert url in message
    assert "404" in message and "MD5" in message and "connection closed" in message
    assert "CAPSNET_DATA" in message and "--data-dir" in message
    assert _names(tmp_path) == []


def test_checksum_mismatch_leaves_an_existing_file_alone(served, tmp_path):
    dest = tmp_path / f"{LABELS}.gz"
    dest.write_bytes(b"old")
    with pytest.raises(DataError, match="MD5"):
        download_file(_url(served, f"/good/{LABELS}.gz"), dest, md5="0" * 32, progress=False)
    assert _names(tmp_path) == [dest.name] and dest.read_bytes() == b"old"


def test_progress_bar_goes_to_stderr_and_can_be_off(served, tmp_path, capsys):
    url = _url(served, f"/good/{LABELS}.gz")
    download_file(url, tmp_path / "a.gz", progress=False)
    assert capsys.readouterr().err == ""
    download_file(url, tmp_path / "b.gz", progress=True)
    captured = capsys.readouterr()
    assert "b.gz" in captured.err and captured.out == ""


def test_load_dataset_downloads_when_asked(served, tmp_path):
    mirrors = [_url(served, "/missing/"), _url(served, "/mnist/")]
    with pytest.raises(DataError, match="not found"):  # a named root is not written by default
        load_dataset("mnist", "test", root=tmp_path, mirrors=mirrors)
    assert not (tmp_path / "mnist").exists()

    ds = load_dataset("mnist", "test", root=tmp_path, download=True, mirrors=mirrors,
                      progress=False)
    assert len(ds) == 10000 and ds.labels[:3].tolist() == [7, 2, 1]
    assert _names(tmp_path / "mnist") == ["t10k-images-idx3-ubyte.gz", f"{LABELS}.gz"]

    hits = sum(served.hits.values())
    load_dataset("mnist", "test", root=tmp_path, download=True, mirrors=mirrors)
    assert sum(served.hits.values()) == hits  # present files are not fetched again


def test_load_dataset_downloads_into_the_user_cache(served, tmp_path, monkeypatch):
    monkeypatch.delenv("CAPSNET_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    ds = load_dataset("mnist", "test", mirrors=[_url(served, "/mnist/")], progress=False)
    assert len(ds) == 10000
    assert (tmp_path / "capsnet" / "mnist" / f"{LABELS}.gz").is_file()
