"""A small CapsNet trained for a moment on the shipped mnist-sample, shared by the viewer's tests."""
from __future__ import annotations

from pathlib import Path

import pytest

from capsnet import CapsNetConfig
from capsnet.train import TrainConfig, fit
from capsnet.viz import Viewer, load_viewer

SMALL = CapsNetConfig(conv1_channels=16, primary_types=4, decoder_hidden=(32, 64))


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("viz") / "tiny"
    fit(SMALL, TrainConfig(dataset="mnist-sample", epochs=1, batch_size=50, train_size=500, test_size=100, seed=0),
        run, device="cpu", progress=False)
    return run


@pytest.fixture(scope="session")
def viewer(tiny_run) -> Viewer:
    return load_viewer(tiny_run, progress=False)
