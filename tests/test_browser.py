"""The quickstart notebook in a real browser: JupyterLab + headless Debian Chromium (Playwright).

Starts JupyterLab on 127.0.0.1 (free port, fixed token, autosave off, throw-away settings and
workspace folders), opens notebooks/01_quickstart.ipynb, runs all cells, checks that the
RoundStepper's controls and panes are on the page and that "next" changes the shown round;
then, at a projector's 1280x720, presses its "lecture" switch and checks in the DOM that its text
is 18 px and up and that every round fits the screen. Screenshots go to tests/artifacts/. With
RIGKIT_UPDATE_SCREENSHOT=1 the stepper screenshot is also copied to docs/img/round_stepper.png,
the README's picture (refreshed deliberately).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import hang_limit

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "tests" / "artifacts"
README_IMAGE = ROOT / "docs" / "img" / "round_stepper.png"
NOTEBOOK = os.environ.get("RIGKIT_BROWSER_NOTEBOOK", "notebooks/01_quickstart.ipynb")
TOKEN = "rigkit-browser-test"
RUN_TIMEOUT_S = hang_limit(60)  # all cells on 2 cores, model load included

pytestmark = pytest.mark.browser


def _setup_module():
    # Loaded by path so the test does not depend on how pytest puts tests/ on sys.path.
    spec = importlib.util.spec_from_file_location("rigkit_browser_setup",
                                                  Path(__file__).with_name("browser_setup.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get_json(url: str) -> object:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[str]:
    """A JupyterLab server for this test; yields its base URL. Autosave is off so the
    committed notebook never gets outputs written into it."""
    settings = tmp_path / "settings" / "@jupyterlab" / "docmanager-extension"
    settings.mkdir(parents=True)
    (settings / "plugin.jupyterlab-settings").write_text(json.dumps({"autosave": False}))
    # no news / update prompts: the machine may be offline, and the toast covers the page
    notify = tmp_path / "settings" / "@jupyterlab" / "apputils-extension"
    notify.mkdir(parents=True)
    (notify / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    port = _free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "RIGKIT_OFFLINE": "1", "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
           "JUPYTER_CONFIG_DIR": str(tmp_path / "config")}
    cmd = [
        sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
        f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={ROOT}",
        f"--LabApp.user_settings_dir={tmp_path / 'settings'}",
        f"--LabApp.workspaces_dir={tmp_path / 'workspaces'}",
        "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.extension_manager=readonly",
    ] + (["--allow-root"] if os.geteuid() == 0 else [])  # CI containers run as root
    log = (tmp_path / "lab.log").open("w")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + hang_limit(15)
        while True:
            with contextlib.suppress(OSError):
                _get_json(f"{url}/api/status?token={TOKEN}")
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("JupyterLab did not start:\n" + (tmp_path / "lab.log").read_text())
            time.sleep(0.5)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)  # the server and the kernels it started
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def _kernels_idle(url: str) -> bool:
    kernels = _get_json(f"{url}/api/kernels?token={TOKEN}")
    return bool(kernels) and all(k["execution_state"] == "idle" for k in kernels)


def _run_all_cells(page) -> None:
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()


# Every element of the stepper with its own visible text: the smallest computed font size.
SMALLEST_TEXT = """(root) => {
  let smallest = 1000, where = '';
  for (const el of root.querySelectorAll('*')) {
    const own = [...el.childNodes].some(n => n.nodeType === 3 && n.textContent.trim());
    if (!own || !el.getClientRects().length) continue;
    const size = parseFloat(getComputedStyle(el).fontSize);
    if (size < smallest) { smallest = size; where = el.outerHTML.slice(0, 100); }
  }
  return [smallest, where];
}"""


# The stepper's parts and their heights in px, to say what to shrink when it does not fit.
PART_HEIGHTS = """(root) => [...root.children].map(c =>
  `${[...c.classList].filter(k => k.startsWith('rigkit-')).join('.') || c.tagName}`
  + ` ${Math.round(c.getBoundingClientRect().height)}`).join(', ')"""


def _check_lecture_mode(page, stepper) -> None:
    """At a projector's 1280x720, the "lecture" switch sets the stepper's text at 18 px and up, and
    each round fits the screen's height (and the notebook area, so it shows without scrolling)."""
    from playwright.sync_api import expect

    page.set_viewport_size({"width": 1280, "height": 720})
    stepper.locator(".rigkit-lecture-switch").click()
    expect(stepper).to_have_class(re.compile(r"\brigkit-lecture\b"), timeout=30_000)
    label = stepper.locator(".rig-round-label")
    total = int(re.search(r"of (\d+)", label.inner_text()).group(1))
    stepper.locator(".rigkit-prev").click()  # back to the first round
    expect(label).to_have_text(re.compile(r"^Round 1 of"), timeout=60_000)
    area = page.locator(".jp-NotebookPanel:visible .jp-WindowedPanel-outer").first.bounding_box()
    for i in range(total):
        if i:
            stepper.locator(".rigkit-next").click()
            expect(label).to_have_text(re.compile(rf"^Round {i + 1} of"), timeout=60_000)
        smallest, where = stepper.evaluate(SMALLEST_TEXT)
        assert smallest >= 18, f"round {i + 1}: {smallest} px text in lecture mode: {where}"
        stepper.scroll_into_view_if_needed()
        box = stepper.bounding_box()
        parts = stepper.evaluate(PART_HEIGHTS)
        assert box["height"] <= 720, f"round {i + 1}: the stepper is {box['height']:.0f} px tall: {parts}"
        assert box["height"] <= area["height"], (
            f"round {i + 1}: the stepper is {box['height']:.0f} px, the notebook shows "
            f"{area['height']:.0f}: {parts}")
        if i == 0:
            page.screenshot(path=str(ARTIFACTS / "lecture_stepper_jupyterlab.png"))


def test_round_stepper_in_jupyterlab(lab: str):
    from playwright.sync_api import expect, sync_playwright

    setup = _setup_module()
    setup.check(launch=False)  # a clear message when Chromium is missing
    notebook_file = ROOT / NOTEBOOK
    before = notebook_file.read_bytes()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=setup.CHROMIUM, args=setup.CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1300})  # the whole stepper above the status bar
        try:
            page.goto(f"{lab}/lab/tree/{NOTEBOOK}?token={TOKEN}", timeout=120_000)
            page.locator(".jp-NotebookPanel .jp-Cell").first.wait_for(timeout=120_000)
            # the kernel must be up before "Run All" is useful
            deadline = time.monotonic() + 120
            while not _kernels_idle(lab) and time.monotonic() < deadline:
                time.sleep(0.5)
            _run_all_cells(page)
            stepper = page.locator(".rigkit-stepper").first
            stepper.wait_for(timeout=RUN_TIMEOUT_S * 1000)
            deadline = time.monotonic() + RUN_TIMEOUT_S
            while not _kernels_idle(lab) and time.monotonic() < deadline:
                time.sleep(1)
            assert _kernels_idle(lab), "the notebook did not finish in time"
            errors = page.locator(".jp-OutputArea-output[data-mime-type*='error']")
            assert errors.count() == 0, errors.first.inner_text()

            for name in ("prev", "next", "slider", "decider", "threshold", "rerun"):
                expect(stepper.locator(f".rigkit-{name}")).to_have_count(1)
            for name in ("header", "draft", "decision", "query", "hits", "budget", "timings",
                         "answer"):
                expect(stepper.locator(f".rigkit-{name}")).to_be_visible()
            expect(stepper.locator(".js-plotly-plot")).to_have_count(1)  # the budget bar
            expect(stepper.locator(".rig-token").first).to_be_visible()

            label = stepper.locator(".rig-round-label")
            expect(label).to_have_text(re.compile(r"^Round 1 of \d+"))
            first_label = label.inner_text()
            stepper.scroll_into_view_if_needed()
            page.screenshot(path=str(ARTIFACTS / "quickstart_page.png"), full_page=True)
            stepper.locator(".rigkit-next").click()
            expect(label).to_have_text(re.compile(r"^Round 2 of \d+"), timeout=60_000)
            assert label.inner_text() != first_label
            stepper.screenshot(path=str(ARTIFACTS / "round_stepper.png"))
            _check_lecture_mode(page, stepper)
        finally:
            page.screenshot(path=str(ARTIFACTS / "browser_last.png"), full_page=True)
            browser.close()
    # autosave is off and nothing saved: the committed notebook keeps its stripped form
    assert notebook_file.read_bytes() == before
    if os.environ.get("RIGKIT_UPDATE_SCREENSHOT") == "1":
        README_IMAGE.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ARTIFACTS / "round_stepper.png", README_IMAGE)
