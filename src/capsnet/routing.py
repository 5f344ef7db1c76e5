"""Routing algorithms: votes of lower capsules in, upper capsules out.

Every algorithm is an ``nn.Module`` with one call shape (shared/DESIGN.md)::

    votes:       (B, I, J, D)   prediction u_hat_{j|i} of lower capsule i for upper j
    activations: (B, I) or None presence of the lower capsules (EM uses it)
    returns      RoutingResult(poses (B, J, D), activations (B, J), coupling (B, I, J))
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from .ops import _squash_vjp, safe_norm, squash

__all__ = ["RoutingResult", "DynamicRouting"]


class RoutingResult(NamedTuple):
    """Output of a routing module; unpacks as ``poses, activations, coupling``."""

    poses: torch.Tensor  # (B, J, D)
    activations: torch.Tensor  # (B, J)
    coupling: torch.Tensor  # (B, I, J), coefficients of the last round


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
    """

    def __init__(self, iterations: int = 3, *, leaky: bool = False, detach_agreement: bool = False) -> None:
        super().__init__()
        if not isinstance(iterations, int) or iterations < 1:
            raise ValueError(f"iterations must be a positive integer, got {iterations!r}")
        self.iterations = iterations
        self.leaky = leaky
        self.detach_agreement = detach_agreement
        self.chunk: int | None = None  # lower capsules per block in route_linear; None: by size

    def extra_repr(self) -> str:
        return f"iterations={self.iterations}, leaky={self.leaky}, detach_agreement={self.detach_agreement}"

    def _coupling(self, b: torch.Tensor) -> torch.Tensor:
        if not self.leaky:
            return torch.softmax(b, dim=-1)  # Procedure 1, line 4: softmax over j
        # Authors' code (_leaky_routing): a zero logit joins the softmax and its
        # share is dropped, so the kept coefficients sum to less than one.
        leak = b.new_zeros(b.shape[:-1] + (1,))
        return torch.softmax(torch.cat([leak, b], dim=-1), dim=-1)[..., 1:]  # (B, I, J)

    def forward(
        self,
        votes: torch.Tensor,
        activations: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
    ) -> RoutingResult:
        """Route ``votes`` to the upper capsules.

        Shapes:
            votes: (B, I, J, D)
            activations: ignored by dynamic routing (accepted for the shared call shape)
            bias: (J, D) or None, added to s_j before the squash in every round
            returns: poses (B, J, D), activations (B, J), coupling (B, I, J)
        """
        if votes.dim() != 4:
            raise ValueError(f"votes must be (B, I, J, D), got shape {tuple(votes.shape)}")
        B, I, J, D = votes.shape
        if bias is not None and tuple(bias.shape) != (J, D):
            raise ValueError(f"bias must be (J, D) = ({J}, {D}), got shape {tuple(bias.shape)}")
        # One transposed copy so both contractions below are plain batched
        # matmuls over (B, J): far faster on CPU than broadcasting products.
        u_hat = votes.permute(0, 2, 1, 3)  # (B, J, I, D)
        u_hat_detached = u_hat.detach() if self.detach_agreement else u_hat
        b = votes.new_zeros(B, I, J)  # Procedure 1, line 2: per example
        for r in range(self.iterations):
            last = r == self.iterations - 1
            c = self._coupling(b)  # (B, I, J)
            u = u_hat if last else u_hat_detached
            # Procedure 1, line 5: s_j = sum_i c_ij u_hat_j|i
            s = torch.matmul(c.transpose(1, 2).unsqueeze(2), u).squeeze(2)  # (B, J, D)
            if bias is not None:
                s = s + bias
            v = squash(s)  # Procedure 1, line 6; (B, J, D)
            if not last:
                # Procedure 1, line 7: b_ij += u_hat_j|i . v_j
                agreement = torch.matmul(u, v.unsqueeze(-1)).squeeze(-1)  # (B, J, I)
                b = b + agreement.transpose(1, 2)  # (B, I, J)
        return RoutingResult(v, safe_norm(v, dim=-1), c)

    def route_linear(self, u: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> RoutingResult:
        """The same routing for linear votes ``u_hat_j|i = W_ij u_i``, from u and W.

        Equals ``forward(votes)`` up to float rounding (tests check values and
        gradients), but runs as one autograd node with a hand-written backward
        (see ``_RouteLinear``): the votes are built once, in blocks of lower
        capsules, and no vote-sized gradient is ever allocated, where autograd
        through the rounds would allocate one per product and per gradient
        term. About 3x faster than autograd on CPU for the MNIST CapsNet
        (benchmarks/README.md). Inputs of different dtypes (bf16 capsules from
        autocast, fp32 weights) are routed in the wider dtype, with autocast off.

        Shapes:
            u: (B, I, Din) lower capsules
            weight: (Din, I, J, Dout), the layout DenseCaps stores
            bias: (J, Dout) or None
            returns: poses (B, J, Dout), activations (B, J), coupling (B, I, J)
        """
        if u.dim() != 3:
            raise ValueError(f"u must be lower capsules (B, I, Din), got shape {tuple(u.shape)}")
        if weight.dim() != 4:
            raise ValueError(f"weight must be (Din, I, J, Dout), got shape {tuple(weight.shape)}")
        B, I, Din = u.shape
        Din_w, I_w, J, D = weight.shape
        if (Din_w, I_w) != (Din, I):
            raise ValueError(f"weight (Din, I, J, Dout) = {tuple(weight.shape)} does not fit capsules (B, I, Din) = {tuple(u.shape)}")
        if bias is not None and tuple(bias.shape) != (J, D):
            raise ValueError(f"bias must be (J, D) = ({J}, {D}), got shape {tuple(bias.shape)}")
        dtype = torch.promote_types(u.dtype, weight.dtype)  # autocast may hand bf16 capsules to fp32 weights
        u, weight = u.to(dtype), weight.to(dtype)
        bias = bias.to(dtype) if bias is not None else None
        chunk = self.chunk if self.chunk is not None else _default_chunk(u, J, D)
        v, c = _RouteLinear.apply(u, weight, bias, self.iterations, self.leaky, self.detach_agreement, chunk)
        return RoutingResult(v, safe_norm(v, dim=-1), c.transpose(1, 2))  # coupling (B, I, J)


MIN_CHUNK = 64  # lower capsules per block on CPU, at least


def _default_chunk(u: torch.Tensor, J: int, D: int) -> int:
    """Lower capsules per block on CPU: about 4 MiB of votes, but never fewer than ``MIN_CHUNK``.

    The 4 MiB rule alone gave blocks of 12 capsules at batch 512, whose thin
    batched products routed 1.5-1.7x slower than the best block size. Which
    size is best moved between runs on this machine (32 in one, 144 in
    another); 64 stayed within about 1.2x of it at batch 128 and 512
    (benchmarks/README.md, "Block size of the routing").
    """
    if u.device.type != "cpu":
        return u.shape[1]  # one block: GPUs want few, large kernels
    per_capsule = u.shape[0] * J * D * u.element_size()
    return max(1, min(u.shape[1], max(MIN_CHUNK, (4 << 20) // max(per_capsule, 1))))


def _coupling_chunk(b: torch.Tensor, leaky: bool) -> torch.Tensor:
    """softmax over the upper capsules (dim 1) of logits laid out (B, J, i)."""
    if not leaky:
        return torch.softmax(b, dim=1)
    # The authors' orphan logit: softmax over [0, b_1..b_J], the zero's share dropped.
    m = b.amax(dim=1, keepdim=True).clamp_min(0)
    e = torch.exp(b - m)
    return e / (e.sum(dim=1, keepdim=True) + torch.exp(-m))


class _RouteLinear(torch.autograd.Function):
    """Procedure 1 on linear votes, with the backward written out by hand.

    Autograd through the rounds would allocate a fresh vote-sized tensor for
    every product and every gradient term: on CPU, faulting those pages in
    costs more than the arithmetic. Here the votes are built once, laid out
    (B, J, I, D) so every contraction is a batched matrix-vector product over
    (b, j), and each pass walks them in blocks of lower capsules that stay in
    cache. Routing is local in i given the previous round's poses, so one pass
    per round does the agreement, the new coupling and the next ``s``. The
    backward never builds the vote gradient: it is a sum of outer products
    ``sum_t alpha_t[b,j,i] g_t[b,j,:]`` (one per use of the votes), formed
    block by block and contracted straight into the gradients of u and W.

    Forward, rounds r = 0..R-1 (b^0 = 0, so c^0 = 1/J):
        c^r = softmax_j(b^r); s^r = sum_i c^r_ij u_hat_ij + bias; v^r = squash(s^r)
        b^(r+1) = b^r + a^r, a^r_ij = u_hat_ij . v^r_j
    Backward, with G_r = dL/db^r and G_R = 0:
        gs^r = squash'(s^r) gv^r;   gc^r_ij = u_hat_ij . gs^r_j (+ grad of the returned c)
        G_r = c^r (gc^r - sum_j c^r gc^r) + G_(r+1);   gv^(r-1) = sum_i G_r,i u_hat_i
        g u_hat_ij = sum_r c^r_ij gs^r_j + sum_(r<R-1) G_(r+1),ij v^r_j
    ``detach_agreement`` keeps only the last round's term in g u_hat (the
    earlier rounds see detached votes); the bias still gets every round.
    """

    @staticmethod
    def forward(ctx, u, weight, bias, iterations, leaky, detach, chunk):  # noqa: D102
        with torch.autocast(u.device.type, enabled=False):
            B, I, Din = u.shape
            _, _, J, D = weight.shape
            BJ = B * J
            u_t = u.transpose(0, 1)  # (I, B, Din), a view
            W_i = weight.reshape(Din, I, J * D).transpose(0, 1)  # (I, Din, J*D), a view
            n = J + 1 if leaky else J  # round 0: every c_ij = 1/n
            blocks = [(i0, min(i0 + chunk, I)) for i0 in range(0, I, chunk)]

            u_hat = []  # Eq. 2, once, as blocks (B, J, i, D): heap-sized, reused by malloc without page faults
            s_sum = u.new_zeros(B, J * D)
            for i0, i1 in blocks:
                blk = torch.bmm(u_t[i0:i1], W_i[i0:i1])  # (i, B, J*D)
                s_sum += blk.sum(0)
                u_hat.append(blk.view(i1 - i0, B, J, D).permute(1, 2, 0, 3).contiguous())
            s = s_sum.view(B, J, D) / n
            if bias is not None:
                s = s + bias
            v = squash(s)
            ss, vs, cs = [s], [v], [None]
            b = u.new_empty(B, J, I) if iterations > 1 else None
            c = u.new_full((B, J, I), 1.0 / n)
            for r in range(1, iterations):
                c = u.new_empty(B, J, I)
                s_sum = u.new_zeros(B, J, D)
                v_row = v.reshape(BJ, 1, D)
                for (i0, i1), U in zip(blocks, u_hat):
                    U = U.view(BJ, i1 - i0, D)
                    # row vector times matrix: several times faster on CPU than U @ column
                    a = torch.bmm(v_row, U.transpose(1, 2)).view(B, J, i1 - i0)  # agreement of round r-1
                    b_blk = a if r == 1 else b[:, :, i0:i1] + a
                    b[:, :, i0:i1] = b_blk
                    c_blk = _coupling_chunk(b_blk, leaky)
                    c[:, :, i0:i1] = c_blk
                    s_sum += torch.bmm(c_blk.reshape(BJ, 1, i1 - i0), U).view(B, J, D)
                s = s_sum if bias is None else s_sum + bias
                v = squash(s)
                ss.append(s)
                vs.append(v)
                cs.append(c)
        ctx.iterations, ctx.leaky, ctx.detach, ctx.chunk, ctx.n = iterations, leaky, detach, chunk, n
        ctx.device_type = u.device.type
        ctx.has_bias = bias is not None
        ctx.save_for_backward(u, weight, *ss, *vs, *cs[1:], *u_hat)
        if iterations == 1:
            ctx.mark_non_differentiable(c)  # uniform: depends on nothing
        return v, c

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_v, grad_c):  # noqa: D102
        with torch.autocast(ctx.device_type, enabled=False):  # a backward called under autocast must not recast
            R = ctx.iterations
            saved = ctx.saved_tensors
            u, weight = saved[:2]
            ss, vs = saved[2:2 + R], saved[2 + R:2 + 2 * R]
            cs = [None, *saved[2 + 2 * R:1 + 3 * R]]
            u_hat = saved[1 + 3 * R:]
            B, I, Din = u.shape
            _, _, J, D = weight.shape
            BJ = B * J
            blocks = [(i0, min(i0 + ctx.chunk, I)) for i0 in range(0, I, ctx.chunk)]
            need_u, need_w, need_bias = ctx.needs_input_grad[:3]
            if grad_v is None:
                grad_v = vs[-1].new_zeros(vs[-1].shape)
            if R == 1:
                grad_c = None
            # Terms of g u_hat = sum_t alpha_t (B, J, I) outer g_t (B, J, D); c^0 = 1/n is kept apart.
            alphas, gs_terms = [], []
            gs0 = None
            grad_bias = None
            G_next = None  # G_(r+1)
            gv = grad_v
            through_rounds = not ctx.detach or (need_bias and ctx.has_bias)
            for r in range(R - 1, -1, -1):
                gs = _squash_vjp(ss[r], gv)
                grad_bias = gs.sum(0) if grad_bias is None else grad_bias + gs.sum(0)
                keep = r == R - 1 or not ctx.detach
                if keep:
                    if r == 0:
                        gs0 = gs
                    else:
                        alphas.append(cs[r])
                        gs_terms.append(gs)
                if r == 0 or not through_rounds:
                    break
                G = u.new_empty(B, J, I)
                gv = u.new_zeros(B, J, D)
                gs_row = gs.reshape(BJ, 1, D)
                for (i0, i1), U in zip(blocks, u_hat):
                    U = U.view(BJ, i1 - i0, D)
                    gc = torch.bmm(gs_row, U.transpose(1, 2)).view(B, J, i1 - i0)
                    if grad_c is not None and r == R - 1:
                        gc = gc + grad_c[:, :, i0:i1]
                    c_blk = cs[r][:, :, i0:i1]
                    g_blk = c_blk * (gc - (c_blk * gc).sum(dim=1, keepdim=True))
                    if G_next is not None:
                        g_blk = g_blk + G_next[:, :, i0:i1]
                    G[:, :, i0:i1] = g_blk
                    gv += torch.bmm(g_blk.reshape(BJ, 1, i1 - i0), U).view(B, J, D)
                if not ctx.detach:  # the agreement of round r-1 used the votes
                    alphas.append(G)
                    gs_terms.append(vs[r - 1])
                G_next = G

            grad_u = grad_w = None
            if need_u or need_w:
                u_t = u.transpose(0, 1)  # (I, B, Din)
                W_i = weight.reshape(Din, I, J * D).transpose(0, 1)  # (I, Din, J*D)
                g_mat = torch.stack(gs_terms, dim=2).reshape(BJ, len(gs_terms), D) if gs_terms else None
                gs0_row = gs0.reshape(B, J, 1, D) / ctx.n if gs0 is not None else None
                grad_u_t = u.new_empty(I, B, Din) if need_u else None
                grad_w_i = weight.new_empty(I, Din, J * D) if need_w else None
                for i0, i1 in blocks:
                    k = i1 - i0
                    if g_mat is not None:
                        a_blk = torch.stack([a[:, :, i0:i1] for a in alphas], dim=-1).reshape(BJ, k, len(alphas))
                        g_hat = torch.bmm(a_blk, g_mat).view(B, J, k, D)
                        if gs0_row is not None:
                            g_hat += gs0_row
                    else:
                        g_hat = gs0_row.expand(B, J, k, D)
                    g_hat = g_hat.permute(2, 0, 1, 3).reshape(k, B, J * D)  # (i, B, J*D)
                    if need_u:
                        torch.bmm(g_hat, W_i[i0:i1].transpose(1, 2), out=grad_u_t[i0:i1])
                    if need_w:
                        torch.bmm(u_t[i0:i1].transpose(1, 2), g_hat, out=grad_w_i[i0:i1])
                if need_u:
                    grad_u = grad_u_t.transpose(0, 1)
                if need_w:
                    grad_w = grad_w_i.transpose(0, 1).reshape(Din, I, J, D)
            if not (need_bias and ctx.has_bias):
                grad_bias = None
            return grad_u, grad_w, grad_bias, None, None, None, None
