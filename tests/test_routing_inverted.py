"""Inverted dot-product attention routing (Tsai et al. 2020) against its passes written out, and its model."""
from __future__ import annotations

import math

import pytest
import torch

from capsnet.models import create_model
from capsnet.routing import InvertedDotProductRouting

DT = torch.float64


def reference(votes, iterations, weight, bias, pose_bias=None):
    """The passes for one example at a time; ``pose_bias`` (J, D) is added to s_j before the layer norm (the
    routing contract's bias, "added to s_j")."""
    B, I, J, D = votes.shape
    out = torch.zeros(B, J, D, dtype=votes.dtype)
    for b in range(B):
        r = [[1.0 / J] * J for _ in range(I)]
        p = None  # the parents' poses, made by the first pass and read by the next
        for t in range(iterations):
            if t > 0:
                for i in range(I):
                    a = [float(votes[b, i, j] @ p[j]) / math.sqrt(D) for j in range(J)]
                    z = sum(math.exp(x) for x in a)
                    r[i] = [math.exp(x) / z for x in a]
            s = [sum(r[i][j] * votes[b, i, j] for i in range(I)) for j in range(J)]
            if pose_bias is not None:
                s = [x + pose_bias[j] for j, x in enumerate(s)]
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


@pytest.mark.parametrize("iterations", [1, 3])
def test_a_pose_bias_is_added_to_s_before_the_norm_as_written_out(iterations):
    """Moving the bias after the layer norm passed every test (the written-out passes took no bias, and the test that
    passes one compares two paths through the same code: mutation testing, 2026-12-02)."""
    g = torch.Generator().manual_seed(4)
    votes = torch.randn(2, 5, 3, 16, generator=g, dtype=DT)
    bias = 0.5 * torch.randn(3, 16, generator=g, dtype=DT)
    routing = InvertedDotProductRouting(16, iterations).double()
    with torch.no_grad():
        routing.norm.weight.copy_(1 + 0.1 * torch.randn(16, generator=g, dtype=DT))
        routing.norm.bias.copy_(0.1 * torch.randn(16, generator=g, dtype=DT))
    weight, shift = routing.norm.weight.detach(), routing.norm.bias.detach()
    for record in (False, True):  # the fused path and the recording one
        out = routing(votes, bias=bias, record=record)
        torch.testing.assert_close(out.poses, reference(votes, iterations, weight, shift, bias))


def test_votes_of_another_size_are_refused():
    with pytest.raises(ValueError, match="votes of 8 dimensions for a routing built with dim=16"):
        InvertedDotProductRouting(16)(torch.zeros(2, 3, 4, 8))


def test_mnist_model_weights_and_shapes():
    model = create_model("inverted-capsnet")
    # 443,793 built from the official classes, less their head's bias (the softmax cannot see it)
    assert sum(p.numel() for p in model.parameters()) == 443_792
    out = model(torch.rand(2, 1, 28, 28))
    assert out.poses.shape == (2, 10, 16) and out.logits.shape == (2, 10) and out.coupling.shape == (2, 512, 10)


@pytest.mark.parametrize("iterations", [1, 2, 3])
@pytest.mark.parametrize("with_bias", [False, True])
def test_fused_backward_gives_the_plain_paths_values_and_gradients(iterations, with_bias):
    """A training step's routing (one batched product for the votes' gradient) against plain autograd
    (fused_backward=False) and the recording path, on random votes, norm and bias, in float64."""
    g = torch.Generator().manual_seed(21 + iterations)
    fused, plain = (InvertedDotProductRouting(16, iterations, fused_backward=f).double() for f in (True, False))
    with torch.no_grad():
        fused.norm.weight.copy_(1 + 0.3 * torch.randn(16, generator=g, dtype=DT))
        fused.norm.bias.copy_(0.3 * torch.randn(16, generator=g, dtype=DT))
    plain.load_state_dict(fused.state_dict())
    votes = torch.randn(3, 7, 4, 16, generator=g, dtype=DT).requires_grad_(True)
    bias = (0.5 * torch.randn(4, 16, generator=g, dtype=DT)).requires_grad_(True) if with_bias else None
    weights = [torch.randn(3, 4, 16, generator=g, dtype=DT), torch.randn(3, 4, generator=g, dtype=DT),
               torch.randn(3, 7, 4, generator=g, dtype=DT)]
    results = []
    for routing, record in ((fused, False), (plain, False), (fused, True)):
        out = routing(votes, bias=bias, record=record)
        assert (type(out.poses.grad_fn).__name__ == "_FusedInvertedBackward") == (routing is fused and not record)
        loss = sum((t * w).sum() for t, w in zip(out, weights))
        inputs = [votes, routing.norm.weight, routing.norm.bias] + ([bias] if with_bias else [])
        results.append((list(out), list(torch.autograd.grad(loss, inputs))))
    for other in results[1:]:
        for x, y in zip(results[0][0] + results[0][1], other[0] + other[1]):
            torch.testing.assert_close(x, y, rtol=1e-9, atol=1e-12)
    # only the norm wanted: the votes get no gradient and the norm the same one
    g_w, = torch.autograd.grad(fused(votes.detach()).activations.sum(), [fused.norm.weight])
    torch.testing.assert_close(g_w, torch.autograd.grad(plain(votes.detach()).activations.sum(),
                                                        [plain.norm.weight])[0])


def test_fused_backward_in_the_model_matches_plain_autograd():
    """The MNIST model's loss gradient for every weight, fused (the default) against plain autograd."""
    from capsnet.models.inverted_capsnet import inverted_capsnet_loss

    torch.manual_seed(3)
    model = create_model("inverted-capsnet").double()
    images, labels = torch.rand(3, 1, 28, 28, dtype=DT), torch.tensor([1, 7, 3])
    grads = []
    for fused in (True, False):
        for m in model.modules():
            if isinstance(m, InvertedDotProductRouting):
                m.fused_backward = fused
        loss, _ = inverted_capsnet_loss(model, images, labels)
        grads.append(torch.autograd.grad(loss, list(model.parameters())))
    for x, y in zip(*grads):
        torch.testing.assert_close(x, y, rtol=1e-8, atol=1e-12)


def test_torch_func_transforms_take_the_plain_path_and_a_second_backward_names_the_way_out():
    g = torch.Generator().manual_seed(5)
    routing = InvertedDotProductRouting(16, 3).double()
    votes = torch.randn(2, 5, 3, 16, generator=g, dtype=DT)
    one_by_one = torch.stack([routing(votes[i:i + 1]).poses[0] for i in range(2)])
    torch.testing.assert_close(torch.vmap(lambda v: routing(v[None]).poses[0])(votes), one_by_one)
    grad = torch.func.grad(lambda v: routing(v).activations.sum())(votes)
    v = votes.clone().requires_grad_(True)
    torch.testing.assert_close(grad, torch.autograd.grad(routing(v, record=True).activations.sum(), v)[0])
    loss = routing(v).activations.sum()
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match=r"fused_backward=False"):
        loss.backward()
    plain = InvertedDotProductRouting(16, 3, fused_backward=False).double()(v).activations.sum()
    plain.backward(retain_graph=True)
    plain.backward()


def test_bf16_autocast_step_is_finite_and_close_to_fp32():
    g = torch.Generator().manual_seed(8)
    routing = InvertedDotProductRouting(16, 2)
    votes = torch.randn(4, 9, 5, 16, generator=g).requires_grad_(True)
    full = torch.autograd.grad(routing(votes).activations.sum(), votes)[0]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = routing(votes.to(torch.bfloat16))
        half = torch.autograd.grad(out.activations.float().sum(), votes)[0]
    assert torch.isfinite(half).all() and half.dtype == torch.float32
    torch.testing.assert_close(half, full, rtol=0.1, atol=0.05)


def test_concurrent_routing_is_the_official_codes_iteration_over_every_layer():
    """routing_mode="concurrent" (the paper's contribution; the official CapsModel.forward without
    --sequential_routing): a uniform pass in every layer bottom up, then in each later iteration every layer one pass
    from the capsules of the iteration before, its input and its own parents. Checked against that loop written here
    over the votes each layer makes (caught from its routing) and the pass from the paper: r_ij = softmax over j of
    v_ij . p_j / sqrt(D), p_j = LayerNorm(sum_i r_ij v_ij)."""
    import torch.nn.functional as F
    from torch import nn

    from capsnet.layers import MatrixCaps
    from capsnet.routing import RoutingResult

    torch.manual_seed(0)
    small = dict(backbone_channels=8, primary_types=4, caps_types=4)
    model = create_model("inverted-capsnet", routing_iterations=3, routing_mode="concurrent", **small).eval()
    layers = (model.caps1, model.caps2, model.classes)
    with torch.no_grad():
        for layer in layers:  # layer norms away from their identity start
            layer.routing.norm.weight.uniform_(0.5, 1.5)
            layer.routing.norm.bias.uniform_(-0.5, 0.5)
    x = torch.rand(2, 1, 28, 28)

    class Catch(nn.Module):
        def forward(self, votes, activations=None, bias=None, record=False):
            self.votes = votes
            B, I, J, D = votes.shape
            return RoutingResult(votes.new_zeros(B, J, D), votes.new_zeros(B, J), votes.new_zeros(B, I, J))

    def one_pass(layer, below, start):
        routing, layer.routing = layer.routing, Catch()
        try:
            shaped = layer(below)
            v = layer.routing.votes
        finally:
            layer.routing = routing
        B, I, J, D = v.shape
        r = torch.full((B, I, J), 1 / J) if start is None else \
            torch.softmax(torch.einsum("bijd,bjd->bij", v, start) / math.sqrt(D), dim=2)
        norm = routing.norm
        p = F.layer_norm(torch.einsum("bij,bijd->bjd", r, v), (D,), norm.weight, norm.bias, norm.eps)
        if layer is model.classes:
            return p
        N, H, W, J, D = shaped.poses.shape
        return MatrixCaps(p.reshape(N, H, W, J, D), p.norm(dim=-1).reshape(N, H, W, J))

    def parents(caps):
        return caps if isinstance(caps, torch.Tensor) else caps.poses.reshape(-1, *caps.poses.shape[3:])

    with torch.no_grad():
        primary = model._primary_capsules(x)
        c1 = one_pass(model.caps1, primary, None)
        c2 = one_pass(model.caps2, c1, None)
        top = one_pass(model.classes, c2, None)
        for _ in range(2):
            c1, c2, top = (one_pass(model.caps1, primary, parents(c1)), one_pass(model.caps2, c1, parents(c2)),
                           one_pass(model.classes, c2, top))
        expected = model.head(top).squeeze(-1)
        got = model(x)
        torch.testing.assert_close(got.logits, expected, rtol=1e-4, atol=1e-5)
        sequential = create_model("inverted-capsnet", routing_iterations=3, **small).eval()
        sequential.load_state_dict(model.state_dict())
        assert (sequential(x).logits - got.logits).abs().max() > 1e-3  # a different routing, not the same one
        view = model.routing_view(x)
        assert view.rounds.shape[1] == 3 and torch.allclose(view.rounds[:, 0], torch.full_like(view.rounds[:, 0], 0.1))
    for R in (1,):  # one iteration: the same uniform passes either way
        a = create_model("inverted-capsnet", routing_iterations=R, routing_mode="concurrent", **small).eval()
        b = create_model("inverted-capsnet", routing_iterations=R, **small).eval()
        b.load_state_dict(a.state_dict())
        with torch.no_grad():
            torch.testing.assert_close(a(x).logits, b(x).logits)
    # a training step routes as evaluation does (its first iteration took the fused path, which made every pass of
    # the layer, not one: logits 0.35 apart; a review, 2026-11-30), and every weight learns through the iterations
    model.train()
    trained = model(x).logits
    torch.testing.assert_close(trained, got.logits)
    trained.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    with pytest.raises(ValueError, match="routing_mode"):
        create_model("inverted-capsnet", routing_mode="parallel")


def test_concurrent_routing_in_two_threads_at_once_gives_each_its_own_result():
    """The concurrent passes' start was module state (a context manager): two threads through one model mixed
    their batches (a review, 2026-11-30); it is now an argument of each call."""
    from concurrent.futures import ThreadPoolExecutor

    torch.manual_seed(0)
    model = create_model("inverted-capsnet", backbone_channels=8, primary_types=4, caps_types=4,
                         routing_mode="concurrent").eval()
    batches = [torch.rand(n, 1, 28, 28) for n in (2, 3) * 6]
    with torch.no_grad():
        alone = [model(x).logits for x in batches]
        with ThreadPoolExecutor(2) as pool:
            together = list(pool.map(lambda x: model(x).logits, batches))
    for a, b in zip(alone, together):
        torch.testing.assert_close(a, b)


def test_inverted_capsnet_is_finite_for_images_of_1e30():
    """The primary capsules' layer norm squared poses of about 4e19 into inf, and the logits were NaN for images of
    1e20 (a review, 2026-11-30); every other classifier was finite to 1e30. Ordinary images are unchanged (k = 1)."""
    torch.manual_seed(0)
    model = create_model("inverted-capsnet", backbone_channels=8, primary_types=4, caps_types=4).eval()
    x = torch.rand(2, 1, 28, 28)
    with torch.no_grad():
        for scale in (1e20, 1e30):
            assert torch.isfinite(model(x * scale).logits).all(), scale
        poses = model.primary(torch.relu(model.backbone(x))).view(2, 4, 16, 14, 14).permute(0, 3, 4, 1, 2)
        torch.testing.assert_close(model._primary_capsules(x).poses, model.primary_norm(poses), rtol=0, atol=0)


def test_a_pass_from_a_start_is_the_plain_paths_in_training_and_bad_starts_or_passes_are_refused():
    """A call with start (no passes) took the fused path in training, which ignores start; a start of the wrong
    shape and zero passes are named."""
    torch.manual_seed(0)
    fused, plain = InvertedDotProductRouting(8, 2), InvertedDotProductRouting(8, 2, fused_backward=False)
    plain.load_state_dict(fused.state_dict())
    v, start = torch.randn(2, 6, 3, 8, requires_grad=True), torch.randn(2, 3, 8)
    torch.testing.assert_close(fused.train()(v, start=start).poses, plain.train()(v, start=start).poses)
    with pytest.raises(ValueError, match=r"start must be the parents' poses \(B, J, D\) = \(2, 3, 8\)"):
        fused(v, start=torch.randn(2, 4, 8))
    with pytest.raises(ValueError, match="passes"):
        fused(v, passes=0)


def test_the_primary_capsules_of_huge_images_are_the_float64_models():
    """The power-of-two scale before the primary layer norm keeps the poses right, not only finite."""
    torch.manual_seed(0)
    model = create_model("inverted-capsnet", backbone_channels=8, primary_types=4, caps_types=4).eval()
    x = torch.rand(2, 1, 28, 28) * 1e20
    with torch.no_grad():
        got = model._primary_capsules(x).poses
        want = model.double()._primary_capsules(x.double()).poses.float()
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)


def test_bfloat16_votes_with_a_float32_bias_route_over_several_passes_in_the_bias_type():
    """The second pass met "expected scalar type Float but found BFloat16": the first pass's poses took the bias's
    float32, its votes stayed bfloat16 (a review of the fast paths at edge shapes, 2026-12-02). Routed as the same
    votes in float32; under autocast, as before."""
    torch.manual_seed(0)
    votes, bias = torch.randn(2, 5, 3, 4).bfloat16(), torch.randn(3, 4) * 0.1
    routing = InvertedDotProductRouting(4, 2)
    for fused in (True, False):
        routing.fused_backward = fused
        out, ref = routing(votes, None, bias), routing(votes.float(), None, bias)
        assert out.poses.dtype == torch.float32
        torch.testing.assert_close(out.poses, ref.poses, rtol=0, atol=0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.isfinite(routing(votes, None, bias).poses).all()
