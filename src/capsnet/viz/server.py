"""The viewer's local HTTP server: one static page and a small JSON API.

Standard library only (``http.server``), one thread per request, one model
behind a lock (``Viewer``). Every bad request is answered with a 4xx status
and ``{"error": message}``; nothing a client sends can stop the server.

API (also in the README):

- ``GET /api/info``: the model, data set and sizes.
- ``GET /api/kernels``: conv1's kernels.
- ``POST /api/forward`` with ``{"index": n}`` or ``{"class": k, "nth": m}``:
  every layer's view of a test image.
- ``POST /api/upload`` with a PNG or JPEG as the body: the same for an
  uploaded or drawn image, after MNIST's preprocessing.
- ``POST /api/reconstruct`` with ``{"capsule": j, "pose": [16 numbers]}``:
  the decoder's image of that capsule (the sliders).
"""
from __future__ import annotations

import json
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any, Callable

from .engine import Viewer, ViewerError
from .images import MAX_UPLOAD_BYTES, mnist_style, read_image

__all__ = ["make_server", "serve_in_thread", "MAX_JSON_BYTES"]

MAX_JSON_BYTES = 64 * 1024  # a pose is 16 numbers; anything near this is not a real request
_DRAIN_BYTES = 64 * 1024 * 1024  # bodies over a limit but under this are read and dropped before the 413
_STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/index.html": ("index.html", "text/html; charset=utf-8"),
    "/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/style.css": ("style.css", "text/css; charset=utf-8"),
}


class _HTTPError(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


def _static(name: str) -> bytes:
    return resources.files(__package__).joinpath("static", name).read_bytes()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: a slider drag reuses one connection
    # Headers and body leave in two writes; with Nagle's algorithm on, the body waits for the
    # client's delayed ACK (40 ms on Linux) on a kept-alive connection.
    disable_nagle_algorithm = True
    server: "_Server"

    # -------------------------------------------------------------- plumbing

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        if self.server.log is not None:
            self.server.log(f"{self.address_string()} {format % args}")

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own errors (a malformed request line or header) as JSON, like ours."""
        self.close_connection = True
        text = message or HTTPStatus(code).phrase
        self._send(code, json.dumps({"error": f"{text}; send an HTTP/1.1 request"}).encode(), "application/json")

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, payload: dict[str, Any]) -> None:
        self._send(status, json.dumps(payload, separators=(",", ":")).encode(), "application/json")

    def _body(self, limit: int) -> bytes:
        length = self.headers.get("Content-Length")
        if length is None:
            self.close_connection = True
            raise _HTTPError(HTTPStatus.LENGTH_REQUIRED, "send a Content-Length header with the request body")
        try:
            n = int(length)
        except ValueError:
            self.close_connection = True
            raise _HTTPError(HTTPStatus.BAD_REQUEST, f"Content-Length {length!r} is not a number") from None
        if n < 0:
            self.close_connection = True
            raise _HTTPError(HTTPStatus.BAD_REQUEST, f"Content-Length {n} is negative")
        if n > limit:
            if n <= _DRAIN_BYTES:  # read and drop it, so the client gets the answer rather than a reset
                remaining = n
                while remaining > 0:
                    chunk = self.rfile.read(min(remaining, 1 << 16))
                    if not chunk:
                        break
                    remaining -= len(chunk)
            self.close_connection = True
            raise _HTTPError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                             f"the request body is {n:,} bytes; this endpoint takes at most {limit:,}")
        data = self.rfile.read(n)
        if len(data) < n:
            self.close_connection = True
            raise _HTTPError(HTTPStatus.BAD_REQUEST, f"the body ended after {len(data)} of {n} bytes")
        return data

    def _json_body(self) -> dict[str, Any]:
        data = self._body(MAX_JSON_BYTES)
        try:
            payload = json.loads(data, parse_constant=_reject_constant)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise _HTTPError(HTTPStatus.BAD_REQUEST, f"the body is not valid JSON ({e})") from None
        except ValueError as e:
            raise _HTTPError(HTTPStatus.BAD_REQUEST, str(e)) from None
        if not isinstance(payload, dict):
            raise _HTTPError(HTTPStatus.BAD_REQUEST, f"the body must be a JSON object, got {type(payload).__name__}")
        return payload

    def _dispatch(self, routes: dict[str, Callable[[], None]]) -> None:
        path = self.path.split("?", 1)[0]
        try:
            route = routes.get(path)
            if route is None:
                other = self._post_routes() if self.command == "GET" else self._get_routes()
                if path in other or (self.command != "GET" and path in _STATIC):
                    raise _HTTPError(HTTPStatus.METHOD_NOT_ALLOWED, f"{path} does not take {self.command}")
                raise _HTTPError(HTTPStatus.NOT_FOUND, f"no such page or endpoint: {path}")
            route()
        except _HTTPError as e:
            self._json(e.status, {"error": str(e)})
        except ViewerError as e:
            self._json(HTTPStatus.BAD_REQUEST, {"error": str(e)})
        except Exception as e:  # a bug must not take the server down: answer, log, go on
            self.log_message("internal error: %r", e)
            self._json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"internal error: {type(e).__name__}: {e}"})

    # -------------------------------------------------------------- routes

    def _get_routes(self) -> dict[str, Callable[[], None]]:
        routes: dict[str, Callable[[], None]] = {p: (lambda p=p: self._page(p)) for p in _STATIC}
        routes["/api/info"] = lambda: self._json(HTTPStatus.OK, self.server.viewer.info())
        routes["/api/kernels"] = lambda: self._json(HTTPStatus.OK, self.server.viewer.kernels())
        return routes

    def _post_routes(self) -> dict[str, Callable[[], None]]:
        return {"/api/forward": self._forward, "/api/upload": self._upload, "/api/reconstruct": self._reconstruct}

    def do_GET(self) -> None:  # noqa: N802 (http.server's names)
        self._dispatch(self._get_routes())

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch(self._post_routes())

    def do_PUT(self) -> None:  # noqa: N802
        self._dispatch({})

    do_DELETE = do_PATCH = do_PUT

    def _page(self, path: str) -> None:
        name, content_type = _STATIC[path]
        self._send(HTTPStatus.OK, _static(name), content_type)

    def _forward(self) -> None:
        viewer = self.server.viewer
        req = self._json_body()
        unknown = set(req) - {"index", "class", "nth"}
        if unknown:
            raise _HTTPError(HTTPStatus.BAD_REQUEST, f"unknown field(s) {sorted(unknown)}: "
                             f"send {{\"index\": n}} or {{\"class\": k, \"nth\": m}}")
        if ("index" in req) == ("class" in req):
            raise _HTTPError(HTTPStatus.BAD_REQUEST, 'send exactly one of {"index": n} or {"class": k, "nth": m}')
        if "index" in req:
            inp = viewer.test_input(index=req["index"])
        else:
            inp = viewer.test_input(label=req["class"], nth=req.get("nth", 0))
        self._json(HTTPStatus.OK, viewer.walk(inp))

    def _upload(self) -> None:
        viewer = self.server.viewer
        img = read_image(self._body(MAX_UPLOAD_BYTES))
        size = list(img.size)
        image = mnist_style(img, viewer.shape)
        self._json(HTTPStatus.OK, viewer.walk(viewer.image_input(image, {"kind": "upload", "size": size})))

    def _reconstruct(self) -> None:
        req = self._json_body()
        unknown = set(req) - {"capsule", "pose"}
        if unknown or "capsule" not in req or "pose" not in req:
            raise _HTTPError(HTTPStatus.BAD_REQUEST, 'send {"capsule": j, "pose": [numbers]} and nothing else')
        self._json(HTTPStatus.OK, self.server.viewer.reconstruct(req["pose"], req["capsule"]))


def _reject_constant(name: str) -> None:
    raise ValueError(f"the body holds {name}, which is not a number JSON allows: send finite numbers")


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a stuck client never keeps the process alive
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], viewer: Viewer, log: Callable[[str], None] | None) -> None:
        self.viewer = viewer
        self.log = log
        super().__init__(address, _Handler)


def make_server(viewer: Viewer, host: str = "127.0.0.1", port: int = 5000,
                log: Callable[[str], None] | None = None) -> _Server:
    """A server bound to ``host:port`` (port 0: any free one); call ``serve_forever()`` on it."""
    return _Server((host, port), viewer, log)


def serve_in_thread(viewer: Viewer, host: str = "127.0.0.1", port: int = 0) -> tuple[_Server, threading.Thread]:
    """Start a server in a daemon thread (tests, benchmarks, notebooks); stop it with ``server.shutdown()``."""
    server = make_server(viewer, host, port)
    thread = threading.Thread(target=server.serve_forever, name="capsnet-viz", daemon=True)
    thread.start()
    return server, thread
