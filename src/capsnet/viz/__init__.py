"""The web viewer: walk an image through a CapsNet and move its capsule's dimensions with sliders.

``capsnet viz --checkpoint RUN_DIR`` serves one page on http://127.0.0.1:5000;
``Viewer`` (engine) computes the views, ``make_server`` (server) answers HTTP.
"""
from __future__ import annotations

import argparse
import sys

from .engine import SWEEP_HALF_RANGE, Viewer, ViewerError, decode, encode, load_viewer
from .server import make_server, serve_in_thread

__all__ = ["Viewer", "ViewerError", "load_viewer", "make_server", "serve_in_thread", "encode", "decode",
           "SWEEP_HALF_RANGE", "add_arguments", "run_command"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", default=None, metavar="RUN_DIR",
                        help="run directory or .safetensors file of a CapsNet; without it the weights are untrained")
    parser.add_argument("--which", choices=("best", "last"), default="best", help="which checkpoint of a run directory")
    from ..data import DATASETS
    from ..data.tasks import TASKS

    parser.add_argument("--dataset", default=None, choices=DATASETS + TASKS,
                        help="test images to pick from (default: the checkpoint's data set; mnist-sample without one; "
                             "multimnist: the fixed test pairs; translated-mnist: test digits on 40x40)")
    parser.add_argument("--data-dir", default=None, help="data root holding mnist/ and fashion-mnist/ "
                                                         "(default: $CAPSNET_DATA, else the user cache)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on; the default serves this machine only (0.0.0.0: every network)")
    parser.add_argument("--port", type=int, default=5000, help="port to listen on (0: any free port)")
    parser.add_argument("--device", default="cpu", help="device for the model (cpu, cuda, auto)")
    parser.add_argument("--quiet", action="store_true", help="do not log each request")


def run_command(args: argparse.Namespace) -> int:
    from ..train import resolve_device

    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port {args.port} is not a port number: use 0..65535")
    viewer = load_viewer(args.checkpoint, which=args.which, dataset=args.dataset, data_dir=args.data_dir,
                         device=str(resolve_device(args.device)))
    try:
        server = make_server(viewer, args.host, args.port,
                             log=None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True)))
    except OSError as e:
        raise ValueError(f"cannot listen on {args.host}:{args.port} ({e.strerror or e}); "
                         f"pick another --port or stop what uses it") from None
    host, port = server.server_address[:2]
    if viewer.checkpoint is None:
        print("no --checkpoint given: the weights are UNTRAINED (random), so predictions and reconstructions "
              "mean nothing; pass --checkpoint RUN_DIR from `capsnet train`", file=sys.stderr)
    print(f"capsnet viewer: {viewer.checkpoint or 'untrained CapsNet'} on {viewer.dataset} test images", flush=True)
    print(f"open http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}/  (Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("stopped")
    finally:
        server.server_close()
    return 0
