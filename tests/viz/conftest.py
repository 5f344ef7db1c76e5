"""The viewers shared by the viewer's tests: the whole run's trained CapsNet and SegCaps R1 (tests/conftest.py), and a
tiny U-Net trained here on a folder of the user's own images and masks."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from capsnet.viz import Viewer, load_viewer

SEGMENTATION_TEST_SIZE = 16  # the canvases segmentation_run was tested on: drawing more costs time, not coverage


@pytest.fixture(scope="session")
def viewer(trained_run, data_root) -> Viewer:
    return load_viewer(trained_run, data_dir=data_root, progress=False)


@pytest.fixture(scope="session")
def segmentation_viewer(segmentation_run, data_root):
    return load_viewer(segmentation_run, data_dir=data_root, progress=False, test_size=SEGMENTATION_TEST_SIZE)


def write_pairs(root: Path, n: int, size: tuple[int, int] = (16, 16)) -> None:
    """``n`` grey PNG images with a bright square on noise, and its 0/255 mask, under root/images and root/masks."""
    rng = np.random.default_rng(0)
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    for k in range(n):
        mask = np.zeros(size, np.uint8)
        r, c = rng.integers(0, size[0] - 6), rng.integers(0, size[1] - 6)
        mask[r:r + 6, c:c + 6] = 1
        image = np.clip(rng.normal(40, 10, size) + 160 * mask, 0, 255).astype(np.uint8)
        Image.fromarray(image).save(root / "images" / f"p{k:02d}.png")
        Image.fromarray(mask * 255).save(root / "masks" / f"p{k:02d}.png")


@pytest.fixture(scope="session")
def unet_run(tmp_path_factory) -> Path:
    """A U-Net of 4 base channels and 2 poolings, trained one epoch on 8 of 10 16x16 pairs in folder:DIR (2 held out
    for testing). Read-only."""
    from capsnet.models import UNetConfig
    from capsnet.train import TrainConfig, fit

    root = tmp_path_factory.mktemp("unet")
    write_pairs(root / "data", 10)
    fit(UNetConfig(base_channels=4, depth=2, input_height=16, input_width=16),
        TrainConfig(dataset=f"folder:{root / 'data'}", epochs=1, batch_size=4, lr=3e-3), root / "run", progress=False)
    return root / "run"


@pytest.fixture(scope="session")
def unet_viewer(unet_run):
    return load_viewer(unet_run, progress=False)
