"""The exported HTML pages in headless Chromium, offline, at a projector's 1280x720.

A run page (`page.run_page`) and a comparison page (`rigkit.widgets.page`) are written from
the saved quickstart runs, opened as files with the network off (every non-file request is
refused and counted), stepped through, and screenshotted to tests/artifacts/. In lecture mode
the DOM must show no text under 18 px and the stepper must fit the viewport's height.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rigkit.trace import RIGResult
from rigkit.widgets import page
from tests.test_browser import _setup_module

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "tests" / "artifacts"
RUNS = ROOT / "notebooks" / "runs"

pytestmark = pytest.mark.browser

# Every element with its own text: its computed font size in px (hidden rounds included, as
# stepping shows them later).
SMALLEST_TEXT = """() => {
  let smallest = 1000, where = '';
  for (const el of document.querySelectorAll('.rigkit-page *')) {
    const own = [...el.childNodes].some(n => n.nodeType === 3 && n.textContent.trim());
    if (!own) continue;
    const size = parseFloat(getComputedStyle(el).fontSize);
    if (size < smallest) { smallest = size; where = el.outerHTML.slice(0, 80); }
  }
  return [smallest, where];
}"""


def _runs(name: str) -> dict[str, RIGResult]:
    data = json.loads((RUNS / f"{name}.json").read_text(encoding="utf-8"))
    return {k: RIGResult.from_dict(v) for k, v in data["results"].items()}


@pytest.fixture
def offline_page(tmp_path):
    """A Chromium page at 1280x720 that can load files only; yields (page, refused URLs)."""
    from playwright.sync_api import sync_playwright

    setup = _setup_module()
    setup.check(launch=False)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    refused: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=setup.CHROMIUM, args=setup.CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1280, "height": 720}, offline=True)

        def route(r):
            if r.request.url.startswith("file:"):
                r.continue_()
            else:
                refused.append(r.request.url)
                r.abort()

        context.route("**/*", route)
        try:
            yield context.new_page(), refused
        finally:
            browser.close()


def test_run_export_opens_offline_and_steps(offline_page, tmp_path):
    from playwright.sync_api import expect

    tab, refused = offline_page
    result = _runs("quickstart")["quickstart"]
    target = tmp_path / "run.html"
    target.write_text(page.run_page(result), encoding="utf-8")
    tab.goto(target.as_uri())
    n = len(result.rounds)
    label = tab.locator(".rig-round-label:visible")
    expect(label).to_have_text(f"Round 1 of {n}")
    expect(tab.locator(".rig-round-0 .rig-token").first).to_be_visible()
    tab.locator(".rig-round-0 .rig-nav label", has_text="next").click()
    expect(label).to_have_text(f"Round 2 of {n}")
    # the entropy heatmap: tokens take the entropy colour
    tab.locator("label", has_text=re.compile("^entropy$")).first.click()
    token = tab.locator(".rig-round-1 .rig-token:not(.rig-marker):not(.rig-span)").first
    assert "124, 58, 237" in token.evaluate("el => getComputedStyle(el).backgroundColor")
    tab.screenshot(path=str(ARTIFACTS / "run_export.png"))
    assert refused == []


def test_lecture_mode_is_readable_and_fits_a_projector(offline_page, tmp_path):
    tab, refused = offline_page
    result = _runs("quickstart")["quickstart"]
    target = tmp_path / "lecture.html"
    target.write_text(page.run_page(result, lecture=True), encoding="utf-8")
    tab.goto(target.as_uri())
    smallest, where = tab.evaluate(SMALLEST_TEXT)
    assert smallest >= 18, f"{smallest} px text: {where}"
    for i in range(len(result.rounds)):  # every round fits, the last one with the answer too
        if i:
            tab.locator(f".rig-round-{i - 1} .rig-nav label", has_text="next").click()
        box = tab.locator(".rig-stepper").bounding_box()
        assert box["y"] + box["height"] <= 720, f"round {i + 1} is {box['height']:.0f} px tall"
        hidden = tab.evaluate("() => document.documentElement.scrollHeight")
        assert hidden <= 720, f"round {i + 1}: the page scrolls to {hidden} px"
    tab.screenshot(path=str(ARTIFACTS / "lecture_stepper.png"))
    assert refused == []


def test_comparison_in_lecture_mode(offline_page, tmp_path):
    tab, refused = offline_page
    results = _runs("rag_vs_rig")
    runs = {name: results[name] for name in ("plain RAG", "RIG")}
    target = tmp_path / "compare.html"
    target.write_text(page.page(page.comparison_html(runs, lecture=True)), encoding="utf-8")
    tab.goto(target.as_uri())
    assert tab.locator("th.rig-system").count() == 2
    assert tab.locator(".rig-final ins, .rig-final del").count() > 0  # the answers differ
    smallest, where = tab.evaluate(SMALLEST_TEXT)
    assert smallest >= 18, f"{smallest} px text: {where}"
    tab.screenshot(path=str(ARTIFACTS / "comparison_lecture.png"))
    assert refused == []
