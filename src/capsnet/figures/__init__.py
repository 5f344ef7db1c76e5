"""Look inside a trained CapsNet: reconstructions, pose sweeps, routing maps, lengths, training curves; and a
segmentation model (``segmentation``): its masks, reconstructions and capsule maps layer by layer.

Three layers, so notebooks can take any of them:

- ``arrays``: ``predict``, ``reconstructions``, ``swept_poses``, ``pose_sweep``,
  ``routing_trace``, ``read_metrics``, ... return tensors and need only torch;
- ``plots``: ``plot_*`` turn those arrays into matplotlib ``Figure`` objects
  (made without pyplot, so they work headless and in servers), and
  ``save_figure`` writes one atomically;
- ``report``: ``write_figures``, every figure of a run, as ``capsnet figures``
  writes them.
"""
from __future__ import annotations

from .arrays import (DEFAULT_DELTAS, FigureError, PairReconstructions, Reconstructions, RoutingTrace, overlay_pair,
                     pair_reconstructions, pose_sweep, predict, read_metrics, reconstructions, routing_trace,
                     swept_poses, sweep_deltas)
from .plots import (FORMATS, plot_lengths, plot_misclassified, plot_multimnist, plot_pose_sweep, plot_reconstructions,
                    plot_routing, plot_training_curves, save_figure)
from .report import FiguresWritten, write_figures
from .segmentation import Segmentations, capsule_maps, overlay_masks, plot_capsule_maps, plot_segmentations, segment

__all__ = ["FigureError", "DEFAULT_DELTAS", "FORMATS", "Reconstructions", "PairReconstructions", "RoutingTrace",
           "predict", "reconstructions", "pair_reconstructions", "overlay_pair", "swept_poses", "sweep_deltas",
           "pose_sweep", "routing_trace", "read_metrics", "plot_reconstructions", "plot_misclassified",
           "plot_pose_sweep", "plot_routing", "plot_lengths", "plot_training_curves", "plot_multimnist", "save_figure",
           "FiguresWritten", "write_figures", "Segmentations", "segment", "capsule_maps", "overlay_masks",
           "plot_segmentations", "plot_capsule_maps"]
