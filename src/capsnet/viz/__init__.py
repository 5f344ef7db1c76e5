"""The web viewer: a local server and one static page (to be built: issue 4)."""
from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", default=None, metavar="RUN_DIR", help="run directory or checkpoint file")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=5000, help="port to listen on")


def run_command(args: argparse.Namespace) -> int:
    raise NotImplementedError("capsnet viz is not built yet")
