"""Routing algorithms: votes of lower capsules in, upper capsules out.

Every algorithm is an ``nn.Module`` in a file of its own, called the same way
(shared/DESIGN.md), so a layer can take any of them::

    votes:       (B, I, J, D)   prediction u_hat_{j|i} of lower capsule i for upper j
    activations: (B, I) or None presence of the lower capsules (EM uses it)
    bias:        (J, D) or None the layer's pose bias, added to s_j (a routing without one, ``pose_bias = False``
                                as EM, refuses it)
    record:      keyword; True also returns every round's coupling
    returns      RoutingResult(poses (B, J, D), activations (B, J), coupling (B, I, J)),
                 with .rounds (B, R, I, J) when recording

A layer whose votes are linear in its input (``DenseCaps``) calls the module's
``route_linear(u, weight, bias, record=...)`` when the module has one: a fast
path that never builds the votes' gradient; inside ``plain_routing()``, and
while ``torch.export`` traces, layers take the plain path instead (an exported
graph holds plain operations, no autograd function). Adding an algorithm is one file,
its test and its entry in ``ROUTINGS`` below (one line, with its import).

A model builds its routing by name with the sizes of the layer it routes (``create_routing(name, in_caps=I,
out_caps=J, dim=D, iterations=r)``): a routing's constructor takes whichever of these it needs, under these names,
and gets only those. Three class attributes say what a routing is not, where it differs from the rest: ``pose_bias =
False`` (it takes no bias, and a layer built for it has none), ``probabilities = False`` (its activations are not
presence probabilities in [0, 1], so a margin loss cannot read them) and ``length_activations = False`` (its
activations are not its poses' lengths: an export names them activations, not lengths).
"""
from __future__ import annotations

import inspect
from typing import Any

from torch import nn

from .._numbers import is_real
from .attention import SelfAttentionRouting
from .dynamic import DynamicRouting
from .dynamic_linear import plain_routing, plain_routing_active
from .em import EMRouting
from .inverted import InvertedDotProductRouting
from .result import RoutingResult, RoutingView, check_votes, checked_view

__all__ = ["RoutingResult", "RoutingView", "check_votes", "checked_view", "DynamicRouting", "EMRouting",
           "SelfAttentionRouting", "InvertedDotProductRouting", "ROUTINGS", "LAYER_SIZES", "create_routing",
           "list_routings", "routing_takes", "routing_name", "routing_is", "TRAITS", "plain_routing",
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


# what a layer knows of itself, passed by ``create_routing`` to the routings whose constructors take it
LAYER_SIZES = ("in_caps", "out_caps", "dim", "iterations")


def _registered(name: str) -> type[nn.Module]:
    if not isinstance(name, str) or name not in ROUTINGS:
        raise ValueError(f"unknown routing {name!r}; valid names are {', '.join(list_routings())}")
    return ROUTINGS[name]


# the class attributes that say what a routing is not, where it differs from the rest (the module's docstring)
TRAITS = ("pose_bias", "probabilities", "length_activations")


def routing_is(name: str | None, trait: str) -> bool:
    """Whether the routing ``name`` has ``trait`` (one of ``TRAITS``): True unless its class sets the attribute
    False, and True for a name not registered (None: a model without routing), as for the dynamic routing the rest
    follow."""
    if trait not in TRAITS:
        raise ValueError(f"unknown routing trait {trait!r}; the traits are {', '.join(TRAITS)}")
    return bool(getattr(ROUTINGS.get(name) if isinstance(name, str) else None, trait, True))


def routing_name(module: nn.Module) -> str | None:
    """The registry name of the last routing module in ``module`` (itself, or the one its last routing layer
    holds: what figures and the viewer draw), or None where it holds none."""
    kinds = {cls: name for name, cls in ROUTINGS.items()}
    found = [m for m in module.modules() if type(m) in kinds]
    return kinds[type(found[-1])] if found else None


def _parameters(name: str) -> list[inspect.Parameter]:
    """The parameters of the routing ``name``'s constructor, read once per call of the functions below; none for a
    routing without a constructor of its own (``nn.Module``'s ``**kwargs`` passes nothing on)."""
    cls = _registered(name)
    if cls.__init__ in (nn.Module.__init__, object.__init__):
        return []
    return list(inspect.signature(cls).parameters.values())


def _takes(parameters: list[inspect.Parameter]) -> tuple[set[str], bool]:
    """The keyword parameters' names, and whether the constructor takes any (``**options``)."""
    return {p.name for p in parameters}, any(p.kind is p.VAR_KEYWORD for p in parameters)


def routing_takes(name: str, option: str) -> bool:
    """Whether the registered routing ``name``'s constructor takes ``option`` (``"iterations"``: whether it
    iterates at all; self-attention routing makes one pass)."""
    names, anything = _takes(_parameters(name))
    return anything or option in names


def create_routing(name: str, *, in_caps: int | None = None, out_caps: int | None = None, dim: int | None = None,
                   iterations: int | None = None, **options: Any) -> nn.Module:
    """Build a registered routing module by name, e.g. ``create_routing("dynamic", iterations=3)``.

    ``in_caps``, ``out_caps`` and ``dim`` (I, J and D of the votes) are passed to the routings that take them and
    left out for the rest, so a layer can build any routing from its own sizes; ``iterations`` too, but given to a
    routing that makes one pass it is refused (it would be ignored); ``options`` go to the routing as they are, an
    unknown one refused by name, and one of another kind than its default (a word for a number, a number for a
    switch) refused here, not at the first step where the routing uses it."""
    parameters = _parameters(name)
    names, anything = _takes(parameters)
    given = {k: v for k, v in (("in_caps", in_caps), ("out_caps", out_caps), ("dim", dim))
             if v is not None and (anything or k in names)}
    if iterations is not None:
        if not (anything or "iterations" in names):
            raise ValueError(f"{name} routing makes one pass and takes no iterations; leave them out")
        given["iterations"] = iterations
    unknown = [] if anything else sorted(set(options) - names)
    if unknown:
        valid = sorted(names - set(LAYER_SIZES))
        raise ValueError(f"{name} routing takes no option {', '.join(unknown)}; its options are "
                         f"{', '.join(valid) or 'none'}")
    _check_option_kinds(name, options, parameters)
    needed = [p.name for p in parameters if p.default is p.empty and
              p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in given and p.name not in options]
    sizes = [k for k in needed if k in LAYER_SIZES]  # left out by the caller: a layer passes these
    if sizes:
        meaning = {"in_caps": "I, the lower capsules", "out_caps": "J, the upper capsules", "dim": "D, the pose size",
                   "iterations": "the rounds"}
        raise ValueError(f"{name} routing needs {', '.join(f'{k} ({meaning[k]})' for k in sizes)}: "
                         f"create_routing({name!r}, {', '.join(f'{k}=...' for k in sizes)})")
    if needed:
        raise ValueError(f"{name} routing's constructor needs {', '.join(needed)}, which no layer passes (a layer "
                         f"gives {', '.join(LAYER_SIZES)} to a routing that takes them): give "
                         f"{'it a default' if len(needed) == 1 else 'them defaults'}, or pass "
                         f"{'it' if len(needed) == 1 else 'them'} as a routing option")
    return ROUTINGS[name](**given, **options)


def _check_option_kinds(name: str, options: dict[str, Any], parameters: list[inspect.Parameter]) -> None:
    """A ValueError for an option whose default (in the constructor's ``parameters``) is a number, a switch or a
    word and whose value is not one (--routing-option scale=abc reached the routing's forward pass as a TypeError
    traceback)."""
    defaults = {p.name: p.default for p in parameters}
    for option, value in options.items():
        default = defaults.get(option, inspect.Parameter.empty)
        if isinstance(default, bool):
            kind, fits = "true or false", isinstance(value, bool)
        elif isinstance(default, (int, float)):
            kind, fits = "a number", is_real(value)
        elif isinstance(default, str):
            kind, fits = "a word", isinstance(value, str)
        else:  # no default, None or a structure: the routing checks it
            continue
        if not fits:
            raise ValueError(f"{name} routing's option {option} takes {kind} (its default: {default!r}), "
                             f"got {value!r}")
