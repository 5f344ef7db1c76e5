"""Models built from capsule layers, and a registry to build them by name."""
from __future__ import annotations

from typing import Any, Callable

from torch import nn

from .baseline import BaselineCNN, BaselineCNNConfig
from .capsnet import CapsNet, CapsNetConfig, CapsNetOutput, Decoder, mask_capsules

__all__ = ["CapsNet", "CapsNetConfig", "CapsNetOutput", "Decoder", "mask_capsules", "BaselineCNN",
           "BaselineCNNConfig", "MODELS", "create_model", "model_name"]

# name -> (config class, model class)
MODELS: dict[str, tuple[type, Callable[..., nn.Module]]] = {
    "capsnet": (CapsNetConfig, CapsNet),
    "baseline": (BaselineCNNConfig, BaselineCNN),
}


def model_name(config: Any) -> str:
    """The registry name of the model a config object builds."""
    for name, (config_cls, _) in MODELS.items():
        if type(config) is config_cls:
            return name
    raise ValueError(f"{type(config).__name__} is not the config of a registered model ({sorted(MODELS)})")


def create_model(name: str, **config: Any) -> nn.Module:
    """Build a registered model; keyword arguments override its config fields."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; valid names are {sorted(MODELS)}")
    config_cls, model_cls = MODELS[name]
    return model_cls(config_cls.from_dict(config))
