"""Render an ``et-link simulate --html`` page in the system's headless Chromium and save a PNG of it.

    python scripts/view_png.py PAGE.html OUT.png [--section rank-0] [--width 1400]

Draws the page the way a reader sees it (Playwright driving ``/usr/lib/chromium/chromium``, the
Debian package; never a downloaded browser) and screenshots from the top of the page to the end of
the chosen section's plot. Used for ``docs/images/view.png`` (the param_dlrm rank 0 view).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from playwright.sync_api import sync_playwright


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("page", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--section", default="rank-0", help="the page section whose plot ends the picture")
    parser.add_argument("--width", type=int, default=1400)
    parser.add_argument("--chromium", default="/usr/lib/chromium/chromium", help="the system Chromium binary")
    args = parser.parse_args()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=args.chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": args.width, "height": 900})
        page.goto(args.page.resolve().as_uri())
        plot = page.locator(f"#plot-{args.section}")
        plot.locator(".barlayer").first.wait_for(timeout=120_000)
        box = plot.bounding_box()
        page.screenshot(path=str(args.out), full_page=True,
                        clip={"x": 0, "y": 0, "width": args.width, "height": box["y"] + box["height"] + 10})
        browser.close()
    print(f"{args.out}: {args.out.stat().st_size / 1024:.0f} KB")


if __name__ == "__main__":
    main()
