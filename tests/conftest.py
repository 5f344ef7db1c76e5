"""Shared fixtures: the offline copy of the real data sets, and the small trained runs every test reads (each
trained once for the whole session, whichever worker asks first)."""
from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path
from typing import Callable

# `pytest -n N` (pytest-xdist, the README's command): the cores go to the N worker processes, so each runs torch on
# one thread, and so do the processes the tests start (set before torch is imported; an explicit setting wins).
# Several threads a worker oversubscribe a small machine: on 2 cores, -n 2 at 2 threads each was slower than no -n.
_XDIST_WORKER = bool(os.environ.get("PYTEST_XDIST_WORKER"))
if _XDIST_WORKER:
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import signal

import numpy as np
import pytest
import torch

from capsnet import CapsNetConfig
from capsnet.train import TrainConfig, fit

if _XDIST_WORKER and os.environ["OMP_NUM_THREADS"] == "1":
    torch.set_num_threads(1)  # in case a plugin imported torch before this file

# A suite started in the background (`pytest ... &`, nohup, a job runner) inherits Ctrl-C ignored, and so would the
# commands its tests interrupt: the tests of Ctrl-C would fail. Python's own handler back, as in a terminal (the
# processes the tests start then get it at their start, as anywhere).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# 4 x 6 x 6 primary capsules of 8D, 10 digit capsules of 16D, a narrow decoder: trains in seconds on a CPU
TINY = CapsNetConfig(conv1_channels=16, primary_types=4, decoder_hidden=(64, 128))


@pytest.fixture
def blank_routing_and_sweeps(monkeypatch: pytest.MonkeyPatch):
    """Called, it makes the routing and pose-sweep figures, the slowest to draw, blank ones (still saved under their
    names) for the rest of the test: for a test of something else than their drawing
    (test_figures_command_writes_every_figure draws them)."""
    def blank() -> None:
        from matplotlib.figure import Figure

        from capsnet.figures import report

        for slowest in ("plot_routing", "plot_pose_sweep"):
            monkeypatch.setattr(report, slowest, lambda *a, **k: Figure(figsize=(1, 1)))
    return blank


_DATA_SETS = ("mnist", "fashion-mnist")  # what the tests read: the real data sets, both


@pytest.fixture(scope="session")
def data_root() -> Path:
    """Real MNIST and Fashion-MNIST IDX files: in $CAPSNET_TEST_DATA when set, else ../shared/data next to the
    repository, else $CAPSNET_DATA (the loaders' own data folder)."""
    given = os.environ.get("CAPSNET_TEST_DATA")
    candidates = [Path(given)] if given else [Path(__file__).parents[1].parent / "shared" / "data"] + (
        [Path(os.environ["CAPSNET_DATA"])] if os.environ.get("CAPSNET_DATA") else [])
    root = next((c.resolve() for c in candidates if all((c / d).is_dir() for d in _DATA_SETS)),
                candidates[0].resolve())
    # both asked for: a folder of MNIST alone failed the Fashion tests (a loader's "not found") instead of skipping
    missing = [f"{d}/" for d in _DATA_SETS if not (root / d).is_dir()]
    if missing:
        if os.environ.get("CAPSNET_REQUIRE_DATA") == "1":  # CI: a clone away from ../shared skipped 160 tests, green
            pytest.fail(f"CAPSNET_REQUIRE_DATA=1 but {' and '.join(missing)} are not in {root}")
        pytest.skip(f"real data sets not found: {' and '.join(missing)} not in {root} (set CAPSNET_TEST_DATA to the "
                    f"folder holding mnist/ and fashion-mnist/)")
    return root


def _trained_once(tmp_path_factory: pytest.TempPathFactory, name: str, train: Callable[[Path], None]) -> Path:
    """``root/run``, where ``train(root / "run")`` made it once for the whole session: under `pytest -n N` each
    worker process holds its own session fixtures, and every worker trained each shared run again (SegCaps' twice
    for 10 s each); now the first worker to ask trains it in the folder the workers share, under a file lock, and
    the others wait for it and read it. A run that failed to train is trained afresh by the next to ask."""
    if not _XDIST_WORKER:
        root = tmp_path_factory.mktemp(name)
        train(root / "run")
        return root / "run"
    shared = tmp_path_factory.getbasetemp().parent  # this session's folder, above each worker's own
    root, done = shared / f"shared-{name}", shared / f"shared-{name}.done"
    with open(shared / f"shared-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if training raises
        if not done.exists():
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir()
            train(root / "run")
            done.touch()
    return root / "run"


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory, data_root) -> Path:
    """A run directory of ``TINY`` trained for 2 epochs on 1,000 real MNIST digits (tested on 200).

    Shared by the figure, viewer and command-line tests: treat it as read-only
    and copy what a test changes.
    """
    return _trained_once(tmp_path_factory, "trained", lambda run: fit(
        TINY, TrainConfig(dataset="mnist", epochs=2, batch_size=32, train_size=1000, test_size=200, seed=0), run,
        device="cpu", data_root=data_root, progress=False))


@pytest.fixture(scope="session")
def segmentation_run(tmp_path_factory, data_root) -> Path:
    """A run directory of SegCaps R1 trained one epoch on 32 mnist-segmentation canvases (tested on 16 and on 16
    out-of-distribution ones). Shared by the segmentation tests of training, evaluation, figures and the viewer:
    treat it as read-only.

    Narrow, as what these tests check is the same at any width and every walk, figure and evaluation runs the
    model: three quarters of the paper's capsule types on the full and 1/2 grids, half on the 1/4 one and a quarter
    on the 1/8 one, so that every layer the tests route through (primary, conv_2_1, conv_3_1, deconv_1_2,
    deconv_3_1) keeps at least 2 parent types (width 0.5 leaves primary and deconv_3_1 one). Capsule types:
    primary 2, conv_2_1 3, conv_2_2 2, conv_3_1 4, conv_3_2 2, conv_4_1 2, deconv_1_1 4 (+ conv_3_1's 4),
    deconv_1_2 2, deconv_2_1 3 (+ conv_2_1's 3), deconv_2_2 3, deconv_3_1 2 (+ conv1's 1), seg_caps 1: 544,513
    weights, the default's 1,425,649."""
    from capsnet.models import SegCapsR1Config

    narrow = SegCapsR1Config(level_widths=(0.75, 0.75, 0.5, 0.25))
    return _trained_once(tmp_path_factory, "segmentation", lambda run: fit(
        narrow, TrainConfig(dataset="mnist-segmentation", epochs=1, batch_size=8, train_size=32,
                            test_size=16, seed=0), run, device="cpu", data_root=data_root, progress=False))


@pytest.fixture(scope="session")
def gan_run(tmp_path_factory, data_root) -> Path:
    """A run directory of CapsPix2pix trained 1 epoch on 16 mnist-skeleton pairs (tested on 4), judged by the shipped
    MNIST CapsNet. Shared by the tests of the GAN loop, generation and figures: treat it as read-only.

    Small, as what these tests check is the same at any size and every image they make runs the generator: a
    quarter of the paper's capsule types on the full and 1/8 grids, three quarters on the 1/2 grid and half on the
    1/4 one, so that conv_2_1 (2 child types into 3) and deconv_1_2 (4 + 4 into 2) still route between several
    parent types (the viewer's routing tests: into one, the coupling is 1 in every round); a noise of 8 and a
    discriminator of 4 channels. 540,497 generator weights, the default's 1,519,953."""
    from capsnet.gan import fit_gan
    from capsnet.models import CapsPix2pixConfig

    small = CapsPix2pixConfig(noise_dim=8, disc_channels=4, level_widths=(0.25, 0.75, 0.5, 0.25))
    return _trained_once(tmp_path_factory, "gan", lambda run: fit_gan(
        small, TrainConfig(dataset="mnist-skeleton", epochs=1, batch_size=8, train_size=16, test_size=4, lr=2e-4),
        run, device="cpu", data_root=data_root, progress=False, judge="pretrained:capsnet-mnist-small"))


def _write_mask_pairs(root: Path, n: int, size: tuple[int, int] = (16, 16), mode: str = "L", mask_scale: int = 255,
                      seed: int = 0) -> None:
    """``n`` PNG images (grey, or ``mode`` RGB) of a bright 6x6 square on noise under root/images, and its mask
    (0/``mask_scale``) of the same name under root/masks: a user's own segmentation folder (``seed``: another
    one's contents)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    for k in range(n):
        mask = np.zeros(size, np.uint8)
        r, c = rng.integers(0, size[0] - 6), rng.integers(0, size[1] - 6)
        mask[r:r + 6, c:c + 6] = 1
        image = np.clip(rng.normal(40, 10, size) + 160 * mask, 0, 255).astype(np.uint8)
        if mode == "RGB":
            image = np.stack([image] * 3, -1)
        Image.fromarray(image, mode).save(root / "images" / f"p{k:02d}.png")
        Image.fromarray(mask * mask_scale).save(root / "masks" / f"p{k:02d}.png")


@pytest.fixture(scope="session")
def mask_pairs():
    """The writer of a user's segmentation folder: ``mask_pairs(root, n, size=(16, 16), mode="L", mask_scale=255,
    seed=0)``."""
    return _write_mask_pairs


@pytest.fixture(scope="session")
def unet_run(tmp_path_factory) -> Path:
    """A U-Net of 4 base channels and 2 poolings, trained one epoch on 7 of 10 16x16 pairs in folder:DIR (3 held out
    for testing, chosen by name). Shared by the viewer and figure tests: read-only."""
    from capsnet.models import UNetConfig

    def train(run: Path) -> None:
        _write_mask_pairs(run.parent / "data", 10)
        fit(UNetConfig(base_channels=4, depth=2, input_height=16, input_width=16),
            TrainConfig(dataset=f"folder:{run.parent / 'data'}", epochs=1, batch_size=4, lr=3e-3), run,
            progress=False)
    return _trained_once(tmp_path_factory, "unet", train)
