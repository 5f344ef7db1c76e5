"""Evaluation, the export check, the Otsu row, the routing table and the epoch record against computations
written out here (each test was written after mutation testing, 2026-11-30, found a change of the code that no
test noticed: the loss over unequal batches, the confusion's axes, the export tolerance and NaN, the IoU column,
the mean over seeds)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from capsnet.data import load_dataset
from capsnet.data.segmentation import otsu_masks
from capsnet.data.tasks import load_test, load_training
from capsnet.evaluate import evaluate, load_model
from capsnet.experiments import format_routing_table, otsu_row
from capsnet.export import ExportError, _compare
from capsnet.models import CapsNetConfig, model_name, model_spec
from capsnet.train import TrainConfig, fit


def test_evaluate_against_one_pass_by_hand():
    model, _ = load_model("pretrained:capsnet-mnist-small")
    test = load_dataset("mnist-sample", "test").subset(range(0, 500, 17))  # 30 digits of every class
    x, y = test.images.float() / 255, (test.labels.long() + 1) % 10  # labels shifted: an asymmetric confusion
    loss_fn = model_spec(model_name(model.config)).loss
    with torch.no_grad():
        whole_loss, scores = loss_fn(model, x, y, recon_weight=0.0005)  # one batch: the mean over the 30
    pred = scores.argmax(1)
    r = evaluate(model, x, y, batch_size=7)  # 7, 7, 7, 7, 2
    assert r.loss == pytest.approx(whole_loss.item(), rel=1e-5)
    want = torch.zeros(10, 10, dtype=torch.int64)
    for t, p in zip(y.tolist(), pred.tolist()):
        want[t, p] += 1  # rows the true class, columns the predicted one
    assert torch.equal(r.confusion, want)
    assert r.accuracy == pytest.approx((pred == y).double().mean().item()) and r.error == pytest.approx(1 - r.accuracy)
    per_class = [None if (y == k).sum() == 0 else ((pred == k) & (y == k)).sum().item() / (y == k).sum().item()
                 for k in range(10)]
    assert r.per_class_accuracy == pytest.approx(per_class)
    assert not torch.equal(want, want.T)  # the case tells the orientation apart


TRACED = SimpleNamespace(module=SimpleNamespace(output_names=("scores", "reconstructions")), label="m")
EXPECTED = (torch.ones(4, 10), torch.zeros(4, 784))


def _got(scores_off=0.0, recon_off=0.0, one=False):
    s, r = EXPECTED[0].clone(), EXPECTED[1].clone()
    if one:
        s[0, 0] += scores_off
    else:
        s += scores_off
    r += recon_off
    return [s, r]


@pytest.mark.parametrize("got", [
    _got(scores_off=1e-3),  # 1e-3 on outputs of scale 1: ten times the documented 1e-4
    _got(scores_off=5e-4, one=True),  # one value off (the mean difference is tiny)
    _got(recon_off=5e-4),  # the second output off, the first exact
    _got(recon_off=float("nan")),  # NaN in the exported file
])
def test_a_difference_past_the_tolerance_or_nan_in_any_output_is_refused(got):
    with pytest.raises(ExportError, match="differs from the PyTorch model"):
        _compare(TRACED, got, EXPECTED, "pt2")


def test_the_reported_difference_is_the_largest_over_every_output():
    # rel 1e-2: float32's rounding of 1 + 5e-5
    assert _compare(TRACED, _got(scores_off=5e-5, recon_off=1e-5), EXPECTED, "pt2") == pytest.approx(5e-5, rel=1e-2)
    assert _compare(TRACED, _got(scores_off=1e-5, recon_off=5e-5), EXPECTED, "pt2") == pytest.approx(5e-5, rel=1e-2)


def test_the_otsu_row_scores_every_test_set_by_dice_and_iou(data_root):
    row = otsu_row("mnist-segmentation", test_size=8, root=data_root)
    split = load_test("mnist-segmentation", size=8, root=data_root, progress=False)
    sets = {"test": split, **split.extra}
    assert "ood" in sets and {f"{k}_{m}" for k in sets for m in ("dice", "iou")} <= set(row)
    for key, sp in sets.items():
        p = otsu_masks(sp.images).numpy().astype(bool).reshape(len(sp), -1)
        t = (sp.labels.numpy() > 0).reshape(len(sp), -1)
        inter, ps, ts, union = (p & t).sum(1), p.sum(1), t.sum(1), (p | t).sum(1)
        dice = np.where(ps + ts == 0, 1.0, 2 * inter / np.maximum(ps + ts, 1))
        iou = np.where(union == 0, 1.0, inter / np.maximum(union, 1))
        assert row[f"{key}_dice"] == pytest.approx(dice.mean()) and row[f"{key}_iou"] == pytest.approx(iou.mean())
    assert row["test_iou"] != pytest.approx(row["test_dice"])


def test_the_routing_table_means_over_three_seeds():
    rows = [{"model": "capsnet", "dataset": "mnist", "weights": 1000 + k, "epochs": 1, "step": 10,
             "test_error": e, "train_images_per_s": s, "peak_mem_mb": 12.0}
            for k, (e, s) in enumerate([(0.010, 100.0), (0.012, 200.0), (0.020, 600.0)])]
    line = format_routing_table(rows).splitlines()[2]
    # mean 1.40% (not the median 1.20%), min-max 1.00-2.00; speed the mean 300 (not the last, 600)
    assert "| 1.40% (1.00-2.00) | 300 | 12 |" in line, line
    assert "| 1,000 |" in line  # the first run's weights (all runs of a model share them)


def test_the_epochs_training_loss_weighs_each_example_once(tmp_path, data_root, monkeypatch):
    # an optimizer that never moves the weights: every batch is scored by the start's weights
    monkeypatch.setattr("capsnet.train.make_optimizer",
                        lambda model, cfg, dev: torch.optim.SGD(model.parameters(), lr=0.0))
    cfg = TrainConfig(dataset="mnist-sample", epochs=1, batch_size=8, train_size=20, test_size=16, seed=3,
                      shift=0)  # no shifts: the images as they are
    mc = CapsNetConfig(conv1_channels=8, primary_types=2, decoder_hidden=(32, 64))
    rec = fit(mc, cfg, tmp_path, device="cpu", progress=False)
    train, _, _ = load_training("mnist-sample", train_size=20, test_size=16, seed=3, root=data_root, progress=False)
    torch.manual_seed(3)
    model = model_spec("capsnet").build(mc).train()
    with torch.no_grad():  # one pass over the 20 (batches of 8, 8, 4 in fit): the mean over the examples
        loss, scores = model_spec("capsnet").loss(model, train.images.float() / 255, train.labels.long(),
                                                  recon_weight=cfg.recon_weight)
    assert rec["train_loss"] == pytest.approx(loss.item(), rel=1e-4)  # float32 sums over other batches


def test_the_multimnist_accuracy_is_top_2_exact_match_worked_by_hand(monkeypatch):
    """evaluate_pairs scores a pair right when the two longest capsules are exactly its two labels (Sabour et al.
    2017, section 6), in any order. By hand on four pairs with set scores: both right (in either order) counts,
    the top-1 alone right does not, nor the right two with a third longer. A top-1 metric passed before (mutation
    testing, 2026-12-01): training and eval went through the same function."""
    from capsnet import evaluate as ev

    scores = torch.tensor([[0.9, 0.8, 0.1, 0.0],   # labels (0, 1): both longest, right
                           [0.2, 0.7, 0.9, 0.0],   # labels (2, 1), given in the other order: right
                           [0.9, 0.1, 0.2, 0.8],   # labels (0, 1): 0 longest, but 3 second: wrong
                           [0.3, 0.9, 0.1, 0.8]])  # labels (0, 3): 3 among the two longest, 0 not: wrong
    labels = torch.tensor([[0, 1], [2, 1], [0, 1], [0, 3]])
    def loss(model, x, y, components, **kw):  # each image holds its row's index: its scores are that row's, and
        return x[:, 0, 0, 0].mean(), scores[x[:, 0, 0, 0].long()]  # its loss too (a batch's loss: their mean)

    monkeypatch.setattr(ev, "_loss_of", lambda model: loss)
    images = torch.arange(4, dtype=torch.float32).view(4, 1, 1, 1).expand(4, 1, 36, 36)  # each image its row's index
    model = torch.nn.Linear(1, 1)
    result = ev.evaluate_pairs(model, images, labels, batch_size=3)
    assert result.accuracy == 0.5 and result.error == 0.5
    # the loss is the mean over pairs, each batch's mean weighted by its size: (3 * 1 + 1 * 3) / 4 = 1.5, the mean
    # of 0..3, where the batches' means summed over 4 pairs give 1.0 (a bug no test caught: mutation testing,
    # 2026-12-02)
    assert result.loss == pytest.approx(1.5)
