"""Models built from capsule layers, and a registry to build them by name."""
from __future__ import annotations

from typing import Any, Callable

from torch import nn

from .capsnet import CapsNet, CapsNetConfig, CapsNetOutput, Decoder, mask_capsules

__all__ = ["CapsNet", "CapsNetConfig", "CapsNetOutput", "Decoder", "mask_capsules", "MODELS", "create_model"]

# name -> (config class, model class)
MODELS: dict[str, tuple[type, Callable[..., nn.Module]]] = {
    "capsnet": (CapsNetConfig, CapsNet),
}


def create_model(name: str, **config: Any) -> nn.Module:
    """Build a registered model; keyword arguments override its config fields."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; valid names are {sorted(MODELS)}")
    config_cls, model_cls = MODELS[name]
    return model_cls(config_cls.from_dict(config))
