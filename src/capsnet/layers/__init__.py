"""Capsule layers, one idea per file; each routes with any module of the shared call shape (``capsnet.routing``).

Adding a layer is one new file, its test and one line here.
"""
from __future__ import annotations

from .conv import ConvCaps2d, ConvTransposeCaps2d
from .dense import DenseCaps
from .matrix import (ClassMatrixCaps, ConvMatrixCaps, DenseMatrixCaps, MatrixCaps, PrimaryMatrixCaps,
                     grid_routing_view)
from .primary import PrimaryCaps

__all__ = ["PrimaryCaps", "DenseCaps", "ConvCaps2d", "ConvTransposeCaps2d", "MatrixCaps", "PrimaryMatrixCaps", "ConvMatrixCaps", "ClassMatrixCaps",
           "DenseMatrixCaps", "grid_routing_view"]
