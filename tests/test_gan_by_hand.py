"""The GAN loop, one GAN step and the synthesis metrics against computations written out here (each test was
written after mutation testing, 2026-11-30, found a change of the code that no test noticed: D's betas, the epoch
record's keys and weights, the best epoch's rule, the spread's seeds, the IoU's cut)."""
from __future__ import annotations

import copy
import json
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from capsnet import gan, synthesis
from capsnet.data.tasks import load_test
from capsnet.evaluate import load_model
from capsnet.gan import fit_gan, gan_step, make_optimizers
from capsnet.models import Pix2pixConfig, create_model
from capsnet.synthesis import evaluate_synthesis, generate
from capsnet.train import TrainConfig


TINY = TrainConfig(dataset="mnist-skeleton", epochs=1, batch_size=8, train_size=16, test_size=4, lr=2e-4)
SMALL = Pix2pixConfig(base_channels=4, disc_channels=4)  # the loop's bookkeeping is the same for every generator


def test_both_optimizers_take_the_models_betas():
    model = create_model("pix2pix", base_channels=4, disc_channels=4)
    og, od = make_optimizers(model, TINY)
    assert og.param_groups[0]["betas"] == od.param_groups[0]["betas"] == (0.5, 0.999)
    assert og.param_groups[0]["lr"] == od.param_groups[0]["lr"] == TINY.lr


def test_the_epoch_record_is_the_batch_size_weighted_mean_of_each_steps_figures(tmp_path, data_root, monkeypatch):
    steps = []
    real_step = gan.gan_step

    def recording(model, opt_g, opt_d, labels, real, z, *a, **k):
        d, g, dp, gp = real_step(model, opt_g, opt_d, labels, real, z, *a, **k)
        steps.append((len(real), {"d": d.item(), "g": g.item(), "l1": gp["l1"].item(), "d_real": dp["d_real"].item(),
                                  "d_fake": dp["d_fake"].item(), "fake_std": gp["fake_std"].item(),
                                  "real_std": gp["real_std"].item(), "fake_edge": gp["fake_edge"].item(),
                                  # independently: D's mean probabilities on this step's real/fake pairs are in (0, 1)
                                  }))
        return d, g, dp, gp

    monkeypatch.setattr(gan, "gan_step", recording)
    cfg = replace(TINY, train_size=20)  # batches of 8, 8 and 4: unequal
    rec = fit_gan(SMALL, cfg, tmp_path / "r", device="cpu", data_root=data_root, progress=False)
    assert [n for n, _ in steps] == [8, 8, 4]
    N = sum(n for n, _ in steps)

    def mean(key):
        return sum(n * s[key] for n, s in steps) / N

    for key, name in (("d", "train_d_loss"), ("g", "train_g_loss"), ("l1", "train_l1"), ("d_real", "train_d_real"),
                      ("d_fake", "train_d_fake"), ("fake_std", "train_fake_std"), ("real_std", "train_real_std"),
                      ("fake_edge", "train_fake_edge")):
        assert rec[name] == pytest.approx(mean(key), rel=1e-6), name
    # and what they are: D's loss is half its BCE on real (target 0.9) and fake (target 0.1), so with the
    # recorded probabilities the real one is the larger early on: the keys are not swapped
    record = json.loads((tmp_path / "r" / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["train_d_real"] == rec["train_d_real"] and record["train_d_fake"] == rec["train_d_fake"]


def test_best_safetensors_is_the_epoch_of_the_highest_held_out_ssim(tmp_path, data_root, monkeypatch):
    from capsnet.checkpoint import load_checkpoint
    from capsnet.synthesis import SynthesisResult

    scripted = iter([SynthesisResult(l1=0.10, ssim=0.5, iou=0.5, spread=0.1),
                     SynthesisResult(l1=0.05, ssim=0.7, iou=0.6, spread=0.1),  # the best SSIM (and the best L1)
                     SynthesisResult(l1=0.30, ssim=0.6, iou=0.9, spread=0.1)])  # the worst L1, best IoU
    monkeypatch.setattr(synthesis, "evaluate_synthesis", lambda *a, **k: {"": next(scripted)})
    fit_gan(SMALL, replace(TINY, epochs=3), tmp_path / "r", device="cpu", data_root=data_root,
            progress=False)
    best = load_checkpoint(tmp_path / "r", "best")
    assert best.state["best"] == {"epoch": 2, "accuracy": 0.7, "split": "test"} and best.state["epoch"] == 2
    records = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [r["test_ssim"] for r in records] == [0.5, 0.7, 0.6]


def test_one_gan_step_is_the_reference_pix2pix_step():
    torch.manual_seed(0)
    model = create_model("pix2pix", base_channels=4, disc_channels=4).train()
    ref = copy.deepcopy(model)
    cfg = TrainConfig(dataset="mnist-skeleton", lr=2e-4)
    og, od = make_optimizers(model, cfg)
    g = torch.Generator().manual_seed(1)
    labels = (torch.rand(3, 1, 32, 32, generator=g) > 0.7).float()
    real = torch.rand(3, 1, 32, 32, generator=g) * torch.tensor([0.2, 0.6, 1.0]).view(3, 1, 1, 1)  # unlike levels
    z = torch.randn(3, getattr(model.config, "noise_dim", 0), generator=g)

    torch.manual_seed(5)
    d_loss, g_loss, d_parts, g_parts = gan_step(model, og, od, labels, real, z)

    rog = torch.optim.Adam(ref.generator.parameters(), lr=2e-4, betas=(0.5, 0.999))
    rod = torch.optim.Adam(ref.discriminator.parameters(), lr=2e-4, betas=(0.5, 0.999))
    torch.manual_seed(5)
    fake = ref.generator(labels, z)
    rl, fl = ref.discriminator(real, labels), ref.discriminator(fake.detach(), labels)
    d = 0.5 * (F.binary_cross_entropy_with_logits(rl, torch.full_like(rl, 0.9))
               + F.binary_cross_entropy_with_logits(fl, torch.full_like(fl, 0.1)))
    rod.zero_grad(); d.backward(); rod.step()
    gl_logits = ref.discriminator(fake, labels)  # the updated D
    l1 = (fake - real).abs().mean()
    gl = F.binary_cross_entropy_with_logits(gl_logits, torch.ones_like(gl_logits)) + 100.0 * l1
    rog.zero_grad(); gl.backward(); rog.step()

    assert d_loss.item() == pytest.approx(d.item(), rel=1e-5)
    assert g_loss.item() == pytest.approx(gl.item(), rel=1e-5)
    assert g_parts["l1"].item() == pytest.approx(l1.item(), rel=1e-6)
    assert d_parts["d_real"].item() == pytest.approx(torch.sigmoid(rl).mean().item(), rel=1e-6)
    assert d_parts["d_fake"].item() == pytest.approx(torch.sigmoid(fl).mean().item(), rel=1e-6)
    f = fake.detach().double()
    per_image_sd = lambda x: x.flatten(1).std(1).mean().item()  # noqa: E731 (sample sd per image, then the mean)
    assert g_parts["fake_std"].item() == pytest.approx(per_image_sd(f), rel=1e-5)
    assert g_parts["real_std"].item() == pytest.approx(per_image_sd(real.double()), rel=1e-5)
    assert g_parts["fake_edge"].item() == pytest.approx(torch.minimum(f, 1 - f).mean().item(), rel=1e-5)
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-7, msg=n)


def _iou(a, b):  # (N, H, W) bool -> (N,), 1 where both empty
    inter = (a & b).reshape(len(a), -1).sum(1)
    union = (a | b).reshape(len(a), -1).sum(1)
    return np.where(union == 0, 1.0, inter / np.maximum(union, 1))


def test_spread_iou_and_the_draws_follow_their_documented_rules(gan_run, data_root, monkeypatch):
    model, _ = load_model(gan_run)
    split = load_test("mnist-skeleton", size=6, root=data_root, progress=False)
    monkeypatch.setattr(synthesis, "SPREAD_SIZE", 4)  # the spread and the draws on the first 4 of the 6
    monkeypatch.setattr(synthesis, "SPREAD_SEEDS", 3)  # seeds 0, 1 and 2 (8 in use)
    r = evaluate_synthesis(model, split, batch_size=4)[""]
    draws = np.stack([generate(model, split.images, seed=s).numpy() for s in range(3)])  # (3, 6, 1, 32, 32)
    real = split.components.numpy().astype(np.float64)
    # spread: per-pixel sample sd over the seeds (seed 0 included) of the first 4 maps, mean over pixels,
    # then over the maps
    assert r.spread == pytest.approx(draws[:, :4].astype(np.float64).std(axis=0, ddof=1).mean(), rel=1e-6)
    # the draws' L1: each seed's mean over the first 4 maps, averaged over the seeds
    assert r.l1_draws == pytest.approx(np.mean([np.abs(d[:4] - real[:4]).mean() for d in draws]), rel=1e-6)
    # seed 0's L1 over all 6
    assert r.l1 == pytest.approx(np.abs(draws[0] - real).mean(), rel=1e-6)
    # IoU of the shapes above half intensity (mean over channels), generated against real
    fake_shape, real_shape = draws[0].mean(1) > 0.5, real.mean(1) > 0.5
    assert r.iou == pytest.approx(_iou(fake_shape, real_shape).mean(), rel=1e-6)


def test_the_iou_cuts_both_images_at_half_intensity(gan_run, data_root, monkeypatch):
    model, _ = load_model(gan_run)
    split = load_test("mnist-skeleton", size=6, root=data_root, progress=False)
    real = split.components
    # a stand-in generator: every image its real one at 40% intensity (no pixel above 0.5: an empty shape)
    monkeypatch.setattr(synthesis, "generate", lambda model, labels, seed=0, **k: real[:len(labels)] * 0.4)
    r = evaluate_synthesis(model, split, batch_size=4)[""]
    assert bool((real.mean(1) > 0.5).flatten(1).any(1).all())  # every real image has a shape
    assert r.iou == 0.0


def test_the_iou_cuts_colour_images_by_their_mean_over_channels(gan_run, data_root, monkeypatch):
    """The shape of a colour image is where its channels' mean passes one half: a generated image with the real ink
    in its red channel alone (mean a third of it) has no shape, where a max over channels would give the real shape
    and IoU 1. Only one-channel sets were scored, where the two rules agree (mutation testing, 2026-12-02)."""
    model, _ = load_model(gan_run)
    split = load_test("mnist-skeleton", size=6, root=data_root, progress=False)
    ink = split.components  # (6, 1, 32, 32) in [0, 1]
    assert bool((ink > 0.9).flatten(1).any(1).all())
    colour = replace(split, components=ink.expand(6, 3, 32, 32).clone())  # grey: every channel the ink
    red = torch.cat([ink, torch.zeros_like(ink), torch.zeros_like(ink)], 1)
    monkeypatch.setattr(synthesis, "generate", lambda model, labels, seed=0, **k: red[:len(labels)])
    assert evaluate_synthesis(model, colour, batch_size=4)[""].iou == 0.0
    monkeypatch.setattr(synthesis, "generate", lambda model, labels, seed=0, **k: colour.components[:len(labels)])
    assert evaluate_synthesis(model, colour, batch_size=4)[""].iou == 1.0
