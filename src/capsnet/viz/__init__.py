"""The web viewer: walk an image through a CapsNet and move its capsule's dimensions with sliders; or look inside a
segmentation model (SegCaps, the U-Net): its predicted mask, Dice and IoU, and the capsule layers that made it; or a
synthesis model (CapsPix2pix, pix2pix): the images one label map gives under several noise seeds, and the generator's
capsule layers.

``capsnet viz --checkpoint RUN_DIR`` serves one page on http://127.0.0.1:5000;
``Viewer``, ``SegmentationViewer`` and ``SynthesisViewer`` (engine, segmentation, synthesis) compute the views,
``load_viewer`` picks the one a checkpoint needs, ``make_server`` (server)
answers HTTP.
"""
from __future__ import annotations

from .engine import SWEEP_HALF_RANGE, Viewer, ViewerError, decode, encode, load_viewer
from .segmentation import SEGMENTATION_TEST_SIZE, THRESHOLD, SegmentationViewer
from .synthesis import SYNTHESIS_TEST_SIZE, SynthesisViewer
from .server import make_server, serve_in_thread

__all__ = ["Viewer", "SegmentationViewer", "SynthesisViewer", "ViewerError", "load_viewer", "make_server",
           "serve_in_thread", "encode", "decode", "SWEEP_HALF_RANGE", "SEGMENTATION_TEST_SIZE", "SYNTHESIS_TEST_SIZE",
           "THRESHOLD"]
