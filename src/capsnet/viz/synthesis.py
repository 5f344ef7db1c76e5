"""What the viewer computes for a synthesis model (CapsPix2pix, pix2pix): the images one label map gives under
several noise seeds, and the generator's layers that made them.

``SynthesisViewer`` answers the calls of ``Viewer`` (``info``, ``kernels``,
``test_input``, ``image_input``, ``walk``), so the server and the page take
one path for every kind. A walk holds the label map, the images it gives
under each seed asked for (``capsnet.synthesis.samples``: a test pair's
images are the ones ``capsnet eval`` scores, a drawn or uploaded map's the
ones ``capsnet generate`` writes for a folder of that one map), for a test
pair the real image with each sample's L1 and SSIM against it and its class,
the spread of the samples over the seeds (the noise-spread metric of
``capsnet eval``), and for a model with a noise vector (CapsPix2pix; pix2pix's
noise is its dropout) a row of images whose noise moves linearly from the
first seed's vector to the second's, the noise channel the first seed gives
the generator, and, as for SegCaps, the capsule lengths of every generator
layer (``capsule_grids``) with, at the one layer asked for, the coupling
coefficients of every routing round. The noise channel, the layers, the
routing and the conv1 maps are of the first seed's noise (the interpolation
runs from it to the second's). ``truncation`` draws the noise from the truncated
normal (``capsnet eval --truncation``). There is nothing to reconstruct from
a pose, so ``reconstruct`` is refused with a message.
"""
from __future__ import annotations

import os
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .._numbers import is_int
from ..figures.report import INTERPOLATION_STEPS  # images from seeds[0]'s noise to seeds[1]'s, as figures draws them
from ..figures.synthesis import interpolate_noise
from ..image_metrics import l1_error, noise_spread, ssim
from ..routing import routing_name
from ..synthesis import row_noise, samples
from .engine import (ViewerError, _Input, _ViewerBase, checked_image, checked_index, encode,
                     first_conv)
from .segmentation import coupling_view, describe_layers, hooked_grids, length_views, routers, routing_layer

__all__ = ["SynthesisViewer", "SYNTHESIS_TEST_SIZE", "DEFAULT_SEEDS", "MAX_SEEDS", "INTERPOLATION_STEPS",
           "MAX_SEED"]

SYNTHESIS_TEST_SIZE = 1000  # test pairs the viewer loads (the first 1,000, as the docs' tables score)
DEFAULT_SEEDS = (0, 1, 2, 3)  # samples per label map: four images from one map show what its noise does
MAX_SEEDS = 8  # the noise-spread metric's draws (capsnet.synthesis.SPREAD_SEEDS): more gives a slow page
MAX_SEED = 2 ** 31 - 1


def _first_maps(labels: torch.Tensor, conv: nn.Conv2d, grids: dict[str, torch.Tensor]) -> torch.Tensor:
    """The generator's first convolution's feature maps as the next layer sees them, (K, H', W'): CapsPix2pix's
    conv1 capsule grid (LeakyReLU 0.01 of conv1 over the label map and noise channel); otherwise (pix2pix, whose
    U-Net starts with it on the label map) the convolution of ``labels`` through LeakyReLU 0.2, which its next
    layer applies first."""
    if "conv1" in grids:
        return grids["conv1"][0, 0]  # (1, 1, 16, H, W) -> (16, H, W)
    return F.leaky_relu(conv(labels)[0], 0.2)  # (K, H', W')


class SynthesisViewer(_ViewerBase):
    """One synthesis model, its test label maps with their real images, and the views of a label map.

    Thread-safe as ``Viewer``: all model calls, and the hooks that catch a
    capsule layer's input, hold one lock.

    Args:
        model: a registered synthesis model (``ConditionalGAN``: ``noise``, ``generate``, ``generator``).
        test_labels: (N, C, H, W) label maps in [0, 1], or None (draw or upload only).
        test_images: (N, C', H, W) the real image of each label map, in [0, 1].
        test_classes: (N,) the class of each pair, or None.
        classes: the names of the classes ``test_classes`` counts, or None.
        dataset: the pairs' data set name, shown by ``info()`` and the page.
        checkpoint: the file the model came from, shown by ``info()``; None for an untrained model.
    """

    kind = "synthesis"
    label_maps = "binary"  # how the run's training label maps read ("graded": class indices 0..K, read as they are)

    def __init__(self, model: nn.Module, *, test_labels: torch.Tensor | None = None,
                 test_images: torch.Tensor | None = None, test_classes: torch.Tensor | None = None,
                 classes: Sequence[str] | None = None, dataset: str | None = None,
                 checkpoint: str | os.PathLike | None = None) -> None:
        if not all(hasattr(model, a) for a in ("generator", "noise", "generate")):
            raise ViewerError(f"SynthesisViewer shows a synthesis model (capspix2pix, capspix2pix-deep, pix2pix), got "
                              f"{type(model).__name__}: a classification or segmentation model opens in Viewer or "
                              f"SegmentationViewer (load_viewer picks)")
        self._hold(model, dataset, checkpoint)  # self.shape: a label map's
        cfg = self.config
        self.out_shape = (cfg.out_channels, cfg.input_height, cfg.input_width)  # an image
        if test_labels is not None:
            if tuple(test_labels.shape[1:]) != self.shape:
                raise ViewerError(f"{dataset or 'the'} test label maps are {tuple(test_labels.shape[1:])} but the "
                                  f"model takes {self.shape}: pick the data set the checkpoint was trained on "
                                  f"(--dataset)")
            want = (len(test_labels), *self.out_shape)
            if test_images is None or tuple(test_images.shape) != want:
                got = None if test_images is None else tuple(test_images.shape)
                raise ViewerError(f"test_images must give one image {want[1:]} per label map, {want} in all, got {got}")
            if test_classes is not None and len(test_classes) != len(test_labels):
                raise ViewerError("test_classes must give one class per label map")
        self.test_labels = test_labels
        self.test_images = test_images
        self.test_classes = test_classes
        self.classes = list(classes or [])
        self.generator = model.generator
        self.noise_dim = int(model.noise(1, 0).shape[1])  # 0: the noise is dropout (pix2pix)
        self._conv_name, self.conv = first_conv(self.generator)
        self._routers = routers(self.generator)  # CapsPix2pix's capsule layers that route
        with torch.inference_mode():  # the sizes of every view, from one blank label map
            x = torch.zeros(1, *self.shape, device=self.device)
            z = model.noise(1, 0, self.device)
            grids, inputs = self._grids(x, z, list(self._routers))
            self._map = list(_first_maps(x, self.conv, grids).shape[1:])
            self.layers = describe_layers(self._routers, grids, inputs)

    # ------------------------------------------------------------------ description

    def info(self) -> dict[str, Any]:
        from ..models import model_name

        # a pair's class is shown, not picked: a test pair is picked by index
        return self._described(0 if self.test_labels is None else len(self.test_labels), self.classes) | {
            "output": list(self.out_shape),
            "model_name": model_name(self.config),
            "noise": "vector" if self.noise_dim else "dropout",
            "noise_dim": self.noise_dim,
            "seeds": list(DEFAULT_SEEDS),
            "max_seeds": MAX_SEEDS,
            "interpolation_steps": INTERPOLATION_STEPS if self.noise_dim else 0,
            "conv1": {"name": self._conv_name, "channels": self.conv.out_channels, "kernel": self.conv.kernel_size[0],
                      "map": self._map, "in_channels": self.conv.in_channels},
            "layers": self.layers,
            "routing_layers": [layer["name"] for layer in self.layers if layer["routing"]],
            "routing": routing_name(self.model) if self.layers else None,  # the algorithm (capsnet.routing's name)
        }

    # ------------------------------------------------------------------ inputs

    def test_input(self, index: int | None = None, label: Any = None, nth: Any = 0) -> _Input:
        """Test pair ``index``: its label map, with its real image as the truth; ``label`` is refused (pick by
        index)."""
        if self.test_labels is None:
            raise ViewerError("no test set is loaded; draw or upload a label map instead")
        if label is not None:
            raise ViewerError('a synthesis test pair is picked by index: send {"index": n}')
        n = len(self.test_labels)
        checked_index(index, n, "label maps")
        source: dict[str, Any] = {"kind": "test", "index": index}
        if self.test_classes is not None:
            k = int(self.test_classes[index])
            source["class"] = k
            if 0 <= k < len(self.classes):
                source["class_name"] = self.classes[k]
        return _Input(_unit(self.test_labels[index]), source, _unit(self.test_images[index]))

    def image_input(self, image: torch.Tensor, source: dict[str, Any]) -> _Input:
        """An uploaded or drawn label map (C, H, W) in [0, 1], of the model's input size; no real image."""
        return _Input(checked_image(image, self.shape), source)

    # ------------------------------------------------------------------ the network

    def _grids(self, labels: torch.Tensor, z: torch.Tensor, hooked: list[str]
               ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Every capsule grid of the generator for (labels, z) (none without ``capsule_grids``) and the input each
        ``hooked`` layer got."""
        if not hasattr(self.generator, "capsule_grids"):
            return {}, {}
        return hooked_grids(self._routers, hooked, lambda: self.generator.capsule_grids(labels, z))

    def _seeds(self, seeds: Any) -> list[int]:
        if seeds is None:
            return list(DEFAULT_SEEDS)
        if (not isinstance(seeds, (list, tuple)) or not 1 <= len(seeds) <= MAX_SEEDS
                or not all(is_int(s) and 0 <= s <= MAX_SEED for s in seeds)):
            raise ViewerError(f"seeds must be a list of 1 to {MAX_SEEDS} integers in 0..{MAX_SEED}, got "
                              f"{str(seeds)[:80]}")
        if len(set(seeds)) != len(seeds):
            raise ViewerError(f"seeds {str(seeds)[:80]} repeats a seed: give each once")
        return [int(s) for s in seeds]

    def _truncation(self, truncation: Any) -> float | None:
        """``truncation`` checked by the model's own noise (a finite number >= 0, and a noise vector to cut)."""
        if truncation is None:
            return None
        try:
            self.model.noise(1, 0, truncation=truncation)
        except ValueError as e:
            raise ViewerError(f"{str(e)[:300]}; or leave truncation out") from None
        return float(truncation)

    def walk(self, inp: _Input, routing: str | None = None, seeds: Any = None, truncation: Any = None
             ) -> dict[str, Any]:
        """Every view of one label map (the JSON of POST /api/forward and /api/upload).

        ``routing``: a capsule layer's name (``info()["routing_layers"]``) whose coupling coefficients of every
        round to send, or None. ``seeds``: the noise seeds of the samples (default ``DEFAULT_SEEDS``).
        ``truncation``: the noise's truncation (None: untruncated).
        """
        layer = routing_layer(self._routers, routing, self.model)
        seeds = self._seeds(seeds)
        truncation = self._truncation(truncation)
        row = inp.source["index"] if inp.source.get("kind") == "test" else 0
        with self._lock, torch.inference_mode():
            label = inp.image.to(self.device)  # (C, H, W)
            images = samples(self.model, label, seeds, row=row, truncation=truncation).float()  # (K, C', H, W)
            z = row_noise(self.model, row, seeds[0], self.device, truncation=truncation)  # (1, Z)
            x = label.unsqueeze(0)  # (1, C, H, W)
            grids, inputs = self._grids(x, z, [layer] if layer else [])
            rounds = self._routers[layer].route(inputs[layer], record=True)[1].rounds if layer else None  # (P,R,T,J)
            maps = _first_maps(x, self.conv, grids).float().cpu()  # (K, H', W')
            noise_map = between = None
            if self.noise_dim:
                noise_map = self.generator.noise(z).view(self.shape[1:]).float().cpu()  # (H, W)
                if len(seeds) > 1:  # (S, C', H, W), the ends: samples 0 and 1
                    between = interpolate_noise(self.model, label, INTERPOLATION_STEPS, (seeds[0], seeds[1]),
                                                row=row, truncation=truncation).float()
        images = images.cpu()
        truth = inp.truth
        scores = None
        if truth is not None:
            real = truth.unsqueeze(0).expand_as(images)
            scores = [{"seed": s, "l1": float(a), "ssim": float(b)}
                      for s, a, b in zip(seeds, l1_error(images, real), ssim(images, real))]
        spread = float(noise_spread(images.unsqueeze(1))[0]) if len(seeds) > 1 else None
        fmax = maps.reshape(maps.shape[0], -1).amax(dim=1).clamp_min(1e-12)
        noise_range = max(float(noise_map.abs().max()), 1e-12) if noise_map is not None else None
        return {
            "source": inp.source,
            "input": encode(inp.image, 0.0, 1.0),
            "truth": None if truth is None else encode(truth, 0.0, 1.0),
            "seeds": seeds,
            "truncation": truncation,
            "samples": encode(images, 0.0, 1.0),
            "scores": scores,
            "spread": spread,
            "interpolation": None if between is None else encode(between, 0.0, 1.0),
            "noise_map": None if noise_map is None else encode(noise_map, -noise_range, noise_range),
            "feature_maps": encode(maps, [0.0] * len(fmax), fmax.tolist()),
            "layers": length_views(grids),
            "routing": None if rounds is None else coupling_view(layer, rounds, grids[layer], self._routers[layer]),
        }

    def reconstruct(self, pose: Any = None, capsule: Any = None) -> dict[str, Any]:
        """Refused: the pose sliders move a digit capsule of a classification model; a generator has none."""
        raise ViewerError(f"this {type(self.model).__name__} makes images from label maps: it has no digit capsules "
                          "to move, so there is nothing to reconstruct from a pose (POST /api/reconstruct is for "
                          "classification models); its images come with every walk (POST /api/forward)")


def _unit(x: torch.Tensor) -> torch.Tensor:
    """(C, H, W) as float in [0, 1] (uint8 0..255 divided)."""
    return x.float() if x.is_floating_point() else x.float() / 255.0
