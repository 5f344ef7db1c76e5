"""Shared fixtures: the offline copy of the real data sets."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def data_root() -> Path:
    """../shared/data next to the repository: real MNIST and Fashion-MNIST IDX files."""
    root = (Path(__file__).parents[1].parent / "shared" / "data").resolve()
    if not (root / "mnist").is_dir():
        pytest.skip(f"real data sets not found at {root}")
    return root
