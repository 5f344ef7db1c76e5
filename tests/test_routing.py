"""DynamicRouting against a plain-loop Procedure 1 (Sabour et al. 2017)."""
from __future__ import annotations

import itertools

import pytest
import torch

from capsnet.routing import DynamicRouting, RoutingResult

DT = torch.float64


def reference_routing(votes, bias=None, *, iterations, leaky=False, detach_agreement=False, squash="sabour"):
    """Procedure 1 written out with loops over b, i and j (vectors only along D).

    ``squash="exp"``: line 6 with Efficient-CapsNet's squash, (1 - e^-|s|) s/|s|, in place of Eq. 1.

    Differentiable, so its autograd gradient is the reference gradient too.
    With ``detach_agreement`` every round but the last sees detached votes.
    Returns poses (B, J, D), lengths (B, J), coupling of the last round (B, I, J).
    """
    B, I, J, D = votes.shape
    poses, lengths, couplings = [], [], []
    for b_ in range(B):
        logits = [[torch.zeros((), dtype=votes.dtype) for _ in range(J)] for _ in range(I)]  # line 2: b_ij <- 0
        for r in range(iterations):
            last = r == iterations - 1
            u_hat = votes[b_] if (last or not detach_agreement) else votes[b_].detach()
            # line 4: c_i = softmax_j(b_i); leaky: a zero logit joins, its share dropped
            c = []
            for i in range(I):
                exps = [torch.exp(logits[i][j]) for j in range(J)]
                total = sum(exps) + (1.0 if leaky else 0.0)
                c.append([exps[j] / total for j in range(J)])
            v = []
            for j in range(J):
                s_j = torch.zeros(D, dtype=votes.dtype)
                for i in range(I):
                    s_j = s_j + c[i][j] * u_hat[i, j]  # line 5
                if bias is not None:
                    s_j = s_j + bias[j]
                n2 = (s_j * s_j).sum()
                n = torch.sqrt(n2)
                scale = n2 / (1 + n2) if squash == "sabour" else 1 - torch.exp(-n)
                v.append(scale * s_j / n)  # line 6 (Eq. 1, or the exp squash) without any epsilon
            if not last:
                for i in range(I):
                    for j in range(J):
                        logits[i][j] = logits[i][j] + (u_hat[i, j] * v[j]).sum()  # line 7
        poses.append(torch.stack(v))
        lengths.append(torch.stack([torch.sqrt((vj * vj).sum()) for vj in v]))
        couplings.append(torch.stack([torch.stack(ci) for ci in c]))
    return torch.stack(poses), torch.stack(lengths), torch.stack(couplings)


def _votes(B=3, I=5, J=4, D=6, seed=0, scale=0.5):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, I, J, D, generator=g, dtype=DT) * scale


def _bias(J=4, D=6, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(J, D, generator=g, dtype=DT) * 0.2


def _close(a, b, **kw):
    torch.testing.assert_close(a, b, rtol=kw.get("rtol", 1e-6), atol=kw.get("atol", 1e-8))


@pytest.mark.parametrize("iterations", [1, 2, 3, 5])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("leaky", [False, True])
@pytest.mark.parametrize("I", [5, 40])  # 40: more children than the broadcast path's 32, the batched-product path
def test_forward_matches_plain_loop_procedure_1(iterations, with_bias, leaky, I):
    """Both of forward's paths against the plain loop (the many-children path was pinned only by a compile test in
    another file: mutation testing, 2026-12-01)."""
    votes = _votes(I=I)
    bias = _bias() if with_bias else None
    out = DynamicRouting(iterations, leaky=leaky)(votes, bias=bias)
    assert isinstance(out, RoutingResult)
    poses, lengths, coupling = reference_routing(votes, bias, iterations=iterations, leaky=leaky)
    assert out.poses.shape == (3, 4, 6) and out.activations.shape == (3, 4) and out.coupling.shape == (3, I, 4)
    _close(out.poses, poses)
    _close(out.activations, lengths)
    _close(out.coupling, coupling)


@pytest.mark.parametrize("iterations", [1, 3])
@pytest.mark.parametrize("with_bias", [False, True])
def test_exp_squash_matches_plain_loop_values_and_gradients(iterations, with_bias):
    votes = _votes(scale=2.0).requires_grad_()
    bias = _bias() if with_bias else None
    routing = DynamicRouting(iterations, squash="exp")
    out = routing(votes, bias=bias)
    poses, lengths, coupling = reference_routing(votes, bias, iterations=iterations, squash="exp")
    _close(out.poses, poses)
    _close(out.activations, lengths)
    _close(out.coupling, coupling)
    # the lengths are 1 - e^-|s|, not Eq. 1's |s|^2 / (1 + |s|^2): the two squashes differ on these votes
    assert (out.poses - reference_routing(votes, bias, iterations=iterations)[0]).abs().max() > 1e-2
    g = torch.randn_like(out.poses)
    got = torch.autograd.grad(out.poses, votes, g)[0]
    want = torch.autograd.grad(poses, votes, g)[0]
    _close(got, want)
    assert "squash='exp'" in repr(routing) and "squash" not in repr(DynamicRouting(3))


def test_exp_squash_route_linear_equals_forward_and_is_finite_at_zero():
    g = torch.Generator().manual_seed(4)
    u = torch.randn(2, 7, 3, generator=g, dtype=DT)
    w = torch.randn(3, 7, 4, 5, generator=g, dtype=DT)
    routing = DynamicRouting(3, squash="exp")
    _close(routing.route_linear(u, w).poses, routing(torch.einsum("bid,dijo->bijo", u, w)).poses)
    votes = torch.zeros(2, 5, 4, 6, requires_grad=True)
    out = routing(votes)
    out.poses.sum().backward()
    assert torch.isfinite(out.poses).all() and torch.isfinite(votes.grad).all()
    with pytest.raises(ValueError, match="squash must be one of 'sabour', 'exp', got 'tanh'"):
        DynamicRouting(3, squash="tanh")


def test_routing_changes_coupling_after_the_first_round():
    # Guards the comparison above against a reference and module that both never update b.
    votes = _votes()
    c1 = DynamicRouting(1)(votes).coupling
    c3 = DynamicRouting(3)(votes).coupling
    _close(c1, torch.full_like(c1, 1 / 4))
    assert (c3 - c1).abs().max() > 1e-3


@pytest.mark.parametrize("iterations", [1, 3])
def test_coupling_sums_to_one_over_j_and_less_when_leaky(iterations):
    votes = _votes(B=4, I=7, J=3, D=5, seed=2, scale=2.0)
    c = DynamicRouting(iterations)(votes).coupling
    _close(c.sum(-1), torch.ones(4, 7, dtype=DT))
    c_leaky = DynamicRouting(iterations, leaky=True)(votes).coupling
    assert (c_leaky > 0).all()
    assert (c_leaky.sum(-1) < 1 - 1e-6).all()
    if iterations == 1:  # b = 0: the leak takes exactly one share of J + 1
        _close(c_leaky, torch.full_like(c_leaky, 1 / 4))


@pytest.mark.parametrize("leaky", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_logits_are_per_example(leaky, with_bias):
    votes = _votes(B=8, seed=3, scale=1.0)
    bias = _bias() if with_bias else None
    routing = DynamicRouting(3, leaky=leaky)
    full = routing(votes, bias=bias)
    for k in range(8):  # a batch of one equals that example in the batch of 8
        alone = routing(votes[k:k + 1], bias=bias)
        for a, b in zip(alone, full):
            _close(a[0], b[k], rtol=1e-10, atol=1e-12)
    perm = torch.tensor([5, 2, 2, 7, 0, 0, 0, 3])  # permuted and duplicated
    shuffled = routing(votes[perm], bias=bias)
    for a, b in zip(shuffled, full):
        _close(a, b[perm], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("iterations", [1, 2, 3, 5])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("leaky", [False, True])
@pytest.mark.parametrize("detach", [False, True])
def test_gradients_match_the_reference(iterations, with_bias, leaky, detach):
    votes = _votes(B=2, I=4, J=3, D=5, seed=4).requires_grad_(True)
    bias = _bias(J=3, D=5).requires_grad_(True) if with_bias else None
    g = torch.Generator().manual_seed(9)
    w_p, w_a, w_c = (torch.randn(2, 3, 5, generator=g, dtype=DT), torch.randn(2, 3, generator=g, dtype=DT),
                     torch.randn(2, 4, 3, generator=g, dtype=DT))

    def loss(p, a, c):
        return (p * w_p).sum() + (a * w_a).sum() + (c * w_c).sum()

    inputs = (votes,) if bias is None else (votes, bias)
    got = torch.autograd.grad(loss(*DynamicRouting(iterations, leaky=leaky, detach_agreement=detach)(votes, bias=bias)), inputs)
    ref = torch.autograd.grad(loss(*reference_routing(votes, bias, iterations=iterations, leaky=leaky,
                                                      detach_agreement=detach)), inputs)
    for a, b in zip(got, ref):
        # The epsilon inside squash's and safe_norm's square roots moves these
        # O(1) gradients by up to ~3e-7; a routing mistake moves them by ~1e-2.
        _close(a, b, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("iterations", [2, 3])
def test_gradients_flow_through_every_round_by_default(iterations):
    # The full gradient differs from the one with the earlier rounds detached,
    # so the test above really tells the two apart.
    votes = _votes(B=2, I=4, J=3, D=5, seed=5).requires_grad_(True)
    full = torch.autograd.grad(DynamicRouting(iterations)(votes).poses.pow(3).sum(), votes)[0]
    cut = torch.autograd.grad(DynamicRouting(iterations, detach_agreement=True)(votes).poses.pow(3).sum(), votes)[0]
    assert (full - cut).abs().max() > 1e-4
    # and the forward values are the same either way
    _close(DynamicRouting(iterations)(votes).poses, DynamicRouting(iterations, detach_agreement=True)(votes).poses)


def _einsum_votes(u, weight):
    return torch.einsum("bid,dijo->bijo", u, weight)  # (B, I, J, Dout)


OPTIONS = list(itertools.product([1, 2, 3], [False, True], [False, True], [False, True], [None, 4]))


@pytest.mark.parametrize("iterations,leaky,detach,with_bias,chunk", OPTIONS)
def test_route_linear_equals_forward_on_votes(iterations, leaky, detach, with_bias, chunk):
    B, I, Din, J, Dout = 3, 6, 4, 5, 7
    g = torch.Generator().manual_seed(6)
    u = torch.randn(B, I, Din, generator=g, dtype=DT).requires_grad_(True)
    weight = (torch.randn(Din, I, J, Dout, generator=g, dtype=DT) * 0.5).requires_grad_(True)
    bias = (torch.randn(J, Dout, generator=g, dtype=DT) * 0.2).requires_grad_(True) if with_bias else None
    w_p, w_a, w_c = (torch.randn(B, J, Dout, generator=g, dtype=DT), torch.randn(B, J, generator=g, dtype=DT),
                     torch.randn(B, I, J, generator=g, dtype=DT))
    w_r = torch.randn(B, iterations, I, J, generator=g, dtype=DT)
    routing = DynamicRouting(iterations, leaky=leaky, detach_agreement=detach)
    routing.chunk = chunk  # 4: blocks of 4 and 2 lower capsules
    inputs = (u, weight) if bias is None else (u, weight, bias)

    # every round's coupling recorded and in the loss: the fast path's carried no gradient (a review, 2026-12-02)
    lin = routing.route_linear(u, weight, bias, record=True)
    plain = routing(_einsum_votes(u, weight), bias=bias, record=True)
    for a, b in zip(lin, plain):
        assert a.shape == b.shape
        _close(a, b, rtol=1e-10, atol=1e-12)
    grads = [torch.autograd.grad((r.poses * w_p).sum() + (r.activations * w_a).sum() + (r.coupling * w_c).sum()
                                 + (r.rounds * w_r).sum(), inputs) for r in (lin, plain)]
    for a, b in zip(*grads):
        _close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("wrt", ["u", "weight", "bias"])
@pytest.mark.parametrize("detach", [False, True])
def test_route_linear_gradient_of_one_input_alone(wrt, detach):
    B, I, Din, J, Dout = 2, 9, 3, 4, 5
    g = torch.Generator().manual_seed(11)
    tensors = {"u": torch.randn(B, I, Din, generator=g, dtype=DT), "weight": torch.randn(Din, I, J, Dout, generator=g, dtype=DT),
               "bias": torch.randn(J, Dout, generator=g, dtype=DT) * 0.2}
    tensors[wrt].requires_grad_(True)
    routing = DynamicRouting(3, detach_agreement=detach)
    routing.chunk = 2
    lin = routing.route_linear(tensors["u"], tensors["weight"], tensors["bias"])
    plain = routing(_einsum_votes(tensors["u"], tensors["weight"]), bias=tensors["bias"])
    (g_lin,) = torch.autograd.grad(lin.poses.pow(3).sum() + lin.coupling.pow(2).sum(), tensors[wrt])
    (g_plain,) = torch.autograd.grad(plain.poses.pow(3).sum() + plain.coupling.pow(2).sum(), tensors[wrt])
    assert g_lin.abs().sum() > 0
    _close(g_lin, g_plain, rtol=1e-10, atol=1e-12)


def test_route_linear_under_bfloat16_autocast_routes_in_float32():
    g = torch.Generator().manual_seed(12)
    u = torch.randn(3, 10, 4, generator=g)
    weight = (torch.randn(4, 10, 5, 6, generator=g) * 0.5).requires_grad_(True)
    routing = DynamicRouting(3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = routing.route_linear(u.to(torch.bfloat16), weight)
    assert out.poses.dtype == torch.float32
    ref = routing.route_linear(u.to(torch.bfloat16).float(), weight)
    _close(out.poses, ref.poses, rtol=1e-5, atol=1e-6)
    out.poses.sum().backward()
    assert weight.grad.dtype == torch.float32 and torch.isfinite(weight.grad).all()
    grad = weight.grad.clone()
    weight.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16):  # backward called inside the autocast block, as loops often do
        routing.route_linear(u.to(torch.bfloat16), weight).poses.sum().backward()
    _close(weight.grad, grad, rtol=1e-5, atol=1e-6)


def test_route_linear_matches_plain_loop_reference():
    B, I, Din, J, Dout = 2, 5, 3, 4, 6
    g = torch.Generator().manual_seed(7)
    u = torch.randn(B, I, Din, generator=g, dtype=DT)
    weight = torch.randn(Din, I, J, Dout, generator=g, dtype=DT) * 0.5
    bias = torch.randn(J, Dout, generator=g, dtype=DT) * 0.2
    votes = torch.zeros(B, I, J, Dout, dtype=DT)
    for b_, i, j in itertools.product(range(B), range(I), range(J)):
        votes[b_, i, j] = weight[:, i, j, :].T @ u[b_, i]  # Eq. 2: u_hat_j|i = W_ij u_i
    out = DynamicRouting(3, leaky=True).route_linear(u, weight, bias)
    for a, b in zip(out, reference_routing(votes, bias, iterations=3, leaky=True)):
        _close(a, b)


def test_float32_matches_float64():
    votes = _votes(B=4, I=32, J=10, D=16, seed=8, scale=0.1)
    out32 = DynamicRouting(3)(votes.float(), bias=_bias(10, 16).float())
    out64 = DynamicRouting(3)(votes, bias=_bias(10, 16))
    assert out32.poses.dtype == torch.float32
    for a, b in zip(out32, out64):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-6)


def test_zero_votes_give_finite_outputs_and_gradients():
    votes = torch.zeros(2, 3, 4, 5, requires_grad=True)
    out = DynamicRouting(3)(votes)
    assert all(torch.isfinite(t).all() for t in out)
    (g,) = torch.autograd.grad(out.activations.sum() + out.poses.sum(), votes)
    assert torch.isfinite(g).all()


def test_activations_are_ignored():
    votes = _votes()
    routing = DynamicRouting(3)
    a = routing(votes)
    b = routing(votes, torch.rand(3, 5, dtype=DT))
    for x, y in zip(a, b):
        assert torch.equal(x, y)


@pytest.mark.parametrize("iterations", [0, -1, 1.5, "3"])
def test_bad_iterations_rejected(iterations):
    with pytest.raises(ValueError, match="iterations"):
        DynamicRouting(iterations)


@pytest.mark.parametrize("shape", [(3, 5, 4), (5, 4, 6), (1, 3, 5, 4, 6)])
def test_forward_rejects_votes_of_wrong_rank(shape):
    with pytest.raises(ValueError, match=r"\(B, I, J, D\)") as info:
        DynamicRouting(3)(torch.zeros(shape))
    assert str(tuple(shape)) in str(info.value)


@pytest.mark.parametrize("bias_shape", [(6,), (4, 5), (3, 6), (1, 6), (4, 6, 1)])
def test_forward_rejects_bias_of_wrong_shape(bias_shape):
    with pytest.raises(ValueError, match=r"\(J, D\) = \(4, 6\)"):
        DynamicRouting(3)(torch.zeros(2, 5, 4, 6), bias=torch.zeros(bias_shape))


def test_route_linear_rejects_weight_that_does_not_fit():
    with pytest.raises(ValueError, match=r"\(Din, I, J, Dout\)"):
        DynamicRouting(3).route_linear(torch.zeros(2, 5, 3), torch.zeros(3, 6, 4, 7))
    with pytest.raises(ValueError, match=r"\(Din, I, J, Dout\)"):
        DynamicRouting(3).route_linear(torch.zeros(2, 5, 3), torch.zeros(4, 5, 4, 7))


@pytest.mark.parametrize("u_shape,w_shape", [((5, 3), (3, 5, 4, 7)), ((2, 5, 3), (3, 5, 28)), ((1, 2, 5, 3), (3, 5, 4, 7))])
def test_route_linear_rejects_wrong_rank_naming_the_expected_shape(u_shape, w_shape):
    # A bare tuple unpacking would say "not enough values to unpack" and name no shape.
    with pytest.raises(ValueError, match=r"\(B, I, Din\)|\(Din, I, J, Dout\)"):
        DynamicRouting(3).route_linear(torch.zeros(u_shape), torch.zeros(w_shape))


@pytest.mark.parametrize("bias_shape", [(7,), (1, 7), (4, 1), (3, 7)])
def test_route_linear_rejects_bias_of_wrong_shape(bias_shape):
    # Like forward: a (D,) or (1, D) bias must not broadcast silently.
    with pytest.raises(ValueError, match=r"\(J, D"):
        DynamicRouting(3).route_linear(torch.zeros(2, 5, 3), torch.zeros(3, 5, 4, 7), torch.zeros(bias_shape))


def test_no_parameters_and_repr():
    routing = DynamicRouting(5, leaky=True, detach_agreement=True)
    assert list(routing.parameters()) == []
    assert "iterations=5" in repr(routing) and "leaky=True" in repr(routing)


@pytest.mark.parametrize("B,expected", [(1, 1152), (8, 819), (32, 204)])
def test_default_block_size_on_cpu_is_about_4_mib_of_votes(B, expected):
    # (B, J, i, 16) fp32 votes: 4 MiB / (B * 10 * 16 * 4 bytes) lower capsules, at most I.
    from capsnet.routing.dynamic_linear import default_chunk

    assert default_chunk(torch.zeros(B, 1152, 8), 10, 16) == expected
    assert default_chunk(torch.zeros(B, 40, 8), 10, 16) == 40  # never more than there are


@pytest.mark.parametrize("B", [128, 512, 4096])
def test_default_block_size_on_cpu_never_falls_below_the_floor(B):
    # At large batches 4 MiB holds only a few capsules; thin blocks route slowly, so the floor holds.
    from capsnet.routing.dynamic_linear import BLOCK_BYTES, MIN_CHUNK, default_chunk

    assert BLOCK_BYTES // (B * 10 * 16 * 4) < MIN_CHUNK
    assert default_chunk(torch.zeros(B, 1152, 8), 10, 16) == MIN_CHUNK
    assert default_chunk(torch.zeros(B, MIN_CHUNK // 2, 8), 10, 16) == MIN_CHUNK // 2


def test_closed_form_squash_gradient_matches_autograd():
    from capsnet.ops import squash
    from capsnet.ops import _squash_vjp

    g = torch.Generator().manual_seed(5)
    s = torch.randn(6, 10, 16, generator=g, dtype=torch.float64) * torch.tensor([0.0, 1e-6, 0.1, 1.0, 3.0, 30.0],
                                                                                  dtype=torch.float64).view(6, 1, 1)
    grad_v = torch.randn(6, 10, 16, generator=g, dtype=torch.float64)
    leaf = s.clone().requires_grad_(True)
    (expected,) = torch.autograd.grad(squash(leaf), leaf, grad_v)
    torch.testing.assert_close(_squash_vjp(s, grad_v), expected, rtol=1e-10, atol=1e-12)
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2), (torch.float16, 2e-3)):
        got = _squash_vjp(s.to(dtype), grad_v.to(dtype))
        assert got.dtype == dtype and torch.isfinite(got).all(), dtype
        torch.testing.assert_close(got.double(), expected, rtol=tol, atol=tol, msg=str(dtype))


@pytest.mark.parametrize("leaky", [False, True])
@pytest.mark.parametrize("iterations", [1, 3])
def test_record_gives_every_rounds_coupling_from_one_call(iterations, leaky):
    # rounds[:, r] is the coupling round r + 1 used: round 1 uniform, the last one the returned coupling,
    # and each equals the coupling of a routing cut after that many rounds.
    votes = _votes(B=2, I=5, J=4, D=6, seed=13, scale=1.0)
    routing = DynamicRouting(iterations, leaky=leaky)
    out = routing(votes, record=True)
    assert out.rounds.shape == (2, iterations, 5, 4)
    _close(out.rounds[:, 0], torch.full((2, 5, 4), 1 / (5 if leaky else 4), dtype=DT))
    _close(out.rounds[:, -1], out.coupling)
    for r in range(iterations):
        _close(out.rounds[:, r], DynamicRouting(r + 1, leaky=leaky)(votes).coupling)
    plain = routing(votes)
    assert plain.rounds is None
    for a, b in zip(out, plain):  # recording changes nothing else; the result still unpacks into three
        _close(a, b, rtol=0, atol=0)
    assert len(out) == 3


@pytest.mark.parametrize("leaky", [False, True])
def test_route_linear_records_the_same_rounds_as_forward(leaky):
    B, I, Din, J, Dout = 2, 7, 3, 4, 5
    g = torch.Generator().manual_seed(14)
    u = torch.randn(B, I, Din, generator=g, dtype=DT)
    weight = torch.randn(Din, I, J, Dout, generator=g, dtype=DT)
    routing = DynamicRouting(3, leaky=leaky)
    routing.chunk = 3
    lin = routing.route_linear(u, weight, record=True)
    plain = routing(_einsum_votes(u, weight), record=True)
    assert lin.rounds.shape == (B, 3, I, J)
    _close(lin.rounds, plain.rounds, rtol=1e-10, atol=1e-12)
    assert routing.route_linear(u, weight).rounds is None


def test_recorded_route_linear_still_has_gradients():
    g = torch.Generator().manual_seed(15)
    u = torch.randn(2, 6, 3, generator=g, dtype=DT, requires_grad=True)
    weight = torch.randn(3, 6, 4, 5, generator=g, dtype=DT)
    routing = DynamicRouting(3)
    out = routing.route_linear(u, weight, record=True)
    (got,) = torch.autograd.grad(out.poses.pow(3).sum(), u)
    (ref,) = torch.autograd.grad(routing.route_linear(u, weight).poses.pow(3).sum(), u)
    _close(got, ref, rtol=0, atol=0)
    assert out.rounds.requires_grad  # differentiable, as the plain path's stack of couplings (2026-12-02)


@pytest.mark.parametrize("shape", [(3,), (3, 4), (2, 5), (3, 5, 1)])
def test_forward_rejects_activations_of_the_wrong_shape(shape):
    with pytest.raises(ValueError, match=r"activations must be \(B, I\) = \(3, 5\)"):
        DynamicRouting(3)(_votes(), torch.zeros(shape, dtype=DT))


def test_route_linear_refuses_a_chunk_that_makes_no_blocks_and_weights_of_no_upper_capsules():
    """chunk -1 made no blocks (poses off by 0.8, a coupling of uninitialised memory), 0 met range()'s "arg 3 must
    not be zero", and J = 0 a ZeroDivisionError (a review of the fast paths at edge shapes, 2026-12-02)."""
    u, weight = torch.randn(2, 3, 2, dtype=DT), torch.randn(2, 3, 4, 5, dtype=DT)
    routing = DynamicRouting(3)
    for chunk in (-1, 0, 2.5, True):
        routing.chunk = chunk
        with pytest.raises(ValueError, match=rf"chunk must be a positive integer \(lower capsules per block\) or "
                                             rf"None \(by size\), got {chunk!r}"):
            routing.route_linear(u, weight)
    routing.chunk = None
    with pytest.raises(ValueError, match=r"has no upper capsules \(J = 0\): route to at least one"):
        routing.route_linear(u, torch.zeros(2, 3, 0, 5, dtype=DT))
