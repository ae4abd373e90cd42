"""A fresh `make lab`, timed: uv against pip alone, with empty caches and with warm ones.

Each build copies the tracked files into a temporary folder and runs `make .venv/.installed-lab`
there (tests/lab_env.py), with pip's and uv's caches in folders of this run: empty for the cold
build, then filled by it for the warm one. After each cold build notebook 01 executes in the new
venv's kernel in replay mode (kernel start, imports, the RoundStepper over the saved run), so
cold build + notebook is the time from `make lab` to a stepper, less JupyterLab's own start.
Printed: seconds per build, the cold builds' slow steps, pip / uv, and against the classroom goal
of 3 minutes.

    python bench/fresh_lab.py            # pip and uv, cold and warm (~5 min on 2 cores)
    python bench/fresh_lab.py --quick    # uv only, cold and warm
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402  (puts the repository on sys.path, keeps the hub offline)

from tests.lab_env import build, copy_tracked, run_notebook  # noqa: E402

GOAL_S = 180.0


def measure(installer: str, work: Path) -> dict:
    """Cold build, notebook 01 in it, then a warm build from the same caches; the cold build's
    steps that took a second or more."""
    caches = {"PIP_CACHE_DIR": str(work / "pip-cache"), "UV_CACHE_DIR": str(work / "uv-cache")}
    row: dict = {}
    for run in ("cold", "warm"):
        tree = copy_tracked(work / f"{installer}-{run}")
        steps: list[tuple[float, str]] = []
        row[run] = round(build(tree, caches, pip_only=installer == "pip", steps=steps), 1)
        if run == "cold":
            row["notebook_01"] = round(run_notebook(tree, "01_quickstart.ipynb")["seconds"], 1)
            row["cold_steps"] = [[round(s, 1), text] for s, text in steps if s >= 1]
        print(f"{installer:>4} {run}: {row[run]:6.1f} s", flush=True)
    return row


def _short(line: str) -> str:
    """A recipe line as read: of the Makefile's INSTALL, the branch PIP_ONLY picked."""
    if line.startswith("if test -z"):
        uv, _, pip = line.partition("then ")[2].partition("; else ")
        line = uv if 'test -z ""' in line else pip.split("; fi")[0]
    return line[:110]


def main() -> int:
    args = common.parser(__doc__).parse_args()
    started = time.perf_counter()
    rows = {}
    with tempfile.TemporaryDirectory(prefix="rigkit-fresh-lab-") as work:
        for installer in (("uv",) if args.quick else ("pip", "uv")):
            rows[installer] = measure(installer, Path(work) / installer)
    print(f"\n{'installer':>9} {'cold':>7} {'warm':>7} {'nb 01':>7} {'to a stepper':>13}")
    for name, row in rows.items():
        stepper = row["cold"] + row["notebook_01"]
        print(f"{name:>9} {row['cold']:6.1f}s {row['warm']:6.1f}s {row['notebook_01']:6.1f}s "
              f"{stepper:8.1f} s = {stepper / GOAL_S:.2f} x the 3-minute goal")
    for name, row in rows.items():
        print(f"\n{name}, cold: where the time goes")
        for seconds, text in row["cold_steps"]:
            print(f"  {seconds:6.1f} s  {_short(text)}")
    if "pip" in rows:
        for run in ("cold", "warm"):
            print(f"pip / uv, {run}: {rows['pip'][run] / rows['uv'][run]:.1f}x")
    common.save(args, "fresh_lab", {"builds": rows, "goal_s": GOAL_S}, started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
