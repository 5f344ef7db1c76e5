"""What every routing algorithm returns, and the checks of what it is given."""
from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple, TypeVar

import torch
from torch import nn

from .._eager import autocast_off, autocast_on
from .._numbers import is_count, is_finite, number_repr

__all__ = ["RoutingResult", "RoutingView", "check_votes", "checked_view"]


class _Fields(NamedTuple):
    poses: torch.Tensor  # (B, J, D)
    activations: torch.Tensor  # (B, J)
    coupling: torch.Tensor  # (B, I, J), coefficients of the last round


class RoutingResult(_Fields):
    """Output of a routing module; unpacks as ``poses, activations, coupling``.

    ``rounds`` is every round's coupling, (B, R, I, J), when the module was
    called with ``record=True`` (for figures and the viewer), else None:
    ``rounds[:, r]`` holds the coefficients round r + 1 used, so
    ``rounds[:, -1]`` equals ``coupling``. It is an attribute, not a tuple
    field, so the result still unpacks into its three tensors.
    """

    rounds: torch.Tensor | None = None  # also for a result made by _make, which skips __new__

    def __new__(cls, poses: torch.Tensor, activations: torch.Tensor, coupling: torch.Tensor,
                rounds: torch.Tensor | None = None) -> "RoutingResult":
        self = super().__new__(cls, poses, activations, coupling)
        self.rounds = rounds
        return self

    def _replace(self, **changes: Any) -> "RoutingResult":
        """The tuple's ``_replace``, ``rounds`` carried over (or replaced: ``rounds=...``); the namedtuple's own
        made a result whose ``rounds`` raised AttributeError."""
        rounds = changes.pop("rounds", self.rounds)
        return RoutingResult(*super()._replace(**changes), rounds)


class RoutingView(NamedTuple):
    """What a model's last routing layer did for some inputs (``model.routing_view(images)``), for figures and the viewer.

    rounds: (N, R, I, J), the coupling each round used (round 1 first, the last what the model used).
    children: (N, I), the lower capsules' lengths or activations.
    scores: (N, J), the class scores (capsule lengths, activations or probabilities).
    grid: (types, rows, columns) of the lower capsules; I = types * rows * columns, ordered (type, row, column).
    children_are: what ``children`` holds, "lengths", "activations" (EM's) or "largest couplings" (the inverted
        model's: each child's largest coupling), for a figure's words.
    """

    rounds: torch.Tensor
    children: torch.Tensor
    scores: torch.Tensor
    grid: tuple[int, int, int]
    children_are: str = "lengths"


def checked_view(view: Any, model: nn.Module) -> RoutingView:
    """``model.routing_view``'s answer, its parts checked against each other before a figure or the viewer lays
    them out: a grid that does not cover the I routed capsules was an IndexError in the figure and a reshape error
    in the viewer, far from the method that gave it. A ValueError names the model's ``routing_view``."""
    who = f"{type(model).__name__}.routing_view"
    if not isinstance(view, RoutingView):
        raise ValueError(f"{who} returned {type(view).__name__}, not a capsnet.routing.RoutingView")
    if not isinstance(view.rounds, torch.Tensor) or view.rounds.dim() != 4:
        raise ValueError(f"{who}: rounds must be a tensor (N, R, I, J), got "
                         f"{tuple(getattr(view.rounds, 'shape', ())) or type(view.rounds).__name__}")
    n, _, i, j = view.rounds.shape
    grid = tuple(view.grid) if isinstance(view.grid, (tuple, list)) else ()
    if len(grid) != 3 or not all(type(k) is int and k > 0 for k in grid):  # (the viewer sends it as JSON)
        raise ValueError(f"{who}: grid {view.grid!r} must be three positive Python ints (types, rows, columns)")
    if grid[0] * grid[1] * grid[2] != i:
        raise ValueError(f"{who}: grid {view.grid!r} must be (types, rows, columns) of the {i} capsules routed, "
                         f"types * rows * columns = {i}")
    for name, want in (("children", (n, i)), ("scores", (n, j))):
        got = getattr(view, name)
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != want:
            raise ValueError(f"{who}: {name} must be {want} for rounds {tuple(view.rounds.shape)}, got "
                             f"{tuple(getattr(got, 'shape', ())) or type(got).__name__}")
    return view


_Route = TypeVar("_Route", bound=Callable[..., Any])


def float16_in_float32(route: _Route) -> _Route:
    """A routing method (``forward``, ``route_grid``) that routes float16 votes in float32, autocast off, and
    returns float16: float16 tops out at 65,504, and a round's sums over thousands of children, or its agreements,
    overflowed for votes of about 1e3 (inf, then NaN poses and gradients). bfloat16 (fp32's range), float32 and
    float64 votes are routed as they come, on the same path as before."""
    @functools.wraps(route)
    def wrapper(self: nn.Module, votes: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if votes.dtype != torch.float16:
            return route(self, votes, *args, **kwargs)
        with autocast_off(votes.device.type):  # float16 autocast would cast the products back
            out = route(self, votes.float(), *args, **kwargs)
        if isinstance(out, RoutingResult):
            return RoutingResult(*(t.half() for t in out), None if out.rounds is None else out.rounds.half())
        return out.half()
    return wrapper  # type: ignore[return-value]


def check_votes(votes: torch.Tensor, activations: torch.Tensor | None = None, bias: torch.Tensor | None = None
                ) -> tuple[int, int, int, int]:
    """(B, I, J, D) of ``votes``, after checking the shared call shape; a clear ValueError otherwise.

    Shapes:
        votes: (B, I, J, D) floating point; activations: (B, I) or None; bias: (J, D) or None
    """
    if votes.dim() != 4:
        raise ValueError(f"votes must be (B, I, J, D), got shape {tuple(votes.shape)}")
    check_floating(votes, "votes", "votes.float() routes them")
    B, I, J, D = votes.shape
    if activations is not None and tuple(activations.shape) != (B, I):
        raise ValueError(f"activations must be (B, I) = ({B}, {I}) for votes {tuple(votes.shape)}, "
                         f"got shape {tuple(activations.shape)}")
    if bias is not None and tuple(bias.shape) != (J, D):
        raise ValueError(f"bias must be (J, D) = ({J}, {D}), got shape {tuple(bias.shape)}")
    return B, I, J, D


def widened(votes: torch.Tensor, module: nn.Module, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Float32 votes into a float64 module (``.double()``) or with a float64 ``bias``, as float64: routed in the
    wider type, as float64 votes into a float32 module are (its parameters promoted where they meet the votes).
    Bfloat16 votes with a wider ``bias`` outside autocast, likewise in the bias's type (inverted attention's second
    pass met "expected scalar type Float but found BFloat16": its poses had taken the bias's type, its votes not).
    Other half-precision votes are left as they are (autocast's, or the routing's own, handling)."""
    if votes.dtype == torch.float32 and (any(p.dtype == torch.float64 for p in module.parameters())
                                         or (bias is not None and bias.dtype == torch.float64)):
        return votes.double()
    if votes.dtype == torch.bfloat16 and bias is not None and bias.dtype in (torch.float32, torch.float64) \
            and not autocast_on(votes.device.type):
        return votes.to(bias.dtype)
    return votes


def check_floating(x: torch.Tensor, what: str, fix: str) -> None:
    """A ValueError unless ``x`` holds real floating-point numbers (integers and booleans are no capsules, and
    complex ones met torch's errors deep inside a layer); ``fix`` ends the message."""
    if not torch.is_floating_point(x):
        raise ValueError(f"{what} must be floating point, got {x.dtype}: {fix}")


def check_count(name: str, value: object) -> None:
    """A ValueError unless ``value`` is a positive integer (not a bool): a routing's or layer's size."""
    if not is_count(value):
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def check_positive(name: str, value: object, hint: str = "") -> None:
    """A ValueError unless ``value`` is a positive finite number (not a bool): a scale, floor or width; ``hint``
    follows the name in the message."""
    if not (is_finite(value) and value > 0):
        raise ValueError(f"{name} must be a positive finite number{hint}, got {number_repr(value)}")


def check_routing(routing: object) -> None:
    """A TypeError unless ``routing`` is a module instance (a layer's ``routing=``): a name such as "dynamic" built
    and then met "'str' object is not callable" at the first forward, the class itself torch's einsum complaint."""
    if isinstance(routing, nn.Module):
        return
    if isinstance(routing, type) and issubclass(routing, nn.Module):
        raise TypeError(f"routing must be a routing module, got the class {routing.__name__} itself: pass an "
                        f"instance, e.g. {routing.__name__}(...), or create_routing(name, ...)")
    fix = (f"create_routing({routing!r}, ...) builds one by name" if isinstance(routing, str)
           else "e.g. create_routing('dynamic', iterations=3)")
    raise TypeError(f"routing must be a routing module (nn.Module), got {type(routing).__name__} {routing!r}: {fix}")


def check_switch(name: str, value: object) -> None:
    """A ValueError unless ``value`` is True or False (a string such as "no" would read as True)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
