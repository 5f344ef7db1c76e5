"""The fused backward shared by routings whose votes enter only through batched matrix-vector products.

EM routing (its weighted moments and expanded distances) and inverted
dot-product attention (``sum_i r_ij v_ij`` and ``v_ij . p_j``) use their
votes in nothing but products of the votes with a vector per (example,
parent). The votes' gradient over every such use is then a sum of outer
products, one per use: ``sum_t left_t right_t`` with ``left_t`` (N, I, 1) and
``right_t`` (N, 1, D), which is one batched product of rank n (the number of
uses), ``L @ R``. Plain autograd instead writes one vote-sized outer product
per use and adds them up, which on a CPU costs several times more than the
routing's forward (benchmarks/README.md, "EM routing's fused backward").

A routing runs its loop once, with autograd on, over *detached* votes, and
``tap``s every product: its graph then holds only the routing's small tensors.
``tapped_backward`` asks that graph for the gradient reaching each product
and for its leaves' gradients, and returns the two factors of the votes'
gradient.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable

import torch

from .._eager import eager

__all__ = ["wants_fused_backward", "first_order", "tap", "tapped_backward"]


def wants_fused_backward(*tensors: torch.Tensor | None) -> bool:
    """A training step in plain eager mode (``eager``), outside ``plain_routing()`` (which promises plain autograd
    throughout: a gradient of a gradient): gradients wanted for one of ``tensors``."""
    from .dynamic_linear import plain_routing_active

    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors) and eager() and \
        not plain_routing_active()


def first_order(what: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """For a hand-written ``backward``: a gradient of its gradient (``create_graph=True``: a gradient penalty, a
    double backward) is refused, naming ``what`` and the fix. ``once_differentiable`` let ``torch.autograd.grad``
    pass over the routing's second-order term without a word (wrong numbers, some gradients None)."""
    def decorate(backward: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(backward)
        def checked(ctx: Any, *grads: Any) -> Any:
            if torch.is_grad_enabled():  # only under create_graph=True: a plain backward runs without grad mode
                raise RuntimeError(f"{what}'s hand-written backward is first-order: a gradient of a gradient "
                                   f"(create_graph=True, a gradient penalty) needs plain autograd: run the model "
                                   f"inside `with capsnet.routing.plain_routing():`")
            return backward(ctx, *grads)
        return checked
    return decorate


def tap(taps: list, product: torch.Tensor, left: torch.Tensor | None, right: torch.Tensor | None) -> torch.Tensor:
    """Record ``product``, a batched matrix-vector product of the (detached) votes, for ``tapped_backward``.

    One of ``left`` (N, I, 1) and ``right`` (N, 1, D) is the product's other
    factor, detached; the other is None and stands for the gradient reaching
    the product. ``product @ votes`` takes ``left = vector^T``; ``votes @ vector``
    and ``vector^T @ votes^T`` take ``right = vector^T``. A product of
    constants is made a leaf that requires grad, so its gradient is asked for too.
    """
    if not product.requires_grad:
        product.requires_grad_()
    taps.append((product, left, right))
    return product


def tapped_backward(outputs: tuple[torch.Tensor, ...], grads: tuple[torch.Tensor, ...], taps: list,
                    leaves: tuple[torch.Tensor, ...]
                    ) -> tuple[torch.Tensor | None, torch.Tensor | None, tuple[torch.Tensor | None, ...]]:
    """The votes' gradient as two factors, ``L`` (N, I, n) and ``R`` (N, n, D) with d loss / d votes = L @ R
    (None, None where no product gets a gradient), and each leaf's gradient (None where it gets none)."""
    used = [(o, g) for o, g in zip(outputs, grads) if o.requires_grad and g is not None]
    found = torch.autograd.grad([o for o, _ in used], [p for p, _, _ in taps] + list(leaves),
                                [g for _, g in used], allow_unused=True) if used else (None,) * (len(taps) + len(leaves))
    left, right = [], []
    for (product, l, r), g in zip(taps, found):
        if g is not None:
            n = math.prod(g.shape[1:])  # not -1: an empty batch has no size to infer it from
            left.append(l if l is not None else g.reshape(g.shape[0], n, 1))
            right.append(r if r is not None else g.reshape(g.shape[0], 1, n))
    L = torch.cat(left, dim=-1) if left else None
    R = torch.cat(right, dim=1) if right else None
    return L, R, tuple(found[len(taps):])
