"""What every model checks of the tensors it is given, with messages that name the fix.

Only dtypes and shapes are read, so the checks cost nothing and force no
host sync on a GPU; class labels' values are read on the CPU alone (a label
out of range met torch's "Target 10 is out of bounds" there).
"""
from __future__ import annotations

import torch

from .._eager import autocast_on, eager
from ..losses import check_mask_values, check_nonempty  # defined beside the losses, which capsnet.models imports

__all__ = ["check_tensor", "check_floating", "check_weights_dtype", "check_class_images", "check_class_labels", "check_integer_labels",
           "check_decode_labels",
           "check_nonempty", "check_mask_values"]


def check_tensor(x: object, what: str = "images") -> None:
    """A TypeError unless ``x`` is a tensor: a NumPy array or a list met torch's "'numpy.ndarray' object has no
    attribute 'dim'"."""
    if not isinstance(x, torch.Tensor):
        module, name = type(x).__module__, type(x).__qualname__
        got = name if module == "builtins" else f"{module}.{name}"
        make = "torch.from_numpy" if module == "numpy" else "torch.tensor"
        raise TypeError(f"{what} must be a torch.Tensor, got {got}: pass {make}({what.replace(' ', '_')})")


def check_floating(x: torch.Tensor, what: str = "images") -> None:
    """A ValueError unless ``x`` is floating point: the 0-255 bytes ``capsnet.data.load_dataset`` and PIL give
    reach the first convolution as a dtype error otherwise (a TypeError unless it is a tensor)."""
    check_tensor(x, what)
    if not torch.is_floating_point(x):
        raise ValueError(f"{what} are {x.dtype}; the models take floating-point {what} in [0, 1]: "
                         f"capsnet.data.unit_float({what.replace(' ', '_')}) converts 0-255 bytes")


def check_weights_dtype(x: torch.Tensor, model: torch.nn.Module, what: str = "images", name: str = "images") -> None:
    """A ValueError naming the fix when floating ``x`` (``what``, the variable ``name`` in the fix) is of another
    dtype than ``model``'s weights outside autocast (float16 images into a float32 model met a convolution's
    "Input type (c10::Half) and bias type (float)")."""
    w = next(model.parameters(), None)
    if w is None or x.dtype == w.dtype or autocast_on(x.device.type):
        return
    raise ValueError(f"{what} are {x.dtype} but the model's weights are {w.dtype}; pass {name}.to({w.dtype}), or "
                     f"convert the model to {x.dtype} (model.to({x.dtype})), or run it under torch.autocast")


def check_class_images(images: torch.Tensor, expected: tuple[int, int, int]) -> None:
    """A ValueError unless ``images`` are floating-point (B, C, H, W) with (C, H, W) = ``expected``."""
    check_tensor(images)
    if images.dim() != 4 or tuple(images.shape[1:]) != tuple(expected):
        raise ValueError(f"expected images (B, {', '.join(map(str, expected))}), got {tuple(images.shape)}")
    check_floating(images)


def check_config(config: object, expected: type, model: str) -> None:
    """A TypeError unless ``config`` is an ``expected`` (or a subclass's) instance: None, a dict or another model's
    config met "'NoneType' object has no attribute 'in_channels'" (or 'conv1_channels') from inside the model."""
    if isinstance(config, expected):
        return
    name = expected.__name__
    if isinstance(config, type):
        got = f"the class {config.__name__} itself: pass an instance, {config.__name__}(...)"
    elif isinstance(config, dict):
        got = f"a dict: {name}(**d) builds one from it"
    else:
        got = type(config).__name__
    raise TypeError(f"{model} takes a {name}, got {got} (create_model(name, **overrides) builds a registered model "
                    f"with its config)")


def check_model_images(model: torch.nn.Module, images: torch.Tensor) -> None:
    """``check_class_images`` against a classifier's config (in_channels, input_height, input_width), then
    ``check_weights_dtype``: what each classifier's forward and routing_view check first."""
    cfg = model.config
    check_class_images(images, (cfg.in_channels, cfg.input_height, cfg.input_width))
    check_weights_dtype(images, model)


def check_integer_labels(labels: torch.Tensor) -> None:
    """A ValueError unless ``labels`` hold integers (class indices), not floats or booleans."""
    check_tensor(labels, "labels")
    if torch.is_floating_point(labels) or labels.dtype == torch.bool:
        raise ValueError(f"labels are {labels.dtype}; give class indices as integers (B,), e.g. "
                         f"labels.argmax(1) for one-hot or probability rows")


def check_decode_labels(labels: torch.Tensor, num_classes: int) -> None:
    """A ValueError unless a classifier's forward pass may decode ``labels``: (B,) class indices or (B, K) indices,
    K capsules per image, as integers. One-hot rows (B, num_classes) of 0 and 1 are refused by name (read on the CPU
    only): each decoded K images from classes 0 and 1, and the reconstruction loss then named the pixels."""
    check_integer_labels(labels)
    if labels.dim() == 2 and labels.shape[1] == num_classes > 2 and labels.numel() and labels.device.type == "cpu" \
            and eager() and bool(((labels == 0) | (labels == 1)).all()) and bool((labels.sum(1) == 1).all()):
        raise ValueError(f"labels of shape {tuple(labels.shape)} are one-hot rows; give class indices (B,): "
                         f"labels.argmax(1) ((B, K) labels decode K capsules per image, by their class indices)")


def check_class_labels(labels: torch.Tensor, batch: int, num_classes: int | None) -> None:
    """A ValueError unless ``labels`` are a classifier's targets for ``batch`` images: (B,) class indices, or (B, 2)
    index pairs (MultiMNIST), as integers. One-hot or probability rows, (B, num_classes), are refused by name: read
    as pairs they would train on classes 0 and 1 (their values) without a word. ``num_classes`` None: a model with
    no config (a user's own, trained by ``capsnet_loss``). An empty batch is refused (``check_nonempty``)."""
    check_nonempty(batch)
    check_integer_labels(labels)
    if labels.dim() == 2 and labels.shape[1] != 2 and num_classes in (None, labels.shape[1]):
        raise ValueError(f"labels of shape {tuple(labels.shape)} look one-hot; give class indices (B,): "
                         f"labels.argmax(1) (two-dimensional labels are MultiMNIST's (B, 2) pairs of classes)")
    if labels.dim() == 2 and num_classes == 2:  # one-hot rows of two classes, or pairs naming both classes of every
        # image: read as pairs they trained towards both at once, a loss of 0 (EM's spread loss) without a word
        raise ValueError(f"labels of shape {tuple(labels.shape)} for a model of 2 classes: give class indices (B,) "
                         f"(labels.argmax(1) for one-hot rows); pairs of classes (MultiMNIST's (B, 2)) need more than "
                         f"2 classes")
    if labels.dim() not in (1, 2) or (labels.dim() == 2 and labels.shape[1] != 2) or labels.shape[0] != batch:
        raise ValueError(f"labels must be ({batch},) class indices or ({batch}, 2) pairs for {batch} images, got shape "
                         f"{tuple(labels.shape)}")
    if num_classes is not None and labels.device.type == "cpu" and eager() and labels.numel():
        low, high = int(labels.min()), int(labels.max())  # on the CPU: no device sync
        if low < 0 or high >= num_classes:
            raise ValueError(f"class labels must be in 0..{num_classes - 1} for {num_classes} classes, got values "
                             f"from {low} to {high}")


def refuse_batch_of_one(where: str, fixes: str) -> None:
    """The ValueError for a training batch of one reaching a batch norm over a 1x1 map (``where``: which map), which
    has a single value per channel: torch's own error named neither a field nor a fix (``fixes``: the model's)."""
    raise ValueError(f"a training batch of one {where}, whose batch norm needs more than one value per channel: train "
                     f"with a batch size that leaves no last batch of one (it holds the training images modulo the "
                     f"batch size), {fixes}")
