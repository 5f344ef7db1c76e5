"""Routing algorithms: votes of lower capsules in, upper capsules out.

Every algorithm is an ``nn.Module`` in a file of its own, called the same way
(shared/DESIGN.md), so a layer can take any of them::

    votes:       (B, I, J, D)   prediction u_hat_{j|i} of lower capsule i for upper j
    activations: (B, I) or None presence of the lower capsules (EM uses it)
    record:      keyword; True also returns every round's coupling
    returns      RoutingResult(poses (B, J, D), activations (B, J), coupling (B, I, J)),
                 with .rounds (B, R, I, J) when recording

A layer whose votes are linear in its input (``DenseCaps``) calls the module's
``route_linear(u, weight, bias, record=...)`` when the module has one: a fast
path that never builds the votes' gradient; inside ``plain_routing()``, and
while ``torch.export`` traces, layers take the plain path instead (an exported
graph holds plain operations, no autograd function). Adding an algorithm is one file,
its test and one line in ``ROUTINGS``.
"""
from __future__ import annotations

from typing import Any

from torch import nn

from .attention import SelfAttentionRouting
from .dynamic import DynamicRouting
from .dynamic_linear import plain_routing, plain_routing_active
from .em import EMRouting
from .inverted import InvertedDotProductRouting
from .result import RoutingResult, RoutingView, check_votes

__all__ = ["RoutingResult", "RoutingView", "check_votes", "DynamicRouting", "EMRouting", "SelfAttentionRouting",
           "InvertedDotProductRouting", "ROUTINGS", "create_routing", "list_routings", "plain_routing",
           "plain_routing_active"]

# name -> routing module class; each takes its options as keyword arguments
ROUTINGS: dict[str, type[nn.Module]] = {
    "dynamic": DynamicRouting,  # Sabour et al. 2017, Procedure 1
    "em": EMRouting,  # Hinton et al. 2018, Procedure 1; needs out_caps (its betas are per upper capsule)
    "self-attention": SelfAttentionRouting,  # Mazzia et al. 2021 (Efficient-CapsNet); needs in_caps, out_caps (prior)
    "inverted": InvertedDotProductRouting,  # Tsai et al. 2020; needs dim (its layer norm)
}


def list_routings() -> list[str]:
    """The names of the registered routing algorithms, sorted."""
    return sorted(ROUTINGS)


def create_routing(name: str, **options: Any) -> nn.Module:
    """Build a registered routing module by name, e.g. ``create_routing("dynamic", iterations=3)``."""
    if name not in ROUTINGS:
        raise ValueError(f"unknown routing {name!r}; valid names are {', '.join(list_routings())}")
    return ROUTINGS[name](**options)
