"""What the viewer's server tests share: a server for the length of a block, and requests to it."""
from __future__ import annotations

import contextlib
import http.client
import io
import json
from typing import Iterator

import numpy as np
from PIL import Image

from capsnet.viz import serve_in_thread


@contextlib.contextmanager
def serving(viewer, **options) -> Iterator:
    """``serve_in_thread(viewer, **options)``'s server for the block, shut down and joined after it."""
    srv, thread = serve_in_thread(viewer, **options)
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=5)


def request(server, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
            timeout: float = 60) -> tuple[int, str | None, bytes]:
    """One request on a fresh connection: (status, Content-Type, body)."""
    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, r.getheader("Content-Type"), r.read()
    finally:
        conn.close()


def api(server, path: str, payload=None, raw: bytes | None = None) -> tuple[int, dict]:
    """GET ``path``, or POST ``payload`` as JSON (``raw``: these bytes as they are); the answer must be JSON."""
    body = raw if raw is not None else (None if payload is None else json.dumps(payload).encode())
    status, ctype, data = request(server, "GET" if body is None else "POST", path, body)
    assert ctype == "application/json"
    return status, json.loads(data)


def png(a: np.ndarray | Image.Image) -> bytes:
    """A PNG of an image or an array: grey for (H, W) uint8, RGBA for (H, W, 4), 16-bit grey for uint16."""
    buf = io.BytesIO()
    (a if isinstance(a, Image.Image) else Image.fromarray(a)).save(buf, "PNG")
    return buf.getvalue()
