"""Every registered model, through its registry entry: finite, trainable, batch-independent, counted."""
from __future__ import annotations

import pytest
import torch

from capsnet.models import MODELS, create_model, model_name

CLASSIFIERS = [n for n, spec in MODELS.items() if spec.kind == "classification"]  # segmentation: test_models_segmentation

# Small sizes so each test runs in a moment; a new model adds its entry (the first test insists).
SMALL = {
    "capsnet": dict(conv1_channels=8, primary_types=2, decoder_hidden=(16, 32)),
    "capsnet-cifar10": dict(conv1_channels=8, primary_types=2, in_channels=1),  # the tests here feed 1x28x28
    "capsnet-svhn": dict(conv1_channels=8, primary_types=2, in_channels=1, decoder_hidden=(16, 32)),
    "baseline": dict(channels=(4, 4), hidden=(8,)),
    "em-capsnet": dict(conv1_channels=8, primary_types=4, caps1_types=4, caps2_types=4),
    "em-capsnet-small": dict(conv1_channels=8, primary_types=2, caps1_types=4, caps2_types=4),
    "efficient-capsnet": dict(decoder_hidden=(16, 32)),
    "inverted-capsnet": dict(backbone_channels=8, primary_types=4, caps_types=4),
    "segcaps": {}, "segcaps-r1": {}, "unet": dict(base_channels=4, depth=2),
    "capspix2pix": dict(noise_dim=8, disc_channels=4), "capspix2pix-deep": dict(noise_dim=8, disc_channels=4),
    "pix2pix": dict(base_channels=4, disc_channels=4),
}


def test_every_registered_model_has_small_sizes_here():
    assert set(SMALL) == set(MODELS)


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_registered_model_trains_through_its_own_loss(name):
    torch.manual_seed(0)
    model = create_model(name, **SMALL[name], num_classes=10, input_height=28, input_width=28)
    assert model_name(model.config) == name and MODELS[name].config.from_dict(model.config.to_dict()) == model.config
    images, labels = torch.rand(4, 1, 28, 28), torch.tensor([0, 3, 3, 9])
    loss, scores = MODELS[name].loss(model, images, labels, recon_weight=0.0005, progress=0.5)
    assert scores.shape == (4, 10) and torch.isfinite(scores).all() and torch.isfinite(loss)
    loss.backward()
    for n, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, n
    assert model.config.num_weights == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_registered_model_scores_an_example_the_same_in_any_batch(name):
    torch.manual_seed(1)
    model = create_model(name, **SMALL[name], num_classes=10, input_height=28, input_width=28).eval()
    images = torch.rand(5, 1, 28, 28)
    with torch.no_grad():
        _, together = MODELS[name].loss(model, images, torch.zeros(5, dtype=torch.long), recon_weight=0.0)
        for k in (0, 3):
            _, alone = MODELS[name].loss(model, images[k:k + 1], torch.zeros(1, dtype=torch.long), recon_weight=0.0)
            torch.testing.assert_close(alone[0], together[k], rtol=1e-4, atol=1e-6)


# the slowest two to trace are slow tests: em-capsnet-small has em-capsnet's layers, and test_fast_paths.py trains
# the CapsNet compiled
COVERED_ELSEWHERE = {"em-capsnet", "capsnet"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in COVERED_ELSEWHERE else n
                                  for n in CLASSIFIERS])
def test_registered_model_compiles_as_one_graph_and_trains_as_eager(name):
    # capsnet train --compile MODE: the training step as one graph (fullgraph fails on any graph break, which CUDA
    # graphs, --compile reduce-overhead, could not take whole), with eager's loss and gradients. aot_eager traces
    # forward and backward as Inductor does, without its C++ build (Inductor itself: the slow tests of
    # test_fast_paths.py and test_models_segmentation.py)
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = create_model(name, **SMALL[name], num_classes=10, input_height=28, input_width=28)
    images, labels = torch.rand(4, 1, 28, 28), torch.tensor([0, 3, 3, 9])
    results = []
    for call in (model, torch.compile(model, backend="aot_eager", fullgraph=True, dynamic=False)):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(1)  # the same dropout masks (the baseline's) for both
        loss, scores = MODELS[name].loss(call, images, labels, recon_weight=0.0005, progress=0.5)
        loss.backward()
        results.append((loss.detach(), scores.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (loss0, scores0, grads0), (loss1, scores1, grads1) = results
    torch.testing.assert_close(loss1, loss0, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(scores1, scores0, rtol=1e-5, atol=1e-6)
    for n in grads0:
        torch.testing.assert_close(grads1[n], grads0[n], rtol=1e-4, atol=1e-6, msg=n)
