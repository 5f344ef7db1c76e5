"""What the viewer computes for a segmentation model: the predicted mask of one image, and the layers that made it.

``SegmentationViewer`` answers the calls of ``Viewer`` (``info``, ``kernels``,
``test_input``, ``image_input``, ``walk``), so the server and the page take
one path for both. A walk holds the input, the foreground probability at
every pixel (the model's own output), the predicted mask (probability > 0.5,
as ``capsnet.evaluate`` scores it), the ground truth with Dice and IoU for a
test canvas, the first convolution's feature maps, and for SegCaps (LaLonde
and Bagci 2018) its reconstruction and the capsule lengths of every layer of
``model.capsule_grids``, plus, at the one capsule layer asked for, the
coupling coefficients of every routing round (``ConvCaps2d.route(x,
record=True)``). There are no classes and no digit capsules to move, so
``reconstruct`` (the pose sliders) is refused with a message.
"""
from __future__ import annotations

import os
from typing import Any, Callable, TypeVar

import torch
from torch import nn

from ..data.segmentation import dice_iou
from ..memory import release_freed
from ..models import segments
from ..routing import routing_name
from .engine import ViewerError, _Input, _ViewerBase, checked_image, checked_index, encode, first_conv
from .images import off_sides

__all__ = ["SegmentationViewer", "THRESHOLD", "SEGMENTATION_TEST_SIZE", "OTHER_SIZE_PIXELS", "routers", "routing_layer",
           "hooked_grids", "describe_layers", "length_views", "coupling_view"]

THRESHOLD = 0.5  # the predicted mask: probability > 0.5, the rule capsnet.evaluate and training score
# uploads of other sizes than the model's (any its stride divides) up to this many pixels, or the model's own count
# if larger: a walk's time grows with the pixels, 16 times a 64x64 canvas's at 256x256, and the server answers one
# walk at a time (capsnet predict takes larger images)
OTHER_SIZE_PIXELS = 256 * 256
SEGMENTATION_TEST_SIZE = 1000  # mnist-segmentation canvases the viewer draws (all 10,000 take ~10 s on a CPU)


def _first_maps(model: nn.Module, conv: nn.Conv2d) -> nn.Module:
    """The first convolution's feature maps as the next layer sees them: ReLU(conv(x)), with the batch norm between
    them when one follows it in its block (the U-Net's ``Conv2d, BatchNorm2d, ReLU``)."""
    for block in model.modules():
        if isinstance(block, nn.Sequential) and len(block) and block[0] is conv:
            stop = next((k for k, m in enumerate(block) if isinstance(m, nn.ReLU)), None)
            if stop is not None:
                return block[:stop + 1]
    return nn.Sequential(conv, nn.ReLU())  # SegCaps: relu(conv1(x)), its conv1 capsule grid


def routers(model: nn.Module) -> dict[str, nn.Module]:
    """The capsule layers of ``model.caps`` (SegCaps' stack, also CapsPix2pix's generator's) that route, by name:
    each has ``route(x, record=True)``. None for a model without such a stack (the U-Net, pix2pix)."""
    caps = getattr(model, "caps", None)
    return {name: m for name, m in caps.items() if hasattr(m, "route")} if isinstance(caps, nn.ModuleDict) else {}


def routing_layer(routers: dict[str, nn.Module], routing: Any, model: nn.Module) -> str | None:
    """``routing`` checked against the layers that route: the name, or None; anything else is a ViewerError that
    names them."""
    if routing is None or (isinstance(routing, str) and routing in routers):
        return routing
    names = ", ".join(routers)
    raise ViewerError(f"unknown routing layer {str(routing)[:60]!r}: " +
                      (f"the capsule layers that route are {names}" if names else
                       f"this {type(model).__name__} has no capsule layers; leave routing out"))


_Ran = TypeVar("_Ran")  # what hooked_grids' callable returns


def hooked_grids(routers: dict[str, nn.Module], hooked: list[str], grids: Callable[[], _Ran]
                 ) -> tuple[_Ran, dict[str, torch.Tensor]]:
    """``grids()`` (a ``capsule_grids`` call: {name: (1, T, D, H', W')}, or SegCaps' ``forward_with_grids``: its
    output and those grids) and the input each ``hooked`` layer of ``routers`` got on the way ((1, T, Din, H, W), the
    skip concatenation included)."""
    inputs: dict[str, torch.Tensor] = {}

    def keep(name: str):
        def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
            inputs[name] = args[0]
        return hook

    handles = [routers[name].register_forward_pre_hook(keep(name)) for name in hooked]
    try:
        return grids(), inputs
    finally:
        for h in handles:
            h.remove()


def describe_layers(routers: dict[str, nn.Module], grids: dict[str, torch.Tensor], inputs: dict[str, torch.Tensor]
                    ) -> list[dict[str, Any]]:
    """``info()["layers"]``: each grid's name, types, dims and grid size, and for a layer that routes (its input in
    ``inputs``) its rounds and child and parent types."""
    rounds = {name: routers[name].route(inputs[name], record=True)[1].rounds.shape  # (P, R, T, J)
              for name in inputs}
    return [{"name": name, "types": g.shape[1], "dim": g.shape[2], "grid": list(g.shape[3:]),
             "routing": None if name not in rounds else
             {"rounds": rounds[name][1], "children": rounds[name][2], "parents": rounds[name][3]}}
            for name, g in grids.items()]  # g: (1, T, D, H', W')


def length_views(grids: dict[str, torch.Tensor]) -> list[dict[str, Any]]:
    """Every capsule's length per layer, each layer encoded from 0 to its longest capsule: [{name, lengths}], the
    lengths (T, H', W')."""
    views = []
    for name, g in grids.items():
        lengths = torch.linalg.vector_norm(g[0].float(), dim=1).cpu()  # (T, H', W')
        views.append({"name": name, "lengths": encode(lengths, 0.0, max(float(lengths.max()), 1e-12))})
    return views


def coupling_view(layer: str, rounds: torch.Tensor, grid: torch.Tensor, router: nn.Module) -> dict[str, Any]:
    """One layer's recorded coupling (P, R, T, J), P the positions of its output ``grid`` (1, J, D, H', W'), as
    {layer, coupling (R, J, T, H', W')} from 0 to its largest coefficient, softmax: what the coefficients sum to 1
    over, "parents" or "children" (``router``'s routing's softmax: over the children the mean over child types the
    page drew was 1/T everywhere)."""
    h, w = grid.shape[-2:]
    P, R, T, J = rounds.shape
    c = rounds.float().cpu().reshape(h, w, R, T, J).permute(2, 4, 3, 0, 1)  # (R, J, T, H', W')
    softmax = getattr(router.routing, "softmax", "parents")
    return {"layer": layer, "coupling": encode(c, 0.0, max(float(c.max()), 1e-12)), "softmax": softmax}


class SegmentationViewer(_ViewerBase):
    """One segmentation model (SegCaps or the U-Net), its test canvases and masks, and the views of an input.

    Thread-safe as ``Viewer``: all model calls, and the hooks that catch a
    capsule layer's input, hold one lock.

    Args:
        model: a registered segmentation model; ``probabilities`` (B, 1, H, W) from ``model(images)``.
        test_images: (N, C, H, W), uint8 0..255 or float in [0, 1], or None (draw or upload only).
        test_masks: (N, 1, H, W) 0/1, one per test image.
        dataset: the test images' data set name, shown by ``info()`` and the page, named in errors.
        checkpoint: the file the model came from, shown by ``info()``; None for an untrained model.
    """

    kind = "segmentation"

    def __init__(self, model: nn.Module, *, test_images: torch.Tensor | None = None,
                 test_masks: torch.Tensor | None = None, dataset: str | None = None,
                 checkpoint: str | os.PathLike | None = None) -> None:
        if not segments(model):
            raise ViewerError(f"SegmentationViewer shows a segmentation model (segcaps, segcaps-r1, unet), got "
                              f"{type(model).__name__}: a classification model opens in Viewer")
        self._hold(model, dataset, checkpoint)
        if test_images is not None:
            if tuple(test_images.shape[1:]) != self.shape:
                raise ViewerError(f"{dataset or 'the'} test images are {tuple(test_images.shape[1:])} but the model "
                                  f"takes {self.shape}: pick the data set the checkpoint was trained on (--dataset)")
            want = (len(test_images), 1, *self.shape[1:])
            if test_masks is None or tuple(test_masks.shape) != want:
                got = None if test_masks is None else tuple(test_masks.shape)
                raise ViewerError(f"test_masks must give one mask {want[1:]} per test image, {want} in all, got {got}")
        self.test_images = test_images
        self.test_masks = test_masks
        # the first convolution: its kernels and feature maps (SegCaps' conv1, the U-Net's first 3x3)
        self._conv_name, self.conv = first_conv(model)
        self._first = _first_maps(model, self.conv)
        self._routers = routers(model)  # SegCaps' capsule layers that route
        self._sizes_seen: set[tuple[int, int]] = set()  # (H, W) of the inputs walked so far
        # uploads of other sizes: (multiple, max pixels) for a model that says what its sides must be multiples of
        multiple = getattr(model, "side_multiple", None)
        own = self.shape[1] * self.shape[2]
        self.sides = None if multiple is None else (int(multiple), max(OTHER_SIZE_PIXELS, own))
        with torch.inference_mode():  # the sizes of every view, from one blank input
            x = torch.zeros(1, *self.shape, device=self.device)
            out = model(x)
            self.decodes = getattr(out, "reconstructions", None) is not None
            self._map = list(self._first(x).shape[2:])
            self.layers = describe_layers(self._routers, *self._grids(x, list(self._routers)))

    # ------------------------------------------------------------------ description

    def info(self) -> dict[str, Any]:
        from ..models import model_name

        # nothing to pick by class: a test canvas is picked by index
        return self._described(0 if self.test_images is None else len(self.test_images), []) | {
            "model_name": model_name(self.config),
            "conv1": {"name": self._conv_name, "channels": self.conv.out_channels, "kernel": self.conv.kernel_size[0],
                      "map": self._map, "batch_norm": any(isinstance(m, nn.BatchNorm2d) for m in self._first)},
            # every layer of model.capsule_grids (SegCaps), in order; "routing" for those that route
            "layers": self.layers,
            "routing_layers": [layer["name"] for layer in self.layers if layer["routing"]],
            "routing": routing_name(self.model) if self.layers else None,  # the algorithm (capsnet.routing's name)
            "decoder": self.decodes,
            "threshold": THRESHOLD,
            # the sizes an upload may have besides the model's own (null: that size only)
            "sides": None if self.sides is None else {"multiple": self.sides[0], "max_pixels": self.sides[1]},
        }

    # ------------------------------------------------------------------ inputs

    def test_input(self, index: int | None = None, label: Any = None, nth: Any = 0) -> _Input:
        """Test canvas ``index`` with its mask; ``label`` is refused (a segmentation test set has no classes)."""
        if self.test_images is None:
            raise ViewerError("no test set is loaded; draw or upload an image instead")
        if label is not None:
            raise ViewerError('a segmentation test set has no classes to pick from: pick a canvas by index, '
                              '{"index": n}')
        n = len(self.test_images)
        checked_index(index, n)
        image = self.test_images[index]
        image = image.float() if image.is_floating_point() else image.float() / 255.0
        return _Input(image, {"kind": "test", "index": index}, self.test_masks[index].to(torch.uint8))

    def image_input(self, image: torch.Tensor, source: dict[str, Any]) -> _Input:
        """An uploaded or drawn image (C, H, W) in [0, 1], of the model's input size or another that ``sides`` (the
        ``info()`` field) allows; no ground truth."""
        C, H, W = image.shape if image.dim() == 3 else (None, None, None)
        if self.sides is not None and C == self.shape[0] and (H, W) != self.shape[1:]:
            if off_sides(W, H, *self.sides):  # canvas_input's rule
                raise ViewerError(f"image must be {self.shape} or have sides multiples of {self.sides[0]} and at "
                                  f"most {self.sides[1]:,} pixels, got {tuple(image.shape)}")
            return _Input(checked_image(image, (C, H, W)), source)
        return _Input(checked_image(image, self.shape), source)

    # ------------------------------------------------------------------ the network

    def _routing_layer(self, routing: Any) -> str | None:
        return routing_layer(self._routers, routing, self.model)

    def _grids(self, x: torch.Tensor, hooked: list[str]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Every capsule grid of ``x`` (none without ``capsule_grids``) and the input each ``hooked`` layer got."""
        if not hasattr(self.model, "capsule_grids"):
            return {}, {}
        return hooked_grids(self._routers, hooked, lambda: self.model.capsule_grids(x))

    def _output_and_grids(self, x: torch.Tensor, hooked: list[str]) -> tuple[Any, dict[str, torch.Tensor],
                                                                               dict[str, torch.Tensor]]:
        """The model's output for ``x``, with ``_grids``' two from the same pass where the model gives both
        (SegCaps' ``forward_with_grids``)."""
        if not hasattr(self.model, "forward_with_grids"):  # the U-Net: no capsule grids
            return (self.model(x), *self._grids(x, hooked))
        (out, grids), inputs = hooked_grids(self._routers, hooked, lambda: self.model.forward_with_grids(x))
        return out, grids, inputs

    def walk(self, inp: _Input, routing: str | None = None) -> dict[str, Any]:
        """Every view of one input (the JSON of POST /api/forward and /api/upload).

        ``routing``: a capsule layer's name (``info()["routing_layers"]``) whose
        coupling coefficients of every round to send, or None.
        """
        layer = self._routing_layer(routing)
        with self._lock, torch.inference_mode():
            x = inp.image.to(self.device).unsqueeze(0)  # (1, C, H, W)
            size = tuple(x.shape[-2:])
            maps = self._first(x)  # (1, K, H, W)
            # probabilities (1, 1, H, W), SegCaps' reconstructions masked by the prediction; its grids from the
            # same pass
            out, grids, inputs = self._output_and_grids(x, [layer] if layer else [])
            rounds = self._routers[layer].route(inputs[layer], record=True)[1].rounds if layer else None  # (P, R, T, J)
            if size not in self._sizes_seen:  # a size not walked before: what its pass freed goes back to the
                # kernel (the freed work buffers of each new size stayed in malloc's heap: 80 upload sizes took RSS
                # from 357 to 2,039 MB)
                self._sizes_seen.add(size)
                release_freed()
        prob = out.probabilities[0].float().cpu()  # (1, H, W)
        mask = (prob > THRESHOLD).to(torch.uint8)  # (1, H, W)
        truth = inp.truth
        dice = iou = None
        if truth is not None:
            d, i = dice_iou(mask.unsqueeze(0), truth.unsqueeze(0))  # (1,), (1,)
            dice, iou = float(d[0]), float(i[0])
        recon = getattr(out, "reconstructions", None)
        fmap = maps[0].float().cpu()  # (K, H, W)
        fmax = fmap.reshape(fmap.shape[0], -1).amax(dim=1).clamp_min(1e-12)
        layers = length_views(grids)
        coupling = None if rounds is None else coupling_view(layer, rounds, grids[layer], self._routers[layer])
        return {
            "source": inp.source,
            "input": encode(inp.image, 0.0, 1.0),
            "probability": encode(prob, 0.0, 1.0),
            "mask": encode(mask, 0.0, 1.0),
            "truth": None if truth is None else encode(truth, 0.0, 1.0),
            "dice": dice,
            "iou": iou,
            "pixels": {"predicted": int(mask.sum()), "truth": None if truth is None else int(truth.sum())},
            "reconstruction": None if recon is None else encode(recon[0].float().cpu(), 0.0, 1.0),
            "feature_maps": encode(fmap, [0.0] * len(fmax), fmax.tolist()),
            "layers": layers,
            "routing": coupling,
        }

    def reconstruct(self, pose: Any = None, capsule: Any = None) -> dict[str, Any]:
        """Refused: the pose sliders move a digit capsule of a classification model; this model has none."""
        raise ViewerError(f"this {type(self.model).__name__} segments images: it has no digit capsules to move, so "
                          "there is nothing to reconstruct from a pose (POST /api/reconstruct is for classification "
                          "models); SegCaps' own reconstruction comes with every walk (POST /api/forward)")
