"""The routing registry, and the shared call shape checked for every registered algorithm."""
from __future__ import annotations

import pytest
import torch

from capsnet.routing import ROUTINGS, RoutingResult, create_routing, list_routings, routing_takes
from routing_names import ALL, SHIPPED


def test_create_routing_by_name_and_unknown_names_list_the_valid_ones():
    routing = create_routing("dynamic", iterations=2, leaky=True)
    assert routing.iterations == 2 and routing.leaky
    with pytest.raises(ValueError, match=f"unknown routing 'nope'; valid names are {ALL}$"):
        create_routing("nope")
    assert list_routings() == sorted(ROUTINGS) and set(SHIPPED) <= set(list_routings())


B, I, J, D = 3, 7, 4, 16
SIZES = {"in_caps": I, "out_caps": J, "dim": D}  # what a layer knows of itself: each routing takes what it needs


def test_an_option_of_another_kind_than_its_default_is_refused_when_the_routing_is_built(monkeypatch):
    """--routing-option scale=abc for a routing that keeps its options for the forward pass reached it as a TypeError
    traceback at the first step (a run folder left behind); a number, a switch or a word is checked against the
    constructor's default, whatever the routing (an option without a simple default is the routing's to check)."""
    import capsnet.routing as routing_module
    from torch import nn

    class Kept(nn.Module):  # a routing added by a user, checking nothing itself
        def __init__(self, in_caps, scale: float = 1.0, renorm: bool = False, mode: str = "mean", extra=None):
            super().__init__()
            self.scale, self.renorm, self.mode, self.extra = scale, renorm, mode, extra

    monkeypatch.setitem(routing_module.ROUTINGS, "kept", Kept)
    for option, value, kind, default in (("scale", "abc", "a number", 1.0), ("scale", True, "a number", 1.0),
                                         ("renorm", 1, "true or false", False), ("mode", 3, "a word", "'mean'")):
        with pytest.raises(ValueError, match=f"kept routing's option {option} takes {kind} \\(its default: "
                                             f"{default}\\), got {value!r}"):
            create_routing("kept", in_caps=3, **{option: value})
    built = create_routing("kept", in_caps=3, scale=2, renorm=True, mode="max", extra=[1, 2])  # an int for a float
    assert (built.scale, built.renorm, built.mode, built.extra) == (2, True, "max", [1, 2])
    with pytest.raises(ValueError, match="em routing's option final_lambda takes a number \\(its default: 0.01\\), "
                                         "got 'x'"):
        create_routing("em", **SIZES, final_lambda="x")


def test_create_routing_passes_each_routing_the_layer_sizes_it_takes_and_refuses_the_rest():
    assert create_routing("em", **SIZES).out_caps == J
    attention = create_routing("self-attention", **SIZES)
    assert (attention.in_caps, attention.out_caps, attention.prior.shape) == (I, J, (I, J))
    assert create_routing("inverted", **SIZES, iterations=4).iterations == 4
    assert create_routing("dynamic", **SIZES, iterations=5).iterations == 5
    assert routing_takes("dynamic", "iterations") and not routing_takes("self-attention", "iterations")
    with pytest.raises(ValueError, match="self-attention routing makes one pass and takes no iterations"):
        create_routing("self-attention", **SIZES, iterations=3)
    with pytest.raises(ValueError, match="em routing takes no option leaky; its options are beta_a_init, "):
        create_routing("em", **SIZES, leaky=True)
    with pytest.raises(ValueError, match="self-attention routing takes no option squash; its options are none"):
        create_routing("self-attention", **SIZES, squash="exp")
    with pytest.raises(ValueError, match="unknown routing 3"):
        routing_takes(3, "iterations")


def test_a_routing_without_a_constructor_takes_nothing_and_one_needing_an_argument_says_which(monkeypatch):
    """A routing with only a forward (nothing to set) was read as taking every option (nn.Module's ``**kwargs``):
    CapsNet passed it in_caps and the rest, and the TypeError was reported as a routing option "of the wrong kind";
    a constructor argument no layer passes was the same message (a review of adding a routing, 2026-12-02)."""
    import capsnet.routing as routing_module
    from torch import nn

    from capsnet.models import create_model
    from capsnet.ops import squash

    class Mean(nn.Module):  # no constructor: uniform coupling, the squashed mean vote
        def forward(self, votes, activations=None, bias=None, **ignored):
            poses = squash(votes.mean(1))
            return RoutingResult(poses, poses.norm(dim=-1), torch.full(votes.shape[:3], 1 / votes.shape[2]))

    class Needs(nn.Module):
        def __init__(self, in_caps, parents, scale=1.0):
            super().__init__()

    monkeypatch.setitem(routing_module.ROUTINGS, "toy-mean", Mean)  # (not "mean": a user's may be registered)
    monkeypatch.setitem(routing_module.ROUTINGS, "needs", Needs)
    assert not routing_takes("toy-mean", "iterations") and not routing_takes("toy-mean", "in_caps")
    assert isinstance(create_routing("toy-mean", **SIZES), Mean)
    with pytest.raises(ValueError, match="toy-mean routing takes no option scale; its options are none"):
        create_routing("toy-mean", **SIZES, scale=2.0)
    model = create_model("capsnet", routing="toy-mean", conv1_channels=8, primary_types=2)
    out = model(torch.rand(2, 1, 28, 28))
    assert out.poses.shape == (2, 10, 16) and torch.isfinite(out.poses).all()
    with pytest.raises(ValueError, match="needs routing's constructor needs parents, which no layer passes .*: give "
                                         "it a default, or pass it as a routing option"):
        create_routing("needs", **SIZES)
    assert isinstance(create_routing("needs", **SIZES, parents=3), Needs)
    # a layer size the caller left out is asked of the caller, not blamed on a layer
    with pytest.raises(ValueError, match=r"^em routing needs out_caps \(J, the upper capsules\): "
                                         r"create_routing\('em', out_caps=...\)$"):
        create_routing("em")
    with pytest.raises(ValueError, match=r"^inverted routing needs dim \(D, the pose size\)"):
        create_routing("inverted", in_caps=I)


@pytest.mark.parametrize("name", sorted(ROUTINGS))
def test_every_routing_has_the_shared_call_shape(name):
    g = torch.Generator().manual_seed(0)
    votes = torch.randn(B, I, J, D, generator=g, dtype=torch.float64, requires_grad=True)
    activations = torch.rand(B, I, generator=g, dtype=torch.float64)
    routing = create_routing(name, **SIZES).double()
    out = routing(votes, activations, record=True)
    assert isinstance(out, RoutingResult)
    assert out.poses.shape == (B, J, D) and out.activations.shape == (B, J) and out.coupling.shape == (B, I, J)
    R = out.rounds.shape[1]
    assert out.rounds.shape == (B, R, I, J) and R >= 1
    torch.testing.assert_close(out.rounds[:, -1], out.coupling)
    assert (out.coupling.sum(-1) <= 1 + 1e-9).all() and (out.coupling >= 0).all()
    # one example's output does not depend on the rest of its batch
    alone = routing(votes[1:2], activations[1:2])
    for a, b in zip(alone, out):
        torch.testing.assert_close(a[0], b[1])
    # finite gradients reach the votes
    (grad,) = torch.autograd.grad(out.poses.sum() + out.activations.sum(), votes)
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0
    with pytest.raises(ValueError, match=r"\(B, I, J, D\)"):
        routing(votes[0])


@pytest.mark.parametrize("name", sorted(ROUTINGS))
@pytest.mark.parametrize("scale", [0.0, 1e4])
def test_every_routing_is_finite_for_zero_and_huge_votes(name, scale):
    g = torch.Generator().manual_seed(1)
    votes = (torch.randn(B, I, J, D, generator=g) * scale).requires_grad_(True)
    routing = create_routing(name, **SIZES)
    out = routing(votes, torch.rand(B, I, generator=g))
    assert all(torch.isfinite(t).all() for t in out), name
    (grad,) = torch.autograd.grad(out.poses.sum() + out.activations.sum(), votes)
    assert torch.isfinite(grad).all(), name


@pytest.mark.parametrize("name", ["dynamic", "inverted", "self-attention"])
def test_routings_of_votes_past_the_squares_range_match_float64(name):
    """Votes of 1e20 to 1e36: their squares (self-attention's scores, inverted routing's layer norm) overflow float32,
    which made a NaN coupling from about 1e19 on; the routing now matches the same routing in float64 (scaled
    inputs give the same coupling: exactly 0 or 1 where float64 itself saturates), with finite gradients. EM
    routing is not in the list: its gradient overflows from about 1e13, its poses from about 1e18 (its docstring). The poses are squashed
    or layer-normed, so of the same size at every scale."""
    g = torch.Generator().manual_seed(3)
    for scale in (1e20, 1e30, 1e36):
        base = torch.randn(B, I, J, D, generator=g, dtype=torch.float64)
        routing = create_routing(name, **SIZES)
        with torch.no_grad():
            for p in routing.parameters():  # a prior (self-attention) or layer norm (inverted) off its start
                p.copy_(torch.randn(p.shape, generator=g) * 0.1 + (1 if p.dim() == 1 else 0))
        want = routing.double()(base * scale)
        votes = (base * scale).float().requires_grad_(True)
        got = routing.float()(votes)
        assert all(torch.isfinite(t).all() for t in got), (name, scale)
        torch.testing.assert_close(got.coupling, want.coupling.float(), rtol=1e-4, atol=1e-6)
        # inverted: the layer norm's eps (1e-5) acts on the scaled parent, whose variance is about 1, where float64's
        # is about scale^2: a difference of about eps / 2 relative to the norm's outputs, which reach about 3
        torch.testing.assert_close(got.poses.double(), want.poses, rtol=1e-4, atol=1e-4 if name == "inverted" else 1e-6)
        (grad,) = torch.autograd.grad(got.poses.sum() + got.activations.sum(), votes)
        assert torch.isfinite(grad).all(), (name, scale)


@pytest.mark.parametrize("name", sorted(ROUTINGS))
def test_every_routing_is_finite_under_bf16_autocast(name):
    g = torch.Generator().manual_seed(2)
    votes = torch.randn(B, I, J, D, generator=g).to(torch.bfloat16).requires_grad_(True)
    routing = create_routing(name, **SIZES)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = routing(votes, torch.rand(B, I, generator=g).to(torch.bfloat16))
        loss = out.poses.float().sum() + out.activations.float().sum()
    loss.backward()
    assert all(torch.isfinite(t.float()).all() for t in out) and torch.isfinite(votes.grad.float()).all()


@pytest.mark.parametrize("name", sorted(ROUTINGS))
def test_every_routing_routes_mixed_float_types_in_the_wider(name):
    """Inverted attention refused float64 votes into its float32 layer norm, and a .double() EM float32 votes ("mixed
    dtype", "expected scalar type Double"): votes and module of different float types route in the wider, as the
    all-float64 module does, and the module's own parameters get their gradients in their own type."""
    import copy

    g = torch.Generator().manual_seed(3)
    votes = torch.randn(B, I, J, D, generator=g, dtype=torch.float64)
    acts = torch.rand(B, I, generator=g, dtype=torch.float64)
    narrow = create_routing(name, **SIZES)
    wide = copy.deepcopy(narrow).double()
    cases = [(narrow, votes, acts)]
    if list(wide.parameters()):  # (a routing without parameters has no float type of its own)
        cases.append((wide, votes.float(), acts.float()))
    for module, v, a in cases:
        v = v.clone().requires_grad_(True)  # a training step's path (the fused backward where a routing has one)
        got = module(v, a)
        expected = wide(v.detach().double(), a.double())
        assert got.poses.dtype == got.activations.dtype == torch.float64
        torch.testing.assert_close(got.poses, expected.poses)
        torch.testing.assert_close(got.activations, expected.activations)
        (got.poses.sum() + got.activations.sum()).backward()
        assert v.grad.dtype == v.dtype and torch.isfinite(v.grad).all()
        assert all(p.grad is None or p.grad.dtype == p.dtype for p in module.parameters())


def test_routing_arguments_of_the_wrong_kind_are_named():
    """DynamicRouting(leaky="no") routed leakily; a negative size or integer votes failed inside torch; a bias of
    the wrong shape was a broadcast error in self-attention and inverted routing."""
    from capsnet.layers import DenseCaps
    from capsnet.routing import DynamicRouting, EMRouting, InvertedDotProductRouting, SelfAttentionRouting

    for make, message in [(lambda: DynamicRouting(3, leaky="no"), "leaky must be True or False, got 'no'"),
                          (lambda: DynamicRouting(3, detach_agreement=1), "detach_agreement must be True or False"),
                          (lambda: InvertedDotProductRouting(dim=0), "dim must be a positive integer, got 0"),
                          # a layer norm over one number: constant poses, no gradient (a review, 2026-12-01)
                          (lambda: InvertedDotProductRouting(dim=1), "dim must be at least 2: the layer norm of a "
                                                                    "one-number pose is its learned shift alone"),
                          # the string "False" read as True by bool(), turning the switch on (a review, 2026-12-01)
                          (lambda: InvertedDotProductRouting(dim=4, fused_backward="False"),
                           "fused_backward must be True or False, got 'False'"),
                          (lambda: EMRouting(3, normalise_cost="False"), "normalise_cost must be True or False"),
                          (lambda: EMRouting(3, detach_routing="false"), "detach_routing must be True or False"),
                          (lambda: EMRouting(3, fused_backward=1), "fused_backward must be True or False, got 1"),
                          (lambda: SelfAttentionRouting(in_caps=-1, out_caps=10), "in_caps must be a positive integer"),
                          (lambda: DenseCaps(-1, 8, 10, 16), "in_caps must be a positive integer, got -1")]:
        with pytest.raises(ValueError, match=message):
            make()
    votes = torch.randn(2, 6, 3, 4)
    for routing in (DynamicRouting(2), EMRouting(out_caps=3), InvertedDotProductRouting(dim=4),
                    SelfAttentionRouting(6, 3)):
        with pytest.raises(ValueError, match=r"votes must be floating point, got torch.int64: votes.float\(\)"):
            routing(votes.long())
    for routing in (DynamicRouting(2), InvertedDotProductRouting(dim=4), SelfAttentionRouting(6, 3)):
        with pytest.raises(ValueError, match=r"bias must be \(J, D\) = \(3, 4\), got shape \(4, 3\)"):
            routing(votes, bias=torch.zeros(4, 3))
        assert routing(votes, bias=torch.zeros(3, 4)).poses.shape == (2, 3, 4)  # the right one still routes


@pytest.mark.parametrize("name", sorted(ROUTINGS))
def test_every_routing_takes_the_layers_pose_bias_unless_it_says_it_has_none(name):
    """The call shape's third argument: a (J, D) bias added to s_j moves the poses; a routing with
    ``pose_bias = False`` (EM) refuses one by name instead of ignoring it."""
    g = torch.Generator().manual_seed(4)
    votes = torch.randn(B, I, J, D, generator=g, dtype=torch.float64)
    routing = create_routing(name, **SIZES).double()
    bias = torch.randn(J, D, generator=g, dtype=torch.float64)
    if not getattr(type(routing), "pose_bias", True):
        with pytest.raises(ValueError, match="takes no pose bias"):
            routing(votes, None, bias)
        return
    with_bias, without = routing(votes, None, bias), routing(votes, None, None)
    assert not torch.allclose(with_bias.poses, without.poses)
    assert torch.isfinite(with_bias.poses).all()
    # float32 votes into a float32 module with a float64 bias: routed in float64, as the all-float64 routing
    # (inverted attention's float32 layer norm raised "expected scalar type Double")
    narrow = create_routing(name, **SIZES)
    narrow.load_state_dict(routing.state_dict())  # the same weights, in float32
    mixed = narrow(votes.float(), None, bias)
    assert mixed.poses.dtype == torch.float64
    torch.testing.assert_close(mixed.poses, routing(votes.float().double(), None, bias).poses)


@pytest.mark.parametrize("name", sorted(ROUTINGS))
@pytest.mark.parametrize("scale", [0.0, 0.1, 10.0, 1e4])
def test_a_routing_that_says_its_activations_are_probabilities_keeps_them_in_0_1(name, scale):
    """``probabilities = False`` is what keeps a routing out of CapsNet's margin loss; the rest must keep their word."""
    g = torch.Generator().manual_seed(5)
    routing = create_routing(name, **SIZES)
    a = routing(torch.randn(B, I, J, D, generator=g) * scale, torch.rand(B, I, generator=g)).activations
    if getattr(type(routing), "probabilities", True):
        # a saturated squash's length is 1 within float32 rounding: 1 + 1.2e-7 for about a third of the seeds of
        # votes of 1e4, for dynamic and self-attention routing alike (a review); a few ulps past 1, never more
        assert ((a >= 0) & (a <= 1 + 4 * torch.finfo(a.dtype).eps)).all(), (name, a)
    elif scale == 10.0:  # the flag is not set for nothing: inverted routing's layer-normed poses are about sqrt(D) long
        assert (a > 1).any(), (name, a)


def test_routing_is_reads_each_routings_traits_and_names_an_unknown_trait():
    """What the registry's readers (CapsNet's margin loss, SegCaps, export, figures) ask of a routing: EM takes no
    pose bias and its activations are not lengths; inverted routing's activations are not probabilities; the rest
    have every trait, as has a name not registered (a model without routing)."""
    from capsnet.routing import TRAITS, routing_is

    expected = {"dynamic": (True, True, True), "em": (False, True, False), "inverted": (True, False, True),
                "self-attention": (True, True, True)}
    assert TRAITS == ("pose_bias", "probabilities", "length_activations")
    assert {name: tuple(routing_is(name, t) for t in TRAITS) for name in expected} == expected  # the shipped ones
    assert routing_is(None, "pose_bias") and routing_is("not-registered", "probabilities")
    with pytest.raises(ValueError, match="unknown routing trait 'bias'; the traits are pose_bias, probabilities, "
                                         "length_activations"):
        routing_is("dynamic", "bias")


@pytest.mark.parametrize("name", list_routings())
def test_a_routings_first_paragraph_cites_its_paper(name):
    """`capsnet routings NAME` and help() show a routing's first paragraph: three of four named no paper."""
    import inspect
    import re

    first = inspect.getdoc(ROUTINGS[name]).split("\n\n")[0]
    assert re.search(r"\b[A-Z][a-z]+\b.*\b(19|20)\d\d\b", first), (
        f"{name}: the first paragraph of its class docstring names no paper (an author's name and a year, e.g. "
        f"'Sabour et al. 2017'; a routing of one's own: 'after Sabour et al. 2017' or the paper it varies): {first!r}")


@pytest.mark.parametrize("name", sorted(ROUTINGS))
def test_float16_votes_of_a_thousand_route_as_float64_does(name):
    """A .half() model's routing: float16 tops out at 65,504 and a round's sums over 1,152 children of votes of about
    1e3 overflowed (inf, then NaN poses and gradients) in dynamic, self-attention and inverted attention routing.
    Routed in float32 (``result.float16_in_float32``) and returned in float16 (EM: float32), the poses and the votes'
    gradient match float64 routing of the same (float16-rounded) votes; grid routing as well."""
    torch.manual_seed(0)
    kw = {"iterations": 3} if routing_takes(name, "iterations") else {}
    routing = create_routing(name, in_caps=1152, out_caps=10, dim=16, **kw)
    if name == "self-attention":
        torch.nn.init.normal_(routing.prior, std=0.1)
    votes = (torch.randn(2, 1152, 10, 16) * 1000).half()
    weights = torch.randn(2, 10, 16, dtype=torch.float64)
    ref_votes = votes.double().requires_grad_()
    ref = create_routing(name, in_caps=1152, out_caps=10, dim=16, **kw).double()
    ref.load_state_dict(routing.state_dict())
    expected = ref(ref_votes)
    (expected.poses * weights).sum().backward()
    half = routing.half()
    got_votes = votes.clone().requires_grad_()
    got = half(got_votes, record=True)
    (got.poses.double() * weights).sum().backward()
    returned = torch.float32 if name == "em" else torch.float16  # EM's poses are float32 (its docstring)
    assert got.poses.dtype == got.coupling.dtype == got.rounds.dtype == returned
    torch.testing.assert_close(got.poses.double(), expected.poses, atol=3e-3, rtol=1e-3)  # EM's poses are votes' size
    torch.testing.assert_close(got.coupling.double(), expected.coupling, atol=3e-3, rtol=0)
    assert torch.isfinite(got_votes.grad).all()
    cosine = torch.nn.functional.cosine_similarity(got_votes.grad.double().flatten(), ref_votes.grad.flatten(), dim=0)
    assert cosine > 0.999, cosine
    with torch.autocast("cpu", dtype=torch.float16):  # float16 autocast (a T4's training) casts products back
        under = half(votes)
    torch.testing.assert_close(under.poses.double(), expected.poses, atol=3e-3, rtol=1e-3)
    wide = routing.bfloat16()(votes.bfloat16())  # bfloat16 has float32's range: routed as it comes, not widened
    assert wide.poses.dtype == (torch.float32 if name == "em" else torch.bfloat16) and torch.isfinite(wide.poses).all()
    half = routing.half()
    if hasattr(half, "route_grid"):  # convolutional capsules: 1,152 children at each of 2 x 2 positions
        grid = votes[:1].reshape(1, 1152, 10, 16, 1, 1).expand(1, 1152, 10, 16, 2, 2)
        poses = half.route_grid(grid)
        assert poses.dtype == torch.float16
        torch.testing.assert_close(poses.double(), ref.route_grid(grid.double()), atol=3e-3, rtol=0)


def test_route_linear_of_a_half_model_routes_in_float32_and_returns_float16():
    """DenseCaps' fast path (capsnet's digit capsules) on float16 capsules and weights: votes W u of about 1e3."""
    torch.manual_seed(0)
    routing = create_routing("dynamic", iterations=3)
    u, weight = torch.randn(2, 1152, 8) * 30, torch.randn(8, 1152, 10, 16) * 10
    got = routing.route_linear(u.half(), weight.half(), record=True)
    expected = routing.route_linear(u.half().double(), weight.half().double(), record=True)
    assert got.poses.dtype == got.coupling.dtype == got.rounds.dtype == torch.float16
    torch.testing.assert_close(got.poses.double(), expected.poses, atol=3e-3, rtol=0)
    torch.testing.assert_close(got.rounds.double(), expected.rounds, atol=3e-3, rtol=0)
