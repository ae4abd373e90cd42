"""A fresh `make lab` environment, built the way a teacher builds one.

The tracked files of this checkout are copied into a folder of their own (nothing is written
here: the editable install leaves its build files in the copy), `make .venv/.installed-lab`
runs there as the README's command does, and a notebook executes in that venv's own kernel in
replay mode. Shared by tests/test_lab_env.py (the notebooks run from it) and bench/fresh_lab.py
(how long it takes, with uv and with pip alone).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

__all__ = ["ROOT", "copy_tracked", "build", "run_notebook"]

ROOT = Path(__file__).resolve().parents[1]

# Runs inside the fresh venv: the notebook with nbclient and the venv's kernel, then one more
# cell that says which Python the kernel was. Prints one JSON line: seconds and that prefix.
_EXECUTE = """
import json, sys, time
import nbformat
from nbclient import NotebookClient
path, timeout = sys.argv[1], int(sys.argv[2])
nb = nbformat.read(path, as_version=4)
nb.cells.append(nbformat.v4.new_code_cell("import sys; print('KERNEL', sys.prefix)"))
client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                        resources={"metadata": {"path": str(__import__('pathlib').Path(path).parent)}})
start = time.perf_counter()
client.execute()
seconds = time.perf_counter() - start
errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
printed = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.get("output_type") == "stream")
widgets = sum("application/vnd.jupyter.widget-view+json" in o.get("data", {})
              for c in nb.cells for o in c.get("outputs", []))
print(json.dumps({"seconds": seconds, "errors": len(errors), "widgets": widgets,
                  "kernel": printed.split("KERNEL", 1)[-1].strip()}))
"""


def copy_tracked(dest: Path, root: Path = ROOT) -> Path:
    """The files git tracks in `root` (as they are in the working tree) copied under `dest`."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True,
                            timeout=60).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = root / name
        if source.is_file():  # a tracked file deleted in the working tree is left out
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


# make's SHELL when steps are timed: runs one recipe line and appends "seconds<TAB>line" to $STEPS.
_TIMED_SHELL = """#!/bin/bash
start=$EPOCHREALTIME; /bin/bash "$@"; rc=$?
printf '%s\\t%s\\n' "$(awk "BEGIN{print $EPOCHREALTIME - $start}")" "${2//$'\\n'/ }" >> "$STEPS"
exit $rc
"""


def build(tree: Path, env: dict[str, str] | None = None, pip_only: bool = False,
          timeout: float = 1800, steps: list[tuple[float, str]] | None = None) -> float:
    """Seconds `make .venv/.installed-lab` takes in `tree` (pip alone with `pip_only`); each recipe
    line's seconds and text are appended to `steps` when it is given."""
    command = ["make", ".venv/.installed-lab"] + (["PIP_ONLY=1"] if pip_only else [])
    env = {**os.environ, **(env or {})}
    if steps is not None:
        shell, log = tree / ".timed-shell", tree / ".steps.tsv"
        shell.write_text(_TIMED_SHELL, encoding="utf-8")
        shell.chmod(0o755)
        command.append(f"SHELL={shell}")
        env["STEPS"] = str(log)
    start = time.perf_counter()
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed in {tree}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    if steps is not None:
        for line in (tree / ".steps.tsv").read_text(encoding="utf-8").splitlines():
            took, _, text = line.partition("\t")
            steps.append((float(took), text))
    return seconds


def run_notebook(tree: Path, name: str, timeout: float = 600) -> dict:
    """Execute notebooks/`name` of `tree` with its venv's kernel, in replay mode and offline:
    {"seconds", "errors", "widgets" (widget outputs), "kernel" (the kernel's sys.prefix)}."""
    venv = tree / ".venv"
    jupyter = tree / ".jupyter-home"  # only the venv's own kernel spec is found
    env = {**os.environ, "RIGKIT_REPLAY": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "RIGKIT_OFFLINE": "1", "JUPYTER_PATH": str(venv / "share" / "jupyter"),
           "JUPYTER_DATA_DIR": str(jupyter / "data"), "JUPYTER_CONFIG_DIR": str(jupyter / "config"),
           "JUPYTER_RUNTIME_DIR": str(jupyter / "runtime")}
    env.pop("PYTHONPATH", None)  # the fresh venv's own rigkit: the copy's, installed editable
    done = subprocess.run([str(venv / "bin" / "python"), "-c", _EXECUTE, str(tree / "notebooks" / name),
                           str(int(timeout))], cwd=tree / "notebooks", env=env, capture_output=True,
                          text=True, timeout=timeout * 2)
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed in {venv}:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])

