"""Import rules, checked by reading every module's imports (top level and inside functions).

Arrows run one way: cli / serve / widgets / eval / trigger -> build -> controller -> deciders,
queries, context, generation, retrieval -> trace, config, text, errors (docs/architecture.md).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "rigkit"
CORE = ("controller", "context", "generation", "retrieval", "deciders", "queries", "trace",
        "config", "text", "transcript", "prompts", "citations", "markers")
ABOVE_CORE = ("widgets", "eval", "trigger", "serve", "cli", "build")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, name: str | None = None) -> set[str]:
    """Every rigkit module `path` (module `name`) imports, anywhere in the file (lazy ones too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    here = (name or module_name(path)).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
            "import_module", "__import__"
        ) and node.args and isinstance(node.args[0], ast.Constant):
            found.add(str(node.args[0].value))
    return {m for m in found if m == "rigkit" or m.startswith("rigkit.")}


def top(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


MODULES = sorted(PACKAGE.rglob("*.py"))
CORE_MODULES = [m for m in MODULES if top(module_name(m)) in CORE]


def test_the_package_is_found():
    assert len(MODULES) > 40 and len(CORE_MODULES) > 25
    assert {"rigkit.controller", "rigkit.deciders.classifier", "rigkit.queries"} <= {
        module_name(m) for m in CORE_MODULES
    }


@pytest.mark.parametrize("path", CORE_MODULES, ids=lambda p: module_name(p))
def test_core_modules_never_import_the_layers_above(path):
    wrong = sorted(m for m in imports_of(path) if top(m) in ABOVE_CORE)
    assert not wrong, f"{module_name(path)} imports {wrong}: core modules sit below them"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_nothing_in_the_package_imports_the_test_kit(path):
    if module_name(path) == "rigkit.testing":
        return
    wrong = sorted(m for m in imports_of(path) if m == "rigkit.testing" or m.startswith("rigkit.testing."))
    assert not wrong, f"{module_name(path)} imports the test kit ({wrong}); it is for tests only"


def test_the_checker_sees_lazy_and_relative_imports(tmp_path):
    sample = tmp_path / "probe.py"
    sample.write_text("def f():\n    from rigkit.trigger import model\n    from . import base\n")
    found = imports_of(sample, "rigkit.deciders.probe")
    assert {"rigkit.trigger", "rigkit.trigger.model", "rigkit.deciders.base"} <= found


def test_building_a_query_loads_no_decider():
    import subprocess
    import sys

    code = ("import sys, rigkit.queries; "
            "print(sorted(m for m in sys.modules if m.startswith('rigkit.deciders')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
