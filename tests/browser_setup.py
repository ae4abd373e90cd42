"""Pre-flight for the browser test: `python -m tests.browser_setup` (run by `make test`).

Checks that Debian's Chromium is installed where the test expects it and that Playwright for
Python can launch it with the test's flags. Playwright's own browser download is never used:
the test drives the system Chromium through `executable_path`.
"""

from __future__ import annotations

import os
import subprocess
import sys

__all__ = ["CHROMIUM", "CHROMIUM_ARGS", "APT_COMMAND", "check"]

CHROMIUM = os.environ.get("RIGKIT_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
APT_COMMAND = "apt-get update && apt-get install -y chromium chromium-driver"


def check(launch: bool = True) -> str:
    """The Chromium version string; raises RuntimeError with what to do when it is missing."""
    if not os.path.exists(CHROMIUM):
        raise RuntimeError(
            f"Chromium not found at {CHROMIUM}. The browser test needs Debian's Chromium:\n"
            f"    sudo sh -c '{APT_COMMAND}'\n"
            "(or set RIGKIT_CHROMIUM to another Chromium binary; do not run `playwright install`).\n"
            "To run everything else: .venv/bin/python -m pytest -m 'not browser'"
        )
    version = subprocess.run(
        [CHROMIUM, "--version"], capture_output=True, text=True, timeout=60, check=False
    ).stdout.strip()
    if launch:
        try:
            from playwright.sync_api import sync_playwright
        except ImportError as exc:
            raise RuntimeError("Playwright for Python is missing: pip install -e '.[dev]'") from exc
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            browser.close()
    return version or "chromium (version unknown)"


def main() -> int:
    try:
        version = check()
    except Exception as exc:  # any failure here is a setup problem to report in one message
        print(f"browser test setup: {exc}", file=sys.stderr)
        return 1
    print(f"browser test setup: OK, {version} at {CHROMIUM} launches under Playwright")
    return 0


if __name__ == "__main__":
    sys.exit(main())
