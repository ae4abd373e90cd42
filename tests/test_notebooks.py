"""Every notebook in notebooks/ runs top to bottom in a real Jupyter kernel (nbclient).

Discovered by glob, so notebooks added later are covered without editing this file. Each runs
with its own folder as working directory (as JupyterLab does), offline (HF_HUB_OFFLINE=1), in
replay mode where it has the switch (RIGKIT_REPLAY=1: saved runs, no model), and must finish
without an error output. The committed files must have their outputs stripped.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
# Per-cell limit, generous for a busy 2-core machine: alone there, each notebook takes < 1 min.
CELL_TIMEOUT_S = int(os.environ.get("RIGKIT_NOTEBOOK_CELL_TIMEOUT", "600"))


def _ids(paths: list[Path]) -> list[str]:
    return [p.stem for p in paths]


def test_notebooks_exist():
    names = {p.stem for p in NOTEBOOKS}
    for expected in ("01_quickstart", "02_rag_vs_rig", "03_deciders", "04_retrieval",
                     "05_bring_your_own"):
        assert expected in names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_is_committed_stripped(path: Path):
    import nbformat

    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.get("outputs"), f"{path.name}: run `make strip` before committing"
            assert cell.get("execution_count") is None, f"{path.name}: run `make strip`"
    assert "widgets" not in nb.metadata, f"{path.name}: widget state left in metadata"


@pytest.mark.notebook
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_runs(path: Path, monkeypatch: pytest.MonkeyPatch):
    import nbformat
    from nbclient import NotebookClient

    # The kernel inherits this process's environment: keep it off the network.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.setenv("RIGKIT_OFFLINE", "1")
    # the classroom path: notebooks with a replay switch step through their saved runs
    # (notebooks/runs/); RIGKIT_REPLAY=0 in the environment runs them live instead
    monkeypatch.setenv("RIGKIT_REPLAY", os.environ.get("RIGKIT_REPLAY", "1"))
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    )
    start = time.perf_counter()
    client.execute()  # raises CellExecutionError with the cell and traceback on any error
    elapsed = time.perf_counter() - start
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    first = nb.cells[next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")]
    printed = "".join(o.get("text", "") for o in first.outputs if o.get("output_type") == "stream")
    assert "rigkit" in printed, f"{path.name}: the first code cell must print versions"
    print(f"{path.name}: {elapsed:.1f} s")


def _tree_state() -> dict[str, str]:
    """Each changed or untracked path `git status` shows (ignored files excluded), with a hash
    of its content, so a file edited again while the notebooks ran counts as a change too."""
    import hashlib
    import subprocess

    try:
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "-z"],
                             cwd=ROOT, capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    state = {}
    for entry in filter(None, out.split("\0")):
        path = ROOT / entry[3:]
        state[entry] = hashlib.sha1(path.read_bytes()).hexdigest() if path.is_file() else "-"
    return state


_STATE_AT_COLLECTION = _tree_state()  # before any notebook in this file ran


def test_notebooks_leave_tracked_files_alone():
    """Runs after the notebook tests above (file order): nothing they wrote is tracked by git.

    On a fresh clone `git status --porcelain` stays empty; in a working tree with edits, the
    changed and untracked paths must be the ones there before the notebooks ran."""
    assert _tree_state() == _STATE_AT_COLLECTION
