"""report.html in a real headless browser (Debian's chromium driven by Playwright): no console errors,
every chart renders, and a screenshot is taken.

Needs /usr/bin/chromium (``apt-get install -y chromium``) and ``pip install playwright``; set
DRAFTGEN_NO_BROWSER=1 to leave this test out on a machine that cannot have a browser.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from _report_helpers import make_config, write_run_dir
from draftgen.config import load_config
from draftgen.report.html import run_report

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]

if os.environ.get("DRAFTGEN_NO_BROWSER") == "1":
    pytest.skip("DRAFTGEN_NO_BROWSER=1: browser test left out on purpose", allow_module_level=True)


def test_report_renders_in_chromium(tmp_path: Path) -> None:
    assert CHROMIUM.exists(), (
        "the report browser test needs Debian's chromium: run `apt-get install -y chromium` "
        "(or set DRAFTGEN_NO_BROWSER=1 to leave this test out)"
    )
    from playwright.sync_api import sync_playwright

    run = tmp_path / "run"
    write_run_dir(run)
    page_path = run_report(load_config(make_config(tmp_path, run)))
    problems: list[str] = []
    requests: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.on("console", lambda msg: problems.append(f"{msg.type}: {msg.text}") if msg.type in ("error", "warning") else None)
            page.on("pageerror", lambda exc: problems.append(f"pageerror: {exc}"))
            page.on("request", lambda req: requests.append(req.url))
            page.goto(page_path.as_uri(), wait_until="load")
            page.wait_for_function("document.querySelectorAll('.chart .main-svg').length >= 6", timeout=20_000)
            charts = page.locator(".chart")
            assert charts.count() == 6
            for i in range(charts.count()):
                chart = charts.nth(i)
                assert chart.locator("svg.main-svg").count() >= 1
                box = chart.bounding_box()
                assert box is not None and box["width"] > 200 and box["height"] > 200
            # Bars and the line actually drew (not only empty axes).
            assert page.locator("#chart-cost .scatterlayer path.js-line").count() == 1
            assert page.locator("#chart-throughput .bars path").count() > 5
            assert page.locator("#chart-providers .slice").count() == 3
            assert page.locator("#datasets tbody tr").count() == 3
            shot = tmp_path / "report.png"
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert shot.stat().st_size > 50_000
    assert problems == []
    assert [u for u in requests if not u.startswith("file:")] == []
