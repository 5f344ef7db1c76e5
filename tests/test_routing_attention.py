"""Self-attention routing (Efficient-CapsNet) against its formula written out with the attention matrix."""
from __future__ import annotations

import math

import pytest
import torch

from capsnet.ops import exp_squash
from capsnet.routing import SelfAttentionRouting

DT = torch.float64


def reference(votes, prior):
    """Mazzia et al. 2021: A_j = U_j U_j^T / sqrt(D), c_ij = softmax_j(sum_k A_j[i, k]), s_j = sum_i u_ij (c_ij + b_ij)."""
    B, I, J, D = votes.shape
    out = torch.zeros(B, J, D, dtype=votes.dtype)
    coupling = torch.zeros(B, I, J, dtype=votes.dtype)
    for b in range(B):
        scores = torch.zeros(I, J, dtype=votes.dtype)
        for j in range(J):
            U = votes[b, :, j]  # (I, D)
            scores[:, j] = (U @ U.T / math.sqrt(D)).sum(dim=1)
        c = torch.exp(scores) / torch.exp(scores).sum(dim=1, keepdim=True)
        coupling[b] = c
        for j in range(J):
            s = sum((c[i, j] + prior[i, j]) * votes[b, i, j] for i in range(I))
            n = s.norm()
            out[b, j] = (1 - 1 / math.e ** n.item()) * s / n
    return out, coupling


def test_matches_the_attention_matrix_formula():
    g = torch.Generator().manual_seed(0)
    votes = torch.randn(2, 5, 3, 4, generator=g, dtype=DT) * 0.5
    routing = SelfAttentionRouting(5, 3).double()
    with torch.no_grad():
        routing.prior.copy_(torch.randn(5, 3, generator=g, dtype=DT) * 0.3)
    out = routing(votes)
    poses, coupling = reference(votes, routing.prior.detach())
    torch.testing.assert_close(out.poses, poses, rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(out.coupling, coupling)
    torch.testing.assert_close(out.activations, poses.norm(dim=-1), rtol=1e-6, atol=1e-6)


def test_the_prior_gets_a_gradient_and_a_vote_that_agrees_scores_higher():
    votes = torch.zeros(1, 3, 2, 4, dtype=DT)
    votes[0, :, 0] = torch.tensor([1.0, 0, 0, 0], dtype=DT)  # all three agree on parent 0
    votes[0, :, 1] = torch.tensor([[1.0, 0, 0, 0], [-1.0, 0, 0, 0], [0, 1.0, 0, 0]], dtype=DT)  # disagree on 1
    routing = SelfAttentionRouting(3, 2).double()
    out = routing(votes)
    assert (out.coupling[0, :, 0] > out.coupling[0, :, 1]).all()
    out.poses.sum().backward()
    assert routing.prior.grad.abs().sum() > 0


def test_wrong_sizes_are_refused():
    with pytest.raises(ValueError, match=r"do not fit this routing's \(I, J\) = \(5, 3\)"):
        SelfAttentionRouting(5, 3)(torch.zeros(2, 4, 3, 8))


def test_exp_squash_length_is_one_minus_exp_minus_norm():
    g = torch.Generator().manual_seed(1)
    s = torch.randn(6, 16, generator=g, dtype=DT) * torch.tensor([0, 1e-3, 0.5, 1, 5, 1e30], dtype=DT).view(6, 1)
    v = exp_squash(s)
    n = s.norm(dim=-1)
    torch.testing.assert_close(v.norm(dim=-1)[1:], 1 - torch.exp(-n[1:]), rtol=1e-6, atol=1e-7)
    assert torch.isfinite(v).all() and v[0].abs().max() == 0
    leaf = s.clone().requires_grad_(True)
    exp_squash(leaf).sum().backward()
    assert torch.isfinite(leaf.grad).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_exp_squash_in_half_precision_where_the_squared_length_overflows(dtype):
    # float16: |s|^2 of 16 entries of 100 is 160,000, past its 65,504; the capsule must still come out of length 1
    for value in (100.0, 6e4 if dtype == torch.float16 else 1e30):
        s = torch.full((2, 16), value, dtype=dtype).requires_grad_(True)
        v = exp_squash(s)
        torch.testing.assert_close(v.float(), torch.full((2, 16), 0.25), rtol=2e-3, atol=0)
        v.sum().backward()
        assert torch.isfinite(s.grad).all()
    small = torch.tensor([[0.3, -0.4]], dtype=dtype)  # |s| = 0.5: the ordinary path
    torch.testing.assert_close(exp_squash(small).float(), torch.tensor([[0.3, -0.4]]) * (1 - math.exp(-0.5)) / 0.5,
                               rtol=1e-2, atol=0)
    assert exp_squash(torch.zeros(3, 0, dtype=dtype)).shape == (3, 0)


def test_exp_squash_of_integers_and_of_very_long_float16_capsules():
    """Integers are squashed as floats (as squash does); a float16 capsule of 32,768 entries of 0.9, |s|^2 =
    26,542 (inside float16), is not scaled up into an overflow: length 1 - e^-163, that is 1."""
    torch.testing.assert_close(exp_squash(torch.tensor([[3, 4]])), exp_squash(torch.tensor([[3.0, 4.0]])))
    v = exp_squash(torch.full((1, 32768), 0.9, dtype=torch.float16))
    assert torch.isfinite(v).all()
    torch.testing.assert_close(v.float().norm(), torch.tensor(1.0), rtol=1e-2, atol=0)


def test_exp_squash_of_huge_float32_capsules_is_a_unit_vector():
    s = torch.tensor([[3e38, -1e38, 0.0, 2e37]])
    v = exp_squash(s)
    assert torch.isfinite(v).all()
    torch.testing.assert_close(v, s.double().div(s.double().norm()).float())
