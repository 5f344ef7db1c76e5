"""The viewers shared by the viewer's tests: of the whole run's trained CapsNet, SegCaps R1, the tiny U-Net trained
on a folder of the user's own images and masks, and CapsPix2pix (tests/conftest.py)."""
from __future__ import annotations

import pytest

from capsnet.viz import Viewer, load_viewer

SEGMENTATION_TEST_SIZE = 16  # the canvases segmentation_run was tested on: drawing more costs time, not coverage


@pytest.fixture(scope="session")
def viewer(trained_run, data_root) -> Viewer:
    return load_viewer(trained_run, data_dir=data_root, progress=False)


@pytest.fixture(scope="session")
def segmentation_viewer(segmentation_run, data_root):
    return load_viewer(segmentation_run, data_dir=data_root, progress=False, test_size=SEGMENTATION_TEST_SIZE)


@pytest.fixture(scope="session")
def unet_viewer(unet_run):
    return load_viewer(unet_run, progress=False)


@pytest.fixture(scope="session")
def pix2pix_viewer():
    """An untrained pix2pix (its noise is dropout: no noise vector, no capsule layers) on three random 32x32 label maps
    and images, of classes "two", "zero" and "one"."""
    import torch

    from capsnet.models import create_model
    from capsnet.viz import SynthesisViewer

    torch.manual_seed(0)
    model = create_model("pix2pix").eval()
    g = torch.Generator().manual_seed(1)
    labels = (torch.rand(3, 1, 32, 32, generator=g) > 0.8).float()
    return SynthesisViewer(model, test_labels=labels, test_images=torch.rand(3, 1, 32, 32, generator=g),
                           test_classes=torch.tensor([2, 0, 1]), classes=["zero", "one", "two"])


@pytest.fixture(scope="session")
def synthesis_viewer(gan_run, data_root):
    """CapsPix2pix of the shared gan_run (1 epoch on 16 mnist-skeleton pairs) on its 4 test pairs."""
    return load_viewer(gan_run, data_dir=data_root, progress=False, test_size=4)
