"""capsnet: capsule networks on PyTorch (Sabour, Frosst and Hinton, NIPS 2017)."""
from .ops import safe_norm, squash
from .routing import DynamicRouting, RoutingResult, create_routing, list_routings
from .layers import DenseCaps, PrimaryCaps
from .losses import margin_loss, reconstruction_loss
from .models import CapsNet, CapsNetConfig, create_model, list_models

__version__ = "0.1.0"

__all__ = [
    "safe_norm", "squash", "DynamicRouting", "RoutingResult", "create_routing", "list_routings", "DenseCaps",
    "PrimaryCaps", "margin_loss", "reconstruction_loss", "CapsNet", "CapsNetConfig", "create_model", "list_models",
    "__version__",
]
