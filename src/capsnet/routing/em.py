"""EM routing: Hinton, Sabour and Frosst, "Matrix capsules with EM routing" (ICLR 2018), Procedure 1 (in a
convolutional layer, each window is routed on its own by default, not Procedure 1's normalisation of a child over
every parent of every window holding it, which ``child_norm`` gives: "Children shared between rows" below).

Each upper capsule j is a Gaussian over the votes: the M-step fits its mean
(the pose) and per-dimension variance to the votes weighted by the routing
coefficients and the lower activations, and turns its description length
into an activation; the E-step gives each lower capsule's vote to the upper
capsules in proportion to their activation times the vote's likelihood.

Kept finite for votes up to about 1e16 in size at any number of iterations
(1e18 at up to 3), and their gradient for votes up to 1e4 at any number (1 to
50 measured), 1e12 at up to 3 iterations (the paper's), 1e10 at 4, 1e8 at
5, 1e5 at 7: past those their float32 squares and the products of
the backward overflow (measured 2026-12-01 at 12 children, 4 parents, 16
dimensions, one child's votes that large, 10 draws each, a loss whose gradient is of order 1; with every vote
that large and the loss the poses' squares, whose gradient grows with them, from about 1e10 at 2 to 7 iterations
(5 draws, 2026-12-03); the issue's bar is 1e4; the attention routings scale such votes by a power of two and stay
finite further) (the failures the public ports report: NaN past one
iteration, all-equal activations):

- routing runs in float32 with autocast off, also inside a bf16 step;
- the variance has a floor added (``var_floor``, 5e-4 as in the official
  code), and log sigma is 0.5 log var, never a square root;
- the E-step works with log-likelihoods and a log-softmax over the upper
  capsules, the activation's log by ``logsigmoid``;
- the M-step weighs the votes by a softmax over the children of
  log R_ij + log a_i, the E-step handing it log R: exact for a parent of any
  mass (a floor under the mass, 1e-6 before 2026-12-01, shrank a starved
  parent's mean and variance and changed the routing after it), and all-zero
  lower activations give a mean of 0;
- the M-step's moments are batched matrix-vector products over the votes
  centred once on their activation-weighted mean, and the E-step's squared
  distance is expanded into such products too: no vote-sized temporary per
  iteration.

Fast backward: the votes enter the iterations only through those
matrix-vector products, so their gradient from all of them together is one
batched product of rank 2T - 1 (T iterations), where autograd would build
one vote-sized outer product per use and add them up. Training steps run
the iterations inside an autograd Function that does exactly that
(``_FusedEM``, built on ``routing/_fused.py``, which inverted attention
shares): about half the routing's forward-and-backward time on a CPU,
same values and gradients (tests/test_routing_em.py checks both against the
plain path). Recording, inference, tracing, compiling, torch.func transforms
and forward-mode AD take the plain path. The fused backward is first-order
and runs once per forward: for double backward (a gradient penalty,
``create_graph=True``), ``retain_graph=True`` or ``gradcheck``, build the
routing with ``fused_backward=False``.

Paper and official code differ in places; this module follows the paper's
Procedure 1 and takes from the official code (google-research/capsule_em)
only its inverse-temperature schedule and variance floor:

- cost: ``cost_j = sum_i R_ij a_i * sum_h (beta_u + log sigma_j^h)`` as Procedure 1,
  times ``100 J / I`` (Gritzman 2019, "Avoiding implementation pitfalls of
  matrix capsule networks with EM routing", IBM's code: the amount of data
  a parent explains normalised by the number of children, so a layer of
  288 children and one of 72 give costs of one scale; without it the
  inverse temperature leaves the class activations almost equal);
- activation: ``a_j = logistic(lambda_t (beta_a / final_lambda - cost_j))``:
  beta_a is learned in units of the final logit (the official code
  multiplies it by 5000 for the same reason: at lambda ~ 1e-3 an Adam step
  on a raw beta_a would move the logit by 1e-6);
- the official code damps the mean (0.9 new + 0.1 previous, the previous
  starting at 0) and takes the variance about the damped mean: off by
  default, ``mean_momentum=0.1`` does it;
- ``cost_scale`` replaces ``100 J / I`` by a constant: the official cost,
  ``sum_i R_ij a_i * sum_h (log var_j^h + beta_v (log 2 pi + 1))``, is
  ``cost_scale=2`` with ``beta_u = beta_v (log 2 pi + 1) / 2`` (its starts,
  beta_v 0.5 and 2.0 in the class layer, are beta_u 0.709 and 2.838);
- lambda in iteration t (0-based) is ``final_lambda * (1 - 0.95^(t+1))``, the
  official schedule ("increases at each iteration according to a fixed
  schedule", Procedure 1's caption gives no values);
- beta_u and beta_a: one of each per upper capsule type (OpenReview answer
  quoted by the ports; the official code does the same), initialised to 0 (at ``beta_u_init`` and ``beta_a_init``
  when given).

Children shared between rows: a convolutional layer folds its windows into
the batch, so one child capsule appears in every window that holds it. By
default each row is routed on its own (R sums to one over the parents of the
row: what the most-used PyTorch port does). Given ``children`` (each vote
row's child ids), the E-step normalises a child's R over all of its votes
instead (``child_norm``): ``"all"``, over every parent of every window that
holds it (Procedure 1's sum over the parents, and IBM's port), or
``"type"``, for each parent type over those windows (the official code's
convolutional E-step, ``update_conv_routing`` in em_layers.py: no
competition between parent types). The first M-step's R is uniform over the
same set (the official code starts from 1/J, uniform over the parent types,
so its first and later M-steps weigh a child on different scales), and the cost's ``100 J / I``
counts a child shared by n windows as 1/n of one in each, so the cost keeps
its scale at a uniform R.
"""
from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn

from .._eager import autocast_off as _autocast_off, eager
from .._numbers import is_count, is_finite
from ._fused import first_order, tap, tapped_backward, wants_fused_backward
from .result import RoutingResult, check_count, check_positive, check_switch, check_votes

__all__ = ["EMRouting"]

CHILD_NORMS = ("all", "type")


class EMRouting(nn.Module):
    """EM routing between matrix capsules (Hinton, Sabour and Frosst, "Matrix capsules with EM routing", ICLR 2018,
    Procedure 1), with the shared call shape.

    Args:
        out_caps: J, the upper capsule types (one beta_u and one beta_a each).
        iterations: EM iterations (the paper's Table 1: 3 is best on smallNORB).
        final_lambda: the inverse temperature's scale (official code: 0.01;
            a class layer there uses a quarter of it).
        var_floor: added to every variance (official code: 5e-4).
        normalise_cost: each parent's cost taken against the others' (mean 0, standard deviation 1 over the
            parents of an example); not in the paper.
        beta_u_init: beta_u's starting value (0: the ports' start). The cost per
            dimension is beta_u + log sigma, and log sigma is about -3 to -5 at
            the start of training (the poses are small), so at 0 the parents
            start almost all active; about 3 starts half of them active, the
            start Hinton's OpenReview answer describes for the official code
            (which got there through the weights' initial spreads).
        beta_a_init: beta_a's starting value, in units of the final logit (0: the ports' start, where the parents
            start almost all active: logits of about +5 after 2 iterations, +7 after 3). The official code's
            starts, converted to these units (its logit is lambda_t (... - 5000 act_b), act_b at 0.5 for the
            convolutional capsules and 1.0 for the class layer, so beta_a = -5000 act_b final_lambda): -25 and
            -12.5.
        fused_backward: training steps take the votes' gradient in one batched
            product (module docstring); False runs plain autograd (same numbers,
            slower: benchmarks/fused_backward.py compares the two).
        child_norm: with ``children`` given to ``forward``, the set a child's R
            sums to one over: ``"all"`` its votes for every parent of every row
            holding it, ``"type"`` its votes for each parent type (module docstring).
        cost_scale: the cost's scale in place of Gritzman's ``100 J / I`` (None); 2, with beta_u at
            beta_v (log 2 pi + 1) / 2, is the official code's cost (module docstring).
        mean_momentum: each M-step's mean is ``(1 - m) new + m previous`` (the first step's previous is 0) and
            its variance is taken about that mean; the official code's is 0.1, 0 (the default) is Procedure 1.
        e_step_temperature: tau, with R_ij proportional to (a_j p_j(V_ij))^tau in every E-step (deterministic
            annealing's form of EM; not in the paper): below 1 each child's assignment is softer. 1 is Procedure 1.
        e_step_var_floor: added to the variances the E-step's Gaussians use, not to the M-step's cost (not in the
            paper): wider Gaussians, a softer assignment, the activations' cost unchanged. 0 is Procedure 1.
        detach_routing: no gradient through the E-steps: every R is a constant to
            the gradient, which reaches the votes, activations and betas through
            the last M-step alone, so more iterations change what the parents see
            but not the gradient's path (the EM analogue of dynamic routing's
            ``detach_agreement``; no reference code does it). The forward pass is
            unchanged.

    Poses are the means mu_j (votes of 16 = 4x4 entries for matrix capsules,
    flattened); activations are a_j in (0, 1); coupling is R_ij, which sums
    to one over the J upper capsules for each lower capsule i (with ``children``:
    over the set ``child_norm`` names, summed across the rows holding the child).
    """

    pose_bias = False  # the means are the poses: a layer routed by EM has no pose bias (capsnet.routing)
    length_activations = False  # a_j comes from the cost, not from |mu_j| (capsnet.routing)

    def __init__(self, out_caps: int, iterations: int = 3, *, final_lambda: float = 0.01, var_floor: float = 5e-4,
                 normalise_cost: bool = False, fused_backward: bool = True,
                 beta_u_init: float = 0.0, beta_a_init: float = 0.0, child_norm: str = "all",
                 detach_routing: bool = False, cost_scale: float | None = None, mean_momentum: float = 0.0,
                 e_step_temperature: float = 1.0, e_step_var_floor: float = 0.0) -> None:
        super().__init__()
        check_count("out_caps", out_caps)
        check_count("iterations", iterations)
        for name, value in (("final_lambda", final_lambda), ("var_floor", var_floor)):
            check_positive(name, value)
        self.out_caps, self.iterations = out_caps, iterations
        self.final_lambda, self.var_floor = final_lambda, var_floor
        for name, value in (("normalise_cost", normalise_cost), ("fused_backward", fused_backward),
                            ("detach_routing", detach_routing)):
            check_switch(name, value)  # --routing-option detach_routing=False is the string "False": on, as bool()
        self.normalise_cost = normalise_cost
        self.fused_backward = fused_backward
        for name, value in (("beta_u_init", beta_u_init), ("beta_a_init", beta_a_init)):
            if not is_finite(value):  # "x" met a bare "must be real number, not str"; True was taken as 1
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        if child_norm not in CHILD_NORMS:
            raise ValueError(f"child_norm must be one of {', '.join(CHILD_NORMS)}, got {child_norm!r}")
        self.child_norm = child_norm
        self.detach_routing = detach_routing
        if cost_scale is not None and not (is_finite(cost_scale) and cost_scale > 0):
            raise ValueError(f"cost_scale must be a positive number (or None: Gritzman's 100 J / I), got {cost_scale!r}")
        if not (is_finite(mean_momentum) and 0 <= mean_momentum < 1):
            raise ValueError(f"mean_momentum must be in [0, 1) (the official code's is 0.1), got {mean_momentum!r}")
        self.cost_scale, self.mean_momentum = cost_scale, float(mean_momentum)
        if not (is_finite(e_step_temperature) and 0.01 <= e_step_temperature <= 10):
            raise ValueError(f"e_step_temperature must be in [0.01, 10] (1: Procedure 1), got {e_step_temperature!r}")
        if not (is_finite(e_step_var_floor) and 0 <= e_step_var_floor <= 100):
            raise ValueError(f"e_step_var_floor must be in [0, 100] (0: Procedure 1), got {e_step_var_floor!r}")
        self.e_step_temperature, self.e_step_var_floor = float(e_step_temperature), float(e_step_var_floor)
        self.beta_u = nn.Parameter(torch.full((out_caps,), float(beta_u_init)))  # (J,)
        self.beta_a = nn.Parameter(torch.full((out_caps,), float(beta_a_init)))  # (J,)

    def extra_repr(self) -> str:
        extra = "".join(f", {k}={v}" for k, v in (("cost_scale", self.cost_scale),
                                                   ("mean_momentum", self.mean_momentum),
                                                   ("e_step_var_floor", self.e_step_var_floor)) if v)
        if self.e_step_temperature != 1:
            extra += f", e_step_temperature={self.e_step_temperature}"
        return f"out_caps={self.out_caps}, iterations={self.iterations}, final_lambda={self.final_lambda}{extra}"

    def inverse_temperature(self, t: int) -> float:
        """lambda of iteration t (0-based): final_lambda * (1 - 0.95^(t+1)) (official code's schedule)."""
        return self.final_lambda * (1.0 - 0.95 ** (t + 1))

    def m_step(self, votes: torch.Tensor, activations: torch.Tensor, R: torch.Tensor, lam: float
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Procedure 1, M-step: each upper capsule's mean, variance and activation logit.

        Shapes:
            votes (B, I, J, D), activations (B, I), R (B, I, J)
            returns mu (B, J, D), var (B, J, D) (the floor included), logit (B, J): a_j = sigmoid(logit)
        """
        VV, centre = _layout(votes, activations)
        tiny = torch.finfo(VV.dtype).tiny  # an R of 0 at the log's floor: no weight beside any R above it
        m1, var, logit = self._m_step(VV, activations, R.transpose(1, 2).clamp_min(tiny).log(), lam,
                                      previous=-centre)
        return m1 + centre, var, logit

    def _m_step(self, VV: torch.Tensor, a: torch.Tensor, log_R: torch.Tensor, lam: float,
                betas: tuple[torch.Tensor, torch.Tensor] | None = None, taps: list | None = None,
                share: "_SharedChildren | None" = None, previous: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The M-step on votes laid out by ``_layout``: log R (B, J, I) -> centred mean, variance, logit.

        Both weighted moments come from one batched matrix-vector product
        over the votes and their squares side by side (no vote-sized
        temporaries); var = E[V^2] - E[V]^2 of the centred votes. The weights R_ij a_i / sum_i R_ij a_i are a
        softmax over i of log R_ij + log a_i: exact for a parent of any mass, however small (a floor under the
        mass shrank a starved parent's mean and variance, and changed the routing after it), their gradient
        bounded where the quotient's grows as 1 / mass^2; a parent of no mass at all (every child it could
        explain silent) has weights 0, a mean of 0.
        ``betas`` stand in for (beta_u, beta_a); ``taps`` collects the
        product and its weights for ``_FusedEM``; ``share`` the children shared between rows; ``previous`` the
        last M-step's centred mean (B, J, D), which ``mean_momentum`` mixes in (the variance about the mixed mean:
        E[(V - mixed)^2] = var + (new - mixed)^2).
        """
        beta_u, beta_a = (self.beta_u, self.beta_a) if betas is None else betas
        B, J, I, D2 = VV.shape
        D = D2 // 2
        mass = (log_R.exp() * a.unsqueeze(1)).sum(dim=-1)  # sum_i R_ij a_i, (B, J)
        # log a at float's smallest normal for a silent child: its weight ~1e-38 beside any live one (and no
        # infinite gradient of log 0)
        log_a = a.clamp_min(torch.finfo(a.dtype).tiny).log().unsqueeze(1)  # (B, 1, I)
        # sums to 1 over i; 0 for a parent whose children are all silent (no mass). Not ``mass > 0``: a starved
        # parent's mass underflows float32 to 0 once every log R is below about -103, and its exact weights were
        # then dropped (its mean fell back to the votes' centre, its variance to the floor: a review)
        live = (a > 0).any(dim=-1).view(B, 1, 1)
        w = torch.softmax(log_R + log_a, dim=-1) * live
        w = w.reshape(B * J, 1, I)
        m = torch.bmm(w, VV.reshape(B * J, I, D2))  # [E[V], E[V^2]], (B * J, 1, 2D)
        if taps is not None:  # d loss / d VV from this product: w^T (d loss / d m)
            tap(taps, m, w.detach().transpose(1, 2), None)
        m = m.view(B, J, D2)
        m1, m2 = m[..., :D], m[..., D:]
        var = (m2 - m1.pow(2)).clamp_min(0) + self.var_floor  # (B, J, D)
        if self.mean_momentum and previous is not None:
            mixed = torch.lerp(m1, previous.to(m1.dtype), self.mean_momentum)
            var = var + (m1 - mixed).pow(2)
            m1 = mixed
        # cost^h = (beta_u + log sigma^h) sum_i R_ij a_i; log sigma = 0.5 log var (a square root's gradient is not finite at 0)
        # Gritzman's normalisation of the data a parent explains (shared children counted by their share)
        if self.cost_scale is not None:
            scale = self.cost_scale
        else:  # no children: no data, a finite cost
            scale = 100.0 * J / max(I, 1) if share is None else share.scale
        cost = scale * mass * (D * beta_u + 0.5 * var.log().sum(dim=-1))  # sum_h cost^h, (B, J)
        if self.normalise_cost and J > 1:  # each parent's cost against the others' (mean 0, std 1 over j, per
            # example); one parent has no others (its sample std would be NaN)
            cost = (cost - cost.mean(dim=-1, keepdim=True)) / (cost.std(dim=-1, keepdim=True) + 1e-4)
        return m1, var, lam * (beta_a / self.final_lambda - cost)

    def _e_step(self, VV: torch.Tensor, m1: torch.Tensor, var: torch.Tensor, logit: torch.Tensor,
                taps: list | None = None, share: "_SharedChildren | None" = None) -> torch.Tensor:
        """Procedure 1, E-step, in the log domain: log R_ij, R_ij = a_j p_j(V_ij) / sum_k a_k p_k(V_ik), as
        (B, J, I) (the M-step weighs the votes by log R: a starved parent's R of 1e-40 still counts).

        sum_h (V - mu)^2 / var is expanded into -2 V mu/var + V^2/var + mu^2/var:
        one batched matrix-vector product over the votes and their squares.
        """
        B, J, I, D2 = VV.shape
        D = D2 // 2
        if self.e_step_var_floor:  # the E-step's Gaussians widened, the M-step's cost left as it is
            var = var + self.e_step_var_floor
        inv = 1.0 / var  # (B, J, D)
        coef = torch.cat([-2 * m1 * inv, inv], dim=-1).view(B * J, 1, D2)
        # coef^T VV^T, a row times the votes' transposed view: the numbers of VV coef, but 3x faster on a CPU, where
        # MKL's batched product is slow for a tall matrix times a column, and so is the transpose its backward takes
        q = torch.bmm(coef, VV.reshape(B * J, I, D2).transpose(1, 2))  # (B * J, 1, I)
        if taps is not None:  # d loss / d VV from this product: (d loss / d q)^T coef
            tap(taps, q, None, coef.detach())
        q = q.view(B, J, I) + (m1.pow(2) * inv).sum(dim=-1, keepdim=True)  # sum_h (V_ij - mu_j)^2 / var_j, (B, J, I)
        log_p = -0.5 * q.clamp_min(0) - 0.5 * (var.log().sum(dim=-1, keepdim=True) + D * math.log(2 * math.pi))
        log_r = F.logsigmoid(logit).unsqueeze(-1) + log_p  # (B, J, I)
        if self.e_step_temperature != 1:  # R proportional to (a_j p_j)^tau: tau < 1 softens the assignment
            log_r = log_r * self.e_step_temperature
        return torch.log_softmax(log_r, dim=1) if share is None else share.log_softmax(log_r)  # over the parents j

    def forward(self, votes: torch.Tensor, activations: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                *, record: bool = False, children: torch.Tensor | None = None,
                num_children: int | None = None) -> RoutingResult:
        """Route ``votes`` (weighted by the lower ``activations``; all 1 when None) to the upper capsules.

        ``children`` (B, I) integers in [0, ``num_children``): the child capsule each vote row comes
        from; rows with the same id hold the same child (a convolutional layer's overlapping windows,
        folded into the batch), whose R is normalised over all its votes (``child_norm``).

        Shapes:
            votes: (B, I, J, D); activations: (B, I) in [0, 1] (refused outside it on the CPU) or None; bias:
                must be None (EM has no pose bias)
            returns: poses mu (B, J, D), activations a (B, J), coupling R (B, I, J) of the last M-step;
                with ``record``, ``rounds`` (B, R, I, J): the R each M-step used (the first uniform).
                Half-precision votes are routed, and returned, in float32.
        """
        B, I, J, D = check_votes(votes, activations)
        if J != self.out_caps:
            raise ValueError(f"votes are for {J} upper capsules but this EMRouting has out_caps={self.out_caps}")
        if bias is not None:
            raise ValueError("EM routing takes no pose bias: build the layer with bias=False")
        if activations is not None and activations.device.type == "cpu" and eager() and activations.numel():
            # the probabilities that the children are present: a negative one was a silent child to the mean's
            # weights but took mass off the cost (a review, 2026-12-01). Checked on the CPU only (elsewhere the
            # check would wait for the device every step), as the labels' range is
            # (a rounding's worth above 1 let through; NaN too: a diverged run's, which its loss names with the
            # step and the fix, where this message blamed the caller)
            if ((activations < 0) | (activations > 1 + 1e-4)).any().item():
                shown = activations[~activations.isnan()]
                lo, hi = shown.min().item(), shown.max().item()
                raise ValueError(f"activations are the probabilities that the lower capsules are present, in [0, 1]; "
                                 f"got values from {lo:g} to {hi:g}: pass a sigmoid's output, or none (all present)")
        # bf16 and fp16 votes are routed in fp32; float32 votes beside float64 betas (a .double() module) in float64
        dtype = torch.promote_types(torch.promote_types(votes.dtype, torch.float32), self.beta_u.dtype)
        with _autocast_off(votes.device.type):  # also inside a bf16 autocast step
            votes = votes.to(dtype)
            a_in = votes.new_ones(B, I) if activations is None else activations.to(dtype)
            share = None if children is None else _SharedChildren(children, num_children, B, I, J, self.child_norm,
                                                                  dtype)
            if self.fused_backward and not record and wants_fused_backward(votes, a_in, self.beta_u, self.beta_a):
                poses, logit, R = _FusedEM.apply(votes, a_in, self.beta_u, self.beta_a, self, share)
                return RoutingResult(poses, torch.sigmoid(logit), R.transpose(1, 2))
            # inference: both halves written into one buffer (no autograd to feed, nothing tracing the graph)
            VV, centre = _layout(votes, a_in, into_buffer=not torch.is_grad_enabled() and eager())
            m1, logit, R, rounds = self._iterate(VV, a_in, record=record, share=share, centre=centre)
            # R is what the last M-step used: the coupling of the last round
            return RoutingResult(m1 + centre, torch.sigmoid(logit), R.transpose(1, 2),
                                 torch.stack(rounds, dim=1) if record else None)

    def _iterate(self, VV: torch.Tensor, a: torch.Tensor, betas: tuple[torch.Tensor, torch.Tensor] | None = None, *,
                 record: bool = False, taps: list | None = None, share: "_SharedChildren | None" = None,
                 centre: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """Procedure 1's loop on laid-out votes: the last M-step's centred mean (B, J, D) and logit (B, J), the R
        (B, J, I) it used, and with ``record`` the R of every M-step, each (B, I, J). ``centre`` (B, J, D), what
        ``_layout`` took off the votes, places the first M-step's previous mean (0) for ``mean_momentum``."""
        B, J, I, _ = VV.shape
        # the mean before the first M-step, for mean_momentum alone: 0, in centred coordinates
        m1 = -centre if self.mean_momentum and centre is not None else None
        # Procedure 1: R_ij = 1 / |Omega_{L+1}|, the parents child i votes for
        log_R = VV.new_full((B, J, I), -math.log(J)) if share is None else share.uniform.log().expand(B, J, I)
        rounds = []
        for t in range(self.iterations):
            if record:
                rounds.append(log_R.exp().transpose(1, 2))
            last = t == self.iterations - 1
            cut = self.detach_routing and not last  # no graph, and no product for the fused backward to ask about
            taps_here = None if cut else taps
            with torch.no_grad() if cut else contextlib.nullcontext():
                m1, var, logit = self._m_step(VV, a, log_R, self.inverse_temperature(t), betas, taps_here, share, m1)
                if not last:
                    log_R = self._e_step(VV, m1, var, logit, taps_here, share)
            if cut:  # no_grad does not stop forward-mode derivatives (jvp)
                log_R = log_R.detach()
        return m1, logit, log_R.exp(), rounds


class _FusedEM(torch.autograd.Function):
    """EMRouting's loop with one batched product for the votes' gradient (module docstring, "Fast backward").

    forward(votes (B, I, J, D), a (B, I), beta_u (J,), beta_a (J,), routing, share) -> poses (B, J, D), logit (B, J),
    R (B, J, I). The loop runs once, with autograd on, over detached votes: its graph holds the routing's
    small tensors (R, weights, moments) and no vote-sized gradient. ``backward`` asks that graph for the
    gradients reaching each matrix-vector product and turns them into the votes' gradient in one ``bmm``.
    """

    @staticmethod
    def forward(ctx, votes, a, beta_u, beta_a, routing, share):
        with torch.enable_grad():
            leaves = tuple(t.detach().requires_grad_() for t in (a, beta_u, beta_a))
            with torch.no_grad():
                VV, centre = _layout(votes, a, into_buffer=True)
            taps: list = []
            m1, logit, R, _ = routing._iterate(VV, leaves[0], leaves[1:], taps=taps, share=share, centre=centre)
            poses = m1 + centre
        ctx.graph = ((poses, logit, R), VV, taps, leaves)
        return poses.detach(), logit.detach(), R.detach()

    @staticmethod
    @first_order("EM routing")
    def backward(ctx, *grads):
        if ctx.graph is None:
            raise RuntimeError("EM routing's fused backward runs once per forward pass (its graph is freed as it "
                               "goes): to backpropagate through the same forward twice (retain_graph=True), build "
                               "the routing with EMRouting(..., fused_backward=False)")
        (outputs, VV, taps, leaves), ctx.graph = ctx.graph, None
        with _autocast_off(VV.device.type):  # float32 products, also when backward is called inside autocast
            return _FusedEM._backward(ctx, outputs, VV, taps, leaves, grads)

    @staticmethod
    def _backward(ctx, outputs, VV, taps, leaves, grads):
        L, Rt, found = tapped_backward(outputs, grads, taps, leaves)  # d loss / d VV = L @ Rt
        B, J, I, D2 = VV.shape
        D = D2 // 2
        g_votes = None
        if L is not None and ctx.needs_input_grad[0]:
            # VV = [V, V^2] of the centred votes V: d/dV = first half + 2 V * second half
            g_V = torch.bmm(L, Rt[..., :D]).view(B, J, I, D)
            g_V.addcmul_(VV[..., :D], torch.bmm(L, Rt[..., D:]).view(B, J, I, D), value=2)
            g_votes = g_V.permute(0, 2, 1, 3)  # the centre is a constant (detached in _layout)
        g_a, g_bu, g_ba = (g if need else None for g, need in zip(found, ctx.needs_input_grad[1:4]))
        return g_votes, g_a, g_bu, g_ba, None, None


class _SharedChildren:
    """Children shared between vote rows (``EMRouting.forward``'s ``children``): the E-step's normaliser, the
    first M-step's uniform R and the cost's scale, for R (B, J, I) laid out upper-capsule-major."""

    def __init__(self, children: torch.Tensor, num_children: int | None, B: int, I: int, J: int, norm: str,
                 dtype: torch.dtype) -> None:
        if not isinstance(children, torch.Tensor) or tuple(children.shape) != (B, I) or children.is_floating_point() \
                or children.is_complex() or children.dtype == torch.bool:
            got = tuple(children.shape) if isinstance(children, torch.Tensor) else type(children).__name__
            raise ValueError(f"children must be an integer tensor (B, I) = ({B}, {I}) of child ids, got {got}")
        if not (is_count(num_children) or isinstance(num_children, torch.SymInt) and num_children >= 1):
            raise ValueError(f"children needs num_children, a positive integer above every id, got {num_children!r}")
        index = children.long()  # (B, I)
        try:  # each child's number of rows: 1/n of it in each
            rows = torch.zeros(num_children, dtype=dtype, device=children.device).index_add_(
                0, index.reshape(-1), children.new_ones(B * I, dtype=dtype))
        except IndexError:
            raise ValueError(f"children ids must lie in 0..{num_children - 1} (num_children={num_children})") from None
        share = 1.0 / rows[index]  # (B, I)
        # the set each entry of R (B, J, I) is normalised over, flattened: its child, or its child and parent type
        if norm == "all":
            self.groups, group = num_children, index.unsqueeze(1).expand(B, J, I)
        else:
            self.groups = num_children * J
            group = index.unsqueeze(1) * J + torch.arange(J, device=children.device).view(1, J, 1)
        self.group = group.reshape(-1)  # (B * J * I,), built once for every E-step
        # uniform R over the set a child's R sums to one over: all J parents of each row, or each type's rows
        self.uniform = (share / J if norm == "all" else share).unsqueeze(1)  # (B, 1, I)
        # Gritzman's 100 J / I with I counting shared children by their share (the cost's scale at uniform R)
        self.scale = 100.0 * (J if norm == "all" else 1) / share.sum(dim=1, keepdim=True)  # (B, 1)

    def log_softmax(self, log_r: torch.Tensor) -> torch.Tensor:
        """The log of exp(log_r) normalised over each child's set (``norm``), shifted by the set's maximum:
        (B, J, I)."""
        group, flat = self.group, log_r.reshape(-1)
        top = flat.new_full((self.groups,), -math.inf).scatter_reduce(0, group, flat.detach(), "amax")
        shifted = flat - top[group]
        total = flat.new_zeros(self.groups).index_add(0, group, shifted.exp())
        return (shifted - total.log()[group]).view(log_r.shape)


def _layout(votes: torch.Tensor, activations: torch.Tensor, *, into_buffer: bool = False
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Votes (B, I, J, D) centred on each upper capsule's activation-weighted mean, beside their squares.

    Centring keeps E[V^2] - E[V]^2 free of cancellation for votes far from 0
    (the variance does not change; the mean gets the centre back) as long as
    the routing weights stay near the activations' own. Where R gathers a
    parent on one tight cluster of votes far from the centre (distance C
    against a spread s), E[V^2] and E[V]^2 are both about C^2 and float32
    keeps about 7 - 2 log10(C/s) digits of their difference: a review
    (2026-11-29) measured activations off by 3e-4 at C = 10 and 8e-3 at
    C = 100 (spread 0.01) against a float64 Procedure 1. A second pass about
    the new mean would remove it, at a vote-sized temporary per iteration.
    Returns [V, V^2] (B, J, I, 2D), upper-capsule-major, and the centre (B, J, D).
    ``into_buffer`` (no autograd) writes both halves straight into one buffer: no concatenation.
    """
    V = votes.permute(0, 2, 1, 3)  # (B, J, I, D); free when the layer made the votes in this layout
    a = activations / activations.sum(dim=1, keepdim=True).clamp_min(1e-12)  # (B, I)
    # (B, J, D): on upper-major votes a row times each (I, D) block, 10x faster on a CPU than the einsum, which copies
    # them child-major first; on child-major votes (a dense layer's) the einsum is the fast one
    centre = (torch.matmul(a[:, None, None, :], V).squeeze(2) if V.is_contiguous() else
              torch.einsum("bi,bjid->bjd", a, V)).detach()
    if into_buffer:
        B, J, I, D = V.shape
        VV = V.new_empty(B, J, I, 2 * D)
        torch.sub(V, centre.unsqueeze(2), out=VV[..., :D])
        torch.mul(VV[..., :D], VV[..., :D], out=VV[..., D:])
        return VV, centre
    V = V - centre.unsqueeze(2)
    return torch.cat([V, V.pow(2)], dim=-1), centre  # (B, J, I, 2D)
