"""Data for capsule networks: IDX files, MNIST-family sets, downloads, augmentation.

Depends on nothing else in capsnet. ``load_dataset`` returns a ``Dataset`` of
two tensors, (N, 1, 28, 28) uint8 images and (N,) int64 labels, meant to be
moved to the device whole and batched by indexing; ``random_shift`` is the
paper's augmentation as one batched tensor op.
"""
from __future__ import annotations

from .augment import random_shift
from .idx import DataError, read_idx, write_idx
from .sets import DATASETS, Dataset, clear_data_cache, load_dataset, split_validation, unit_float

__all__ = [
    "DataError", "Dataset", "DATASETS", "load_dataset", "split_validation", "clear_data_cache",
    "random_shift", "read_idx", "write_idx", "unit_float",
]
