"""Pre-flight for the browser test: `python -m tests.browser_setup [--install]` (run by `make test`).

Checks that Debian's Chromium is installed where the test expects it and that Playwright for
Python can launch it with the test's flags. With `--install` (what `make test` passes) a missing
Chromium is installed with apt-get when this user may install system packages (root, or sudo
without a password); otherwise the one command to run is printed. Playwright's own browser download is never used:
the test drives the system Chromium through `executable_path`.
"""

from __future__ import annotations

import os
import shutil
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


def _apt_prefix() -> list[str] | None:
    """How this user runs apt-get: directly (root), through passwordless sudo, or not at all."""
    if shutil.which("apt-get") is None:
        return None
    if os.geteuid() == 0:
        return []
    if shutil.which("sudo") and subprocess.run(
        ["sudo", "-n", "true"], capture_output=True, check=False
    ).returncode == 0:
        return ["sudo", "-n"]
    return None


def install_chromium() -> None:
    """Install Debian's Chromium (and its driver) when missing and this user can."""
    if os.path.exists(CHROMIUM) or "RIGKIT_CHROMIUM" in os.environ:
        return
    prefix = _apt_prefix()
    if prefix is None:
        return  # check() then names the command to run
    print("browser test setup: installing Debian's chromium (apt-get)...", file=sys.stderr)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update", "-qq"],
                    ["apt-get", "install", "-y", "-qq", "chromium", "chromium-driver"]):
        done = subprocess.run(prefix + command, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            raise RuntimeError(f"{' '.join(prefix + command)} failed: {tail[0]}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if "--install" in argv:
            install_chromium()
        version = check()
    except Exception as exc:  # any failure here is a setup problem to report in one message
        print(f"browser test setup: {exc}", file=sys.stderr)
        return 1
    print(f"browser test setup: OK, {version} at {CHROMIUM} launches under Playwright")
    return 0


if __name__ == "__main__":
    sys.exit(main())
