"""The viewer's local HTTP server: one static page and a small JSON API.

Standard library only (``http.server``), one thread per connection, one model
behind a lock (``Viewer``). Every bad request is answered with a 4xx status
line, headers and ``{"error": message}``; nothing a client sends can stop the
server, crash a request with a 5xx, or hold a thread or much memory for long:

- JSON bodies are at most ``MAX_JSON_BYTES``, nested at most
  ``MAX_JSON_DEPTH`` deep, and hold only finite numbers within
  ±``MAX_JSON_NUMBER`` (checked while parsing, so no huge integer or float
  that overflows float32 ever reaches the model);
- GET and HEAD serve the pages and GET endpoints, POST the POST endpoints;
  any other method gets 405 with an ``Allow`` header, an unknown path 404;
- a request line that is not HTTP/1.x (HTTP/2, a TLS hello, binary junk)
  gets a 400 status line and headers, and the connection is closed (a 5xx
  only ever means a bug);
- a connection waits at most ``READ_TIMEOUT_S`` for the next bytes of a
  request (or for the next request on a kept-alive connection) and at most
  ``REQUEST_TIMEOUT_S`` for a whole request, then gets a 408 and is closed;
- ``LISTEN_BACKLOG`` pending connections are queued, so a burst of clients
  connecting at once is not reset; at most ``MAX_CONNECTIONS`` are served at
  once (a thread each), the next ones answered 503 and closed at once (500
  idle clients held 503 threads for up to ``REQUEST_TIMEOUT_S`` each); a
  connection answered drains what its client still sends for up to
  ``_LINGER_S`` before it closes, at most ``MAX_DRAINING`` at once (the rest
  close at once), so threads and sockets stay under about 200;
- uploads are capped before decoding and at most two are decoded at once
  (``capsnet.viz.images``);
- a request for another host name than ``localhost``, an IP address, this
  machine's name or one of ``allowed_hosts`` gets a 403 (a web page whose
  name its owner points at 127.0.0.1, DNS rebinding, would otherwise read the
  viewer as its own), and so does a request sent by a page of another origin
  (an ``Origin`` header that is not the viewer's own: a form or ``fetch`` on
  any web site the user visits could otherwise make it work).

Every answer carries ``X-Capsnet-Viewer``, a token drawn as the server
starts: the page keeps the one of its first answer and refuses answers with
another (a viewer restarted on the same port with another model of the same
shape answered a page still showing the old one's classes and routing).

API (also in the README):

- ``GET /api/info``: the model, data set and sizes; ``kind`` is
  ``"classification"``, ``"segmentation"`` or ``"synthesis"``.
- ``GET /api/kernels``: conv1's kernels (a segmentation model's first convolution, a synthesis model's
  generator's).
- ``POST /api/forward`` with ``{"index": n}`` or ``{"class": k, "nth": m}``:
  every layer's view of a test image. A segmentation model takes
  ``{"index": n}``, optionally with ``"routing": LAYER`` (a capsule layer's
  name: its coupling coefficients of every round come too). A synthesis
  model takes ``{"index": n}`` (a test label map), optionally with
  ``"seeds": [s, ...]`` (1 to 8 noise seeds), ``"truncation": t`` and
  ``"routing": LAYER``.
- ``POST /api/upload`` with a PNG or JPEG as the body: the same for an
  uploaded or drawn image, after MNIST's preprocessing; for a segmentation
  model an image of its input size, or of another its stride divides (up to
  ``OTHER_SIZE_PIXELS``: ``info()["sides"]``), taken as it is
  (``/api/upload?routing=LAYER`` as above); for a synthesis model a label
  map of exactly its input size (``?seeds=0,1,2&truncation=T&routing=LAYER``,
  each optional).
- ``POST /api/reconstruct`` with ``{"capsule": j, "pose": [16 numbers]}``:
  the decoder's image of that capsule (the sliders); refused with a 400 for a
  segmentation or synthesis model, which has no digit capsules.
"""
from __future__ import annotations

import functools
import io
import ipaddress
import json
import math
import re
import secrets
import socket
import sys
import threading
import time
import traceback
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any, Callable, Iterable
from urllib.parse import parse_qs

from .engine import Viewer, ViewerError
from .images import MAX_UPLOAD_BYTES, canvas_input, upload_input
from .segmentation import SegmentationViewer
from .synthesis import SynthesisViewer

__all__ = ["make_server", "serve_in_thread", "VIEWER_HEADER", "MAX_CONNECTIONS", "MAX_DRAINING", "MAX_JSON_BYTES",
           "MAX_JSON_DEPTH", "MAX_JSON_NUMBER", "READ_TIMEOUT_S", "REQUEST_TIMEOUT_S", "LISTEN_BACKLOG"]

MAX_JSON_BYTES = 64 * 1024  # a pose is 16 numbers; anything near this is not a real request
MAX_JSON_DEPTH = 16  # a real request nests 2 deep ({"pose": [...]}); json's parser recurses once per level
# |number| in a JSON body: a seed's range (``synthesis.MAX_SEED``, capsnet generate's), far beyond any index
# (< 10^5) or pose value (about ±1), and far inside float32 (3.4e38), so every number the engine gets converts to a
# finite float32 (it was 1e9, which refused the seeds above it that an upload's query took).
MAX_JSON_NUMBER = 2 ** 31 - 1
_MAX_NUMBER_CHARS = 100  # a number written with more characters than this is refused before it is converted
READ_TIMEOUT_S = 10.0  # s: the longest wait for the next bytes of a request, or for a kept-alive connection's next one
REQUEST_TIMEOUT_S = 60.0  # s: the longest a whole request (line, headers, body) may take to arrive (4 MiB at 70 kB/s)
VIEWER_HEADER = "X-Capsnet-Viewer"  # every answer's: the token of the server that gave it (a restart draws another)
LISTEN_BACKLOG = 128  # pending connections queued by the kernel (socketserver's default is 5)
MAX_CONNECTIONS = 128  # connections served at once, a thread each (a browser opens about 6 to one host; as many as
# LISTEN_BACKLOG queues, so a burst the kernel queues is served)
# uploads whose bodies (up to 4 MiB each) are held at once; more are answered 503 at once, before their body is read
MAX_UPLOADS_IN_FLIGHT = 8
_LINGER_S = 2.0  # s: before closing, unread input is drained this long, so the client reads our answer, not a reset
# connections draining at once, past the MAX_CONNECTIONS served (their slot given back with the answer); more are
# closed without a drain: clients that never close their end held a thread and a socket each for the drain, and a
# flood of them had 380 threads and sockets open, past a 256-file limit (a review, 2026-12-02)
MAX_DRAINING = 64
_LINGER_BYTES = 1 << 20
_DRAIN_BYTES = 64 * 1024 * 1024  # bodies over a limit but under this are read and dropped before the 413
_STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/index.html": ("index.html", "text/html; charset=utf-8"),
    "/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/segmentation.js": ("segmentation.js", "text/javascript; charset=utf-8"),
    "/synthesis.js": ("synthesis.js", "text/javascript; charset=utf-8"),
    "/style.css": ("style.css", "text/css; charset=utf-8"),
}
_GET_API = ("/api/info", "/api/kernels")
_POST_API = ("/api/forward", "/api/upload", "/api/reconstruct")
# A logged request line's control characters, escaped: raw escape sequences sent by a client would drive the terminal
# (clear it, retitle it). The C0 and C1 controls and DEL, as CPython's own handler escapes them since 3.11.1.
_CONTROL_ESCAPES = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))}
# In a JSON text, the characters that open or close a level, and what hides them: strings and escapes.
_JSON_STRUCTURE = re.compile(r'\\.|["\[\]{}]', re.DOTALL)


NOT_FINITE = ("the model's outputs for this input are NaN or infinite: its weights overflow, as a diverging run's "
              "do; open an earlier checkpoint (--which), or train again with a lower --lr")


class _HTTPError(Exception):
    def __init__(self, status: HTTPStatus, message: str, *, allow: str | None = None, close: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.allow = allow
        self.close = close


@functools.lru_cache(maxsize=None)
def _static(name: str) -> bytes:
    """A page file's bytes, read once (a file opened for every page load was what failed, with a 500, once clients
    held every file the process may open)."""
    return resources.files(__package__).joinpath("static", name).read_bytes()


def _short(text: str, n: int = 60) -> str:
    return text if len(text) <= n else f"{text[:n]}... ({len(text):,} characters)"


# ------------------------------------------------------------------ JSON with bounds

def _refuse_constant(name: str) -> None:
    raise ValueError(f"the body holds {name}, which is not a number JSON allows: send finite numbers")


def _out_of_range(text: str) -> ValueError:
    return ValueError(f"the number {_short(text, 40)} is out of range: send finite numbers within "
                      f"±{MAX_JSON_NUMBER:,.0f} (every number the viewer takes, a pose entry, an index, a seed, lies "
                      f"within it)")


def _parse_int(text: str) -> int:
    if len(text) > _MAX_NUMBER_CHARS:
        raise _out_of_range(text)
    value = int(text)
    if abs(value) > MAX_JSON_NUMBER:
        raise _out_of_range(text)
    return value


def _parse_float(text: str) -> float:
    if len(text) > _MAX_NUMBER_CHARS:
        raise _out_of_range(text)
    value = float(text)  # 1e999 is inf here: refused below
    if not math.isfinite(value) or abs(value) > MAX_JSON_NUMBER:
        raise _out_of_range(text)
    return value


def _check_depth(text: str) -> None:
    """Refuse JSON nested deeper than MAX_JSON_DEPTH before json's recursive parser sees it."""
    depth = 0
    in_string = False
    for m in _JSON_STRUCTURE.finditer(text):
        token = m.group()
        if token == '"':
            in_string = not in_string
        elif in_string or token[0] == "\\":
            continue  # an escape (inside a string; outside one the JSON is invalid anyway)
        elif token in "[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                raise ValueError(f"the body nests more than {MAX_JSON_DEPTH} levels deep; "
                                 'a request is one object, e.g. {"capsule": 3, "pose": [16 numbers]}')
        else:
            depth -= 1


def _parse_json(data: bytes) -> Any:
    """A JSON body, bounded in depth and numbers; ValueError with a message for the client otherwise."""
    try:
        text = data.decode(json.detect_encoding(data))
    except UnicodeDecodeError as e:
        raise ValueError(f"the body is not valid JSON ({e})") from None
    _check_depth(text)
    try:
        return json.loads(text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_refuse_constant)
    except json.JSONDecodeError as e:
        raise ValueError(f"the body is not valid JSON ({e})") from None
    except RecursionError:  # not reachable after _check_depth; kept so that no body can ever make a 500
        raise ValueError(f"the body nests more than {MAX_JSON_DEPTH} levels deep") from None


# ------------------------------------------------------------------ reading with deadlines

class _Reader(io.RawIOBase):
    """The connection's reads, each waiting at most the read timeout and none past the request's deadline."""

    def __init__(self, sock: socket.socket, handler: _Handler) -> None:
        self._sock = sock
        self._handler = handler
        self.received = 0  # bytes, over the connection's life

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        handler = self._handler
        wait = handler.timeout
        if handler.deadline is not None:
            left = handler.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the request took too long to arrive")
            wait = min(wait, left)
        self._sock.settimeout(wait)
        try:
            n = self._sock.recv_into(buffer)
        finally:
            self._sock.settimeout(handler.timeout)  # writes get the full timeout
        self.received += n
        return n


# ------------------------------------------------------------------ the handler

class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: a slider drag reuses one connection
    # Headers and body leave in two writes; with Nagle's algorithm on, the body waits for the
    # client's delayed ACK (40 ms on Linux) on a kept-alive connection.
    disable_nagle_algorithm = True
    server: "_Server"
    deadline: float | None = None

    # -------------------------------------------------------------- plumbing

    def setup(self) -> None:
        self.timeout = self.server.read_timeout  # StreamRequestHandler sets it on the socket
        super().setup()
        self.rfile.close()  # the socket's own reader: replaced by one that keeps the deadlines
        self._reader = _Reader(self.connection, self)
        self.rfile = io.BufferedReader(self._reader)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        if self.server.log is not None:
            self.server.log(f"{self.address_string()} {(format % args).translate(_CONTROL_ESCAPES)}")

    def handle_one_request(self) -> None:
        """One request: read it within the deadlines, route it, answer; any connection error closes quietly."""
        self.deadline = time.monotonic() + self.server.request_timeout
        self._body_read = False
        self.command = None  # so an error before the request line is parsed is not taken for a HEAD
        self.headers = None  # nor the last request's headers for this one's
        self.requestline, self.request_version = "", self.protocol_version  # for errors before the line is parsed
        started = self._reader.received
        try:
            try:
                line = self.rfile.readline(65537)
                for _ in range(8):  # RFC 9112, 2.2: empty lines before a request line are ignored
                    if line not in (b"\r\n", b"\n"):
                        break
                    line = self.rfile.readline(65537)
                self.raw_requestline = line
                if not line:
                    self.close_connection = True  # the client closed the connection
                    return
                if len(line) > 65536:
                    self.send_error(HTTPStatus.REQUEST_URI_TOO_LONG, "the request line is over 64 KiB")
                    return
                if not line.strip():
                    self.send_error(HTTPStatus.BAD_REQUEST, "the request line is empty")
                    return
                if not self.parse_request():  # it answered already
                    return
            except TimeoutError:
                self.close_connection = True
                if self._reader.received > started:  # part of a request came: say why it is dropped
                    self._error(HTTPStatus.REQUEST_TIMEOUT, self._too_slow())
                return  # an idle kept-alive connection: closed without a word
            self._route()
            self.wfile.flush()
        except OSError:  # the client reset the connection, stopped reading, or went away
            self.close_connection = True

    def _too_slow(self) -> str:
        return (f"the request did not arrive in time (at most {self.server.read_timeout:g} s between its bytes "
                f"and {self.server.request_timeout:g} s in all); send it whole")

    def parse_request(self) -> bool:
        if len(str(self.raw_requestline, "iso-8859-1").split()) == 2:  # "GET /": HTTP/0.9, refused at once (the
            self.request_version = "HTTP/0.9"  # base class would first wait for headers such a client never sends,
            self.send_error(HTTPStatus.BAD_REQUEST, "HTTP/0.9 requests are not served")  # then answer without a
            return False  # status line)
        if not super().parse_request():
            return False
        if self.request_version == "HTTP/0.9":  # "GET /": an answer without a status line is no answer
            self.send_error(HTTPStatus.BAD_REQUEST, "HTTP/0.9 requests are not served")
            return False
        if self.headers.get_payload() or any("\n" in v for v in self.headers.values()):  # a line with no colon
            # (the parser stopped there and took the rest for a body, losing the headers after it: Content-Length),
            # or one folded onto the header before (read as part of its value)
            self.close_connection = True
            self._error(HTTPStatus.BAD_REQUEST, "a header line is malformed (no 'Name: value', or folded onto the "
                                                "line before); send one 'Name: value' line per header")
            return False
        return True

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own errors (a malformed request line or header): a status line and JSON, like ours."""
        self.close_connection = True
        if self.request_version in (None, "", "HTTP/0.9"):  # unknown or unusable: answer as HTTP/1.1 anyway
            self.request_version = self.protocol_version
        text = _short(message or HTTPStatus(code).phrase, 200)
        if code == HTTPStatus.HTTP_VERSION_NOT_SUPPORTED:  # HTTP/2 and later: the client's doing, so a 4xx
            code = HTTPStatus.BAD_REQUEST
        fix = "send a shorter request line and headers" if code in (HTTPStatus.REQUEST_URI_TOO_LONG,
                                                                    HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE) \
            else "send an HTTP/1.1 request"
        self._error(code, f"{text}; {fix}")

    def _body_declared(self) -> bool:
        headers = getattr(self, "headers", None)
        if headers is None:
            return False
        length = headers.get("Content-Length")
        return "Transfer-Encoding" in headers or (length is not None and length.strip() != "0")

    def _send(self, status: int, body: bytes, content_type: str, allow: str | None = None) -> None:
        if self._body_declared() and not self._body_read:
            self.close_connection = True  # its unread body would be taken for the next request
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header(VIEWER_HEADER, self.server.identity)
        if allow is not None:
            self.send_header("Allow", allow)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, payload: dict[str, Any], allow: str | None = None) -> None:
        try:  # strict JSON: a bare NaN (a diverging run's outputs) is no JSON, and the page's JSON.parse refused it
            body = json.dumps(payload, separators=(",", ":"), allow_nan=False)
        except ValueError:
            status, body = HTTPStatus.INTERNAL_SERVER_ERROR, json.dumps({"error": NOT_FINITE}, separators=(",", ":"))
        self._send(status, body.encode(), "application/json", allow)

    def _error(self, status: int, message: str, allow: str | None = None) -> None:
        self._json(status, {"error": message}, allow)

    def _body(self, limit: int) -> bytes:
        if "Transfer-Encoding" in self.headers:
            raise _HTTPError(HTTPStatus.LENGTH_REQUIRED, "send the body with a Content-Length header "
                             "(chunked transfer encoding is not supported)", close=True)
        lengths = self.headers.get_all("Content-Length") or []
        if not lengths:
            raise _HTTPError(HTTPStatus.LENGTH_REQUIRED, "send a Content-Length header with the request body",
                             close=True)
        if len({v.strip() for v in lengths}) > 1:
            raise _HTTPError(HTTPStatus.BAD_REQUEST, "the request has conflicting Content-Length headers",
                             close=True)
        length = lengths[0].strip()
        if not re.fullmatch(r"[0-9]{1,18}", length):
            raise _HTTPError(HTTPStatus.BAD_REQUEST, f"Content-Length {_short(length, 30)!r} is not a number "
                             "of bytes", close=True)
        n = int(length)
        try:
            if n > limit:
                if n <= _DRAIN_BYTES:  # read and drop it, so the client gets the answer rather than a reset
                    remaining = n
                    while remaining > 0:
                        chunk = self.rfile.read(min(remaining, 1 << 16))
                        if not chunk:
                            break
                        remaining -= len(chunk)
                    self._body_read = remaining == 0
                raise _HTTPError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                                 f"the request body is {n:,} bytes; this endpoint takes at most {limit:,}", close=True)
            data = self.rfile.read(n)
        except TimeoutError:
            raise _HTTPError(HTTPStatus.REQUEST_TIMEOUT, self._too_slow(), close=True) from None
        self._body_read = True
        if len(data) < n:
            raise _HTTPError(HTTPStatus.BAD_REQUEST, f"the body ended after {len(data)} of {n} bytes", close=True)
        return data

    def _json_body(self) -> dict[str, Any]:
        data = self._body(MAX_JSON_BYTES)
        try:
            payload = _parse_json(data)
        except ValueError as e:
            raise _HTTPError(HTTPStatus.BAD_REQUEST, str(e)) from None
        if not isinstance(payload, dict):
            raise _HTTPError(HTTPStatus.BAD_REQUEST, f"the body must be a JSON object, got {type(payload).__name__}")
        return payload

    # -------------------------------------------------------------- routes

    def _route(self) -> None:
        path = self.path.split("?", 1)[0]
        method = self.command
        get = {p: (lambda p=p: self._page(p)) for p in _STATIC}
        get["/api/info"] = lambda: self._json(HTTPStatus.OK, self.server.viewer.info())
        get["/api/kernels"] = lambda: self._json(HTTPStatus.OK, self.server.viewer.kernels())
        post = {"/api/forward": self._forward, "/api/upload": self._upload, "/api/reconstruct": self._reconstruct}
        try:
            self._check_origin()
            if method in ("GET", "HEAD") and path in get:
                route = get[path]
            elif method == "POST" and path in post:
                route = post[path]
            elif path in get:
                raise _HTTPError(HTTPStatus.METHOD_NOT_ALLOWED, f"{path} takes GET or HEAD, not "
                                 f"{_short(method, 20)}", allow="GET, HEAD")
            elif path in post:
                raise _HTTPError(HTTPStatus.METHOD_NOT_ALLOWED, f"{path} takes POST, not {_short(method, 20)}",
                                 allow="POST")
            else:
                raise _HTTPError(HTTPStatus.NOT_FOUND, f"no such page or endpoint: {_short(path)}")
            route()
        except _HTTPError as e:
            if e.close:
                self.close_connection = True
            self._error(e.status, str(e), e.allow)
        except ViewerError as e:
            self._error(HTTPStatus.BAD_REQUEST, str(e))
        except (ConnectionError, TimeoutError):
            raise  # the connection failed or the client stopped reading: nothing to answer on
        except Exception as e:  # a bug must not take the server down: answer, log, go on
            self.log_message("internal error: %r", e)
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, f"internal error: {type(e).__name__}: {e}")

    def _check_origin(self) -> None:
        """A 403 unless the request names a host this viewer answers for and, when it says where it comes from
        (``Origin``), comes from the viewer's own page."""
        host = self.headers.get("Host")
        if host is None:  # HTTP/1.0 may leave it out; a browser never does
            return
        name = _host_name(host)
        if not (name == "localhost" or name.endswith(".localhost") or _is_address(name)
                or name in self.server.allowed_hosts):
            port = self.server.server_address[1]
            raise _HTTPError(HTTPStatus.FORBIDDEN, f"this viewer answers for localhost, an IP address or this "
                             f"machine's name, not for {_short(host, 80)!r} (a web page under another name could "
                             f"read it: DNS rebinding): open http://127.0.0.1:{port}/, or start it with "
                             f"--allow-host {_short(name, 80)}", close=True)
        origin = self.headers.get("Origin")
        if origin is not None and not self._own_origin(origin, host):
            raise _HTTPError(HTTPStatus.FORBIDDEN, f"a page from {_short(origin, 80)!r} may not use this viewer; it "
                             f"answers its own page (http://{_short(host, 80)}/) and programs that send no Origin "
                             f"header", close=True)

    def _own_origin(self, origin: str, host: str) -> bool:
        """Whether a page of ``origin`` is the viewer's own: served under the Host it asks (by http, or https through a
        proxy that terminates TLS), or under a name given to ``--allow-host`` (a reverse proxy that sends the
        viewer its own address as Host)."""
        origin = origin.strip().lower()
        if origin in (f"http://{host.strip().lower()}", f"https://{host.strip().lower()}"):
            return True
        scheme, _, rest = origin.partition("://")
        return scheme in ("http", "https") and bool(rest) and _host_name(rest) in self.server.named_hosts

    def _page(self, path: str) -> None:
        name, content_type = _STATIC[path]
        self._send(HTTPStatus.OK, _static(name), content_type)

    def _forward(self) -> None:
        viewer = self.server.viewer
        req = self._json_body()
        if viewer.kind == "synthesis":
            unknown = set(req) - {"index", "routing", "seeds", "truncation"}
            if unknown or "index" not in req:
                what = f"unknown field(s) {_short(str(sorted(unknown)), 200)}: " if unknown else ""
                raise _HTTPError(HTTPStatus.BAD_REQUEST, f'{what}send {{"index": n}}, optionally with "seeds": '
                                 f'[s, ...], "truncation": t and "routing": a capsule layer (a test label map is '
                                 f'picked by index)')
            inp = viewer.test_input(index=req["index"])
            self._json(HTTPStatus.OK, viewer.walk(inp, routing=req.get("routing"), seeds=req.get("seeds"),
                                                  truncation=req.get("truncation")))
            return
        if viewer.kind == "segmentation":
            unknown = set(req) - {"index", "class", "routing"}  # "class" is refused by the engine, with why
            if unknown or "index" not in req:
                what = f"unknown field(s) {_short(str(sorted(unknown)), 200)}: " if unknown else ""
                raise _HTTPError(HTTPStatus.BAD_REQUEST, f'{what}send {{"index": n}}, optionally with '
                                 f'"routing": a capsule layer (a segmentation test set has no classes to pick from)')
            inp = viewer.test_input(index=req["index"], label=req.get("class"))
            self._json(HTTPStatus.OK, viewer.walk(inp, routing=req.get("routing")))
            return
        unknown = set(req) - {"index", "class", "nth"}
        if unknown:
            raise _HTTPError(HTTPStatus.BAD_REQUEST, f"unknown field(s) {_short(str(sorted(unknown)), 200)}: "
                             f"send {{\"index\": n}} or {{\"class\": k, \"nth\": m}}")
        # (an "nth" beside "index" was passed over, the answer that of the index alone: a bug hunt, 2026-12-05)
        if ("index" in req) == ("class" in req) or ("index" in req and "nth" in req):
            raise _HTTPError(HTTPStatus.BAD_REQUEST, 'send exactly one of {"index": n} or {"class": k, "nth": m}')
        if "index" in req:
            inp = viewer.test_input(index=req["index"])
        else:
            if req["class"] is None:  # the engine's "no class" would ask for an index ("test index must be ...")
                raise _HTTPError(HTTPStatus.BAD_REQUEST, f"unknown class null: classes are "
                                 f"0..{len(viewer.classes) - 1}")
            inp = viewer.test_input(label=req["class"], nth=req.get("nth", 0))
        self._json(HTTPStatus.OK, viewer.walk(inp))

    def _upload(self) -> None:
        slots = self.server.upload_slots
        if not slots.acquire(blocking=False):
            raise _HTTPError(HTTPStatus.SERVICE_UNAVAILABLE, f"the viewer is busy with {MAX_UPLOADS_IN_FLIGHT} other "
                             "uploads; send this one again in a moment", close=True)
        # the slot bounds the upload bodies held at once: released once the body is decoded (``_decoded``), not
        # after the walk and the answer (a client's next upload then found its own last one still holding a slot:
        # 503s with eight clients, the README's limit)
        self._held = [slots]
        try:
            self._upload_held()
        finally:
            self._decoded()

    def _decoded(self) -> None:
        """Give back this request's upload slot (once): its body is read and decoded, or the upload ended."""
        while getattr(self, "_held", None):
            self._held.pop().release()

    def _upload_held(self) -> None:
        viewer = self.server.viewer
        if self.headers.get("Content-Type", "").lower().startswith("multipart/"):  # curl -F, a browser form
            raise _HTTPError(HTTPStatus.BAD_REQUEST, "the upload is a multipart form; send the image's own bytes as "
                             "the request body (curl --data-binary @FILE, not -F)", close=True)
        if viewer.kind == "synthesis":
            fields = self._query({"routing", "seeds", "truncation"},
                                 "/api/upload?seeds=0,1,2&truncation=T&routing=LAYER")
            seeds, truncation = _seeds_field(fields.get("seeds")), _truncation_field(fields.get("truncation"))
            image, size = canvas_input(self._body(MAX_UPLOAD_BYTES), viewer.shape,  # the query first: it is cheap
                                       "makes images from {W}x{H} label maps", label_maps=viewer.label_maps)
            self._decoded()
            inp = viewer.image_input(image, {"kind": "upload", "size": list(size)})
            self._json(HTTPStatus.OK, viewer.walk(inp, routing=fields.get("routing"), seeds=seeds,
                                                  truncation=truncation))
            return
        if viewer.kind == "segmentation":
            routing = self._query({"routing"}, "/api/upload?routing=LAYER").get("routing")
            image, size = canvas_input(self._body(MAX_UPLOAD_BYTES), viewer.shape, sides=viewer.sides)
            self._decoded()
            inp = viewer.image_input(image, {"kind": "upload", "size": list(size)})
            self._json(HTTPStatus.OK, viewer.walk(inp, routing=routing))
            return
        self._query(set(), "/api/upload (a classifier's upload takes no query)")  # ?routing=x was ignored
        if viewer.no_uploads:
            raise _HTTPError(HTTPStatus.BAD_REQUEST, viewer.no_uploads)
        image, size = upload_input(self._body(MAX_UPLOAD_BYTES), viewer.shape, viewer.upload_style)
        self._decoded()
        self._json(HTTPStatus.OK, viewer.walk(viewer.image_input(image, {"kind": "upload", "size": list(size)})))

    def _query(self, allowed: set[str], example: str) -> dict[str, str]:
        """The query string's fields, each at most once and each one of ``allowed``; anything else is a 400 that
        shows ``example``."""
        query = self.path.split("?", 1)[1] if "?" in self.path else ""
        try:
            fields = parse_qs(query, keep_blank_values=True, strict_parsing=bool(query), max_num_fields=8)
        except ValueError as e:
            raise _HTTPError(HTTPStatus.BAD_REQUEST, f"the query string is malformed ({_short(str(e), 80)}): send "
                             f"/api/upload or {example}") from None
        unknown = set(fields) - allowed
        if unknown or any(len(v) > 1 for v in fields.values()):
            raise _HTTPError(HTTPStatus.BAD_REQUEST, f"unknown or repeated query field(s) "
                             f"{_short(str(sorted(unknown or fields)), 200)}: send /api/upload or {example}")
        return {k: v[0] for k, v in fields.items()}

    def _reconstruct(self) -> None:
        req = self._json_body()
        viewer = self.server.viewer
        if viewer.kind in ("segmentation", "synthesis"):
            viewer.reconstruct()  # raises a ViewerError (a 400) that says what to do instead
        unknown = set(req) - {"capsule", "pose"}
        if unknown or "capsule" not in req or "pose" not in req:
            raise _HTTPError(HTTPStatus.BAD_REQUEST, 'send {"capsule": j, "pose": [numbers]} and nothing else')
        self._json(HTTPStatus.OK, viewer.reconstruct(req["pose"], req["capsule"]))


_HOST_NAME = re.compile(r"[a-z0-9_.-]+(?::[0-9]{1,5})?", re.IGNORECASE)  # a name, perhaps with its port


def checked_host_name(name: str) -> str:
    """``name`` (an ``--allow-host`` value) if it is a host name as a browser's Host header gives it (a name or an
    address, perhaps with a port); else a ValueError naming the fix (a URL's scheme became the name allowed, and a
    wildcard was kept as written and matched nothing)."""
    text = name.strip()
    if text.startswith("[") or (text.count(":") > 1 and _is_address(text)):  # [::1]:5000, ::1
        return name
    if _HOST_NAME.fullmatch(text):
        return name
    from urllib.parse import urlsplit

    try:
        inside = urlsplit(text).hostname if "://" in text else None
    except ValueError:
        inside = None
    fix = f"give --allow-host {inside}" if inside else (
        "wildcards are not matched: give each name with its own --allow-host" if "*" in text else
        "give the name alone, as it appears in the address bar between :// and the next / or :")
    raise ValueError(f"--allow-host takes a host name (viewer.example.com), got {_short(text, 80)!r}: {fix}")


def _host_name(host: str) -> str:
    """A Host header's name, lower case, without its port, brackets or a final dot."""
    name = host.strip().lower()
    if name.startswith("["):  # [::1]:5000
        return name[1:name.find("]")] if "]" in name else name
    if name.count(":") == 1:  # name:port (more colons: an IPv6 address without brackets, as it is)
        name = name.split(":", 1)[0]
    return name.rstrip(".")


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)  # an address: DNS rebinding needs a name to point at 127.0.0.1
    except ValueError:
        return False
    return True


_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")  # a plain decimal number


def _seeds_field(text: str | None) -> list[int] | None:
    """``seeds=0,1,2`` of an upload's query string as a list (the viewer checks the values), or None."""
    if text is None:
        return None
    parts = text.split(",")
    if not 1 <= len(parts) <= 64 or not all(re.fullmatch(r"[0-9]{1,10}", p) for p in parts):
        raise _HTTPError(HTTPStatus.BAD_REQUEST, f"seeds={_short(text, 40)} is not a comma-separated list of "
                         f"non-negative integers of at most 10 digits: send e.g. ?seeds=0,1,2,3")
    return [int(p) for p in parts]


def _truncation_field(text: str | None) -> float | None:
    """``truncation=T`` of an upload's query string as a number (the viewer checks its range), or None."""
    if text is None:
        return None
    if not _DECIMAL.fullmatch(text):  # Python's float() would take "1_0", "inf" and "nan" as well
        raise _HTTPError(HTTPStatus.BAD_REQUEST, f"truncation={_short(text, 40)} is not a number: send e.g. "
                         f"?truncation=0.5, or leave it out for the untruncated noise")
    try:
        return _parse_float(text)
    except ValueError:
        raise _HTTPError(HTTPStatus.BAD_REQUEST, f"truncation={_short(text, 40)} is out of range (at most "
                         f"{MAX_JSON_NUMBER:,}); the noise is untruncated beyond about 6 anyway: send e.g. "
                         f"?truncation=0.5, or leave it out") from None


# ------------------------------------------------------------------ the server

def _one_at_a_time(log: Callable[[str], None]) -> Callable[[str], None]:
    """``log`` called by one request thread at a time: a ``print`` writes its text and its newline apart, and lines of
    concurrent requests ran together ("... 413 -127.0.0.1 ...") beside empty ones (a review, 2026-12-02)."""
    lock = threading.Lock()

    def logged(line: str) -> None:
        with lock:
            log(line)

    return logged


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a stuck client never keeps the process alive
    # a restarted viewer rebinds its port at once (TIME_WAIT); not on Windows, where SO_REUSEADDR lets a second
    # server bind a port another listens on, and the browser reaches either
    allow_reuse_address = sys.platform != "win32"
    request_queue_size = LISTEN_BACKLOG

    def __init__(self, address: tuple[str, int], viewer: Viewer | SegmentationViewer | SynthesisViewer,
                 log: Callable[[str], None] | None, read_timeout: float, request_timeout: float,
                 allowed_hosts: frozenset[str], named_hosts: frozenset[str]) -> None:
        self.viewer = viewer
        self.log = None if log is None else _one_at_a_time(log)
        self.allowed_hosts = allowed_hosts
        self.named_hosts = named_hosts  # the --allow-host names alone: their pages may post from any scheme and port
        self.upload_slots = threading.BoundedSemaphore(MAX_UPLOADS_IN_FLIGHT)
        self.connection_slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.drain_slots = threading.BoundedSemaphore(MAX_DRAINING)
        self.identity = secrets.token_hex(8)  # this server's, in every answer (VIEWER_HEADER)
        self._holding: set[Any] = set()  # the connections holding a slot: each gives it back once (``_give_back``)
        self._holding_lock = threading.Lock()
        self.read_timeout = read_timeout
        self.request_timeout = request_timeout
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        """A thread for the connection while fewer than ``MAX_CONNECTIONS`` are served; else a 503 and the connection
        closed at once, on the accepting thread (no drain: it must not wait on a client)."""
        if not self.connection_slots.acquire(blocking=False):
            body = json.dumps({"error": f"the viewer is serving {MAX_CONNECTIONS} connections at once; try again in a "
                                        f"moment"}).encode()
            try:
                request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                                b"%s: %s\r\nX-Content-Type-Options: nosniff\r\nCache-Control: no-store\r\n"
                                b"Retry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
                                % (VIEWER_HEADER.encode(), self.identity.encode(), len(body), body))  # (the
                # token every answer carries, as the README says: this one had none, a bug hunt, 2026-12-05)
            except OSError:  # the client is gone already
                pass
            self.close_request(request)
            return
        with self._holding_lock:
            self._holding.add(request)
        try:
            super().process_request(request, client_address)
        except BaseException:  # perhaps no thread started: then nothing else gives the slot back
            self._give_back(request)
            raise

    def _give_back(self, request: Any) -> None:
        """Release ``request``'s connection slot, the first time alone: a Ctrl-C or SIGTERM raised inside
        ``Thread.start`` once the thread ran had both sides give it back, and "Semaphore released too many times"
        replaced the KeyboardInterrupt, which ``serve_forever`` then took for one request's error and served on."""
        with self._holding_lock:
            if request not in self._holding:
                return
            self._holding.discard(request)
        self.connection_slots.release()

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        """socketserver's, with the connection's slot given back once its answers are written, before the brief
        drain of ``shutdown_request``: the client has its answer then, and its next connection found the slot still
        held (a 503 at the cap for a client asking one request at a time: a flaky test, 2026-12-02)."""
        try:
            try:
                self.finish_request(request, client_address)
            except Exception:
                self.handle_error(request, client_address)
        finally:
            self._give_back(request)
            if self.drain_slots.acquire(blocking=False):
                try:
                    self.shutdown_request(request)
                finally:
                    self.drain_slots.release()
            else:  # MAX_DRAINING closing already: this one closes at once (its client may then see a reset)
                try:
                    request.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                self.close_request(request)

    def shutdown(self) -> None:
        """Stop serving and close the socket: the port is free when this returns (a notebook cell run twice found it
        taken while the serving thread was still closing it)."""
        super().shutdown()
        self.server_close()

    def shutdown_request(self, request: Any) -> None:
        """Close a connection gracefully: send our FIN, then drain what the client still sends (briefly).

        Closing a socket with unread input makes the kernel send a reset, which can destroy the answer
        before the client reads it (a refused body, a pipelined request); draining first avoids that.
        """
        try:
            request.shutdown(socket.SHUT_WR)
            end = time.monotonic() + _LINGER_S
            drained = 0
            while drained < _LINGER_BYTES and (left := end - time.monotonic()) > 0:
                request.settimeout(left)
                chunk = request.recv(1 << 16)
                if not chunk:
                    break
                drained += len(chunk)
        except OSError:
            pass
        self.close_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if self.log is None:
            super().handle_error(request, client_address)
        else:
            self.log(f"{client_address[0]} internal error:\n{traceback.format_exc()}")


class _Server6(_Server):
    address_family = socket.AF_INET6


def make_server(viewer: Viewer | SegmentationViewer | SynthesisViewer, host: str = "127.0.0.1", port: int = 5000,
                log: Callable[[str], None] | None = None, *, read_timeout: float | None = None,
                request_timeout: float | None = None, allowed_hosts: Iterable[str] = ()) -> _Server:
    """A server bound to ``host:port`` (port 0: any free one); call ``serve_forever()`` on it.

    ``read_timeout`` and ``request_timeout`` (seconds) default to the module's
    ``READ_TIMEOUT_S`` and ``REQUEST_TIMEOUT_S``. Requests are answered for
    ``localhost``, IP addresses, this machine's name, ``host`` and the names
    in ``allowed_hosts`` (a name others reach this machine by); any other
    Host header gets a 403.
    """
    if host.startswith("[") and host.endswith("]"):  # [::1], as URLs write an IPv6 address
        host = host[1:-1]
    named = frozenset(_host_name(checked_host_name(n)) for n in allowed_hosts if n.strip())
    names = named | frozenset(_host_name(n) for n in (socket.gethostname(), host) if n.strip())
    server = _Server6 if ":" in host else _Server  # an IPv6 address (::1) needs a socket of its family
    return server((host, port), viewer, log, READ_TIMEOUT_S if read_timeout is None else read_timeout,
                  REQUEST_TIMEOUT_S if request_timeout is None else request_timeout, names, named)


def serve_in_thread(viewer: Viewer | SegmentationViewer | SynthesisViewer, host: str = "127.0.0.1", port: int = 0,
                    **kwargs: Any) -> tuple[_Server, threading.Thread]:
    """Start a server in a daemon thread (tests, benchmarks, notebooks); stop it with ``server.shutdown()``, which
    also closes its socket (the port is free again: a notebook cell run twice found it taken, and the old socket
    accepted connections it never answered)."""
    server = make_server(viewer, host, port, **kwargs)
    # shutdown() waits for serve_forever's next look at its flag: every 0.5 s by default (the suite's servers spent
    # about 0.5 s each stopping); the command line's server is stopped by Ctrl-C and keeps the default
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="capsnet-viz",
                              daemon=True)
    thread.start()
    return server, thread
