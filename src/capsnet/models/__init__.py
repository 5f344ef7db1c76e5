"""Models built from capsule layers, and the one place they are named.

``MODELS`` maps a name to its ``ModelSpec``: the config dataclass, the module
built from it, the training loss and a title for tables. Training, evaluation,
checkpoints, experiments and the command line all look models up here, so
adding a model is one file (config, module, loss), its test and one line below,
with its import above and its classes in ``__all__``; the registry tests take
it from there, at its registered sizes unless their ``SMALL`` tables give
smaller ones (README, "Where things live, and how to add one", lists what
they hold a model to).
"""
from __future__ import annotations

import os
from types import MappingProxyType
from typing import Any, Callable, Mapping, NamedTuple

import torch
from torch import nn

from .baseline import BaselineCNN, BaselineCNNConfig, baseline_loss
from .capsnet import (CapsNet, CapsNetCifar10Config, CapsNetConfig, CapsNetOutput, CapsNetSvhnConfig, Decoder, capsnet_loss,
                      mask_capsules)
from .efficient_capsnet import EfficientCapsNet, EfficientCapsNetConfig
from .inverted_capsnet import InvertedCapsNet, InvertedCapsNetConfig, InvertedCapsNetOutput, inverted_capsnet_loss
from .em_capsnet import EMCapsNet, EMCapsNetConfig, EMCapsNetOutput, EMCapsNetSmallConfig, em_capsnet_loss
from .capspix2pix import (CapsPix2pix, CapsPix2pixConfig, CapsPix2pixDeepConfig, CapsPix2pixGenerator,
                          ConditionalDiscriminator,
                          ConditionalGAN, GAN_LR, synthesis_losses)
from .pix2pix import PatchDiscriminator, Pix2pix, Pix2pixConfig, UNetGenerator
from .segcaps import SegCaps, SegCapsConfig, SegCapsOutput, SegCapsR1Config, segmentation_model_loss
from .unet import UNet, UNetConfig, UNetOutput

__all__ = ["CapsNet", "CapsNetConfig", "CapsNetCifar10Config", "CapsNetSvhnConfig", "CapsNetOutput", "Decoder", "mask_capsules", "capsnet_loss", "BaselineCNN",
           "BaselineCNNConfig", "baseline_loss", "EMCapsNet", "EMCapsNetConfig", "EMCapsNetSmallConfig",
           "EMCapsNetOutput", "em_capsnet_loss", "EfficientCapsNet", "EfficientCapsNetConfig", "InvertedCapsNet",
           "InvertedCapsNetConfig", "InvertedCapsNetOutput", "inverted_capsnet_loss", "ModelSpec", "MODELS", "SCORES", "check_registry", "list_models", "model_spec", "create_model",
           "model_name", "train_defaults", "default_routing", "num_weights", "pretrained", "list_pretrained", "SegCaps", "SegCapsConfig", "SegCapsR1Config", "SegCapsOutput",
           "segmentation_model_loss", "UNet", "UNetConfig", "UNetOutput", "is_segmentation", "reconstructs",
           "cannot_reconstruct", "LOOK_INSIDE_NEEDS", "CapsPix2pix",
           "CapsPix2pixConfig", "CapsPix2pixDeepConfig", "CapsPix2pixGenerator", "ConditionalDiscriminator", "ConditionalGAN", "Pix2pix",
           "Pix2pixConfig", "UNetGenerator", "PatchDiscriminator", "synthesis_losses"]


class ModelSpec(NamedTuple):
    """How to build, train and name one registered model."""

    config: type  # frozen dataclass with to_dict() and from_dict(); its defaults are the paper's
    build: Callable[[Any], nn.Module]  # config -> module
    # (model, images, labels, components=None, *, recon_weight, progress) -> (loss (), class scores (B, K));
    # progress is the fraction of training done (0..1), for losses with a schedule (EM's spread margin)
    loss: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    title: str  # for tables and plots
    # "classification": labels (B,) or (B, 2), scores (B, K); "segmentation": masks (B, 1, H, W) in, per-pixel
    # probabilities (B, 1, H, W) out, scored by Dice and IoU; "synthesis": a conditional GAN, label maps
    # (B, C_in, H, W) to images (B, C_out, H, W), its loss (model, labels, images, z) -> (d_loss, g_loss, parts)
    kind: str = "classification"
    paper: str = ""  # where the model comes from, for `capsnet models` and tables
    # training settings (TrainConfig fields) this model gets unless typed, by `capsnet train` and the experiments
    train_defaults: Mapping[str, Any] = MappingProxyType({})
    # a classifier's class scores (its output's ``scores``), for figures and the viewer: one of SCORES
    scores: str = "lengths"


# what a classifier's class scores can be: capsule lengths (the margin loss's, its m+ and m- drawn on figures),
# routing activations (EM's, the spread loss's) or probabilities (a softmax's, cross-entropy's)
SCORES = ("lengths", "activations", "probabilities")


EM_RECIPE = MappingProxyType({"lr": 3e-3})

MODELS: dict[str, ModelSpec] = {
    "capsnet": ModelSpec(CapsNetConfig, CapsNet, capsnet_loss, "CapsNet", paper="Sabour et al. 2017, section 4"),
    "capsnet-cifar10": ModelSpec(CapsNetCifar10Config, CapsNet, capsnet_loss, "CapsNet (CIFAR-10)",
                                 paper="Sabour et al. 2017, section 7"),
    "capsnet-svhn": ModelSpec(CapsNetSvhnConfig, CapsNet, capsnet_loss, "CapsNet (SVHN)",
                              paper="Sabour et al. 2017, section 7"),
    # a warm-up: at full rate, Adam's first steps move every weight of the first dense layer (fan-in 128*H*W: 100k at
    # 28x28, 205k at 40x40) by lr at once, which can kill its ReLUs for good (docs/results.md, "The CNN baseline on
    # larger inputs": at chance for whole runs on 36x36 and 40x40)
    "baseline": ModelSpec(BaselineCNNConfig, BaselineCNN, baseline_loss, "CNN baseline",
                          paper="Sabour et al. 2017, section 5", train_defaults=MappingProxyType({"warmup_steps": 200}),
                          scores="probabilities"),
    # Gritzman's (IBM) Adam rate: the paper gives none
    "em-capsnet": ModelSpec(EMCapsNetConfig, EMCapsNet, em_capsnet_loss, "EM matrix capsules",
                            paper="Hinton, Sabour and Frosst 2018", train_defaults=EM_RECIPE, scores="activations"),
    "em-capsnet-small": ModelSpec(EMCapsNetSmallConfig, EMCapsNet, em_capsnet_loss, "EM matrix capsules (small)",
                                  paper="Hinton, Sabour and Frosst 2018, section 5", train_defaults=EM_RECIPE,
                                  scores="activations"),
    # CapsNet's loss: margin + 0.0005 x summed squared error, the paper's 0.392 x pixel-mean squared error at 28x28;
    # the official code's rate and MNIST augmentation
    "efficient-capsnet": ModelSpec(EfficientCapsNetConfig, EfficientCapsNet, capsnet_loss, "Efficient-CapsNet",
                                   paper="Mazzia et al. 2021", train_defaults=MappingProxyType(
                                       {"lr": 5e-4, "augment": "efficient-capsnet"})),
    "inverted-capsnet": ModelSpec(InvertedCapsNetConfig, InvertedCapsNet, inverted_capsnet_loss,
                                  "inverted dot-product attention", paper="Tsai et al. 2020", scores="probabilities"),
    "segcaps": ModelSpec(SegCapsConfig, SegCaps, segmentation_model_loss, "SegCaps R3", "segmentation",
                         paper="LaLonde and Bagci 2018"),
    "segcaps-r1": ModelSpec(SegCapsR1Config, SegCaps, segmentation_model_loss, "SegCaps R1", "segmentation",
                            paper="LaLonde and Bagci 2018"),
    "unet": ModelSpec(UNetConfig, UNet, segmentation_model_loss, "U-Net", "segmentation",
                      paper="Ronneberger et al. 2015"),
    "capspix2pix": ModelSpec(CapsPix2pixConfig, CapsPix2pix, synthesis_losses, "CapsPix2pix", "synthesis",
                             paper="Bass et al. 2019", train_defaults=MappingProxyType({"lr": GAN_LR})),
    "capspix2pix-deep": ModelSpec(CapsPix2pixDeepConfig, CapsPix2pix, synthesis_losses, "CapsPix2pix (deep start)",
                                  "synthesis", paper="Bass et al. 2019; its start: README, 'Synthesis'",
                                  train_defaults=MappingProxyType({"lr": GAN_LR})),
    "pix2pix": ModelSpec(Pix2pixConfig, Pix2pix, synthesis_losses, "pix2pix", "synthesis", paper="Isola et al. 2017",
                         train_defaults=MappingProxyType({"lr": GAN_LR})),
}


def check_registry(models: Mapping[str, ModelSpec] | None = None) -> None:
    """Each registered model (of ``models``, by default ``MODELS``) has a config class of its own: a checkpoint
    records its model by the config's class (``model_name``), so a second entry on one class would be saved, and
    rebuilt, as the first; and its ``scores`` are one of ``SCORES``."""
    seen: dict[type, str] = {}
    for name, spec in (MODELS if models is None else models).items():
        if spec.config in seen:
            raise TypeError(f"models {seen[spec.config]!r} and {name!r} are registered with one config class, "
                            f"{spec.config.__name__}: a run of {name!r} would be saved and rebuilt as "
                            f"{seen[spec.config]!r}; give {name!r} a config class of its own (a subclass shares the "
                            f"fields: class MyConfig({spec.config.__name__}): ..., as capsnet-cifar10 does)")
        seen[spec.config] = name
        if spec.scores not in SCORES:
            raise ValueError(f"model {name!r}: scores={spec.scores!r}; choose from {', '.join(SCORES)}")


check_registry()


def list_models() -> list[str]:
    """The registered model names, in registry order."""
    return list(MODELS)


def is_segmentation(name_or_config: Any) -> bool:
    """Whether a model (its registry name or its config) segments images rather than classifies them."""
    name = name_or_config if isinstance(name_or_config, str) else model_name(name_or_config)
    return model_spec(name).kind == "segmentation"


def reconstructs(model: nn.Module) -> bool:
    """Whether a classifier ``model`` draws reconstructions for figures and the viewer: a decoder (not None) and a
    ``reconstruct(poses, index)`` method (README, "Where things live, and how to add one")."""
    return cannot_reconstruct(model) is None


def cannot_reconstruct(model: nn.Module) -> str | None:
    """Why ``model`` draws no reconstructions (figures' and the viewer's words), or None where it does
    (``reconstructs``): no decoder, or a decoder without a ``reconstruct(poses, index)`` method."""
    kind = type(model).__name__
    if getattr(model, "decoder", None) is None:
        return f"this {kind} has no decoder: it cannot reconstruct"
    if not callable(getattr(model, "reconstruct", None)):
        return (f"this {kind} has a decoder but no reconstruct(poses, index) method: it cannot reconstruct (README, "
                f"\"Where things live, and how to add one\")")
    return None


# what figures and the viewer need of a classifier, said where they refuse one
LOOK_INSIDE_NEEDS = ("a routing_view(images) method (its routing maps) or a decoder with a reconstruct(poses, index) "
                     "method (reconstructions and pose sweeps): README, \"Where things live, and how to add one\"")


def segments(model: nn.Module) -> bool:
    """Whether ``model`` is a registered segmentation model (by its config; False for a model without one, or with a
    config the registry does not know)."""
    try:
        return is_segmentation(model.config)
    except (AttributeError, ValueError):
        return False


def segments_size(model: nn.Module, data: tuple[int, ...], name: str) -> bool:
    """Whether ``model``, a fully convolutional segmentation model (one with a ``side_multiple``: SegCaps, the U-Net),
    segments data set ``name``'s images of shape ``data`` (C, H, W) though it trained on another size: the channels it
    trained on and sides multiples of its stride, as ``capsnet predict`` segments them. Sides off the stride are a
    ValueError naming the fix; False for every other model (it takes the size it trained on only) and channel count."""
    multiple = getattr(model, "side_multiple", None)
    if not isinstance(multiple, int) or not segments(model) or data[0] != model.config.in_channels:
        return False
    cfg = model.config
    H, W = data[1:]
    if H % multiple or W % multiple:
        from .segcaps import sides_fix

        raise ValueError(f"{name} has images {H}x{W} (HxW), and this model segments images whose sides are multiples "
                         f"of {multiple} (it trained on {cfg.input_height}x{cfg.input_width}): "
                         f"{sides_fix(H, W, multiple)}")
    return True


def model_spec(name: str) -> ModelSpec:
    """The registry entry of ``name``; an unknown name is a ValueError listing the valid ones."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; valid names are {', '.join(MODELS)}")
    return MODELS[name]


def default_routing(name: str) -> str | None:
    """The routing model ``name`` is built with unless told otherwise (its config's ``routing``), or None for a model
    without a routing field."""
    return getattr(model_spec(name).config(), "routing", None)


def train_defaults(name: str, lr_schedule: str = "exponential", dataset: str | None = None) -> dict[str, Any]:
    """The training settings model ``name`` gets unless typed (``ModelSpec.train_defaults``), for a run on
    ``lr_schedule``: a default warm-up goes with the exponential schedule only, since a linear schedule's warm-up must
    fit its run's length, which the model cannot know (the user's ``--warmup-steps`` sets it there); and, on a task
    ``dataset``, that task's own over them (``Task.train_defaults``: MultiMNIST's decay period). A model's own
    augmentation (Efficient-CapsNet's) is its paper's recipe for MNIST: given on the 28x28 grey image sets alone,
    not where the task makes its training images itself (``Task.places_digits``: config.json recorded it as if
    applied) nor on SVHN's colour digits or a user's classes:DIR."""
    from ..data.tasks import TASKS  # (a name's lookup: a user's folder:DIR is not read, and has none)

    own = dict(model_spec(name).train_defaults)
    if lr_schedule != "exponential":
        own.pop("warmup_steps", None)
    if not (dataset in TASKS and not TASKS[dataset].places_digits and TASKS[dataset].input_shape == (1, 28, 28)):
        own.pop("augment", None)  # an augmentation of a model's own is its paper's for 28x28 grey digits (MNIST's)
        own.pop("shift", None)
    return own | (dict(TASKS[dataset].train_defaults) if dataset in TASKS else {})


def model_name(config: Any) -> str:
    """The registry name of the model a config object builds."""
    names = [name for name, spec in MODELS.items() if type(config) is spec.config]
    if len(names) > 1:  # an entry added to MODELS after import, on a config class already registered
        check_registry()
    if names:
        return names[0]
    if isinstance(config, nn.Module) and type(getattr(config, "config", None)) in {s.config for s in MODELS.values()}:
        raise ValueError(f"a {type(config).__name__} model was given where its config belongs: pass model.config")
    raise ValueError(f"{type(config).__name__} is not the config of a registered model ({', '.join(MODELS)}); "
                     f"make one with create_model(NAME, ...).config or model_spec(NAME).config(...)")


def num_weights(config: Any) -> int:
    """The weights a registered model's ``config`` builds: ``config.num_weights`` where the config computes it from its
    sizes (every model shipped does, and checks it before allocating), else counted on the model built on the meta
    device, which holds no data (a model of one's own need not write the count)."""
    count = getattr(config, "num_weights", None)
    if isinstance(count, int):
        return count
    with torch.device("meta"):
        return sum(p.numel() for p in model_spec(model_name(config)).build(config).parameters())


def create_model(name: str, **config: Any) -> nn.Module:
    """Build registered model ``name`` (``list_models()``); keyword arguments override its config fields, whose
    names, defaults and meanings ``model_spec(name).config`` holds (``capsnet models NAME`` prints them); an unknown
    field is refused by name with the valid ones, a value of the wrong type or range by its field."""
    spec = model_spec(name)
    return spec.build(spec.config.from_dict(config))


def list_pretrained() -> list[str]:
    """The names of the trained models shipped in the package (for ``pretrained``)."""
    from .. import pretrained as shipped

    return shipped.names()


def pretrained(name: str | None = None, *, device: str | torch.device = "cpu") -> nn.Module:
    """A trained model shipped in the package, in eval mode; ``name`` (``NAME`` or ``pretrained:NAME``) defaults to
    the viewer's model.

    ``list_pretrained()`` names them; each one's model card says how it was trained and what it scores.
    """
    from .. import pretrained as shipped
    from ..evaluate import load_model

    name = os.fspath(name) if name else shipped.DEFAULT  # a Path of the name too
    model, _ = load_model(name if shipped.is_shipped(name) else shipped.PREFIX + name, device=device)  # either form
    return model
