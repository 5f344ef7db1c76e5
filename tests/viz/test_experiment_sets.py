"""The viewer on checkpoints of the paper's experiments: MultiMNIST pairs (36x36) and translated MNIST (40x40)."""
from __future__ import annotations

import pytest
import torch

from capsnet import CapsNetConfig
from capsnet.data import load_dataset
from capsnet.data.tasks import multimnist_test, translated_test
from capsnet.train import TrainConfig, fit
from capsnet.viz import ViewerError, load_viewer

NARROW = dict(conv1_channels=8, primary_types=2, decoder_hidden=(16, 32))


@pytest.fixture(scope="module")
def runs(tmp_path_factory, data_root):
    out = {}
    for dataset, side in (("multimnist", 36), ("translated-mnist", 40)):
        run = tmp_path_factory.mktemp("viz-tasks") / dataset
        fit(CapsNetConfig(input_height=side, input_width=side, **NARROW),
            TrainConfig(dataset=dataset, epochs=1, batch_size=32, train_size=64, test_size=20, seed=0), run,
            device="cpu", data_root=data_root, progress=False)
        out[dataset] = run
    return out


def test_multimnist_checkpoint_shows_the_fixed_test_pairs(runs, data_root):
    viewer = load_viewer(runs["multimnist"], data_dir=data_root, progress=False)
    info = viewer.info()
    assert info["input"] == [1, 36, 36] and info["primary"]["grid"] == [10, 10] and info["test_size"] == 10000
    digits = load_dataset("mnist", "test", root=data_root)
    pairs = multimnist_test(digits.images, digits.labels, 30)
    inp = viewer.test_input(index=7)
    assert torch.equal(inp.image, pairs.images[7])  # the same pairs as `capsnet eval` and `capsnet figures`
    a, b = pairs.labels[7].tolist()
    assert inp.source["label"] == [a, b] and inp.source["label_name"] == f"{a}+{b}"
    # picking by class finds the pairs that hold a digit of that class
    for nth in range(3):
        assert 4 in viewer.test_input(label=4, nth=nth).source["label"]
    # the n-th pair holding a 4 as either digit, in test order (the first digit alone passed: mutation testing)
    fours = (viewer.test_labels == 4).any(dim=1).nonzero().flatten()
    assert (viewer.test_labels[fours[:20], 0] != 4).any()  # some pairs hold their 4 second
    assert [viewer.test_input(label=4, nth=n).source["index"] for n in range(20)] == fours[:20].tolist()
    view = viewer.walk(inp)
    assert view["input"]["shape"] == [1, 36, 36] and view["reconstruction"]["shape"] == [1, 36, 36]
    assert view["coupling"]["shape"] == [3, 10, 2, 10, 10]


def test_translated_checkpoint_shows_40x40_digits(runs, data_root):
    viewer = load_viewer(runs["translated-mnist"], data_dir=data_root, progress=False)
    digits = load_dataset("mnist", "test", root=data_root)
    inp = viewer.test_input(label=3)
    first3 = int((digits.labels == 3).nonzero()[0])
    assert inp.source["index"] == first3 and inp.source["label"] == 3
    assert torch.equal(inp.image, translated_test(digits.images)[first3])
    assert viewer.walk(inp)["feature_maps"]["shape"] == [8, 32, 32]
    with pytest.raises(ViewerError, match=r"mnist test images are \(1, 28, 28\) but the model takes \(1, 40, 40\)"):
        load_viewer(runs["translated-mnist"], dataset="mnist", data_dir=data_root, progress=False)


def test_an_untrained_capsnet_opens_on_any_classification_set_at_its_size(data_root):
    """`capsnet viz --untrained --dataset translated-mnist`: the untrained CapsNet was built for 28x28 MNIST whatever
    the data set, and refused its 40x40 digits with "pick the data set the checkpoint was trained on" (there is no
    checkpoint); it is now sized for the data set, as a new run is. Another task's data set is still refused."""
    viewer = load_viewer(None, dataset="translated-mnist", data_dir=data_root, progress=False, test_size=4)
    cfg = viewer.model.config
    assert (cfg.in_channels, cfg.input_height, cfg.input_width) == (1, 40, 40)
    assert tuple(viewer.test_input(index=0).image.shape[-2:]) == (40, 40)
    assert viewer.walk(viewer.test_input(index=0))["feature_maps"]["shape"][1:] == [32, 32]  # 40 - 9 + 1
    with pytest.raises(ViewerError, match="the untrained CapsNet is a classification model but mnist-segmentation "
                                          "is a segmentation data set: open it on a classification data set such as "
                                          "mnist-sample"):  # not "the data set it was trained on": it was not
        load_viewer(None, dataset="mnist-segmentation", data_dir=data_root, progress=False, test_size=4)


def test_the_untrained_viewer_leaves_the_callers_random_state_alone():
    """load_viewer(None) seeds the untrained CapsNet's weights (the same model every time) without reseeding the
    caller's torch random stream (it called torch.manual_seed(0) on it)."""
    torch.manual_seed(1234)
    expected = torch.rand(3)
    torch.manual_seed(1234)
    first = load_viewer(None, progress=False).model.state_dict()
    assert torch.equal(torch.rand(3), expected)
    second = load_viewer(None, progress=False).model.state_dict()
    assert all(torch.equal(t, second[k]) for k, t in first.items())
