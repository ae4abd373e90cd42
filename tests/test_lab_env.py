"""A fresh `make lab` environment runs the notebooks: notebook 09 (saved evaluation results,
pandas) and the quickstart, which replays its saved run in a RoundStepper.

The environment is built from a copy of the tracked files into a temporary folder, exactly as
`make lab` builds it (tests/lab_env.py), with the machine's own pip and uv caches, so after
`make test`'s own install it mostly links cached packages. Marked `notebook`: it executes
notebooks in a real kernel, that venv's own.
"""

from __future__ import annotations

import shutil

import pytest

from tests.conftest import hang_limit
from tests.lab_env import build, copy_tracked, run_notebook

pytestmark = pytest.mark.notebook


@pytest.fixture(scope="module")
def lab_tree(tmp_path_factory):
    tree = copy_tracked(tmp_path_factory.mktemp("fresh-lab"))
    try:
        build(tree, timeout=hang_limit(120))  # 29-48 s with uv and warm caches here (docs/notebooks.md)
        yield tree
    finally:
        shutil.rmtree(tree, ignore_errors=True)  # ~1.3 GB: pytest keeps its last three temp folders


@pytest.mark.parametrize("name", ["09_where_the_loss_lies.ipynb", "01_quickstart.ipynb"])
def test_a_notebook_runs_in_the_fresh_lab_environment(lab_tree, name):
    ran = run_notebook(lab_tree, name, timeout=hang_limit(60))
    assert ran["errors"] == 0
    assert ran["kernel"] == str(lab_tree / ".venv"), "the notebook ran in another Python"
    if name.startswith("01"):
        assert ran["widgets"] >= 1  # the RoundStepper over the saved run


def test_the_lab_environment_compiles_nothing_and_has_what_the_notebooks_import(lab_tree):
    import subprocess

    python = str(lab_tree / ".venv" / "bin" / "python")
    probe = "import pandas, jupyterlab, ipywidgets, anywidget, nbclient, rigkit.widgets.stepper"
    assert subprocess.run([python, "-c", probe], capture_output=True, timeout=hang_limit(30)).returncode == 0
    listed = subprocess.run([python, "-m", "pip", "list", "--format=freeze"], capture_output=True,
                            text=True, timeout=hang_limit(30), check=True).stdout
    assert "llama_cpp_python" not in listed.replace("-", "_")  # the served-model extra compiles
