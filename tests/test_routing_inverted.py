"""Inverted dot-product attention routing (Tsai et al. 2020) against its passes written out, and its model."""
from __future__ import annotations

import math

import pytest
import torch

from capsnet.models import create_model
from capsnet.routing import InvertedDotProductRouting

DT = torch.float64


def reference(votes, iterations, weight, bias):
    B, I, J, D = votes.shape
    out = torch.zeros(B, J, D, dtype=votes.dtype)
    for b in range(B):
        r = [[1.0 / J] * J for _ in range(I)]
        for t in range(iterations):
            if t > 0:
                for i in range(I):
                    a = [float(votes[b, i, j] @ p[j]) / math.sqrt(D) for j in range(J)]
                    z = sum(math.exp(x) for x in a)
                    r[i] = [math.exp(x) / z for x in a]
            s = [sum(r[i][j] * votes[b, i, j] for i in range(I)) for j in range(J)]
            p = [(x - x.mean()) / torch.sqrt(x.var(unbiased=False) + 1e-5) * weight + bias for x in s]
        out[b] = torch.stack(p)
    return out


@pytest.mark.parametrize("iterations", [1, 2, 3])
def test_matches_the_passes_written_out(iterations):
    g = torch.Generator().manual_seed(0)
    votes = torch.randn(2, 5, 3, 16, generator=g, dtype=DT)
    routing = InvertedDotProductRouting(16, iterations).double()
    with torch.no_grad():
        routing.norm.weight.copy_(1 + 0.1 * torch.randn(16, generator=g, dtype=DT))
        routing.norm.bias.copy_(0.1 * torch.randn(16, generator=g, dtype=DT))
    out = routing(votes, record=True)
    torch.testing.assert_close(out.poses, reference(votes, iterations, routing.norm.weight.detach(),
                                                    routing.norm.bias.detach()))
    assert out.rounds.shape == (2, iterations, 5, 3) and (out.rounds[:, 0] == 1 / 3).all()
    torch.testing.assert_close(out.coupling.sum(-1), torch.ones(2, 5, dtype=DT))


def test_votes_of_another_size_are_refused():
    with pytest.raises(ValueError, match="votes of 8 dimensions for a routing built with dim=16"):
        InvertedDotProductRouting(16)(torch.zeros(2, 3, 4, 8))


def test_mnist_model_weights_and_shapes():
    model = create_model("inverted-capsnet")
    # 443,793 built from the official classes, less their head's bias (the softmax cannot see it)
    assert sum(p.numel() for p in model.parameters()) == 443_792
    out = model(torch.rand(2, 1, 28, 28))
    assert out.poses.shape == (2, 10, 16) and out.logits.shape == (2, 10) and out.coupling.shape == (2, 512, 10)
