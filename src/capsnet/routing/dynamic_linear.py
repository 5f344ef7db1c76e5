"""Dynamic routing on linear votes, with its backward written by hand: the fast path of ``DynamicRouting``.

When the votes are linear in the lower capsules, ``u_hat_j|i = W_ij u_i``
(Sabour et al. 2017, Eq. 2), Procedure 1 can run from ``u`` and ``W`` as one
autograd node. Autograd through the rounds would allocate a fresh
vote-sized tensor for every product and every gradient term; here the votes
are built once, in cache-sized blocks of lower capsules, and no vote-sized
gradient is ever allocated. ``DynamicRouting.route_linear`` calls
``route_linear``; tests check it against the plain path in values and
gradients. benchmarks/README.md ("How capsnet's routing is fast", "Block
size of the routing") has the measurements behind the choices here.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, NamedTuple

import torch

from .._eager import autocast_off
from .._numbers import is_count
from ._fused import first_order
from ..ops import _squash_vjp, squash

__all__ = ["coupling_softmax", "route_linear", "default_chunk", "MIN_CHUNK", "plain_routing", "plain_routing_active"]

MIN_CHUNK = 64  # lower capsules per block on CPU, at least (benchmarks/README.md, "Block size of the routing")
BLOCK_BYTES = 4 << 20  # about this many bytes of votes per block on CPU: a block stays in cache


_plain_depth = 0  # open plain_routing() blocks: a module global, which torch.compile guards on without a graph break


@contextlib.contextmanager
def plain_routing() -> Iterator[None]:
    """Within this block layers skip ``route_linear`` and route votes with plain tensor operations.

    The fast path is one ``torch.autograd.Function`` with a hand-written
    backward, made for training; a graph exported for inference (ONNX,
    ``torch.export``) must hold plain operations instead, whose values are
    the same up to float rounding. ``torch.export`` tracing (which the ONNX
    exporter runs) turns the fast path off by itself (``plain_routing_active``);
    this block is for other tracers and for tests.
    """
    global _plain_depth
    _plain_depth += 1
    try:
        yield
    finally:
        _plain_depth -= 1


def plain_routing_active() -> bool:
    """True inside ``plain_routing()`` and while ``torch.export`` traces: layers must not call ``route_linear``."""
    if _plain_depth:
        return True
    is_exporting = getattr(getattr(torch, "compiler", None), "is_exporting", None)  # torch 2.1 has none
    return bool(is_exporting and is_exporting())


def coupling_softmax(b: torch.Tensor, dim: int, leaky: bool = False) -> torch.Tensor:
    """Procedure 1, line 4: ``c_i = softmax_j(b_i)``, the upper capsules j along ``dim``.

    ``leaky`` adds the authors' zero "orphan" logit to every softmax and drops
    its share (``_leaky_routing`` in their code), so the coefficients of a
    lower capsule sum to less than one: softmax over [0, b_1 .. b_J] without
    building the concatenation.
    """
    if not leaky:
        return torch.softmax(b, dim=dim)
    m = b.amax(dim=dim, keepdim=True).clamp_min(0)  # the orphan's logit 0 takes part in the maximum
    e = torch.exp(b - m)
    return e / (e.sum(dim=dim, keepdim=True) + torch.exp(-m))


def default_chunk(u: torch.Tensor, J: int, D: int) -> int:
    """Lower capsules per block: about ``BLOCK_BYTES`` of votes on CPU, never fewer than ``MIN_CHUNK``; all on GPUs.

    Shapes: u (B, I, Din) lower capsules; J upper capsules of D dimensions.
    """
    if u.device.type != "cpu":
        return u.shape[1]  # one block: GPUs want few, large kernels
    per_capsule = u.shape[0] * J * D * u.element_size()  # bytes of one lower capsule's votes
    return max(1, min(u.shape[1], max(MIN_CHUNK, BLOCK_BYTES // max(per_capsule, 1))))


def route_linear(u: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, *, iterations: int,
                 leaky: bool = False, detach_agreement: bool = False, chunk: int | None = None,
                 record: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Procedure 1 on the votes ``W_ij u_i``: the last round's poses and coupling, and every round's when recording.

    Inputs of different dtypes (bf16 capsules from autocast, fp32 weights)
    are routed in the wider dtype, with autocast off; float16 ones (a
    ``.half()`` model) in float32, and returned in float16.

    Shapes:
        u: (B, I, Din) lower capsules
        weight: (Din, I, J, Dout), the layout DenseCaps stores
        bias: (J, Dout) or None
        returns: v (B, J, Dout), coupling (B, I, J), rounds (B, R, I, J) when ``record``, else None
    """
    if u.dim() != 3:
        raise ValueError(f"u must be lower capsules (B, I, Din), got shape {tuple(u.shape)}")
    if weight.dim() != 4:
        raise ValueError(f"weight must be (Din, I, J, Dout), got shape {tuple(weight.shape)}")
    B, I, Din = u.shape
    Din_w, I_w, J, D = weight.shape
    if (Din_w, I_w) != (Din, I):
        raise ValueError(f"weight (Din, I, J, Dout) = {tuple(weight.shape)} does not fit capsules "
                         f"(B, I, Din) = {tuple(u.shape)}")
    if bias is not None and tuple(bias.shape) != (J, D):
        raise ValueError(f"bias must be (J, D) = ({J}, {D}), got shape {tuple(bias.shape)}")
    if J == 0:  # the uniform first round's 1/J divided by zero
        raise ValueError(f"weight (Din, I, J, Dout) = {tuple(weight.shape)} has no upper capsules (J = 0): route to "
                         f"at least one")
    if chunk is not None and not is_count(chunk):
        # -1 made no blocks: poses off by 0.8 and a coupling of uninitialised memory, 0 met range()'s own error
        raise ValueError(f"chunk must be a positive integer (lower capsules per block) or None (by size), got "
                         f"{chunk!r}")
    dtype = torch.promote_types(u.dtype, weight.dtype)  # autocast may hand bf16 capsules to fp32 weights
    given = dtype
    if dtype == torch.float16:  # routed in float32 (float16's sums overflow; result.float16_in_float32), returned
        dtype = torch.float32
    u, weight = u.to(dtype), weight.to(dtype)
    bias = bias.to(dtype) if bias is not None else None
    chunk = chunk if chunk is not None else default_chunk(u, J, D)
    v, c, rounds = _RouteLinear.apply(u, weight, bias, iterations, leaky, detach_agreement, chunk, record)
    # c: (B, J, I); rounds: (B, R, J, I) or empty
    v, c, rounds = v.to(given), c.to(given), rounds.to(given)
    return v, c.transpose(1, 2), rounds.transpose(2, 3) if record else None


class _Saved(NamedTuple):
    """What the forward keeps for the backward, by name."""

    u: torch.Tensor  # (B, I, Din)
    weight: torch.Tensor  # (Din, I, J, D)
    s: list[torch.Tensor]  # s^r, r = 0..R-1, each (B, J, D), before the squash
    v: list[torch.Tensor]  # v^r = squash(s^r), each (B, J, D)
    c: list[torch.Tensor | None]  # c^r, each (B, J, I); c[0] is None: round 0 is uniform, 1/n
    u_hat: list[torch.Tensor]  # the votes, one (B, J, i, D) tensor per block of i lower capsules


def _save(ctx, saved: _Saved) -> None:
    """``ctx.save_for_backward`` takes a flat list: remember how long each named list was."""
    ctx.lengths = (len(saved.s), len(saved.v), len(saved.c) - 1, len(saved.u_hat))
    ctx.save_for_backward(saved.u, saved.weight, *saved.s, *saved.v, *saved.c[1:], *saved.u_hat)


def _load(ctx) -> _Saved:
    flat = list(ctx.saved_tensors)
    u, weight = flat[:2]
    lists, at = [], 2
    for n in ctx.lengths:
        lists.append(flat[at:at + n])
        at += n
    s, v, c, u_hat = lists
    return _Saved(u, weight, s, v, [None, *c], u_hat)


class _RouteLinear(torch.autograd.Function):
    """Procedure 1 on linear votes, with the backward written out by hand.

    Votes are laid out (B, J, i, D) per block of i lower capsules, so every
    contraction is a batched matrix-vector product over (b, j), and each pass
    walks the blocks while they stay in cache. Routing is local in i given the
    previous round's poses, so one pass per round does the agreement, the new
    coupling and the next ``s``. The backward never builds the vote gradient:
    it is a sum of outer products ``sum_t alpha_t[b,j,i] g_t[b,j,:]`` (one per
    use of the votes), formed block by block and contracted straight into the
    gradients of u and W.

    Forward, rounds r = 0..R-1 (b^0 = 0, so c^0 = 1/n, n = J or J + 1 when leaky):
        c^r = softmax_j(b^r); s^r = sum_i c^r_ij u_hat_ij + bias; v^r = squash(s^r)
        b^(r+1) = b^r + a^r, a^r_ij = u_hat_ij . v^r_j
    Backward, with G_r = dL/db^r and G_R = 0:
        gs^r = squash'(s^r) gv^r;   gc^r_ij = u_hat_ij . gs^r_j (+ grads of the returned c and recorded c^r)
        G_r = c^r (gc^r - sum_j c^r gc^r) + G_(r+1);   gv^(r-1) = sum_i G_r,i u_hat_i
        g u_hat_ij = sum_r c^r_ij gs^r_j + sum_(r<R-1) G_(r+1),ij v^r_j
    ``detach_agreement`` keeps only the last round's term in g u_hat (the
    earlier rounds see detached votes); the bias still gets every round.
    """

    @staticmethod
    def forward(ctx, u, weight, bias, iterations, leaky, detach, chunk, record):  # noqa: D102
        with autocast_off(u.device.type):
            B, I, Din = u.shape
            _, _, J, D = weight.shape
            BJ = B * J
            u_t = u.transpose(0, 1)  # (I, B, Din), a view
            W_i = weight.reshape(Din, I, J * D).transpose(0, 1)  # (I, Din, J*D), a view
            n = J + 1 if leaky else J  # round 0: every c_ij = 1/n
            blocks = [(i0, min(i0 + chunk, I)) for i0 in range(0, I, chunk)]

            u_hat = []  # Eq. 2, once, as blocks: heap-sized, reused by malloc without page faults
            s_sum = u.new_zeros(B, J * D)
            for i0, i1 in blocks:
                blk = torch.bmm(u_t[i0:i1], W_i[i0:i1])  # (i, B, J*D)
                s_sum += blk.sum(0)
                u_hat.append(blk.view(i1 - i0, B, J, D).permute(1, 2, 0, 3).contiguous())  # (B, J, i, D)
            s = s_sum.view(B, J, D) / n  # (B, J, D)
            if bias is not None:
                s = s + bias
            v = squash(s)
            ss, vs, cs = [s], [v], [None]
            b = u.new_empty(B, J, I) if iterations > 1 else None  # routing logits, (B, J, I)
            c = u.new_full((B, J, I), 1.0 / n)
            for r in range(1, iterations):
                c = u.new_empty(B, J, I)
                s_sum = u.new_zeros(B, J, D)
                v_row = v.reshape(BJ, 1, D)
                for (i0, i1), U in zip(blocks, u_hat):
                    U = U.view(BJ, i1 - i0, D)
                    # row vector times matrix: several times faster on CPU than U @ column
                    a = torch.bmm(v_row, U.transpose(1, 2)).view(B, J, i1 - i0)  # agreement of round r-1
                    b_blk = a if r == 1 else b[:, :, i0:i1] + a  # (B, J, i)
                    b[:, :, i0:i1] = b_blk
                    c_blk = coupling_softmax(b_blk, dim=1, leaky=leaky)  # (B, J, i)
                    c[:, :, i0:i1] = c_blk
                    s_sum += torch.bmm(c_blk.reshape(BJ, 1, i1 - i0), U).view(B, J, D)
                s = s_sum if bias is None else s_sum + bias
                v = squash(s)
                ss.append(s)
                vs.append(v)
                cs.append(c)
            if record:  # every round's coupling, the uniform round 0 included: (B, R, J, I)
                rounds = torch.stack([u.new_full((B, J, I), 1.0 / n), *cs[1:]], dim=1)
            else:
                rounds = u.new_empty(0)
        ctx.iterations, ctx.leaky, ctx.detach, ctx.chunk, ctx.n = iterations, leaky, detach, chunk, n
        ctx.device_type = u.device.type
        ctx.has_bias = bias is not None
        _save(ctx, _Saved(u, weight, ss, vs, cs, u_hat))
        # every round's coupling but the uniform first is differentiable, as the plain path's stack of them is (its
        # gradient was dropped: a loss on the rounds met "does not require grad", a mixed one lost that term)
        fixed = [c] if iterations == 1 else []  # uniform: depends on nothing
        if not record or iterations == 1:
            fixed.append(rounds)
        ctx.mark_non_differentiable(*fixed)  # one call: a second one replaced the first
        return v, c, rounds

    @staticmethod
    @first_order("dynamic routing")
    def backward(ctx, grad_v, grad_c, grad_rounds):  # noqa: D102
        with autocast_off(ctx.device_type):  # a backward called under autocast must not recast
            R = ctx.iterations
            saved = _load(ctx)
            u, weight, cs = saved.u, saved.weight, saved.c
            B, I, Din = u.shape
            _, _, J, D = weight.shape
            BJ = B * J
            blocks = [(i0, min(i0 + ctx.chunk, I)) for i0 in range(0, I, ctx.chunk)]
            need_u, need_w, need_bias = ctx.needs_input_grad[:3]
            if grad_v is None:
                grad_v = saved.v[-1].new_zeros(saved.v[-1].shape)  # (B, J, D)
            if R == 1:
                grad_c = None
            # Terms of g u_hat = sum_t alpha_t (B, J, I) outer g_t (B, J, D); c^0 = 1/n is kept apart.
            alphas, gs_terms = [], []
            gs0 = None  # (B, J, D): the gradient of s^0, whose coupling is the constant 1/n
            grad_bias = None
            G_next = None  # G_(r+1), (B, J, I)
            gv = grad_v  # (B, J, D)
            through_rounds = not ctx.detach or (need_bias and ctx.has_bias)
            for r in range(R - 1, -1, -1):
                gs = _squash_vjp(saved.s[r], gv)  # (B, J, D)
                grad_bias = gs.sum(0) if grad_bias is None else grad_bias + gs.sum(0)  # (J, D)
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
                for (i0, i1), U in zip(blocks, saved.u_hat):
                    U = U.view(BJ, i1 - i0, D)
                    gc = torch.bmm(gs_row, U.transpose(1, 2)).view(B, J, i1 - i0)  # (B, J, i)
                    if grad_c is not None and r == R - 1:
                        gc = gc + grad_c[:, :, i0:i1]
                    if grad_rounds is not None and grad_rounds.numel():  # the recorded c^r, (B, R, J, I)
                        gc = gc + grad_rounds[:, r, :, i0:i1]
                    c_blk = cs[r][:, :, i0:i1]  # (B, J, i)
                    g_blk = c_blk * (gc - (c_blk * gc).sum(dim=1, keepdim=True))  # softmax's backward over j
                    if G_next is not None:
                        g_blk = g_blk + G_next[:, :, i0:i1]
                    G[:, :, i0:i1] = g_blk
                    gv += torch.bmm(g_blk.reshape(BJ, 1, i1 - i0), U).view(B, J, D)
                if not ctx.detach:  # the agreement of round r-1 used the votes
                    alphas.append(G)
                    gs_terms.append(saved.v[r - 1])
                G_next = G

            grad_u = grad_w = None
            if need_u or need_w:
                u_t = u.transpose(0, 1)  # (I, B, Din)
                W_i = weight.reshape(Din, I, J * D).transpose(0, 1)  # (I, Din, J*D)
                T = len(gs_terms)
                g_mat = torch.stack(gs_terms, dim=2).reshape(BJ, T, D) if gs_terms else None  # (B*J, T, D)
                gs0_row = gs0.reshape(B, J, 1, D) / ctx.n if gs0 is not None else None  # (B, J, 1, D)
                grad_u_t = u.new_empty(I, B, Din) if need_u else None
                grad_w_i = weight.new_empty(I, Din, J * D) if need_w else None
                for i0, i1 in blocks:
                    k = i1 - i0
                    if g_mat is not None:
                        a_blk = torch.stack([a[:, :, i0:i1] for a in alphas], dim=-1).reshape(BJ, k, T)  # (B*J, i, T)
                        g_hat = torch.bmm(a_blk, g_mat).view(B, J, k, D)  # the votes' gradient, (B, J, i, D)
                        if gs0_row is not None:
                            g_hat += gs0_row
                    else:
                        g_hat = gs0_row.expand(B, J, k, D)
                    g_hat = g_hat.permute(2, 0, 1, 3).reshape(k, B, J * D)  # (i, B, J*D)
                    if need_u:
                        torch.bmm(g_hat, W_i[i0:i1].transpose(1, 2), out=grad_u_t[i0:i1])  # (i, B, Din)
                    if need_w:
                        torch.bmm(u_t[i0:i1].transpose(1, 2), g_hat, out=grad_w_i[i0:i1])  # (i, Din, J*D)
                if need_u:
                    grad_u = grad_u_t.transpose(0, 1)  # (B, I, Din)
                if need_w:
                    grad_w = grad_w_i.transpose(0, 1).reshape(Din, I, J, D)  # (Din, I, J, D)
            if not (need_bias and ctx.has_bias):
                grad_bias = None
            return grad_u, grad_w, grad_bias, None, None, None, None, None
