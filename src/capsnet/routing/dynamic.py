"""Routing by agreement: Sabour, Frosst and Hinton, "Dynamic Routing Between Capsules" (NIPS 2017), Procedure 1."""
from __future__ import annotations

import torch
from torch import nn

from ..ops import exp_squash, safe_norm, squash
from .dynamic_linear import coupling_softmax, route_linear
from .result import RoutingResult, check_count, check_switch, check_votes, float16_in_float32

__all__ = ["DynamicRouting", "SQUASHES"]

# the squash of line 6: Sabour et al.'s Eq. 1, |s|^2 / (1 + |s|^2) s/|s|, or Efficient-CapsNet's (Mazzia et al. 2021,
# eq. 3), (1 - e^-|s|) s/|s|, which is linear near zero where Eq. 1 is quadratic
SQUASHES = {"sabour": squash, "exp": exp_squash}

_FEW_CHILDREN = 32  # lower capsules per routing at most for which forward() uses broadcast products


class DynamicRouting(nn.Module):
    """Routing by agreement (Sabour et al. 2017, Procedure 1).

    The routing logits ``b`` start at zero for every example (never shared by
    the batch); ``c_i = softmax_j(b_i)`` couples each lower capsule to the upper
    ones; ``s_j = sum_i c_ij u_hat_j|i (+ bias_j)``; ``v_j = squash(s_j)``;
    ``b_ij += u_hat_j|i . v_j``. Activations are the lengths ``|v_j|``.

    Args:
        iterations: routing rounds r (the paper uses 3).
        leaky: add a zero logit to every softmax, the "orphan" category of the
            authors' code, so a lower capsule can couple to none of the upper.
        detach_agreement: stop gradients through the agreement updates of all
            but the last round (a common speed trick). The default lets them
            flow through every round, as in the authors' code.
        softmax: ``"parents"`` (the default: Procedure 1, line 4, and SegCaps'
            code) normalises each lower capsule's coefficients over the upper
            capsules j; ``"children"`` normalises each upper capsule's over the
            lower capsules i instead, as some convolutional-capsule codes do
            (then a parent with no agreeing child still takes a weighted mean).
        squash: ``"sabour"`` (the default: Eq. 1) or ``"exp"``, Efficient-CapsNet's
            ``(1 - e^-|s|) s/|s|`` (Mazzia et al. 2021, eq. 3). Eq. 1 shortens a
            short vector quadratically (length |s|^2 near zero), so in a deep
            stack of capsule layers the image-dependent part of the poses can
            fade from layer to layer; ``"exp"`` keeps length |s| near zero.
            (``capsnet.ops.exp_squash``: a capsule whose |s|^2 could overflow
            its dtype is scaled first, so long capsules have length 1 in
            float16 too.)

    Layers with linear votes call ``route_linear`` (the same maths from the
    lower capsules and the weight, with a hand-written backward) when the
    routing module offers it.
    """

    def __init__(self, iterations: int = 3, *, leaky: bool = False, detach_agreement: bool = False,
                 softmax: str = "parents", squash: str = "sabour") -> None:
        super().__init__()
        check_count("iterations", iterations)
        if softmax not in ("parents", "children"):
            raise ValueError(f"softmax must be 'parents' or 'children', got {softmax!r}")
        if not isinstance(squash, str) or squash not in SQUASHES:
            raise ValueError(f"squash must be one of {', '.join(map(repr, SQUASHES))}, got {squash!r}")
        check_switch("leaky", leaky)
        check_switch("detach_agreement", detach_agreement)
        self.softmax = softmax
        self.squash = squash
        self.iterations = iterations
        self.leaky = leaky
        self.detach_agreement = detach_agreement
        self.chunk: int | None = None  # lower capsules per block in route_linear; None: by size

    def extra_repr(self) -> str:
        more = f", softmax={self.softmax!r}" if self.softmax != "parents" else ""
        more += f", squash={self.squash!r}" if self.squash != "sabour" else ""
        return f"iterations={self.iterations}, leaky={self.leaky}, detach_agreement={self.detach_agreement}{more}"

    @float16_in_float32
    def forward(self, votes: torch.Tensor, activations: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                *, record: bool = False) -> RoutingResult:
        """Route ``votes`` to the upper capsules.

        Shapes:
            votes: (B, I, J, D)
            activations: (B, I) or None, ignored by dynamic routing (accepted for the shared call shape)
            bias: (J, D) or None, added to s_j before the squash in every round
            returns: poses (B, J, D), activations (B, J), coupling (B, I, J);
                with ``record``, ``rounds`` (B, R, I, J)
        """
        B, I, J, D = check_votes(votes, activations)
        if bias is not None and tuple(bias.shape) != (J, D):
            raise ValueError(f"bias must be (J, D) = ({J}, {D}), got shape {tuple(bias.shape)}")
        # Many lower capsules (a dense layer): one transposed copy, so both contractions below are batched
        # matmuls over (B, J), far faster on CPU than broadcast products. Few (local routing at every position of
        # a convolutional capsule layer, B = examples x positions): broadcast products summed over the short axis
        # are 1.25-2.9x faster than matmuls of tiny matrices (benchmarks/README.md, "Local routing").
        few = I <= _FEW_CHILDREN
        u_hat = votes if few else votes.permute(0, 2, 1, 3)  # (B, I, J, D) or (B, J, I, D)
        u_hat_detached = u_hat.detach() if self.detach_agreement else u_hat
        b = votes.new_zeros(B, I, J)  # Procedure 1, line 2: per example
        rounds = []
        squash_fn = SQUASHES[self.squash]
        for r in range(self.iterations):
            last = r == self.iterations - 1
            c = coupling_softmax(b, dim=-1 if self.softmax == "parents" else 1, leaky=self.leaky)  # line 4; (B, I, J)
            if record:
                rounds.append(c)
            u = u_hat if last else u_hat_detached
            if few:
                s = (c.unsqueeze(-1) * u).sum(1)  # line 5: sum_i c_ij u_hat_j|i; (B, J, D)
            else:
                s = torch.matmul(c.transpose(1, 2).unsqueeze(2), u).squeeze(2)  # line 5; (B, J, D)
            if bias is not None:
                s = s + bias
            v = squash_fn(s)  # line 6; (B, J, D)
            if not last:
                if few:
                    b = b + (u * v.unsqueeze(1)).sum(-1)  # line 7: u_hat_j|i . v_j; (B, I, J)
                else:
                    # v^T u^T, a row times the votes' transposed view: 4x faster on a CPU than u v (a tall matrix
                    # times a column, slow in MKL's batched product)
                    agreement = torch.matmul(v.unsqueeze(-2), u.transpose(-1, -2)).squeeze(-2)  # line 7; (B, J, I)
                    b = b + agreement.transpose(1, 2)  # (B, I, J)
        return RoutingResult(v, safe_norm(v, dim=-1), c, torch.stack(rounds, dim=1) if record else None)

    @float16_in_float32
    def route_grid(self, votes: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """The same routing at every position of a grid, on votes in the layout a convolution makes them.

        Local routing (``capsnet.layers.conv``) routes each position's votes
        alone: ``forward`` on the votes with the positions folded into the
        batch gives the same poses, but needs the votes permuted into (B * H *
        W, I, J, D) and the poses back. Here every product runs in place over
        the grid, positions innermost, with no copy of the votes: 1.2-1.3x
        faster for a SegCaps training step on a CPU (benchmarks/README.md,
        "Local routing in the grid's layout"). Every option of the module
        applies; the coupling is not returned (``forward`` for that).

        Shapes:
            votes: (B, I, J, D, H, W): I lower capsule types vote for J upper types at each of H x W positions
            bias: (J, D) or None
            returns: poses (B, J, D, H, W)
        """
        if votes.dim() != 6:
            raise ValueError(f"votes must be a grid (B, I, J, D, H, W), got shape {tuple(votes.shape)}")
        _, _, J, D, _, _ = votes.shape
        if bias is not None and tuple(bias.shape) != (J, D):
            raise ValueError(f"bias must be (J, D) = ({J}, {D}), got shape {tuple(bias.shape)}")
        b = votes.new_zeros(votes.shape[:3] + (1,) + votes.shape[4:])  # (B, I, J, 1, H, W): per example, position
        detached = votes.detach() if self.detach_agreement else votes
        grid_bias = None if bias is None else bias.view(1, J, D, 1, 1)
        squash_fn = SQUASHES[self.squash]
        for r in range(self.iterations):
            last = r == self.iterations - 1
            c = coupling_softmax(b, dim=2 if self.softmax == "parents" else 1, leaky=self.leaky)  # (B, I, J, 1, H, W)
            u = votes if last else detached
            s = (c * u).sum(1)  # (B, J, D, H, W)
            if grid_bias is not None:
                s = s + grid_bias
            v = squash_fn(s, dim=2)  # (B, J, D, H, W)
            if not last:
                b = b + (u * v.unsqueeze(1)).sum(3, keepdim=True)  # (B, I, J, 1, H, W)
        return v

    def route_linear(self, u: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                     record: bool = False) -> RoutingResult:
        """The same routing for linear votes ``u_hat_j|i = W_ij u_i``, from u and W (``dynamic_linear``).

        Equals ``forward(votes)`` up to float rounding (tests check values and
        gradients), without ever holding a vote-sized gradient: for Procedure 1
        as written (``softmax="parents"``, ``squash="sabour"``); with other
        options it builds the votes and calls ``forward``.

        Shapes:
            u: (B, I, Din) lower capsules
            weight: (Din, I, J, Dout), the layout DenseCaps stores
            bias: (J, Dout) or None
            returns: poses (B, J, Dout), activations (B, J), coupling (B, I, J);
                with ``record``, ``rounds`` (B, R, I, J)
        """
        if self.softmax != "parents" or self.squash != "sabour":  # the fast path knows Procedure 1 only: build votes
            votes = torch.einsum("bid,dijo->bijo", u, weight)  # (B, I, J, Dout)
            return self.forward(votes, None, bias, record=record)
        v, c, rounds = route_linear(u, weight, bias, iterations=self.iterations, leaky=self.leaky,
                                    detach_agreement=self.detach_agreement, chunk=self.chunk, record=record)
        return RoutingResult(v, safe_norm(v, dim=-1), c, rounds)
