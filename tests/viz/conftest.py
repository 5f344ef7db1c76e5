"""The viewer of the whole run's trained CapsNet (tests/conftest.py), shared by the viewer's tests."""
from __future__ import annotations

import pytest

from capsnet.viz import Viewer, load_viewer


@pytest.fixture(scope="session")
def viewer(trained_run, data_root) -> Viewer:
    return load_viewer(trained_run, data_dir=data_root, progress=False)
