"""End to end in a real headless browser: Debian's chromium driven by Playwright.

Playwright never downloads a browser here: it launches /usr/bin/chromium
(CHROMIUM overrides the path). Without chromium or playwright the test is
skipped, unless CAPSNET_REQUIRE_BROWSER=1 (set by .ci/run) makes that a failure.
"""
from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from capsnet.viz import decode, serve_in_thread

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run", "--disable-quic"]


def _missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -e '.[test]')"
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        return f"no chromium at {CHROMIUM} (apt-get install chromium, or set CHROMIUM)"
    return None


@pytest.fixture(scope="module")
def page_url(viewer):
    why = _missing()
    if why:
        if os.environ.get("CAPSNET_REQUIRE_BROWSER") == "1":
            pytest.fail(f"CAPSNET_REQUIRE_BROWSER=1 but {why}")
        pytest.skip(why)
    srv, thread = serve_in_thread(viewer)
    yield "http://%s:%d/" % srv.server_address[:2]
    srv.shutdown()
    srv.server_close()


def test_pick_draw_and_slide(page_url, viewer):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 1000})
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(page_url)
            page.wait_for_selector("body[data-ready='1']", timeout=30_000)
            assert page.locator("#untrained").is_hidden()
            assert len(page.locator("input.dim-slider").all()) == 16

            # pick a test image by index
            page.fill("#test-index", "7")
            page.click("#show-test")
            page.wait_for_function("document.body.dataset.walks === '2'")
            assert "test image #7" in page.inner_text("#source")
            recon = "document.getElementById('recon').toDataURL()"
            before = page.evaluate(recon)

            # drag slider 0 with the mouse, then send sliders 4, 9 and 13 to their ends with the keyboard
            page.locator("#dim-0").scroll_into_view_if_needed()
            box = page.locator("#dim-0").bounding_box()
            page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
            page.mouse.down()
            page.mouse.move(box["x"] + 3, box["y"] + box["height"] / 2, steps=6)
            page.mouse.up()
            for d, key in [(4, "End"), (9, "Home"), (13, "End")]:
                page.focus(f"#dim-{d}")
                page.keyboard.press(key)
            page.wait_for_function("document.querySelector('#dim-13-value').textContent === '+0.250'")
            page.wait_for_function("Number(document.body.dataset.reconstructions || 0) >= 1 "
                                   "&& !state.inflight && !state.pending")
            page.wait_for_function(f"{recon} !== {before!r}")
            assert page.inner_text("#error") == ""

            # what the page shows is the decoder's image of the pose the sliders set
            base = page.evaluate("state.walk.poses[state.selected]")
            pose = page.evaluate("state.pose")
            j = page.evaluate("state.selected")
            delta = [p - b for p, b in zip(pose, base)]
            assert delta[0] < -0.2 and abs(delta[4] - 0.25) < 1e-3 and abs(delta[9] + 0.25) < 1e-3
            assert all(abs(delta[d]) < 1e-9 for d in range(16) if d not in (0, 4, 9, 13))
            expected = decode(viewer.reconstruct(pose, j)["reconstruction"])[0]  # (28, 28)
            shown = page.evaluate("""() => {
                const c = document.getElementById('recon'), s = c.width / 28;
                const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
                const out = [];
                for (let y = 0; y < 28; y++) for (let x = 0; x < 28; x++)
                    out.push(d[4 * (Math.floor((y + 0.5) * s) * c.width + Math.floor((x + 0.5) * s))]);
                return out;
            }""")
            np.testing.assert_array_equal(np.array(shown).reshape(28, 28), np.round(expected * 255))

            # draw a vertical stroke: the drawing is sent, preprocessed and classified
            input_before = page.evaluate("document.getElementById('input').toDataURL()")
            page.locator("#draw").scroll_into_view_if_needed()
            box = page.locator("#draw").bounding_box()
            page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.15)
            page.mouse.down()
            for k in range(1, 11):
                page.mouse.move(box["x"] + box["width"] * 0.52, box["y"] + box["height"] * (0.15 + 0.07 * k))
            page.mouse.up()
            page.wait_for_function("document.body.dataset.walks === '3' || document.querySelector('#error').textContent")
            assert page.inner_text("#error") == ""
            assert "your image" in page.inner_text("#source")
            assert page.evaluate("document.getElementById('input').toDataURL()") != input_before
            blank = "(() => { const c = document.getElementById('draw');" \
                    " return c.getContext('2d').getImageData(0, 0, c.width, c.height).data.every(" \
                    "(v, i) => i % 4 === 3 || v === 0); })()"
            assert not page.evaluate(blank)  # the stroke is on the canvas ...

            # ... until another test image is shown: the drawing is no longer the input
            page.click("#show-test")
            page.wait_for_function("document.body.dataset.walks === '4'")
            assert page.evaluate(blank)

            # the primary capsules and per-type routing maps: one labelled map per capsule type
            types = viewer.info()["primary"]["types"]
            for panel in ("#primary", "#routing-types"):
                assert page.locator(f"{panel} figure canvas").count() == types
                assert page.locator(f"{panel} figcaption").all_inner_texts()[:2] == ["type 0", "type 1"]
                assert page.locator(f"{panel} canvas").first.bounding_box()["width"] >= 48  # not a tiny strip

            # the panels a user came for are above the fold of a 1400x1000 window
            page.set_viewport_size({"width": 1400, "height": 1000})
            page.evaluate("window.scrollTo(0, 0)")
            for panel in ("#digits-panel", "#routing-panel", "#primary-panel"):
                assert page.locator(panel).bounding_box()["y"] < 1000 - 150, panel
            assert errors == []
        finally:
            browser.close()
