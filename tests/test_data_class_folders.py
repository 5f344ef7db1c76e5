"""classes:DIR: the user's own images in a subfolder per class, read, split, trained on, scored and predicted."""
from __future__ import annotations

import csv
import json
import re
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from capsnet.data.class_folders import load_class_folder
from capsnet.data.idx import DataError
from capsnet.data.sets import load_dataset
from capsnet.data.tasks import (class_change, folder_contents, held_out_names, load_classes, load_training, task,
                                task_kind)
from capsnet.evaluate import evaluate_checkpoint
from capsnet.models import CapsNetConfig
from capsnet.train import TrainConfig, fit
from cli_helpers import in_process


def _write(root: Path, files: dict[str, np.ndarray]) -> None:
    """``files``: path under ``root`` -> (H, W) or (H, W, 3) uint8 array, saved as PNG."""
    for rel, a in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(a).save(root / rel)


def _pixels(value: int, shape=(6, 5)) -> np.ndarray:
    return np.full(shape, value, dtype=np.uint8)


def test_each_subfolder_is_a_class_numbered_in_name_order(tmp_path):
    # written in another order than the names sort: the labels follow the names, the images their own files
    _write(tmp_path, {"zebra/b.png": _pixels(30), "zebra/a.png": _pixels(20), "ant/x.png": _pixels(10),
                      "moth/q.png": _pixels(40), ".hidden/h.png": _pixels(99)})
    (tmp_path / "readme.txt").write_text("not an image: passed over")
    images, labels, names, classes = load_class_folder(tmp_path)
    assert classes == ("ant", "moth", "zebra")
    assert names == ["ant/x.png", "moth/q.png", "zebra/a.png", "zebra/b.png"]
    assert labels.tolist() == [0, 1, 2, 2]
    assert images.shape == (4, 1, 6, 5) and images.dtype == torch.uint8
    assert images[:, 0, 0, 0].tolist() == [10, 40, 20, 30]


def test_without_a_test_folder_each_class_is_held_out_apart_by_name(tmp_path):
    files = {f"{c}/{k:02d}.png": _pixels(k) for c in ("a", "b", "c") for k in range(7)}
    _write(tmp_path, files)
    train, test = load_classes(tmp_path, "train"), load_classes(tmp_path, "test")
    assert len(train) + len(test) == 21 and not set(train.names) & set(test.names)
    for k, c in enumerate("abc"):  # the rule of folder:DIR's pairs, on each class's own names
        members = [f"{c}/{n:02d}.png" for n in range(7)]
        assert {n for n in test.names if n.startswith(c)} == held_out_names(members)
        assert (test.labels == k).sum() >= 1 and (train.labels == k).sum() >= 1
    assert train.classes == test.classes == ("a", "b", "c")
    # each image's pixels travel with its name and label
    for split in (train, test):
        for image, label, name in zip(split.images, split.labels, split.names):
            assert int(image[0, 0, 0]) == int(name[2:4]) and split.classes[int(label)] == name[0]
    # a file added to one class moves no other image across
    _write(tmp_path, {"a/99.png": _pixels(99)})
    again = load_classes(tmp_path, "test")
    assert set(test.names) <= set(again.names) and set(again.names) - set(test.names) <= {"a/99.png"}


def test_clear_data_cache_lets_go_of_the_folders_read_too(tmp_path, monkeypatch):
    """A folder read once is kept while its files stay as they are; clear_data_cache() let go of the MNIST files
    alone, leaving a notebook no way to free a folder of large images (a review, 2026-12-02). Now the next load
    reads the folder again."""
    from capsnet.data import clear_data_cache, tasks

    _write(tmp_path, {f"{c}/{k}.png": _pixels(k) for c in ("a", "b") for k in range(4)})
    reads = []
    real = tasks.load_class_folder
    monkeypatch.setattr(tasks, "load_class_folder", lambda *a, **k: reads.append(1) or real(*a, **k))
    load_training(f"classes:{tmp_path}", progress=False)
    load_training(f"classes:{tmp_path}", progress=False)
    first = len(reads)
    assert first >= 1 and any(str(tmp_path) in str(key) for key in tasks._FOLDERS.items)  # read once, kept
    assert clear_data_cache() >= 1
    assert not any(str(tmp_path) in str(key) for c in (tasks._FOLDERS, tasks._BOTH_SPLITS) for key in c.items)
    load_training(f"classes:{tmp_path}", progress=False)
    assert len(reads) == 2 * first  # read again


def test_a_test_folder_is_numbered_by_the_training_classes(tmp_path):
    _write(tmp_path, {"cat/1.png": _pixels(1), "dog/1.png": _pixels(2), "emu/1.png": _pixels(3),
                      "test/emu/9.png": _pixels(9), "test/cat/8.png": _pixels(8)})
    train, held, split = load_training(f"classes:{tmp_path}", progress=False)
    assert split == "test" and len(train) == 3
    assert held.labels.tolist() == [0, 2] and held.names == ("cat/8.png", "emu/9.png")  # emu is class 2, not 1
    t = task(f"classes:{tmp_path}")
    assert (t.kind, t.num_classes, t.input_shape, t.metric) == ("classification", 3, (1, 6, 5), "accuracy")


def test_a_photo_in_two_class_folders_is_warned_by_name(tmp_path, monkeypatch):
    """One picture saved into two class folders (labelled both ways: at most one can be scored right; a test copy of
    another class's training image is scored as if unseen) is named, in either split, once per folder read; a
    picture copied within its own class is not (held_out_twins keeps such copies in one split)."""
    photo = np.arange(30, dtype=np.uint8).reshape(6, 5)
    _write(tmp_path / "a", {"cat/1.png": photo, "cat/2.png": _pixels(2), "cat/3.png": _pixels(3), "cat/4.png": photo,
                            "dog/1.png": _pixels(11), "dog/2.png": _pixels(12), "dog/3.png": _pixels(13)})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a copy within its own class: no warning
        assert task(f"classes:{tmp_path / 'a'}").num_classes == 2
    _write(tmp_path / "a", {"dog/kitten.png": photo})
    with pytest.warns(UserWarning, match=r"classes:\S+ holds 2 image\(s\) whose contents are an image of another class "
                                         r"too: cat/1\.png = dog/kitten\.png, cat/4\.png = dog/kitten\.png; "
                                         r"labelled both ways, at most one of each can be scored right"):
        task(f"classes:{tmp_path / 'a'}")
    monkeypatch.chdir(tmp_path)  # the same folder by a relative name: read (and warned) once, not again
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert task("classes:a").num_classes == 2
    _write(tmp_path / "b", {"cat/1.png": photo, "dog/1.png": _pixels(11), "test/cat/9.png": _pixels(9),
                            "test/dog/9.png": photo})  # the test split's copy of another class's training image
    with pytest.warns(UserWarning, match=r"holds 1 image\(s\) whose contents are an image of another class too: "
                                         r"test/dog/9\.png = cat/1\.png;"):
        task(f"classes:{tmp_path / 'b'}")


def test_a_folder_named_classes_is_classification_before_it_is_read(tmp_path):
    assert task_kind(f"classes:{tmp_path / 'not there yet'}") == "classification"
    with pytest.raises(DataError, match="no such folder; give a folder holding one subfolder of PNG images per class"):
        task(f"classes:{tmp_path / 'not there yet'}")


_GREY, _RGB = _pixels(5, (8, 8)), np.zeros((8, 8, 3), np.uint8)


@pytest.mark.parametrize("files, problem", [
    ({"a/1.png": _GREY, "a/2.png": _GREY}, r"holds only the class folder a/; a classifier needs at least 2 classes"),
    ({"a/1.png": _GREY, "b/1.png": _GREY, "x.png": _GREY},
     r"1 PNG file\(s\) outside the class folders \(x.png\); put each image in the subfolder named by its class"),
    ({"a/1.png": _GREY, "b/1.png": _pixels(5, (9, 8))},
     r"images must all be one size: .*b/1.png is 9x8 \(HxW\) but .*a/1.png is 8x8; resize or crop them to one size "
     r"\(make the folder from the photos with capsnet prepare --images PHOTOS --out DIR --size N \[--mode grey\] "
     r"\(any format and size in; PNG files of one size out\), N the side of a trained model's input"),
    ({"a/1.png": _GREY, "b/1.png": _RGB}, r"b/1.png is RGB \(3 channels\) but .*a/1.png is grayscale .*one mode"),
    ({"a/1.png": _GREY, "a/2.png": _pixels(6, (8, 8)), "b/1.png": _pixels(7, (8, 8))},
     r"class 'b' holds 1 image in .*; at least 2 are needed to hold one out for testing \(add images, or put the "
     r"test images in .*test/b\)"),
    ({"a/1.png": _GREY, "b/1.png": _GREY, "test/c/1.png": _GREY},
     r"test holds class folder\(s\) c that the training images have no folder for \(its classes: a, b\)"),
    ({"cat/1.png": _GREY, "dog, big/1.png": _GREY, "test/dog/1.png": _GREY},  # one class, not two: quoted
     r'test holds class folder\(s\) "dog" that the training images have no folder for \(its classes: "cat", '
     r'"dog, big"\)'),
    ({"a/1.png": _GREY, "b/1.png": _pixels(7, (8, 8)), "test/a/2.png": _GREY},
     r"test holds 1 of the training images \(the same file's contents, of the same class\): a/2.png "
     r"\(= a/1.png\)"),
    ({"a/1.png": _GREY, "A/1.png": _GREY}, r"class folders A/ and a/, names that differ in case alone"),
    ({"a/1.png": _GREY, "b/1.jpg": _GREY}, r"no PNG files in .*b \(found 1 other file\(s\): 1.jpg; make the folder "
                                           r"from the photos with capsnet prepare --images PHOTOS"),
    ({"a/1.png": _GREY, "b/1.png": _GREY, "b/2.jpg": _GREY},  # photos beside the PNGs: prepare makes them, too
     r"b holds 1 image file\(s\) that are not PNG beside its PNG images of class 'b' \(2.jpg\); capsnet reads PNG "
     r"only: make the folder from the photos with capsnet prepare --images PHOTOS --out DIR --size N"),
    ({"a/1.png": _GREY, "b/1.png": _GREY, "b/more/deeper/2.png": _GREY, "b/thumbs/.cache/3.png": _GREY,
      "b/meta/._4.png": _GREY},
     r"b holds subfolder\(s\) of PNG files \(more\), which are not read; move their images into .*b itself"),
    ({"a/1.png": _GREY, "b/1.png": _GREY, "test/.hidden.png": _GREY},
     r"test holds no class folders; put the test images in .*test/CLASS .*, or remove the empty test/ to hold "
     r"about a fifth of each class out"),
])
def test_a_bad_folder_gets_one_message_naming_the_problem_and_the_fix(tmp_path, files, problem):
    for rel, a in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(a).save(tmp_path / rel, format="PNG" if rel.endswith(".png") else "JPEG")
    with pytest.raises(DataError, match=problem):
        load_training(f"classes:{tmp_path}", progress=False)


def test_a_first_few_test_images_hold_every_class(tmp_path):
    _write(tmp_path / "d", {f"{c}/{k:02d}.png": _pixels(k) for c in ("a", "b", "c") for k in range(10)})
    _write(tmp_path / "e", {f"{c}/{k}.png": _pixels(k) for c in ("a", "b", "c") for k in range(2)}
           | {f"test/{c}/{k}.png": _pixels(50 + k) for c in ("a", "c") for k in range(3)})
    for root, first in ((tmp_path / "d", [0, 1, 2]), (tmp_path / "e", [0, 2, 0, 2])):
        test = load_classes(root, "test")
        assert test.labels[:len(first)].tolist() == first  # a class at a time in turn, not all of a's first
        _, held, _ = load_training(f"classes:{root}", test_size=len(first), progress=False)
        assert held.labels.tolist() == first and held.names == test.names[:len(first)]
    assert len(set(load_classes(tmp_path / "e", "test").names)) == 6


@pytest.mark.parametrize("kind", ["classes", "folder", "pairs"])
def test_a_held_out_split_named_test_in_another_case_is_refused_not_passed_over(tmp_path, kind, mask_pairs):
    """DIR/Test/ (or TEST/) was passed over without a word on Linux (the test split then drawn from the training
    files; in classes:DIR, read as a class named Test), and read as test/ on macOS's and Windows' disks (a bug hunt,
    2026-12-05). Refused on every system, with the rename."""
    root = tmp_path / kind
    for seed, top in enumerate((root, root / "Test")):
        if kind == "classes":
            _write(top, {f"{c}/{k}.png": _pixels(40 * k + 10 * seed + 100 * (c == "dog")) for c in ("cat", "dog")
                         for k in range(3)})
        else:
            mask_pairs(top, 5, seed=seed)
            if kind == "pairs":
                for sub in ("labels", "images"):  # label maps (the masks) and images, under pairs:DIR's names
                    (top / {"labels": "masks", "images": "images"}[sub]).rename(top / f"_{sub}")
                for sub in ("labels", "images"):
                    (top / f"_{sub}").rename(top / sub)
    what = {"classes": "images, in class folders of their own", "folder": "pairs (images/ and masks/)",
            "pairs": "pairs (labels/ and images/)"}[kind]
    with pytest.raises(DataError, match=rf"{re.escape(str(root))} holds Test/, where capsnet reads a held-out split "
                                        rf"from test/ \(the lower-case name, on every system alike\): rename it test/ "
                                        rf"if it holds the test {re.escape(what)}, else give it another name"):
        load_training(f"{kind}:{root}", root=None, progress=False)
    (root / "Test").rename(root / "test")  # as asked: its pairs (images) are the test split
    assert len(load_training(f"{kind}:{root}", root=None, progress=False)[0]) == (6 if kind == "classes" else 5)


def test_a_class_folder_copied_from_macos_keeps_its_split_and_a_name_not_utf8_is_refused(tmp_path):
    import os
    import unicodedata

    decomposed = unicodedata.normalize("NFD", "café")
    _write(tmp_path, {f"{c}/{k:02d}.png": _pixels(k) for c in (decomposed, "tea") for k in range(12)})
    before = load_classes(tmp_path, "test").names
    (tmp_path / decomposed).rename(tmp_path / unicodedata.normalize("NFC", "café"))  # as a copy to Linux writes it
    assert load_classes(tmp_path, "test").names == before
    # both forms side by side: named as differing in Unicode form, not "in case alone" (a review, 2026-12-01)
    _write(tmp_path, {f"{decomposed}/00.png": _pixels(0)})
    with pytest.raises(DataError, match=r"names that differ in their Unicode form alone \(composed and decomposed "
                                        r"accents"):
        load_classes(tmp_path, "test")
    import shutil

    shutil.rmtree(tmp_path / decomposed)
    # a Mac's zip unpacked: __MACOSX/CLASS/._NAME.png (metadata) is no class (it was one, "holds no PNG files")
    _write(tmp_path, {"__MACOSX/tea/._00.png": _pixels(0)})
    assert load_classes(tmp_path, "test").names == before
    os.rename(os.fsencode(tmp_path / "tea"), os.fsencode(tmp_path) + b"/t\xe9")  # Latin-1 bytes
    with pytest.raises(DataError, match=r"a class folder whose name is not UTF-8: 't\\udce9'; rename it"):
        load_classes(tmp_path, "test")


def test_the_recorded_classes_say_what_changed(tmp_path):
    _write(tmp_path, {f"{c}/{k}.png": _pixels(k) for c in ("cat", "dog") for k in range(3)})
    name = f"classes:{tmp_path}"
    state = {"data": folder_contents(name)}
    assert state["data"]["classes"] == ["cat", "dog"] and class_change(state, name) is None
    (tmp_path / "dog").rename(tmp_path / "hound")
    assert class_change(state, name) == (
        f"{name} holds other class folders than when the run trained on it (new: hound; gone: dog), and a model "
        f"scores the classes it was trained on in their order; put the class folders back as they were, or train a "
        f"new run on the folder as it is")
    assert "(not the model's: hound; missing: dog)" in class_change(state, name, trained_here=False)
    assert class_change({"data": {"files": 6}}, name) is None  # a state that does not say


@pytest.fixture(scope="module")
def digit_classes(tmp_path_factory) -> tuple[Path, Path]:
    """Three classes of the MNIST digits that ship with capsnet (zero, one, seven; 8 each, 28x28), and a run of a
    small CapsNet trained one epoch on them."""
    root = tmp_path_factory.mktemp("classes") / "digits"
    digits = load_dataset("mnist-sample", "train")
    for digit, name in ((0, "zero"), (1, "one"), (7, "seven")):
        for k in (digits.labels == digit).nonzero().flatten()[:8].tolist():
            _write(root, {f"{name}/{k}.png": digits.images[k, 0].numpy()})
    run = root.parent / "run"
    fit(CapsNetConfig(conv1_channels=8, primary_types=2, decoder_hidden=(32, 64), num_classes=3),
        TrainConfig(dataset=f"classes:{root}", epochs=1, batch_size=8, seed=0), run, progress=False)
    return root, run


def test_a_model_of_other_classes_scored_on_class_folders_is_warned_and_its_outputs_keep_its_names(digit_classes,
                                                                                                     tmp_path,
                                                                                                     monkeypatch):
    """The shipped MNIST model scored on the digits in folders zero, one, ..., nine (read in name order: eight,
    five, ...) printed an accuracy without a word (a folder's classes are known only once it is read), and named its
    outputs by the folder's classes: a zero it read as 0 was "misclassified as eight", the folder's class 0 (a bug
    hunt, 2026-12-05). Warned now in eval, figures and the viewer, and its outputs named as its own classes."""
    import capsnet.figures.report as report
    from capsnet.evaluate import load_model
    from capsnet.figures import FigureError, write_figures
    from capsnet.viz.engine import load_viewer

    words = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
    root = tmp_path / "words"
    digits = load_dataset("mnist-sample", "test")
    for digit, name in enumerate(words):
        for k in (digits.labels == digit).nonzero().flatten()[:2].tolist():
            _write(root, {f"{name}/{k}.png": digits.images[k, 0].numpy()})
    done = evaluate_checkpoint("pretrained:capsnet-mnist-small", dataset=f"classes:{root}", progress=False)
    said = (f"the model was trained on mnist (0, 1, 2, ...) but classes:{root}'s classes are others "
            f"(eight, five, four, ...)")
    assert done.warning.startswith(said) and done.format().splitlines()[1].startswith(f"warning: {said}")
    wrong = done.report()["misclassified"]
    model, _ = load_model("pretrained:capsnet-mnist-small")
    test = load_classes(root, "test")
    with torch.no_grad():
        read = model(test.images.float() / 255).lengths.argmax(1).tolist()
    assert [w["predicted"] for w in wrong] == [str(read[test.names.index(w["file"])]) for w in wrong]
    assert {"true": "zero", "predicted": "0"} in [{k: w[k] for k in ("true", "predicted")} for w in wrong]
    # folders 0, 1, 2: the model's own first classes, each label its output's (warned too, before: a review)
    digits_only = tmp_path / "digits"
    for digit in range(3):
        for k in (digits.labels == digit).nonzero().flatten()[:2].tolist():
            _write(digits_only, {f"{digit}/{k}.png": digits.images[k, 0].numpy()})
    assert evaluate_checkpoint("pretrained:capsnet-mnist-small", dataset=f"classes:{digits_only}",
                               progress=False).warning is None
    # outputs past the folder's classes are named as the model's own classes (a bare "5" for a CIFAR model's dog,
    # scored on folders airplane/ and automobile/): a model of classes a..j, on folders a/, b/, c/ of digits 0-2
    import capsnet.evaluate as evaluate

    letters = tmp_path / "letters"
    for digit, name in enumerate("abc"):
        picked = (digits.labels == digit).nonzero().flatten().tolist()
        sevens = (digits.labels == 7).nonzero().flatten().tolist()
        _write(letters, {f"{name}/{k}.png": digits.images[k, 0].numpy() for k in picked[:2]})
        _write(letters, {f"test/{name}/{k}.png": digits.images[k, 0].numpy()  # test/c/: sevens, read as 7
                         for k in (sevens[:2] if name == "c" else picked[2:4])})
    monkeypatch.setattr(evaluate, "trained_classes", lambda *a: tuple("abcdefghij"))
    lettered = evaluate_checkpoint("pretrained:capsnet-mnist-small", dataset=f"classes:{letters}", progress=False)
    assert lettered.warning is None
    assert {"h"} <= {w["predicted"] for w in lettered.report()["misclassified"]}
    monkeypatch.setattr(report, "save_figure", lambda fig, path, dpi: path)  # the notes, not the pixels
    drawn = write_figures("pretrained:capsnet-mnist-small", out=tmp_path / "figs", dataset=f"classes:{root}",
                          progress=False, dims=[0], deltas=[0, 0.25])
    assert f"warning: {said}" in " ".join(drawn.notes), drawn.notes
    assert load_viewer("pretrained:capsnet-mnist-small", dataset=f"classes:{root}", progress=False
                       ).warning.startswith(said)
    # the run on folders zero, one, seven on the shipped digits: refused before they are read, not deep in the
    # scoring
    with pytest.raises(ValueError, match=r"mnist-sample has 10 classes but the checkpoint's model tells 3 apart \(it "
                                         r"trained on classes:.*\): its labels would name outputs the model does not "
                                         r"have; evaluate it on the data set it was trained on \(--dataset\)"):
        evaluate_checkpoint(digit_classes[1], which="last", dataset="mnist-sample", progress=False)
    with pytest.raises(FigureError, match=r"mnist-sample has 10 classes but the checkpoint's model tells 3 apart .*; "
                                          r"draw it on the data set it was trained on \(--dataset\)"):
        write_figures(digit_classes[1], which="last", out=tmp_path / "refused", dataset="mnist-sample",
                      progress=False)
    assert not (tmp_path / "refused").exists()
    from capsnet.synthesis import load_judge  # nor does it judge generated digits (taken before)

    with pytest.raises(ValueError, match=r"the judge .* was trained on classes:.*, whose classes are not those of "
                                         r"mnist-skeleton's images \(mnist\)"):
        load_judge(digit_classes[1], dataset="mnist-skeleton")


def test_resume_true_without_a_run_on_class_folders_gets_the_advice_to_build_the_model(digit_classes, tmp_path):
    """"a run trained on this folder before a class folder was added or removed cannot go on" was said where no run
    was there to resume (resume=True in Python, a model of 10 classes on 3 folders): a review, 2026-12-05."""
    root, _ = digit_classes
    with pytest.raises(ValueError, match=r"needs a model with num_classes 3, and this one has num_classes 10; build "
                                         r"it with those"):
        fit(CapsNetConfig(conv1_channels=8, primary_types=2, decoder_hidden=(32, 64)),
            TrainConfig(dataset=f"classes:{root}", epochs=1, batch_size=8), tmp_path / "none", resume=True,
            progress=False)


def test_a_run_on_class_folders_is_scored_with_its_class_names(digit_classes, capsys):
    root, run = digit_classes
    done = evaluate_checkpoint(run, which="last", progress=False, device="cpu")
    assert done.classes == ("one", "seven", "zero") and done.report()["classes"] == ["one", "seven", "zero"]
    test = load_classes(root, "test")
    assert done.images == len(test) and done.results[""].confusion.sum() == len(test)
    lines = done.format().splitlines()
    head = next(k for k, line in enumerate(lines) if line.endswith("<- predicted"))
    assert [line.split()[-1] for line in lines[head + 1:head + 4]] == ["one", "seven", "zero"]
    r = in_process(capsys, "eval", "--checkpoint", run, "--which", "last", "--no-progress")
    lines = r.stdout.splitlines()
    head = next(k for k, line in enumerate(lines) if line.endswith("<- predicted"))
    assert r.returncode == 0 and [line.split()[-1] for line in lines[head + 1:head + 4]] == ["one", "seven", "zero"]
    assert json.loads((run / "eval-last.json").read_text())["classes"] == ["one", "seven", "zero"]


def test_eval_names_each_misclassified_file_of_the_folder(digit_classes):
    from capsnet.evaluate import load_model

    root, run = digit_classes
    done = evaluate_checkpoint(run, which="last", progress=False, device="cpu")
    test = load_classes(root, "test")
    model, _ = load_model(run, which="last", device="cpu")
    with torch.no_grad():  # the model's own lengths, read here
        predicted = model(test.images.float() / 255).lengths.argmax(1).tolist()
    wrong = [{"file": f, "true": test.classes[t], "predicted": test.classes[p]}
             for f, t, p in zip(test.names, test.labels.tolist(), predicted) if t != p]
    report = done.report()
    assert report["test_files"] == list(test.names) and report["misclassified"] == wrong
    assert 0 < len(wrong) < len(test)  # one epoch on 16 images: some right, some wrong (else the test checks little)
    line = next(line for line in done.format().splitlines() if line.startswith("misclassified"))
    assert line.startswith(f"misclassified ({len(wrong)} of {len(test)}): {wrong[0]['file']} as "
                           f"{wrong[0]['predicted']}")


def test_predict_names_the_classes_when_the_folder_is_gone(digit_classes, tmp_path, capsys):
    root, run = digit_classes
    moved = tmp_path / "moved"
    shutil.copytree(root, moved)
    images = tmp_path / "images"
    images.mkdir()
    for f in (moved / "seven").iterdir():
        shutil.copy(f, images / f.name)
    shutil.copytree(run, tmp_path / "run")  # the run's record points at `root`; this copy's folder is then gone
    saved = root.rename(root.parent / "away")
    try:
        r = in_process(capsys, "predict", "--checkpoint", tmp_path / "run", "--which", "last", "--images", images,
                       "--out", tmp_path / "out", "--no-progress")
    finally:
        saved.rename(root)
    assert r.returncode == 0, r.stderr
    with open(tmp_path / "out" / "predictions.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 8 and {r["class"] for r in rows} <= {"one", "seven", "zero"}
    assert set(rows[0]) >= {"score_one", "score_seven", "score_zero"}
    for row in rows:  # the class named is the one of highest score
        scores = {c: float(row[f"score_{c}"]) for c in ("one", "seven", "zero")}
        assert row["class"] == max(scores, key=scores.get)


def _two_class_run(root: Path, tmp_path: Path) -> Path:
    """A copy of two of ``root``'s classes (one, zero) in tmp_path/digits, and a tiny CapsNet trained one epoch on it
    in tmp_path/run; returns the copy."""
    copy = tmp_path / "digits"
    for name in ("one", "zero"):
        shutil.copytree(root / name, copy / name)
    cfg = CapsNetConfig(conv1_channels=4, primary_types=2, decoder_hidden=(16, 32), num_classes=2)
    fit(cfg, TrainConfig(dataset=f"classes:{copy}", epochs=1, batch_size=8), tmp_path / "run", progress=False)
    return copy


def test_a_resume_after_a_class_folder_was_added_is_refused(digit_classes, tmp_path, capsys):
    root, _ = digit_classes
    copy = _two_class_run(root, tmp_path)
    shutil.copytree(root / "seven", copy / "seven")
    r = in_process(capsys, "train", "--resume", "--out", tmp_path / "run", "--epochs", "2", "--no-progress")
    assert r.returncode != 0 and (f"classes:{copy} holds 3 class folders and the model scores 2 classes: a run "
                                  f"trained on this folder before a class folder was added or removed cannot go on"
                                  in r.stderr), r.stderr
    shutil.rmtree(copy / "seven")
    (copy / "one").rename(copy / "uno")  # as many classes, one renamed: the labels would mean other classes
    r = in_process(capsys, "train", "--resume", "--out", tmp_path / "run", "--epochs", "2", "--no-progress")
    assert r.returncode != 0 and "(new: uno; gone: one)" in r.stderr, r.stderr
    r = in_process(capsys, "eval", "--checkpoint", tmp_path / "run", "--which", "last", "--no-progress")
    assert r.returncode != 0 and "(new: uno; gone: one)" in r.stderr, r.stderr
    assert not (tmp_path / "run" / "eval-last.json").exists()


def test_figures_refuse_a_folder_whose_classes_changed_and_name_the_flag_for_one_that_moved(digit_classes, tmp_path):
    from capsnet.figures import FigureError, write_figures

    root, _ = digit_classes
    copy = _two_class_run(root, tmp_path)
    (copy / "zero").rename(copy / "alpha")  # now class 0: the titles would call the model's "one" digits alpha
    with pytest.raises(FigureError, match=r"\(new: alpha; gone: zero\)"):
        write_figures(tmp_path / "run", out=tmp_path / "figs", progress=False)
    copy.rename(tmp_path / "elsewhere")
    with pytest.raises(DataError, match=r"not there any more \(moved or removed\): give --dataset classes:DIR"):
        write_figures(tmp_path / "run", out=tmp_path / "figs", progress=False)
    assert not (tmp_path / "figs").exists()


def test_figures_of_a_class_folder_run_title_its_images_by_their_files(digit_classes, tmp_path, monkeypatch):
    """A test index finds nothing in a user's folder: the class-score panels, the misread inputs, the pose sweeps
    and the notes name each image's file (CLASS/FILE.png), the folder's own test split's."""
    import capsnet.figures.report as report
    from capsnet.figures import write_figures

    root, run = digit_classes
    drawn = {}
    for name in ("plot_lengths", "plot_misclassified", "plot_pose_sweep"):
        def keep(*args, _plot=getattr(report, name), _name=name, **kwargs):
            drawn.setdefault(_name, []).append(fig := _plot(*args, **kwargs))
            return fig
        monkeypatch.setattr(report, name, keep)
    monkeypatch.setattr(report, "save_figure", lambda fig, path, dpi: path)  # their titles, not their pixels (~10 s)
    done = write_figures(run, out=tmp_path / "figs", progress=False, misclassified=24, dims=[0], deltas=[0, 0.25])
    test = load_classes(root, "test")
    chosen = [int((test.labels == k).nonzero()[0]) for k in range(3)]  # the first of each class
    firsts = [test.names[i] for i in chosen]
    # each panel: its index, and its file without the class folder (the title's "true" names the class)
    assert [a.get_title().split(chr(10))[0] for a in drawn["plot_lengths"][0].axes[:3]] == [
        f"test image {i}, {name.split('/')[1]}" for i, name in zip(chosen, firsts)]
    assert done.notes[0].endswith(f"({', '.join(firsts)})"), done.notes[0]
    sweeps = [fig._suptitle.get_text() for fig in drawn["plot_pose_sweep"]]
    assert [t.split(" (true")[0].removeprefix("Pose sweep of ") for t in sweeps] == firsts, sweeps
    # the misread ones (the seeded one-epoch model reads one of the three wrong): their files under their indices
    index, file = drawn["plot_misclassified"][0].axes[0].get_title().split(chr(10))[0].split(": ")
    assert test.names[int(index.removeprefix("#"))].split("/")[1] == file, (index, file)


def test_a_new_run_of_the_wrong_classes_is_told_the_model_size_not_a_folder_change(digit_classes, tmp_path):
    root, _ = digit_classes
    with pytest.raises(ValueError, match=r"needs a model with num_classes 3, and this one has num_classes 10; build"):
        fit(CapsNetConfig(conv1_channels=4, primary_types=2), TrainConfig(dataset=f"classes:{root}", epochs=1),
            tmp_path / "run", progress=False)


def test_the_routing_experiment_runs_a_folder_of_classes_in_a_folder_named_after_it(digit_classes, tmp_path):
    from capsnet.experiments import format_routing_table, plan

    root, _ = digit_classes
    runs = plan("routing", tmp_path / "x", train=TrainConfig(epochs=1), datasets=[f"classes:{root}"],
                models=["capsnet"])
    assert [r.run_dir for r in runs] == [tmp_path / "x" / "classes-digits" / "capsnet-seed0"]  # not x/classes:/...
    assert runs[0].model_config.num_classes == 3
    row = {"model": "capsnet", "dataset": f"classes:{root}", "test_error": 0.5, "weights": 1, "epochs": 1}
    assert "| capsnet | CapsNet | classes-digits | 1 |" in format_routing_table([row])
    # each run gets its model's defaults as capsnet train gives them on its own data set: Efficient-CapsNet's MNIST
    # augmentation on MNIST, not on the folder (the experiment's first set's defaults went to every set: a review)
    runs = plan("routing", tmp_path / "y", train=TrainConfig(epochs=1), datasets=["mnist", f"classes:{root}"],
                models=["efficient-capsnet"])
    assert {r.dataset.split(":")[0]: (r.train_config.lr, r.train_config.augment) for r in runs} == {
        "mnist": (5e-4, "efficient-capsnet"), "classes": (5e-4, "shift")}


def test_the_viewer_opens_a_run_on_class_folders_with_its_names_and_refuses_other_classes(digit_classes, tmp_path):
    from capsnet.viz.engine import ViewerError, load_viewer

    root, run = digit_classes
    viewer = load_viewer(run, which="last", progress=False)
    info = viewer.info()
    assert info["classes"] == ["one", "seven", "zero"] and info["test_size"] == len(load_classes(root, "test"))
    assert info["upload_style"] == "pad"  # a user's images are not known to be digits: fitted whole, as prepare does
    from capsnet.data.prepare import fit_image
    from capsnet.viz.images import upload_input

    photo = tmp_path / "photo.png"
    with Image.open(next((root / "zero").iterdir())) as digit:  # 28 wide, 48 high: the upload fitted whole
        Image.fromarray(np.pad(np.asarray(digit), ((10, 10), (0, 0)))).save(photo)
    x, size = upload_input(photo.read_bytes(), viewer.shape, viewer.upload_style)
    assert size == (28, 48) and torch.equal(x, torch.from_numpy(fit_image(photo, 28, 28, "grey", "pad")) / 255)
    # a large, elongated JPEG: decoded and scaled as predict's fit does (the viewer's working copy, shrunk to 1,024 a
    # side first, differed by up to 17 grey levels; a review, 2026-12-02)
    rng = np.random.default_rng(0)
    wide = tmp_path / "wide.jpg"
    Image.fromarray(rng.integers(0, 256, (600, 3000), dtype=np.uint8)).save(wide, quality=90)
    for how in ("pad", "crop"):
        x, size = upload_input(wide.read_bytes(), viewer.shape, how)
        assert size == (3000, 600) and torch.equal(x, torch.from_numpy(fit_image(wide, 28, 28, "grey", how)) / 255)
    other = tmp_path / "other"
    for name in ("one", "seven", "zero"):
        shutil.copytree(root / name, other / ("eight" if name == "seven" else name))
    with pytest.raises(ViewerError, match=r"holds other class folders than the model was trained on \(not the "
                                          r"model's: eight; missing: seven\)"):
        load_viewer(run, which="last", dataset=f"classes:{other}", progress=False)
    # another data set of another number of classes: said by its counts before its test set loads (it was "10 class
    # names for a model with 3 classes", once the set had loaded; a review, 2026-12-01)
    with pytest.raises(ViewerError, match=r"^capsnet tells 3 classes apart \(it trained on classes:.*digits\) but "
                                          r"mnist-sample has 10: open it on the data set it was trained on"):
        load_viewer(run, which="last", dataset="mnist-sample", progress=False)
    with pytest.raises(ViewerError, match=r"tells 10 classes apart \(it trained on mnist\) but classes:.* has 3"):
        load_viewer("pretrained:capsnet-mnist-small", dataset=f"classes:{root}", progress=False)


def test_the_folder_maker_writes_a_set_that_reads_back_as_its_images_and_classes(tmp_path, capsys):
    import runpy

    tool = runpy.run_path(str(Path(__file__).parents[1] / "tools" / "make_class_folders.py"))
    assert tool["main"](["--dataset", "mnist-sample", "--per-class", "3", "--test-per-class", "2",
                         "--out", str(tmp_path / "d")]) == 0
    assert "wrote 30 train, 20 test images" in capsys.readouterr().out
    digits = load_dataset("mnist-sample", "train")
    train = load_classes(tmp_path / "d", "train")
    assert train.classes == digits.classes and len(train) == 30
    for image, label, name in zip(train.images, train.labels, train.names):  # CLASS/INDEX.png: the same digit
        k = int(name.split("/")[1][:5])
        assert torch.equal(image, digits.images[k]) and int(label) == int(digits.labels[k])
    assert len(load_classes(tmp_path / "d", "test")) == 20
    with pytest.raises(SystemExit, match="already holds files"):
        tool["main"](["--dataset", "mnist-sample", "--out", str(tmp_path / "d")])
    # more test images than a class has (mnist-sample's test split: 500): refused before anything is written (the
    # training images and an empty test/0 were, and the rerun was refused as "already holds files")
    with pytest.raises(SystemExit, match=r"test split has \d+ images of class '0', fewer than the 60 asked for "
                                         r"\(--test-per-class\); nothing written"):
        tool["main"](["--dataset", "mnist-sample", "--per-class", "2", "--test-per-class", "60",
                      "--out", str(tmp_path / "short")])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit, match="file is a file; give a new or empty folder"):  # NotADirectoryError
        tool["main"](["--dataset", "mnist-sample", "--out", str(tmp_path / "file")])
    (tmp_path / "empty").mkdir()  # an empty folder is written into
    assert tool["main"](["--dataset", "mnist-sample", "--per-class", "1", "--test-per-class", "0",
                         "--out", str(tmp_path / "empty")]) == 0
    assert len(list((tmp_path / "empty").glob("*/*.png"))) == 10


def test_an_exported_model_carries_its_class_folders_names_not_their_path(digit_classes):
    # what export_model writes into the file (ONNX metadata_props, a .pt2's capsnet.json: the round trip through
    # both formats is tests/cli/test_cli_export.py's), from this run's checkpoint
    from capsnet.checkpoint import load_checkpoint
    from capsnet.export import metadata_of

    root, run = digit_classes
    meta = metadata_of("capsnet", load_checkpoint(run / "last.safetensors"))
    assert json.loads(meta["capsnet.classes"]) == ["one", "seven", "zero"]
    assert meta["capsnet.dataset"] == "classes-digits" and str(root) not in json.dumps(meta)  # no path of this disk


def test_photos_of_any_size_and_format_are_made_into_class_folders_capsnet_reads(tmp_path, capsys):
    from capsnet.data.prepare import prepare_class_folders

    wide = np.zeros((32, 64), np.uint8)
    wide[:, :32] = 255  # left half white: 64 wide, 32 high
    src = tmp_path / "src"
    _write(src, {"stripes/wide.png": wide, "test/stripes/t.png": wide.T.copy()})
    (src / "dots").mkdir()
    Image.fromarray(np.full((50, 40, 3), 200, np.uint8)).save(src / "dots" / "photo.jpg", quality=95)
    icon = np.zeros((10, 30, 4), np.uint8)
    icon[..., 0], icon[:, :15, 3] = 255, 255  # red, its right half transparent
    Image.fromarray(icon).save(src / "dots" / "icon.png")
    (src / "dots" / "notes.txt").write_text("not an image")
    # formats Pillow recognises and cannot read (stopped the whole prepare, "not a readable image"): passed over
    (src / "dots" / "features.h5").write_bytes(b"\x89HDF\r\n\x1a\n0000")
    (src / "dots" / "clip.mpg").write_bytes(b"\x00\x00\x01\xb3" + bytes(16))
    _write(src, {"__MACOSX/dots/._photo.png": _GREY})  # a Mac zip's metadata: no class
    Image.fromarray(np.full((8, 8), 32896, np.uint16)).save(src / "dots" / "deep.png")  # 16-bit: 32896 / 257 = 128
    done = prepare_class_folders(src, tmp_path / "crop", 32, mode="grey", fit="crop")
    assert done.counts == {"train": 4, "test": 1}
    assert done.skipped == [src / "dots" / name for name in ("clip.mpg", "features.h5", "notes.txt")]
    train = load_classes(tmp_path / "crop", "train")
    assert train.classes == done.classes == ("dots", "stripes") and train.images.shape == (4, 1, 32, 32)
    assert (train.images[train.names.index("dots/deep.png")] == 128).all()  # not clipped to white
    crop = train.images[train.names.index("stripes/wide.png"), 0]
    # the shorter side (32) already the size: the centre 32 columns cut out, 16 white then 16 black, exactly
    assert (crop[:, :16] == 255).all() and (crop[:, 16:] == 0).all()
    assert abs(train.images[train.names.index("dots/photo.png"), 0].float().mean().item() - 200) <= 2  # a JPEG
    flat = train.images[train.names.index("dots/icon.png"), 0].float()  # red on black: grey 76 (ITU-R 601-2)
    assert abs(flat[:, 4].mean().item() - 76) <= 2 and flat[:, 28].max() <= 2  # the transparent half black
    prepare_class_folders(src, tmp_path / "pad", 32, mode="rgb", fit="pad")
    padded = load_classes(tmp_path / "pad", "train")
    assert padded.images.shape == (4, 3, 32, 32)
    pad = padded.images[padded.names.index("stripes/wide.png"), 0]
    # the longer side (64) down to 32: the image 16 high, centred on black (8 rows above and below)
    assert (pad[:8] == 0).all() and (pad[24:] == 0).all() and (pad[12, :12] >= 250).all() and (pad[12, 20:] <= 5).all()
    # the defaults: crop, as the library and the command say (a default of pad passed every test: mutation testing,
    # 2026-12-02), and RGB
    prepare_class_folders(src, tmp_path / "default", 32)
    default = load_classes(tmp_path / "default", "train")
    assert default.images.shape == (4, 3, 32, 32)
    assert (default.images[default.names.index("stripes/wide.png"), 0] == crop).all()
    assert in_process(capsys, "prepare", "--images", src, "--out", tmp_path / "cli", "--size", "32",
                      "--no-progress").returncode == 0
    made = load_classes(tmp_path / "cli", "train")
    assert (made.images[made.names.index("stripes/wide.png"), 0] == crop).all()


def test_a_long_file_name_in_a_title_keeps_the_end_that_tells_files_apart():
    """Phone photos under a long class folder were all titled 'golden_retriever/IMG_20…' (a review)."""
    from capsnet.figures.plots import plot_lengths, plot_misclassified

    names = [f"golden_retriever/IMG_20240312_{k:04d}.png" for k in (1, 2)]
    fig = plot_lengths(torch.rand(2, 2), torch.tensor([0, 0]), classes=["golden_retriever", "cat"], indices=[5, 9],
                       names=names)
    assert [a.get_title() for a in fig.axes] == ["test image 5, …20240312_0001.png\ntrue golden_retriever",
                                                 "test image 9, …20240312_0002.png\ntrue golden_retriever"]
    from capsnet.figures.arrays import Reconstructions

    rec = Reconstructions(torch.tensor([1, 1]), torch.rand(2, 1, 8, 8), torch.rand(2, 1, 8, 8), torch.rand(2, 2))
    fig = plot_misclassified(torch.rand(2, 1, 8, 8), rec, torch.tensor([0, 0]), ["golden_retriever", "cat"],
                             indices=[5, 9], names=names)
    assert fig.axes[0].get_title().split(chr(10))[0] == "#5: …0312_0001.png"


def test_a_large_jpeg_is_decoded_at_a_reduced_scale_that_keeps_the_fitted_pixels(tmp_path):
    """A photo many times the fitted size is decoded by libjpeg at 1/2..1/8 of its size (a 95-megapixel photo fitted
    to 28x28 took 707 MB), never below DRAFT_MARGIN times the side on either side, whichever way EXIF turns it; what
    prepare writes is within about a grey level of the full decode's fit on average; a PNG is read whole."""
    from capsnet.data.prepare import DRAFT_MARGIN, fit_pil, open_turned, prepare_class_folders

    y, x = np.mgrid[0:1800, 0:2400]
    scene = ((np.sin(x / 150) * np.cos(y / 110) + 1) * 120 + (x > 1200) * 15).astype(np.uint8)  # smooth, 2400x1800
    src = tmp_path / "src"
    (src / "waves").mkdir(parents=True)
    Image.fromarray(scene).save(src / "waves" / "photo.jpg", quality=95)
    turned = Image.fromarray(scene.T.copy())  # stored 1800 wide, 2400 high; EXIF orientation 6: shown a quarter turned
    exif = turned.getexif()
    exif[0x0112] = 6
    turned.save(src / "waves" / "turned.jpg", quality=95, exif=exif)
    Image.fromarray(scene).save(tmp_path / "flat.png")
    full = open_turned(src / "waves" / "photo.jpg")
    assert full.size == (2400, 1800)
    small = open_turned(src / "waves" / "photo.jpg", 28)
    assert small.size == (300, 225) and min(small.size) >= DRAFT_MARGIN * 28  # 1/8, still 8 x 28 high
    assert open_turned(src / "waves" / "turned.jpg", 28).size == (300, 225)  # reduced, then turned
    assert open_turned(src / "waves" / "photo.jpg", 100).size == (1200, 900)  # 1/2: 900 high, at least 8 x 100
    assert open_turned(src / "waves" / "photo.jpg", 120).size == (2400, 1800)  # 1/2 would be under 8 x 120 high
    assert open_turned(tmp_path / "flat.png", 28).size == (2400, 1800)
    Image.fromarray(scene).save(tmp_path / "phone.jpg", format="MPO", save_all=True, quality=95,
                                append_images=[Image.fromarray(scene[::4, ::4])])  # a phone's JPEG (a review)
    with Image.open(tmp_path / "phone.jpg") as img:
        assert img.format == "MPO"
    assert open_turned(tmp_path / "phone.jpg", 28).size == (300, 225)
    _write(src, {f"{c}/{k}.png": np.full((6, 6), 40 * k + 100 * (c == "dots"), np.uint8)
                 for c in ("dots", "test/dots", "test/waves") for k in range(2)})  # a second class, a test split
    prepare_class_folders(src, tmp_path / "out", 28, mode="grey", fit="crop")
    train = load_classes(tmp_path / "out", "train")
    written = train.images[list(train.names).index("waves/photo.png"), 0].float()
    whole = torch.tensor(np.asarray(fit_pil(full, 28, "grey", "crop")), dtype=torch.float32)
    assert (written - whole).abs().mean() < 1.5 and (written - whole).abs().max() <= 6, (written - whole).abs()
    # a detailed picture (random blocks of 10 px, 720x480: a scale of 1/2 at 28): libjpeg's scaling is a coarser
    # filter than the fit's Lanczos, and at 4 pixels per fitted pixel (1/4) it moved them by 1.3 levels on average
    blocks = (np.random.default_rng(0).integers(0, 2, (48, 72)).repeat(10, 0).repeat(10, 1) * 220).astype(np.uint8)
    Image.fromarray(np.stack([blocks, blocks[::-1], 255 - blocks], -1)).save(tmp_path / "blocks.jpg", quality=92)
    reduced = open_turned(tmp_path / "blocks.jpg", 28)
    assert reduced.size == (360, 240)
    moved = np.abs(np.asarray(fit_pil(reduced, 28, "rgb", "crop"), dtype=float)
                   - np.asarray(fit_pil(open_turned(tmp_path / "blocks.jpg"), 28, "rgb", "crop"), dtype=float))
    assert moved.mean() < 1.0 and moved.max() <= 5, (moved.mean(), moved.max())


def test_prepare_refuses_before_it_writes_and_the_command_says_what_to_train(tmp_path, capsys):
    from capsnet.data.prepare import prepare_class_folders

    src = tmp_path / "src"
    _write(src, {"a/x.png": _GREY, "a/y.png": _pixels(6, (8, 8)), "b/x.png": _GREY, "b/w.png": _pixels(4, (8, 8))})
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(src / "a" / "x.jpg")
    with pytest.raises(DataError, match=r"a/x.jpg and .*a/x.png have one name \(x\), which would be one PNG; rename one"):
        prepare_class_folders(src, tmp_path / "out", 16)
    (src / "a" / "x.jpg").unlink()
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(src / "a" / "X.jpg")  # one PNG where case is not told apart
    with pytest.raises(DataError, match=r"a/X.jpg and .*a/x.png have names that differ in case alone, which would be "
                                        r"one PNG on macOS's and Windows' disks; rename one of them"):
        prepare_class_folders(src, tmp_path / "out", 16)
    (src / "a" / "X.jpg").unlink()
    (src / "a" / "z.jpg").write_bytes(b"\xff\xd8 not really a JPEG")
    with pytest.raises(DataError, match=r"a/z.jpg is not a readable image .*; re-save it or move it out"):
        prepare_class_folders(src, tmp_path / "out", 16)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))  # nothing written, no leftovers
    (src / "a" / "z.jpg").unlink()
    (src / "c").mkdir()
    (src / "c" / "IMG_1.HEIC").write_bytes(b"")  # read once pillow-heif is installed (not here): the fix named
    with pytest.raises(DataError, match=r"src/c holds no image file Pillow reads \(1 HEIC photo\(s\): pip install "
                                        r"pillow-heif, and they are read\); put the class's images there"):
        prepare_class_folders(src, tmp_path / "out", 16)
    shutil.rmtree(src / "c")
    # a training photo copied into test/: named by its photo and its twin (train refused the folder made, naming the
    # PNG alone and pointing at the made folder; a review, 2026-12-01); another class's same pixels are no copy
    _write(src, {"test/a/t.png": _GREY, "test/b/u.png": _pixels(7, (8, 8))})
    with pytest.raises(DataError, match=r"src/test holds 1 photo\(s\) that are also training photos of their class "
                                        r"\(the same pixels once fitted\): test/a/t.png \(= a/x.png\); a test image "
                                        r"must not be trained on: keep each in test/ only \(remove its twin from the "
                                        r"class folder\); nothing written$"):
        prepare_class_folders(src, tmp_path / "out", 16)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))
    _write(src, {"b/v.png": _pixels(9, (8, 8)), "test/a/t.png": _pixels(9, (8, 8))})  # b's pixels, tested as a
    assert prepare_class_folders(src, tmp_path / "made-with-test", 16).counts == {"train": 5, "test": 2}
    shutil.rmtree(src / "test")
    (src / "b" / "v.png").unlink()
    _write(src, {"loose.png": _GREY})
    with pytest.raises(DataError, match=r"1 image\(s\) outside the class folders \(loose.png\); put each in"):
        prepare_class_folders(src, tmp_path / "out", 16)
    (src / "loose.png").unlink()
    with pytest.raises(DataError, match="is inside"):
        prepare_class_folders(src, src / "made", 16)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "k").write_text("")
    r = in_process(capsys, "prepare", "--images", src, "--out", tmp_path / "full", "--size", "16")
    assert r.returncode == 2 and "already holds files; give an empty or new folder (--out)" in r.stderr
    r = in_process(capsys, "prepare", "--images", src, "--out", tmp_path / "out", "--size", "17", "--mode", "grey",
                   "--no-progress")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == (f"wrote 4 train images of 17x17 (grey) in 2 classes to {tmp_path / 'out'}; train on "
                                f"them with: capsnet train --dataset classes:{tmp_path / 'out'}")
    assert load_classes(tmp_path / "out", "train").images.shape[1:] == (1, 17, 17)
    # one pixel smaller, the command it named was refused ("input 16x16 is too small for conv1 9x9 ..."): not named
    r = in_process(capsys, "prepare", "--images", src, "--out", tmp_path / "small", "--size", "16", "--no-progress")
    assert r.returncode == 0 and r.stdout.strip() == (
        f"wrote 4 train images of 16x16 (rgb) in 2 classes to {tmp_path / 'small'}; but capsnet train's CapsNet takes "
        f"images of 17x17 at least (conv1 9x9, then primary capsules 9x9 at stride 2): prepare them again with "
        f"--size 17 or more")
    with pytest.raises(ValueError, match="input 16x16 is too small for conv1 9x9"):
        CapsNetConfig(input_height=16, input_width=16)
    r = in_process(capsys, "prepare", "--images", src, "--out", tmp_path / "huge", "--size", "5000")
    assert r.returncode == 2 and "--size: must be an integer >= 1 and <= 4,096, got 5000" in r.stderr


def _disk_full_after(monkeypatch, files: int) -> list:
    """Pillow's saves find the disk full after ``files`` files (the files saved are listed in the list returned);
    ``monkeypatch.undo()`` gives the disk back."""
    from PIL import Image as PILImage

    save, saved = PILImage.Image.save, []

    def full_disk(self, fp, *args, **kwargs):
        if len(saved) == files:
            raise OSError(28, "No space left on device")
        saved.append(fp)
        return save(self, fp, *args, **kwargs)

    monkeypatch.setattr(PILImage.Image, "save", full_disk)
    return saved


@pytest.mark.parametrize("given, theirs", [("new", ["a", "b"]), ("empty", ["a", "b"]), ("empty", ["c"])])
def test_prepare_into_a_folder_another_run_fills_meanwhile_says_so_and_leaves_the_other_runs_files(tmp_path, given,
                                                                                                   theirs, monkeypatch):
    """Two `capsnet prepare` into one --out: the one that finished second said "cannot write in PARENT: Directory
    not empty" (its rename of a whole folder failing), or, into a folder given empty, would have moved its class
    folders over the other's files (a review, 2026-12-02). Now it names the cause and writes nothing."""
    from capsnet.data import prepare

    src, out = tmp_path / "src", tmp_path / "out"
    _write(src, {"a/x.png": _GREY, "a/y.png": _pixels(6, (8, 8)), "b/x.png": _pixels(5, (8, 8)),
                 "b/w.png": _pixels(4, (8, 8))})
    if given == "empty":
        out.mkdir()
    real = prepare._fitted

    def other_run_finishes(*args, **kwargs):  # while this run fits its first photo: class folders of the same
        if not (out / theirs[0]).exists():  # names as this run's, or of others (mixed in without a word before)
            _write(out, {f"{c}/theirs.png": _GREY for c in theirs})
        return real(*args, **kwargs)

    monkeypatch.setattr(prepare, "_fitted", other_run_finishes)
    with pytest.raises(DataError, match=rf"^{re.escape(str(out))} was filled by another program while this one worked "
                                        r"\(two `capsnet prepare` into one --out\?\); nothing written by this one"):
        prepare.prepare_class_folders(src, out, 16)
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == sorted(
        [*theirs, *(f"{c}/theirs.png" for c in theirs)])
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []


def test_prepare_refuses_a_class_that_training_could_not_hold_one_out_of(tmp_path):
    """Without test/, classes:DIR holds out a fifth of each class: a class of one photo, or of one photo saved twice
    ("IMG_1.png", "IMG_1 (1).png"), was prepared and its train command refused after the work (a review,
    2026-12-02). With test/, such a class is taken, as classes:DIR takes it."""
    from capsnet.data.prepare import prepare_class_folders

    src = tmp_path / "src"
    _write(src, {"a/x.png": _GREY, "a/y.png": _pixels(6, (8, 8)), "b/IMG_1.png": _pixels(9, (8, 8))})
    with pytest.raises(DataError, match=r"class 'b' holds 1 image in .*src/b; at least 2 are needed to hold one out "
                                        r"for testing \(add images, or put the test images in .*src/test/b\)"):
        prepare_class_folders(src, tmp_path / "out", 8)
    _write(src, {"b/IMG_1 (1).png": _pixels(9, (8, 8))})
    with pytest.raises(DataError, match=r"the photos of class 'b' in .*src/b hold the same pixels once fitted: a test "
                                        r"image must not be a copy of a training one, .*; nothing written$"):
        prepare_class_folders(src, tmp_path / "out", 8)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))
    with pytest.raises(DataError, match="the 2 files in .*b hold the same contents"):  # what training said after
        load_classes(src, "train")
    _write(src, {"test/a/t.png": _pixels(3, (8, 8)), "test/b/u.png": _pixels(4, (8, 8))})
    assert prepare_class_folders(src, tmp_path / "out", 8).counts == {"train": 4, "test": 2}
    assert len(load_classes(tmp_path / "out", "train")) == 4


def test_prepare_interrupted_while_writing_leaves_no_folder(tmp_path, monkeypatch):
    from capsnet.data.prepare import prepare_class_folders

    _write(tmp_path / "src", {f"{c}/{k}.png": _pixels(k + 1, (8, 8)) for c in ("a", "b") for k in range(3)})
    saved = _disk_full_after(monkeypatch, 2)  # the third file finds the disk full
    # said of the folder (the CLI said "cannot write the output ... (any earlier file of that name is unchanged)")
    with pytest.raises(DataError, match=f"cannot write the prepared images into {tmp_path / 'out'}: No space left on "
                                        f"device; free space there or write elsewhere \\(--out\\); nothing was kept"):
        prepare_class_folders(tmp_path / "src", tmp_path / "out", 8)
    assert len(saved) == 2 and not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))
    monkeypatch.undo()
    killed = tmp_path / ".out.tmp-999999999-1-dir"  # what a run killed outright (SIGKILL) leaves: no such process
    (killed / "a").mkdir(parents=True)
    (killed / "a" / "0.png").write_bytes(b"half")
    assert prepare_class_folders(tmp_path / "src", tmp_path / "out", 8).counts == {"train": 6}  # the same command again
    assert not killed.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["out", "src"]


def test_prepare_fills_an_empty_folder_given_in_place(tmp_path, monkeypatch):
    """An empty --out was removed and the partial folder renamed over it: its permissions, group bits and inode were
    lost, a shell standing in it saw an empty deleted folder, and a mount point was refused after every image was
    written (a review, 2026-12-01). Now it is filled in place, the record last; a failure leaves it empty, and a
    killed run's partial folder inside it is removed by the next."""
    import os
    import stat

    from capsnet.data.prepare import RECORD, prepare_class_folders

    _write(tmp_path / "src", {f"{c}/{k}.png": _pixels(10 * k + (c == "b")) for c in ("a", "b") for k in range(3)})
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o2770)
    inode = out.stat().st_ino
    _disk_full_after(monkeypatch, 3)  # the fourth file finds the disk full
    with pytest.raises(DataError, match="No space left"):
        prepare_class_folders(tmp_path / "src", out, 8)
    assert out.is_dir() and list(out.iterdir()) == [] and out.stat().st_ino == inode
    monkeypatch.undo()
    killed = out / ".capsnet-prepare.tmp-999999999-1-dir"  # a run killed outright (SIGKILL): no such process
    (killed / "a").mkdir(parents=True)
    (killed / "a" / "0.png").write_bytes(b"half")
    assert prepare_class_folders(tmp_path / "src", out, 8).counts == {"train": 6}
    assert out.stat().st_ino == inode and stat.S_IMODE(out.stat().st_mode) == 0o2770
    assert sorted(p.name for p in out.iterdir()) == [RECORD, "a", "b"] and len(list(out.glob("*/*.png"))) == 6
    assert len(load_classes(out, "train")) + len(load_classes(out, "test")) == 6
    assert sorted(os.listdir(tmp_path)) == ["out", "src"]  # nothing beside it


def test_16_bit_grey_files_are_scaled_alike_whatever_their_own_brightest_pixel(tmp_path):
    """Pillow opens a 16-bit PGM as 32-bit I; the scale was chosen by the image's own maximum, so a dark scan (200
    of 65,535) came out 200 of 255 and a lighter one (300) as 1 (a review, 2026-12-02)."""
    from capsnet.data.prepare import fit_image

    got = {}
    for level in (200, 300, 30000, 65535):
        a = np.zeros((20, 20), np.uint16)
        a[5:15, 5:15] = level
        path = tmp_path / f"p{level}.pgm"
        path.write_bytes(b"P5\n20 20\n65535\n" + a.astype(">u2").tobytes())
        with Image.open(path) as opened:
            assert opened.mode in ("I", "I;16", "I;16B")
        got[level] = int(fit_image(path, 20, 20, "grey", "crop").max())
    assert got == {level: round(level / 257) for level in got} == {200: 1, 300: 1, 30000: 117, 65535: 255}


def test_prepare_writes_what_classes_dir_reads_or_refuses_what_it_would_refuse(tmp_path, monkeypatch):
    """From a review: a key colour's transparency, 0..1 float images, an ICC profile and notes.pdf were carried
    through or misread, and folders classes:DIR refuses (case twins, a test class training lacks, images in a
    subfolder, a link to nothing) were written, to be refused by capsnet train after the work."""
    from PIL import ImageCms

    from capsnet.data.prepare import prepare_class_folders

    src = tmp_path / "src"
    _write(src, {"a/1.png": _GREY, "b/1.png": _GREY})
    Image.fromarray(np.full((8, 8), 50, np.uint8)).save(src / "a" / "keyed.png", transparency=50)  # all transparent
    Image.fromarray(np.full((8, 8), 0.5, np.float32)).save(src / "b" / "float.tif")
    icc = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    Image.fromarray(np.full((8, 8, 3), 9, np.uint8)).save(src / "b" / "profiled.png", icc_profile=icc)
    (src / "b" / "notes.pdf").write_bytes(b"%PDF-1.4 not an image here")
    (tmp_path / "made").mkdir()
    monkeypatch.chdir(tmp_path / "made")
    done = prepare_class_folders(src, ".", 8, mode="grey")  # "." itself: the empty working folder
    assert done.counts == {"train": 5} and done.skipped == [src / "b" / "notes.pdf"]
    # every file opaque, as classes:DIR takes them (it refuses transparency), in its training or its test split
    splits = [load_classes(tmp_path / "made", split) for split in ("train", "test")]
    both = {n: d.images[k, 0] for d in splits for k, n in enumerate(d.names)}
    assert len(both) == 5 and (both["a/keyed.png"] == 0).all() and (both["b/float.png"] == 128).all()  # flattened on black; 0.5 * 255
    with Image.open(tmp_path / "made" / "b" / "profiled.png") as png:
        assert "icc_profile" not in png.info and png.mode == "L"  # no RGB profile in a grey PNG
    monkeypatch.chdir(tmp_path)
    (tmp_path / "link").symlink_to(tmp_path / "empty", target_is_directory=True)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="link is a link; give the folder it points at"):
        prepare_class_folders(src, tmp_path / "link", 8)
    for files, problem in (
            ({"A/1.png": _GREY}, r"class folders A/ and a/, names that differ in case alone"),
            ({"test/c/1.png": _GREY}, r"test holds class folder\(s\) c that the training images have no folder for"),
            ({"a/2019/1.png": _GREY}, r"a holds subfolder\(s\) of images \(2019\), which are not read")):
        case = tmp_path / f"case{len(problem)}"
        shutil.copytree(src, case)
        _write(case, files)
        with pytest.raises(DataError, match=problem):
            prepare_class_folders(case, tmp_path / "out", 8)
        assert not (tmp_path / "out").exists()
    (src / "b" / "gone.png").symlink_to(tmp_path / "nowhere.png")
    with pytest.raises(DataError, match=r"b holds 1 link\(s\) to nothing \(gone.png\)"):
        prepare_class_folders(src, tmp_path / "out", 8)


def test_predict_fits_photos_of_other_sizes_and_formats_as_prepare_does(digit_classes, tmp_path):
    from capsnet.checkpoint import Checkpoint, save_checkpoint
    from capsnet.models import create_model
    from capsnet.predict import predict_folder

    root, run = digit_classes
    sevens = sorted((root / "seven").iterdir())[:4]
    (tmp_path / "png").mkdir()
    (tmp_path / "photos").mkdir()
    for k, f in enumerate(sevens):
        shutil.copy(f, tmp_path / "png" / f.name)
        digit = np.asarray(Image.open(f))
        if k % 2:  # 28x40: the digit with 6 black columns each side; crop keeps its centre 28x28, the digit exactly
            Image.fromarray(np.pad(digit, ((0, 0), (6, 6)))).save(tmp_path / "photos" / f.name)
        else:  # another format, at the model's own size
            Image.fromarray(digit).save(tmp_path / "photos" / f"{f.stem}.bmp")
    (tmp_path / "photos" / "notes.txt").write_text("passed over")
    (tmp_path / "photos" / "IMG_1.HEIC").write_bytes(b"")  # read once pillow-heif is installed (not here)
    plain = predict_folder(run, tmp_path / "png", tmp_path / "out1", which="last")
    fitted = predict_folder(run, tmp_path / "photos", tmp_path / "out2", which="last", fit="crop")
    by_stem = {Path(r["file"]).stem: r for r in plain.rows}
    assert len(fitted.rows) == 4 and fitted.notes == [
        "passed over 2 file(s) that are not images: IMG_1.HEIC, notes.txt (1 HEIC photo(s): pip install pillow-heif, "
        "and they are read)"]
    for r in fitted.rows:  # the same scores as the 28x28 PNGs themselves
        want = by_stem[Path(r["file"]).stem]
        assert r["class"] == want["class"] and r["score"] == pytest.approx(want["score"], abs=1e-6)
    with pytest.raises(DataError, match=r"capsnet reads PNG only: convert them to PNG, or move them out; or give --fit "
                                        r"crop or pad, which reads every format Pillow opens$"):
        predict_folder(run, tmp_path / "photos", tmp_path / "out3", which="last")
    for f in [*(tmp_path / "photos").glob("*.bmp"), tmp_path / "photos" / "IMG_1.HEIC"]:
        f.unlink()
    with pytest.raises(DataError, match=r"is 28x40 \(HxW\) but the classifier takes 28x28 images; resize or crop it "
                                        r"to that size, or give --fit crop \(or pad\)"):
        predict_folder(run, tmp_path / "photos", tmp_path / "out3", which="last")
    (tmp_path / "named").mkdir()  # a JPEG under a .png name: the same way out (it named conversion alone)
    Image.fromarray(np.zeros((28, 28), np.uint8)).save(tmp_path / "named" / "scan.png", format="JPEG")
    with pytest.raises(DataError, match=r"scan.png is a JPEG file, not a PNG; convert it to PNG; or give --fit crop or "
                                        r"pad, which reads every format Pillow opens$"):
        predict_folder(run, tmp_path / "named", tmp_path / "out3", which="last")
    assert not (tmp_path / "out3").exists()
    unet = create_model("unet", base_channels=4, depth=2)
    save_checkpoint(tmp_path / "unet.safetensors", Checkpoint("unet", unet.config.to_dict(), {},
                                                              {"epoch": 1, "step": 1}, unet.state_dict()))
    with pytest.raises(ValueError, match="segments images of any size as they are: leave --fit out"):
        predict_folder(tmp_path / "unet.safetensors", tmp_path / "photos", tmp_path / "out4", fit="pad")
    with pytest.raises(ValueError, match="--fit and --mnist-style each make an image of the model's size"):
        predict_folder(run, tmp_path / "photos", tmp_path / "out5", which="last", fit="pad", mnist_style=True)
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(tmp_path / "photos" / "y.jpg")
    # --mnist-style reads every format Pillow opens (PNG alone until 2026-12-01): the blank JPEG is named as blank
    with pytest.raises(DataError, match=r"y.jpg: the image is blank: give a digit that stands out from its "
                                        r"background$"):
        predict_folder("pretrained:capsnet-mnist-small", tmp_path / "photos", tmp_path / "out6", mnist_style=True)
    # from a review: x.jpg beside x.png both classified (rows are named by file); a shape held in the alpha alone
    # refused, not scored blank
    for f in (tmp_path / "photos").iterdir():
        f.unlink()
    seven = np.asarray(Image.open(sevens[0]))
    Image.fromarray(seven).save(tmp_path / "photos" / "x.png")
    Image.fromarray(seven).save(tmp_path / "photos" / "x.jpg", quality=95)
    both = predict_folder(run, tmp_path / "photos", tmp_path / "out7", which="last", fit="pad")
    assert sorted(r["file"] for r in both.rows) == ["x.jpg", "x.png"]
    ink = np.zeros((28, 28, 4), np.uint8)
    ink[..., 3] = seven  # black strokes whose shape is their alpha alone
    Image.fromarray(ink).save(tmp_path / "photos" / "drawn.png")
    with pytest.raises(DataError, match=r"drawn.png holds its shape in its transparency alone"):
        predict_folder(run, tmp_path / "photos", tmp_path / "out8", which="last", fit="pad")


def test_a_run_on_a_prepared_folder_remembers_its_fit_for_predict_and_the_viewer(digit_classes, tmp_path):
    from capsnet.checkpoint import load_checkpoint
    from capsnet.data.prepare import prepare_class_folders, prepared_fit
    from capsnet.predict import predict_folder
    from capsnet.viz.engine import load_viewer

    root, _ = digit_classes
    src = tmp_path / "photos"
    for name in ("one", "zero"):
        shutil.copytree(root / name, src / name)
    prepare_class_folders(src, tmp_path / "made", 28, mode="grey", fit="crop")
    assert prepared_fit(tmp_path / "made") == "crop" and prepared_fit(root) is None  # a folder it did not make
    assert len(load_classes(tmp_path / "made", "train")) + len(load_classes(tmp_path / "made", "test")) == 16
    cfg = CapsNetConfig(conv1_channels=4, primary_types=2, decoder_hidden=(16, 32), num_classes=2)
    fit(cfg, TrainConfig(dataset=f"classes:{tmp_path / 'made'}", epochs=1, batch_size=8), tmp_path / "run",
        progress=False)
    assert load_checkpoint(tmp_path / "run" / "last.safetensors").state["data"]["prepared_fit"] == "crop"
    wide = tmp_path / "new"
    wide.mkdir()
    photo = np.zeros((28, 40), np.uint8)
    photo[4:24, :6] = 255  # a bar that a crop to the centre 28 columns cuts away and a pad keeps
    Image.fromarray(photo).save(wide / "w.png")
    # a photo of another size is fitted by the fit the run recorded (it was refused, naming it), and a note says so
    done = predict_folder(tmp_path / "run", wide, tmp_path / "out", which="last")
    crop, pad = (predict_folder(tmp_path / "run", wide, tmp_path / f"out-{f}", which="last", fit=f) for f in
                 ("crop", "pad"))
    assert done.rows == crop.rows != pad.rows
    assert done.notes == ["1 of 1 images (w.png) were fitted to the model's 28x28 grey input by --fit crop (resized, "
                          "converted or their transparency flattened onto black), as capsnet prepare made the folder "
                          "it trained on (give --fit to choose)"]
    assert not crop.notes and not pad.notes
    # a folder of images the model's size and a subfolder (old photos, say): read as the PNG path reads them, the
    # subfolder passed over (it was refused, "move their images into ... itself"), and no note: nothing was fitted
    same = tmp_path / "same"
    (same / "old").mkdir(parents=True)
    Image.fromarray(np.zeros((28, 28), np.uint8)).save(same / "s.png")
    Image.fromarray(photo).save(same / "old" / "w.png")
    done = predict_folder(tmp_path / "run", same, tmp_path / "out-same", which="last")
    assert [r["file"] for r in done.rows] == ["s.png"] and done.notes == []
    # of the model's size but colour, or with transparent pixels (refused without a fit): converted as prepare
    # converts photos, and noted as such (the note counted resized images alone; a review, 2026-12-01)
    colour = np.zeros((28, 28, 4), np.uint8)
    colour[..., 0], colour[..., 3] = 200, 255
    Image.fromarray(colour[..., :3]).save(same / "c.png")
    colour[:10, :, 3] = 0
    Image.fromarray(colour).save(same / "t.png")
    done = predict_folder(tmp_path / "run", same, tmp_path / "out-same", which="last")
    assert done.notes[0].startswith("2 of 3 images (c.png, t.png) were fitted to the model's 28x28 grey input")
    # a grey JPEG of the model's size: its pixels are what it decodes to, not "fitted" (it was named in the note)
    jpeg = tmp_path / "jpeg"
    jpeg.mkdir()
    Image.fromarray(photo[:, :28]).save(jpeg / "j.jpg", quality=90)
    Image.fromarray(photo).save(jpeg / "w.jpg", quality=90)
    done = predict_folder(tmp_path / "run", jpeg, tmp_path / "out-jpeg", which="last")
    assert [r["file"] for r in done.rows] == ["j.jpg", "w.jpg"]
    assert done.notes[0].startswith("1 of 2 images (w.jpg) were fitted")
    assert load_viewer(tmp_path / "run", which="last", progress=False).upload_style == "crop"
    # the PNGs without prepare's record (copied alone, say): the same images, so no "folder changed" warning, and the
    # resumed run keeps the fit it trained with (it warned, then saved the folder without it; a review, 2026-12-01)
    (tmp_path / "made" / ".capsnet-prepare.json").unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit(cfg, TrainConfig(dataset=f"classes:{tmp_path / 'made'}", epochs=2, batch_size=8), tmp_path / "run",
            progress=False, resume=True)
    assert load_checkpoint(tmp_path / "run" / "last.safetensors").state["data"]["prepared_fit"] == "crop"


def test_copies_of_one_photo_go_to_one_split_and_a_class_of_one_picture_is_refused(tmp_path):
    """Without a test folder each image was split by its name alone: "IMG_000.png" and its copy "IMG_000 (1).png"
    landed in both splits (11 of 15 test images copies of training ones, no word; a review, 2026-12-01). Copies now
    follow their first name's draw; an image without a twin keeps the split its name gives."""
    files = {}
    for k in range(20):
        files[f"a/IMG_{k:03d}.png"] = files[f"a/IMG_{k:03d} (1).png"] = _pixels(k)  # each photo saved twice
        files[f"b/{k:02d}.png"] = _pixels(100 + k)  # no twins: split by name as before
    _write(tmp_path, files)
    train, test = load_classes(tmp_path, "train"), load_classes(tmp_path, "test")
    trained = {bytes(im.flatten().tolist()) for im in train.images}
    assert len(test) >= 2 and not any(bytes(im.flatten().tolist()) in trained for im in test.images)
    twins = [(f"a/IMG_{k:03d}.png", f"a/IMG_{k:03d} (1).png") for k in range(20)]
    held = held_out_names([min(t) for t in twins])  # the first name (sorted: the copy's, " " < ".") decides both
    assert {n for n in test.names if n.startswith("a/")} == {n for t in twins if min(t) in held for n in t}
    assert {n for n in test.names if n.startswith("b/")} == held_out_names([f"b/{k:02d}.png" for k in range(20)])
    for k in range(20):  # a class whose every image is one picture has nothing to test on that was not trained on
        (tmp_path / "b" / f"{k:02d}.png").unlink()
    _write(tmp_path, {"b/x.png": _pixels(7), "b/y.png": _pixels(7)})
    with pytest.raises(DataError, match=r"the 2 files in .*/b hold the same contents: a test file must not be a copy "
                                        r"of a training one, so at least 2 different ones are needed"):
        load_classes(tmp_path, "test")


@pytest.mark.parametrize("fit", ["crop", "pad"])
def test_a_fit_to_a_size_that_is_not_square_gives_its_height_and_width(fit):
    """fit_array(image, 28, 20) is 28 high and 20 wide for both fits: every fit test was square, so height and width
    swapped in the crop passed (mutation testing, 2026-12-02)."""
    from capsnet.data.prepare import fit_array

    img = Image.fromarray(np.full((50, 80), 200, np.uint8))  # 80 wide, 50 high
    out = fit_array(img, 28, 20, "grey", fit)
    assert out.shape == (1, 28, 20) and out.dtype == np.uint8
