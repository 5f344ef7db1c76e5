"""The web viewer: walk an image through a CapsNet and move its capsule's dimensions with sliders.

``capsnet viz --checkpoint RUN_DIR`` serves one page on http://127.0.0.1:5000;
``Viewer`` (engine) computes the views, ``make_server`` (server) answers HTTP.
"""
from __future__ import annotations

from .engine import SWEEP_HALF_RANGE, Viewer, ViewerError, decode, encode, load_viewer
from .server import make_server, serve_in_thread

__all__ = ["Viewer", "ViewerError", "load_viewer", "make_server", "serve_in_thread", "encode", "decode",
           "SWEEP_HALF_RANGE"]
