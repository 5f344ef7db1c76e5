"""CapsNet: the paper's parameter counts, shapes, masking, gradients, config, registry."""
from __future__ import annotations

import json

import pytest
import torch

from capsnet.losses import margin_loss, reconstruction_loss
from capsnet.models import (MODELS, CapsNet, CapsNetConfig, CapsNetOutput, Decoder, create_model, mask_capsules,
                            num_weights)
from capsnet.routing import ROUTINGS, routing_takes
from routing_names import ALL, CAPSNET

# Small sizes for everything but the parameter counts and the full-size gradient test.
SMALL = dict(conv1_channels=16, primary_types=4, primary_dim=4, digit_dim=6, decoder_hidden=(32, 48))


def _count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.fixture(scope="module")
def mnist_model() -> CapsNet:
    torch.manual_seed(0)
    return CapsNet(CapsNetConfig())


@pytest.mark.parametrize("decoder,routing_bias,expected", [
    (True, False, 8_215_568),  # the paper's 8.2M
    (False, False, 6_804_224),  # the paper's 6.8M
    (True, True, 8_215_568 + 160),  # the authors' routing bias, 10 x 16
    (False, True, 6_804_224 + 160),
])
def test_parameter_counts_match_the_paper(decoder, routing_bias, expected):
    model = CapsNet(CapsNetConfig(decoder=decoder, routing_bias=routing_bias))
    assert _count(model) == expected


def test_default_config_is_the_papers_mnist_model(mnist_model):
    cfg = mnist_model.config
    assert cfg.routing_bias and cfg.decoder and cfg.routing_iterations == 3
    assert cfg.primary_grid == (6, 6) and cfg.num_primary == 1152
    assert _count(mnist_model) == 8_215_568 + 160
    assert mnist_model.digits.weight.shape == (8, 1152, 10, 16)


def test_mnist_forward_shapes(mnist_model):
    images = torch.rand(2, 1, 28, 28)
    out = mnist_model(images)
    assert isinstance(out, CapsNetOutput)
    assert out.poses.shape == (2, 10, 16)
    assert out.lengths.shape == (2, 10)
    assert out.reconstructions.shape == (2, 1, 28, 28)
    assert out.coupling.shape == (2, 1152, 10)
    assert all(torch.isfinite(t).all() for t in out)
    torch.testing.assert_close(out.lengths, torch.linalg.norm(out.poses, dim=-1), rtol=1e-4, atol=1e-5)
    assert ((out.lengths > 0) & (out.lengths < 1)).all()
    assert ((out.reconstructions >= 0) & (out.reconstructions <= 1)).all()


def test_every_parameter_gets_a_finite_nonzero_gradient(mnist_model):
    torch.manual_seed(1)
    mnist_model.zero_grad(set_to_none=True)
    images, labels = torch.rand(2, 1, 28, 28), torch.tensor([3, 7])
    out = mnist_model(images, labels)
    loss = margin_loss(out.lengths, labels)
    if out.reconstructions is not None:  # capsnet-cifar10 has none, as the authors trained it
        loss = loss + reconstruction_loss(out.reconstructions, images)
    loss.backward()
    for name, p in mnist_model.named_parameters():
        assert p.grad is not None, f"{name} got no gradient"
        assert torch.isfinite(p.grad).all(), f"{name} has a non-finite gradient"
        assert p.grad.abs().sum() > 0, f"{name} has an all-zero gradient"
    mnist_model.zero_grad(set_to_none=True)


def _small(**kw) -> CapsNet:
    torch.manual_seed(2)
    return CapsNet(CapsNetConfig(**{**SMALL, **kw})).double()


def test_masking_uses_labels_when_given_else_longest_capsule():
    model = _small()
    images = torch.rand(4, 1, 28, 28, dtype=torch.float64)
    out = model(images)
    predicted = out.lengths.argmax(1)
    torch.testing.assert_close(out.reconstructions, model.decoder(mask_capsules(out.poses, predicted)), rtol=0, atol=0)
    labels = (predicted + 1) % model.config.num_classes  # never the prediction
    out_l = model(images, labels)
    torch.testing.assert_close(out_l.poses, out.poses, rtol=0, atol=0)
    torch.testing.assert_close(out_l.reconstructions, model.decoder(mask_capsules(out.poses, labels)), rtol=0, atol=0)
    assert not torch.allclose(out_l.reconstructions, out.reconstructions)
    torch.testing.assert_close(model.reconstruct(out.poses, labels), out_l.reconstructions, rtol=0, atol=0)


def test_mask_capsules_keeps_one_capsule_and_flattens():
    poses = torch.arange(2 * 3 * 4, dtype=torch.float64).reshape(2, 3, 4) + 1
    masked = mask_capsules(poses, torch.tensor([2, 0]))
    assert masked.shape == (2, 12)
    expected = torch.zeros(2, 3, 4, dtype=torch.float64)
    expected[0, 2], expected[1, 0] = poses[0, 2], poses[1, 0]
    torch.testing.assert_close(masked, expected.reshape(2, 12), rtol=0, atol=0)


def test_decode_masked_gives_each_image_its_own_k_capsules():
    """(B, K) indices decode image b from its own capsules k = 0..K-1, as K separate (B,) masks do; a transposed
    index (image 0 decoded from image 1's class) passed every test (mutation testing, 2026-12-02)."""
    from capsnet.models.capsnet import decode_masked

    torch.manual_seed(0)
    poses = torch.randn(3, 4, 2, dtype=torch.float64)
    index = torch.tensor([[0, 2], [1, 3], [3, 0]])
    out = decode_masked(torch.nn.Identity(), poses, index)  # the decoder's input itself: the masked capsules
    assert out.shape == (3, 2, 8)
    for k in range(2):
        torch.testing.assert_close(out[:, k], mask_capsules(poses, index[:, k]), rtol=0, atol=0)
    assert out[0, 1].view(4, 2)[2].equal(poses[0, 2]) and out[0, 1].view(4, 2)[[0, 1, 3]].eq(0).all()


def test_decoder_layout():
    dec = Decoder(160, (1, 28, 28))
    sizes = [(m.in_features, m.out_features) for m in dec.modules() if isinstance(m, torch.nn.Linear)]
    assert sizes == [(160, 512), (512, 1024), (1024, 784)]  # section 4.1
    out = dec(torch.randn(3, 160))
    assert out.shape == (3, 1, 28, 28) and ((out > 0) & (out < 1)).all()


@pytest.mark.parametrize("channels,height,width,grid", [(1, 36, 36, (10, 10)), (3, 32, 32, (8, 8)), (2, 28, 40, (6, 12))])
def test_other_input_sizes(channels, height, width, grid):
    model = _small(in_channels=channels, input_height=height, input_width=width)
    assert model.config.primary_grid == grid
    images = torch.rand(2, channels, height, width, dtype=torch.float64)
    out = model(images, torch.tensor([0, 9]))
    assert out.poses.shape == (2, 10, 6)
    assert out.coupling.shape == (2, 4 * grid[0] * grid[1], 10)
    assert out.reconstructions.shape == (2, channels, height, width)
    assert all(torch.isfinite(t).all() for t in out)


def test_without_decoder():
    model = _small(decoder=False)
    out = model(torch.rand(2, 1, 28, 28, dtype=torch.float64))
    assert out.reconstructions is None and model.decoder is None
    with pytest.raises(RuntimeError, match="decoder"):
        model.reconstruct(out.poses, torch.tensor([0, 1]))


@pytest.mark.parametrize("kw", [
    dict(input_height=16, input_width=16),  # conv1 gives 8x8, smaller than the 9x9 primary kernel
    dict(input_height=28, input_width=16),
    dict(input_height=5, input_width=5),  # smaller than conv1's kernel
])
def test_too_small_input_is_rejected_clearly(kw):
    with pytest.raises(ValueError, match="too small") as info:
        CapsNetConfig(**kw)
    assert f"{kw['input_height']}x{kw['input_width']}" in str(info.value)


def test_smallest_input_that_fits():
    cfg = CapsNetConfig(input_height=17, input_width=17)
    assert cfg.primary_grid == (1, 1) and cfg.num_primary == 32


@pytest.mark.parametrize("images_shape", [(2, 1, 28, 27), (2, 3, 28, 28), (2, 784), (1, 28, 28)])
def test_forward_rejects_wrong_image_shape(images_shape):
    model = _small()
    with pytest.raises(ValueError, match=r"\(B, 1, 28, 28\)"):
        model(torch.zeros(images_shape, dtype=torch.float64))


@pytest.mark.parametrize("field,value", [("routing_iterations", 0), ("num_classes", -1), ("digit_dim", 1.5),
                                         ("conv1_channels", True)])
def test_config_rejects_bad_values(field, value):
    with pytest.raises(ValueError, match=field):
        CapsNetConfig(**{field: value})


def test_config_round_trip():
    cfg = CapsNetConfig(input_height=36, input_width=36, leaky_routing=True, decoder_hidden=(64, 128), routing_iterations=2)
    d = cfg.to_dict()
    assert json.loads(json.dumps(d)) == d  # plain JSON, for checkpoints
    back = CapsNetConfig.from_dict(json.loads(json.dumps(d)))
    assert back == cfg and isinstance(back.decoder_hidden, tuple)
    assert CapsNetConfig.from_dict(CapsNetConfig().to_dict()) == CapsNetConfig()
    assert CapsNetConfig.from_dict({}) == CapsNetConfig()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_config_round_trips_through_json(name):
    # A checkpoint stores the config as JSON, so tuple fields come back as lists and must become tuples again.
    cfg = MODELS[name].config()
    text = json.dumps(cfg.to_dict())
    back = MODELS[name].config.from_dict(json.loads(text))
    assert back == cfg and type(back) is type(cfg) and json.dumps(back.to_dict()) == text
    assert all(not isinstance(v, tuple) for v in cfg.to_dict().values())


def test_config_from_dict_rejects_unknown_keys_by_name():
    with pytest.raises(ValueError, match="unknown") as info:
        CapsNetConfig.from_dict({"routing_iterations": 3, "iters": 2, "dropout": 0.1})
    assert "iters" in str(info.value) and "dropout" in str(info.value)


def test_a_subclassed_config_reads_a_saved_run_with_its_bases_old_values_as_well_as_its_own():
    from dataclasses import dataclass

    from capsnet._config import JsonConfig

    @dataclass(frozen=True)
    class Base(JsonConfig):
        a: int = 1  # added later; runs saved before it did what a = 0 does
        b: str = "new"
        _SAVED_BEFORE = {"a": 0}

    @dataclass(frozen=True)
    class Child(Base):
        b: str = "newer"  # changed later still, in the subclass alone
        c: float = 2.0
        _SAVED_BEFORE = {"b": "old", "c": 0.5}

    assert Child.from_saved({}) == Child(a=0, b="old", c=0.5)  # the base's entry holds for the subclass too
    assert Child.from_saved({"a": 3, "c": 1.0}) == Child(a=3, b="old", c=1.0)  # recorded values win
    assert Base.from_saved({}) == Base(a=0, b="new")  # a subclass's entries stay its own
    assert Child.from_dict({}) == Child(a=1, b="newer", c=2.0)  # a fresh config: today's defaults


def test_create_model_unknown_name_lists_valid_names():
    with pytest.raises(ValueError) as info:
        create_model("no-such-model")
    assert "no-such-model" in str(info.value)
    for name in MODELS:
        assert name in str(info.value)


def test_create_model_passes_config_and_rejects_unknown_fields():
    model = create_model("capsnet", **SMALL, input_height=36, input_width=36)
    assert isinstance(model, CapsNet) and model.config.input_height == 36 and model.config.primary_grid == (10, 10)
    with pytest.raises(ValueError, match="bogus"):
        create_model("capsnet", bogus=1)


@pytest.mark.parametrize("name", sorted(n for n, spec in MODELS.items() if issubclass(spec.build, CapsNet)))
def test_every_registered_capsule_model_runs_and_trains(name):  # the CNN baseline: tests/test_baseline.py
    torch.manual_seed(3)
    model = create_model(name, **SMALL)
    cfg = model.config
    images = torch.rand(2, cfg.in_channels, cfg.input_height, cfg.input_width)
    labels = torch.tensor([1, 4])
    out = model(images, labels)
    assert all(torch.isfinite(t).all() for t in out if t is not None)
    loss = margin_loss(out.lengths, labels)
    if out.reconstructions is not None:  # capsnet-cifar10 has none, as the authors trained it
        loss = loss + reconstruction_loss(out.reconstructions, images)
    loss.backward()
    for n, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, n
    assert MODELS[name][0].from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("overrides", [{}, {"input_height": 32, "input_width": 48}])
def test_num_weights_counts_what_the_model_holds(name, overrides):
    # The count is checked against the size limit before anything is allocated, so it must be exact.
    small = {"capsnet": dict(conv1_channels=8, primary_types=2, decoder_hidden=(16, 32)),
             "baseline": dict(channels=(4, 4), hidden=(8,)), "capspix2pix": dict(noise_dim=8, disc_channels=4),
             "pix2pix": dict(base_channels=4, disc_channels=4)}.get(name, {})
    for extra in ({}, {"routing_bias": False, "decoder": not MODELS[name].config().decoder}
                  if name.startswith("capsnet") else {}):
        cfg = MODELS[name].config(**small, **overrides, **extra)
        assert num_weights(cfg) == sum(p.numel() for p in MODELS[name].build(cfg).parameters())


def test_configs_refuse_too_many_weights_before_allocating():
    with pytest.raises(ValueError, match=r"would hold 11,062,159,792 weights, more than 2,147,483,648"):
        CapsNetConfig(primary_types=4096, conv1_channels=4096)


def _truncated_normal_std(std: float) -> float:
    """The standard deviation of N(0, std^2) truncated at +-2 std (TensorFlow's truncated_normal_initializer)."""
    from math import erf, exp, pi, sqrt
    z = 2.0
    mass = erf(z / sqrt(2))  # P(|x| < 2 std)
    density = exp(-z * z / 2) / sqrt(2 * pi)
    return std * sqrt(1 - 2 * z * density / mass)  # 0.8796 std


def test_authors_init_starts_every_layer_as_the_authors_code():
    torch.manual_seed(0)
    model = CapsNet(CapsNetConfig(init="authors"))
    layers = [(model.conv1.weight, model.conv1.bias, 0.05), (model.primary.conv.weight, model.primary.conv.bias, 0.1),
              (model.digits.weight, model.digits.bias, 0.1)]
    layers += [(m.weight, m.bias, 0.1) for m in model.decoder.net if isinstance(m, torch.nn.Linear)]
    assert len(layers) == 6
    for weight, bias, std in layers:
        assert weight.abs().max() <= 2 * std  # truncated at 2 standard deviations
        assert weight.std().item() == pytest.approx(_truncated_normal_std(std), rel=0.05 if weight.numel() > 2e4 else 0.15)
        assert weight.mean().abs().item() < 0.1 * std
        assert torch.equal(bias, torch.full_like(bias, 0.1))
    assert model.primary.out_scale == pytest.approx(1 / 32)
    assert CapsNet(CapsNetConfig()).primary.out_scale == 1.0  # the default is PyTorch's start, unscaled
    # with leaky routing the authors' code routes the primary capsules leakily too: one more zero logit
    leaky = CapsNetConfig(init="authors", leaky_routing=True, conv1_channels=8, primary_types=4)
    assert CapsNet(leaky).primary.out_scale == pytest.approx(1 / 5)


def test_authors_primary_capsules_are_the_convolution_over_the_types_plus_the_bias():
    # the authors' code makes the primary capsules by one routing round over the 32 types with zero logits: each
    # type's votes times 1/32, then the bias, then the squash; computed here from the weights, not through the layer
    from capsnet.ops import squash
    torch.manual_seed(0)
    model = CapsNet(CapsNetConfig(init="authors", conv1_channels=16, primary_types=4)).double()
    h = torch.rand(2, 16, 20, 20, dtype=torch.float64)
    conv = model.primary.conv
    pre = torch.nn.functional.conv2d(h, conv.weight, stride=2) / 4 + conv.bias.view(1, -1, 1, 1)  # (2, 4*8, 6, 6)
    expected = squash(pre.view(2, 4, 8, 6, 6).permute(0, 1, 3, 4, 2).reshape(2, 4 * 36, 8))
    torch.testing.assert_close(model.primary(h), expected)
    # the same function as an unscaled layer holding weight / 4: only the parametrisation differs
    plain = CapsNet(CapsNetConfig(conv1_channels=16, primary_types=4)).double()
    plain.primary.conv.weight.data.copy_(conv.weight / 4)
    plain.primary.conv.bias.data.copy_(conv.bias)
    torch.testing.assert_close(plain.primary(h), expected)


def test_init_is_checked_and_saved_with_the_config():
    with pytest.raises(ValueError, match="init"):
        CapsNetConfig(init="xavier")
    cfg = CapsNetConfig(init="authors")
    assert CapsNetConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    old = CapsNetConfig().to_dict()
    del old["init"]  # a checkpoint from before the option: PyTorch's start, as then
    assert CapsNetConfig.from_saved(old).init == "torch"


# ------------------------------------------------------------------ the digit capsules' routing, by name


@pytest.mark.parametrize("routing", CapsNetConfig.probability_routings())
def test_capsnet_trains_with_every_routing_whose_activations_are_probabilities(routing):
    """``CapsNetConfig.routing`` reaches the registry: the layer's sizes go to the routing, the weights are counted
    before building, every weight (the routing's own too) gets a gradient, and an image's output does not depend on
    its batch."""
    torch.manual_seed(6)
    cfg = CapsNetConfig(**SMALL, routing=routing, routing_iterations=2 if routing_takes(routing, "iterations") else 3)
    model = CapsNet(cfg)
    assert isinstance(model.digits.routing, ROUTINGS[routing])
    assert cfg.num_weights == _count(model)
    images, labels = torch.rand(3, 1, 28, 28), torch.tensor([1, 4, 7])
    out = model(images, labels)
    assert out.poses.shape == (3, 10, 6) and out.lengths.shape == (3, 10) and out.coupling.shape == (3, 144, 10)
    assert ((out.lengths >= 0) & (out.lengths <= 1)).all()
    loss = margin_loss(out.lengths, labels) + reconstruction_loss(out.reconstructions, images)
    loss.backward()
    for n, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, (routing, n)
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(images[1:2]).lengths[0], model(images).lengths[1])
    model.train()
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the speed path for GPUs: finite, and so are the gradients
        half = model(images, labels)
        loss = margin_loss(half.lengths.float(), labels) + reconstruction_loss(half.reconstructions.float(), images)
    model.zero_grad()
    loss.backward()
    assert torch.isfinite(half.lengths.float()).all() and all(torch.isfinite(p.grad).all() for p in model.parameters())
    model.eval()
    view = model.routing_view(images)
    assert view.rounds.shape[-2:] == (144, 10)
    assert view.rounds.shape[1] == (2 if routing_takes(routing, "iterations") else 1)
    assert MODELS["capsnet"].config.from_dict(cfg.to_dict()) == cfg


def test_em_routed_capsnet_weighs_the_votes_by_the_primary_capsules_lengths_and_has_no_pose_bias():
    torch.manual_seed(7)
    model = CapsNet(CapsNetConfig(**SMALL, routing="em"))
    assert model.digits.bias is None and not model.config.pose_bias and model.config.routing_bias
    u = model.primary_capsules(torch.rand(2, 1, 28, 28))
    expected = model.digits.routing(model.digits.votes(u), u.norm(dim=-1))
    torch.testing.assert_close(model.digits(u, model._presence(u)).activations, expected.activations)
    assert not torch.allclose(model.digits.routing(model.digits.votes(u), None).activations, expected.activations)


@pytest.mark.parametrize("overrides,message", [
    (dict(routing="inverted"), "inverted routing's activations are not probabilities in \\[0, 1\\].*use one of "
                               f"{CAPSNET}, or a model"),
    (dict(routing="em", leaky_routing=True), "leaky_routing is an option of dynamic routing; em routing does not"),
    (dict(routing="self-attention", detach_agreement=True), "detach_agreement is an option of dynamic routing"),
    (dict(routing="self-attention", routing_iterations=2), "CapsNetConfig.routing_iterations sets the rounds of a "
                                                           "routing that iterates; self-attention routing makes one "
                                                           "pass: leave it at 3"),
    (dict(routing="em", routing_bias=False), r"routing_bias: em routing's digit capsules have no pose bias .* \(drop "
                                              r"--no-routing-bias"),
    (dict(routing="nope"), f"routing must be one of {ALL}, got 'nope'"),
    (dict(routing=3), "routing must be a string"),
    (dict(routing="em", routing_options={"bogus": 1}), "routing_options {'beta_a_init': -25.0, 'bogus': 1}: em routing "
                                                       "takes no option bogus; its options are beta_a_init, "),
    (dict(routing="em", routing_options={"final_lambda": -1}), "final_lambda must be a positive finite number, got -1"),
    (dict(routing="em", routing_options={"final_lambda": "x"}),
     r"em routing's option final_lambda takes a number \(its default: 0.01\), got 'x'"),
    (dict(routing="em", routing_options={"final_lambda": -1}), "final_lambda must be a positive finite number, got -1"),
    # the M-step's mass floor is gone (its weights are exact, 2026-12-01): named, not ignored
    (dict(routing="em", routing_options={"eps": 1e-6}), "em routing takes no option eps; its options are "),
    (dict(routing="em", routing_options={"detach_routing": "false"}),
     r"em routing's option detach_routing takes true or false \(its default: False\), got 'false'"),
    (dict(routing_options={"iterations": 2}),
     r"routing_options: iterations is set by routing_iterations \(--routing-iterations\), not here"),
    # accepted and ignored before: CapsNet's votes share no children
    (dict(routing="em", routing_options={"child_norm": "type"}), r"routing_options: child_norm changes nothing here: "
                                                                 r"CapsNet's digit capsules share no child .*; leave"),
    (dict(routing_options={"leaky": True}),
     r"routing_options: leaky is set by leaky_routing \(--leaky-routing\), not here"),
    (dict(routing_options=[["leaky", True]]), "routing_options must be a JSON object"),
    (dict(routing_options={"x": [1]}), "routing_options must be a JSON object of named numbers"),
    (dict(digit_init_std=-0.1), "digit_init_std must be in 1e-06..100, got -0.1"),
    (dict(digit_init_std=0.0), "digit_init_std must be in 1e-06..100, got 0.0"),
    (dict(routing="self-attention", input_height=10, input_width=10), "input 10x10 is too small for conv1 9x9"),
])
def test_capsnet_config_refuses_a_routing_it_cannot_train_by_name(overrides, message):
    with pytest.raises(ValueError, match=message):
        CapsNetConfig(**overrides)


def test_a_capsnet_saved_with_rounds_its_one_pass_routing_never_used_still_loads():
    """The rounds refused above read back at their default from a run saved before they were refused."""
    assert CapsNetConfig.from_saved({"routing": "self-attention", "routing_iterations": 2}).routing_iterations == 3
    assert CapsNetConfig.from_saved({"routing": "em", "routing_iterations": 2}).routing_iterations == 2  # EM iterates


def test_capsnet_starts_em_routing_as_routing_starts_says_and_the_config_overrides_it():
    from capsnet.models.capsnet import ROUTING_STARTS

    torch.manual_seed(8)
    options, std = ROUTING_STARTS["em"]
    model = CapsNet(CapsNetConfig(**SMALL, routing="em"))
    assert model.digits.routing.beta_a.eq(options["beta_a_init"]).all()
    assert abs(model.digits.weight.std().item() - std) < 0.05 * std  # 576 x 60 draws: within 5%
    cfg = CapsNetConfig(**SMALL, routing="em", routing_options={"beta_a_init": 0, "final_lambda": 0.02},
                        digit_init_std=0.01)
    model = CapsNet(cfg)
    assert model.digits.routing.beta_a.eq(0).all() and model.digits.routing.final_lambda == 0.02
    assert abs(model.digits.weight.std().item() - 0.01) < 0.0005
    assert CapsNetConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg  # a checkpoint's config.json
    # the start is written into the config (a saved run says how it started, whatever the table says later)
    assert CapsNetConfig(routing="em").to_dict()["routing_options"] == options
    assert CapsNetConfig(routing="em").to_dict()["digit_init_std"] == std
    assert CapsNetConfig().to_dict()["routing_options"] == {} and CapsNetConfig().digit_init_std is None
    assert abs(CapsNet(CapsNetConfig(**SMALL, init="authors", digit_init_std=0.5)).digits.weight.std().item()
               - 0.5 * 0.8796) < 0.03  # truncated at 2 standard deviations
    # dynamic routing keeps the paper's start
    assert abs(CapsNet(CapsNetConfig(**SMALL)).digits.weight.std().item() - 0.01) < 0.0005


def test_capsnet_configs_hash_and_keep_their_own_routing_options():
    """routing_options is a dict: the frozen configs could no longer be hashed (set members, dict keys), and the
    caller's dict, changed after the config was made, changed the config past its checks."""
    from capsnet.models import CapsNetCifar10Config, CapsNetSvhnConfig

    options = {"final_lambda": 0.02}
    cfg = CapsNetConfig(routing="em", routing_options=options)
    options["final_lambda"] = -1.0
    assert cfg.routing_options == {"beta_a_init": -25.0, "final_lambda": 0.02}  # the start written in, not -1
    assert len({cfg, CapsNetConfig(routing="em", routing_options={"final_lambda": 0.02}), CapsNetConfig()}) == 2
    assert hash(CapsNetCifar10Config()) == hash(CapsNetCifar10Config()) and hash(CapsNetSvhnConfig()) == hash(
        CapsNetSvhnConfig())


def test_every_registered_models_config_hashes_and_equal_configs_hash_alike():
    """A frozen dataclass subclass writes its own field-tuple hash, which a dict field (routing_options) breaks,
    unless it is given its parent's: three subclasses lost theirs so far. Every registry entry's config, checked."""
    from capsnet.models import MODELS

    for name, spec in MODELS.items():
        assert hash(spec.config()) == hash(spec.config()), name


def test_a_routing_added_to_the_registry_reaches_capsnet_with_no_other_change(monkeypatch):
    """DESIGN.md's promise for an outsider: one module and one registry line, and CapsNet trains with it."""
    from torch import nn

    from capsnet.ops import squash
    from capsnet.routing import RoutingResult

    class MeanRouting(nn.Module):  # every child coupled equally, one learned gain per parent
        def __init__(self, in_caps: int, out_caps: int) -> None:
            super().__init__()
            self.in_caps = in_caps
            self.gain = nn.Parameter(torch.ones(out_caps))

        def forward(self, votes, activations=None, bias=None, *, record=False):
            s = votes.mean(dim=1) * self.gain[:, None] + (0 if bias is None else bias)
            v = squash(s)
            c = votes.new_full(votes.shape[:3], 1.0 / votes.shape[2])
            return RoutingResult(v, v.norm(dim=-1), c, c.unsqueeze(1) if record else None)

    monkeypatch.setitem(ROUTINGS, "toy-mean", MeanRouting)  # (not "mean": a user's may be registered)
    cfg = CapsNetConfig(**SMALL, routing="toy-mean")
    model = CapsNet(cfg)
    assert model.digits.routing.in_caps == cfg.num_primary and cfg.num_weights == _count(model)
    images, labels = torch.rand(2, 1, 28, 28), torch.tensor([0, 3])
    out = model(images, labels)
    margin_loss(out.lengths, labels).backward()
    assert model.digits.routing.gain.grad.abs().sum() > 0
    assert "toy-mean" in CapsNetConfig.probability_routings()


@pytest.mark.parametrize("name", ["capsnet", "efficient-capsnet"])
def test_labels_outside_the_classes_are_refused_by_name_not_by_one_hot(name):
    """A label past the last class or below 0, given to the forward for the decoder's mask: one_hot's bare
    RuntimeError ('Class values must be smaller than num_classes.') named neither the range nor the labels."""
    model = create_model(name, **({"conv1_channels": 8, "primary_types": 2} if name == "capsnet" else {}))
    images = torch.rand(3, 1, 28, 28)
    for labels, got in (([1, 2, 10], "from 1 to 10"), ([-1, 2, 3], "from -1 to 3")):
        with pytest.raises(ValueError, match=f"class labels must be in 0..9 for 10 class capsules, got values {got}"):
            model(images, torch.tensor(labels))
    assert model(images, torch.tensor([0, 9, 5])).reconstructions.shape == (3, 1, 28, 28)


@pytest.mark.parametrize("name", ["capsnet", "efficient-capsnet", "em-capsnet-small", "inverted-capsnet"])
def test_routing_view_and_reconstruct_check_their_inputs_as_forward_does(name):
    """A review of the Python API (2026-12-02): routing_view skipped forward's image check (a 32x32 image into a
    28x28 CapsNet met "expected lower capsules (B, 72, 8), got (2, 128, 8)" from inside, bytes torch's dtype
    error); reconstruct took float class indices (2.7 decoded class 2) and met "mat1 and mat2 shapes cannot be
    multiplied" for capsules of the wrong shape."""
    from capsnet.models.capsnet import mask_capsules

    model = create_model(name).eval()
    C, H, W = model.config.in_channels, model.config.input_height, model.config.input_width
    with pytest.raises(ValueError, match=rf"expected images \(B, {C}, {H}, {W}\), got \(2, {C}, {H + 4}, {W + 4}\)"):
        model.routing_view(torch.rand(2, C, H + 4, W + 4))
    with pytest.raises(ValueError, match="images are torch.uint8; the models take floating-point images"):
        model.routing_view(torch.ones(2, C, H, W, dtype=torch.uint8))
    assert model.routing_view(torch.rand(2, C, H, W)).rounds.shape[0] == 2  # and the right images still work
    if not hasattr(model, "reconstruct"):
        return
    J, D = model.config.num_classes, model.digits.out_dim
    with pytest.raises(ValueError, match=rf"poses must be the class capsules \(B, {J}, {D}\) \(the model's "
                                         rf"output.poses\), got \(2, 5, {D}\)"):
        model.reconstruct(torch.rand(2, 5, D), torch.tensor([0, 1]))
    for index in (torch.tensor([0.0, 2.7]), torch.tensor([True, False])):
        with pytest.raises(ValueError, match=f"labels are {index.dtype}; give class indices as integers"):
            model.reconstruct(torch.rand(2, J, D), index)
        with pytest.raises(ValueError, match=f"labels are {index.dtype}"):
            mask_capsules(torch.rand(2, J, D), index)
    assert model.reconstruct(torch.rand(2, J, D), torch.tensor([0, J - 1])).shape == (2, C, H, W)


def test_a_model_class_and_the_decoder_name_a_config_or_size_of_the_wrong_kind():
    """A review of the Python API (2026-12-02): CapsNet(None), a dict or another model's config met "'NoneType'
    object has no attribute 'in_channels'" from inside; Decoder(0, ...) built zero-width layers (torch only warned)
    and an out_shape of (28, 28) met "not enough values to unpack"."""
    from capsnet.models import SegCaps
    from capsnet.models.baseline import BaselineCNNConfig

    for config, got in ((None, "got NoneType"), ({"num_classes": 5}, r"got a dict: CapsNetConfig\(\*\*d\) builds"),
                        (BaselineCNNConfig(), "got BaselineCNNConfig"),
                        (CapsNetConfig, r"got the class CapsNetConfig itself: pass an instance, "
                                        r"CapsNetConfig\(\.\.\.\)")):
        with pytest.raises(TypeError, match=f"CapsNet takes a CapsNetConfig, {got}"):
            CapsNet(config)
    with pytest.raises(TypeError, match="SegCaps takes a SegCapsConfig, got CapsNetConfig"):
        SegCaps(CapsNetConfig())
    assert isinstance(SegCaps(create_model("segcaps-r1").config), SegCaps)  # a subclass's config is taken
    for args, message in (((0, (1, 28, 28)), "in_features must be a positive integer, got 0"),
                          ((16, (1, 28, 28), (0,)), "each hidden layer's width must be a positive integer, got 0"),
                          ((16, (28, 28)), r"out_shape must be the image's \(C, H, W\), e.g. \(1, 28, 28\), got "
                                           r"\(28, 28\)"),
                          ((16, (1, 0, 28)), "out_shape's height must be a positive integer, got 0")):
        with pytest.raises(ValueError, match=message):
            Decoder(*args)
    assert Decoder(16, (1, 4, 4), hidden=(8,))(torch.rand(2, 16)).shape == (2, 1, 4, 4)
