"""capsnet: capsule networks on PyTorch (Sabour, Frosst and Hinton, NIPS 2017).

The names below load on first use (PEP 562): ``import capsnet`` itself imports no torch, so the ``capsnet``
command can say a Ctrl-C during its start-up in one line rather than a traceback from inside torch's import.
"""
from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

# name -> the submodule that defines it
_LAZY = {
    "safe_norm": "ops", "squash": "ops",
    "DynamicRouting": "routing", "RoutingResult": "routing", "create_routing": "routing", "list_routings": "routing",
    "DenseCaps": "layers", "PrimaryCaps": "layers",
    "margin_loss": "losses", "reconstruction_loss": "losses",
    "CapsNet": "models", "CapsNetConfig": "models", "create_model": "models", "list_models": "models",
}

# the subpackages and modules a user reaches as attributes after a bare `import capsnet` (capsnet.models.create_model,
# capsnet.routing.plain_routing(): the docs' spellings), imported on that first use
_SUBMODULES = ("ops", "routing", "layers", "losses", "models", "data", "figures", "export", "evaluate", "train",
               "synthesis", "checkpoint", "pretrained", "runtime", "memory", "average", "bench", "experiments",
               "distributed", "gan", "predict", "image_metrics", "tensorboard", "viz", "cli")

__all__ = [*_LAZY, "__version__"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value  # once: later lookups do not come here
        return value
    if name in _SUBMODULES:
        return import_module(f".{name}", __name__)  # the import sets the attribute itself
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | set(_SUBMODULES))
