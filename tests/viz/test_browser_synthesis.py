"""The synthesis page (CapsPix2pix, pix2pix) end to end in headless chromium, as test_browser.py drives the
classification and segmentation pages (skipped the same way without chromium or playwright)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from capsnet.viz import decode
from http_helpers import serving
from test_browser import ARGS, CHROMIUM, CLASSIFICATION_ONLY, _need_browser, _pixels, _stroke, open_page

pytestmark = pytest.mark.e2e  # a real chromium on the viewer: the README's e2e tier, run by CI's second step


@pytest.fixture(scope="module")
def synthesis_urls(synthesis_viewer, pix2pix_viewer):
    _need_browser()
    with serving(synthesis_viewer) as caps, serving(pix2pix_viewer) as pix:
        yield ["http://%s:%d/" % srv.server_address[:2] for srv in (caps, pix)]


def _open(browser, url: str, errors: list):
    page = open_page(browser, url, errors, width=1400, timeout=60_000)
    assert page.inner_text("#error") == ""
    return page


def _wait_walk(page, n: int) -> None:
    """Wait for the page's n-th walk to be shown, with no error left on the page."""
    page.wait_for_function(f"document.body.dataset.walks === '{n}'", timeout=60_000)
    assert page.inner_text("#error") == ""
    assert page.evaluate("document.body.dataset.walks") == str(n)


def _shown_samples(page, H: int, W: int) -> list[np.ndarray]:
    n = page.locator("#syn-samples canvas[id^='syn-sample-']").count()
    return [_pixels(page, f"syn-sample-{k}", H, W) for k in range(n)]


def _bytes(e, k: int | None = None) -> np.ndarray:
    """An encoded image (C, H, W), or image k of a batch, as the page draws it: channel 0's bytes."""
    a = decode(e)
    return np.round((a if k is None else a[k])[0] * 255)


def test_the_capspix2pix_page_shows_samples_noise_and_layers(synthesis_urls, synthesis_viewer):
    from playwright.sync_api import sync_playwright

    v = synthesis_viewer
    info = v.info()
    _, H, W = info["input"]
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = _open(browser, synthesis_urls[0], errors)
            for hidden in CLASSIFICATION_ONLY + ("#seg-panel", "#syn-interpolation-none"):
                assert page.locator(hidden).is_hidden(), hidden
            assert page.locator("input.dim-slider").count() == 0
            for shown in ("#syn-panel", "#syn-noise-panel", "#layers-panel", "#seg-routing-panel", "#conv-panel",
                          "#test-index", "#syn-seeds", "#syn-truncation", "#syn-truth", "#syn-noise-map"):
                assert page.locator(shown).is_visible(), shown
            assert "CapsPix2pix (capspix2pix), synthesis" in page.inner_text("#model-info")
            assert "13 capsule layers, 12 of them routing (dynamic)" in page.inner_text("#model-info")
            assert page.input_value("#syn-seeds") == "0, 1, 2, 3"

            # the real image and the four samples drawn are the engine's, captioned with their scores
            w = v.walk(v.test_input(0))
            np.testing.assert_array_equal(_pixels(page, "syn-truth", H, W), _bytes(w["truth"]))
            shown = _shown_samples(page, H, W)
            assert len(shown) == 4
            for k, pixels in enumerate(shown):
                np.testing.assert_array_equal(pixels, _bytes(w["samples"], k))
            captions = page.locator("#syn-samples figcaption").all_inner_texts()
            s0 = w["scores"][0]
            assert captions[0] == "real image"
            assert captions[1].split("\n") == ["seed 0", f"L1 {s0['l1']:.3f} · SSIM {s0['ssim']:.3f}"]
            assert f"spread {w['spread']:.4f} over 4 seeds" in page.inner_text("#syn-summary")
            source = page.inner_text("#source")
            assert "test pair #0 of mnist-skeleton" in source and f"class {w['source']['class_name']}" in source

            # the interpolation row (seed 0 to seed 1), the noise channel and every capsule layer
            assert page.locator("#syn-interpolation canvas").count() == 8
            between = _pixels(page, "syn-interpolation-7", H, W)
            np.testing.assert_array_equal(between, _bytes(w["interpolation"], 7))
            assert page.inner_text("#syn-interpolation-ends") == "seed 0 to seed 1"
            assert page.inner_text("#syn-noise-caption").startswith("noise channel of seed 0")
            layers = page.locator("#layers .layer")
            assert layers.count() == len(info["layers"]) > 0
            for k, layer in enumerate(info["layers"]):
                assert layers.nth(k).locator("figure canvas").count() == layer["types"]
            assert page.locator("#feature-maps").bounding_box()["width"] > 0

            # other seeds re-walk the same label map
            page.fill("#test-index", "2")
            page.click("#show-test")
            _wait_walk(page, 2)
            page.fill("#syn-seeds", "5,6")
            page.press("#syn-seeds", "Enter")
            _wait_walk(page, 3)
            assert "test pair #2" in page.inner_text("#source")
            assert "test pair #2" in page.get_attribute("#input", "aria-label")  # named as drawn (a review)
            assert page.get_attribute("#syn-sample-1", "aria-label") == "the image of seed 6"
            w = v.walk(v.test_input(2), seeds=[5, 6])
            shown = _shown_samples(page, H, W)
            assert len(shown) == 2 and page.locator("#syn-samples figure").count() == 3
            for k, pixels in enumerate(shown):
                np.testing.assert_array_equal(pixels, _bytes(w["samples"], k))
            assert [c.split("\n")[0] for c in page.locator("#syn-samples figcaption").all_inner_texts()] == \
                ["real image", "seed 5", "seed 6"]
            assert page.inner_text("#syn-interpolation-ends") == "seed 5 to seed 6"
            assert not np.array_equal(shown[0], shown[1])  # two draws of the noise

            # truncation 0: every seed gets the noise's mean, so one image
            page.fill("#syn-truncation", "0")
            page.press("#syn-truncation", "Enter")
            _wait_walk(page, 4)
            assert page.evaluate("state.walk.truncation") == 0
            shown = _shown_samples(page, H, W)
            np.testing.assert_array_equal(shown[0], shown[1])
            np.testing.assert_array_equal(shown[0], _bytes(v.walk(v.test_input(2), seeds=[9], truncation=0)["samples"],
                                                           0))
            assert "spread 0.0000" in page.inner_text("#syn-summary")

            # one seed: no interpolation, but the noise channel; a seed list that is not one is refused, not sent
            page.fill("#syn-seeds", "3")
            page.press("#syn-seeds", "Enter")
            _wait_walk(page, 5)
            assert len(_shown_samples(page, H, W)) == 1
            assert page.locator("#syn-interpolation-block").is_hidden()
            assert page.locator("#syn-interpolation-none").is_visible()
            assert page.locator("#syn-noise-map").is_visible()
            page.fill("#syn-seeds", "1, x")
            page.press("#syn-seeds", "Enter")
            page.wait_for_function("document.querySelector('#error').textContent !== ''")
            assert "seeds" in page.inner_text("#error")
            assert page.evaluate("document.body.dataset.walks") == "5"
            page.fill("#syn-seeds", "1, 1")  # the server's refusal is shown too
            page.press("#syn-seeds", "Enter")
            page.wait_for_function("document.querySelector('#error').textContent.includes('repeats')")
            page.fill("#syn-seeds", "0, 4")
            page.press("#syn-seeds", "Enter")
            _wait_walk(page, 6)

            # another routing layer, for the same label map
            other = info["routing_layers"][-1]
            assert page.evaluate("state.routing") != other
            page.select_option("#routing-layer", other)
            _wait_walk(page, 7)
            assert page.inner_text("#seg-routing-layer") == f"{other}, to parent type 0"
            assert page.evaluate("state.walk.routing.layer") == other and "test pair #2" in page.inner_text("#source")

            # a drawing: thin strokes scaled to the label map's size, walked with the seeds and truncation set
            _stroke(page)
            _wait_walk(page, 8)
            assert page.evaluate("state.walk.source.kind") == "upload"
            assert f"your label map ({W}x{H} px" in page.inner_text("#source")
            assert page.locator("#syn-truth").count() == 0
            assert "L1" not in page.inner_text("#syn-samples") and "no real image" in page.inner_text("#syn-summary")
            drawn = decode(page.evaluate("state.walk.input"))[0]  # (H, W)
            rows = (drawn > 0.5).sum(axis=1)
            assert rows.sum() > 5 and rows.max() <= 2, rows  # a skeleton's stroke: one or two pixels wide
            w = page.evaluate("state.walk")
            assert w["seeds"] == [0, 4] and w["truncation"] == 0 and w["routing"]["layer"] == other
            expected = v.walk(v.image_input(torch.from_numpy(decode(w["input"])), {"kind": "upload"}), seeds=[0, 4],
                              truncation=0)
            for k, pixels in enumerate(_shown_samples(page, H, W)):
                np.testing.assert_array_equal(pixels, _bytes(expected["samples"], k))

            # a drawing whose walk fails (seeds not yet fixed) stays the input: fixing the seeds walks it
            page.fill("#syn-seeds", "1, x")
            page.press("#syn-seeds", "Enter")
            page.wait_for_function("document.querySelector('#error').textContent !== ''")
            page.click("#clear-drawing")
            _stroke(page, x0=0.3)  # a new drawing, refused in the page as well (nothing sent)
            assert page.evaluate("document.body.dataset.walks") == "8"
            page.fill("#syn-seeds", "5")
            page.press("#syn-seeds", "Enter")
            _wait_walk(page, 9)
            assert page.evaluate("state.walk.source.kind") == "upload" and page.evaluate("state.walk.seeds") == [5]
            redrawn = decode(page.evaluate("state.walk.input"))[0]
            assert (redrawn > 0.5).sum(axis=0).argmax() < (drawn > 0.5).sum(axis=0).argmax()  # the new, left stroke

            # a test pair again: the drawing is cleared, the real image is back
            page.click("#show-test")
            _wait_walk(page, 10)
            assert page.locator("#syn-truth").is_visible()
            assert errors == []
        finally:
            browser.close()


def test_the_pix2pix_page_has_no_noise_vector_nor_capsule_layers(synthesis_urls, pix2pix_viewer):
    from playwright.sync_api import sync_playwright

    v = pix2pix_viewer
    _, H, W = v.info()["input"]
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = _open(browser, synthesis_urls[1], errors)
            for hidden in CLASSIFICATION_ONLY + ("#seg-panel", "#syn-truncation-label", "#syn-noise-panel",
                                                 "#syn-interpolation", "#syn-noise-map", "#layers-panel",
                                                 "#seg-routing-panel"):
                assert page.locator(hidden).is_hidden(), hidden
            for shown in ("#syn-panel", "#syn-seeds", "#syn-truth", "#conv-panel"):
                assert page.locator(shown).is_visible(), shown
            assert page.inner_text("#conv-title") == "First convolution (down.0)"
            assert "dropout" in page.inner_text("#syn-panel") and "untrained Pix2pix" in page.inner_text("#model-info")
            assert page.locator("#untrained").is_visible()
            assert "so the images it makes mean nothing" in page.inner_text("#untrained")

            w = v.walk(v.test_input(0))
            shown = _shown_samples(page, H, W)
            assert len(shown) == 4
            for k, pixels in enumerate(shown):
                np.testing.assert_array_equal(pixels, _bytes(w["samples"], k))
            assert "class two" in page.inner_text("#source")

            page.fill("#syn-seeds", "7")  # a seed picks the dropout masks; no truncation is sent (it is refused)
            page.press("#syn-seeds", "Enter")
            _wait_walk(page, 2)
            np.testing.assert_array_equal(_shown_samples(page, H, W)[0],
                                          _bytes(v.walk(v.test_input(0), seeds=[7])["samples"], 0))
            assert "spread – (one seed)" in page.inner_text("#syn-summary")

            _stroke(page)
            _wait_walk(page, 3)
            assert page.evaluate("state.walk.source.kind") == "upload" and page.locator("#syn-truth").count() == 0
            assert page.locator("#layers-panel").is_hidden() and page.locator("#syn-noise-panel").is_hidden()
            assert errors == []
        finally:
            browser.close()
