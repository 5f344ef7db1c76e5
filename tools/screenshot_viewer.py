"""A screenshot of the viewer on a checkpoint, as the README shows it: the page served on loopback and drawn by
Debian's chromium through Playwright (never a downloaded browser).

    python tools/screenshot_viewer.py --checkpoint runs/experiment-segmentation/segcaps --which last \\
        --index 3 --data-dir ../shared/data --out docs/viewer-segcaps.png
"""
from __future__ import annotations

import argparse
import os

from capsnet.viz import load_viewer, serve_in_thread

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True, help="run directory, checkpoint file or pretrained:NAME")
    p.add_argument("--which", choices=("best", "last"), default="last")
    p.add_argument("--dataset", default=None, help="test set to pick from (default: the run's)")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--index", type=int, default=0, help="the test image shown")
    p.add_argument("--routing", default=None, help="segmentation models: the capsule layer whose routing is shown")
    p.add_argument("--size", type=int, nargs=2, default=(1400, 1000), metavar=("WIDTH", "HEIGHT"))
    p.add_argument("--out", required=True, help="PNG file to write")
    args = p.parse_args(argv)

    from playwright.sync_api import sync_playwright

    viewer = load_viewer(args.checkpoint, which=args.which, dataset=args.dataset, data_dir=args.data_dir,
                         progress=False)
    server, _ = serve_in_thread(viewer)
    url = "http://%s:%d/" % server.server_address[:2]
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": args.size[0], "height": args.size[1]})
            page.goto(url)
            page.wait_for_function("document.body.dataset.ready === '1'", timeout=60_000)
            if args.index:
                page.fill("#test-index", str(args.index))
                walks = page.evaluate("Number(document.body.dataset.walks || 0)")
                page.click("#show-test")
                page.wait_for_function(f"Number(document.body.dataset.walks || 0) > {walks}", timeout=60_000)
            if args.routing:
                page.select_option("#routing-layer", args.routing)
                page.wait_for_timeout(2000)
            page.screenshot(path=args.out, full_page=False)
            browser.close()
    finally:
        server.shutdown()
        server.server_close()
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
