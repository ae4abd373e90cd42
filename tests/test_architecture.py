"""Import rules, checked by reading every module's imports (top level and inside functions).

Arrows run one way: cli / serve / widgets / eval / trigger / finetune -> build -> controller ->
deciders, queries, context, generation, retrieval -> trace, config, text, errors
(docs/architecture.md). `rigkit.build` is the one module that turns a config into parts; no
module reaches into another's private names.
"""

from __future__ import annotations

import ast
import functools
import importlib
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "rigkit"
UPPER = ("cli", "serve", "widgets", "eval", "trigger", "finetune")  # the commands and their tools
BUILD = ("build",)
TEST_KIT = ("testing",)
CORE = ("controller", "callbacks", "context", "compression", "generation", "retrieval", "deciders", "queries", "trace",
        "config", "text", "transcript", "prompts", "citations", "grounding", "markers", "corpus", "readers", "embeddings",
        "files", "errors", "streaming", "datasets", "http")
# Turning a config into a part: the defining package and rigkit.build call these, nobody else.
FACTORIES = {
    "generator_from_config": "generation",
    "load_generator": "generation",
    "open_retriever": "retrieval",
    "open_index": "retrieval",
    "reranker_from_config": "retrieval",
    "decider_from_config": "deciders",
    "build_query_builder": "queries",
    "RIGController": "controller",
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache  # each rule reads every file: parse it once
def _tree(path: Path) -> ast.AST:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _from_module(node: ast.ImportFrom, path: Path, name: str | None) -> str:
    """The absolute module a `from ... import` names (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    here = (name or module_name(path)).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    base = ".".join(package[: len(package) - node.level + 1])
    return f"{base}.{node.module}" if node.module else base


def imports_of(path: Path, name: str | None = None) -> set[str]:
    """Every rigkit module `path` (module `name`) imports, anywhere in the file (lazy ones too)."""
    found: set[str] = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = _from_module(node, path, name)
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
            "import_module", "__import__"
        ) and node.args and isinstance(node.args[0], ast.Constant):
            found.add(str(node.args[0].value))
    return {m for m in found if m == "rigkit" or m.startswith("rigkit.")}


def private_names_taken(path: Path, name: str | None = None) -> list[str]:
    """`module._name` that `path` takes from another rigkit module: imported, or read off a module
    it imported (`from rigkit import build; build._x`)."""
    name = name or module_name(path)
    taken: list[str] = []
    modules: dict[str, str] = {}  # local name -> the rigkit module it is bound to
    tree = _tree(path)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = _from_module(node, path, name)
            if not source.startswith("rigkit"):
                continue
            for alias in node.names:
                if _private(alias.name) and source != name:
                    taken.append(f"{source}.{alias.name}")
                if _is_module(f"{source}.{alias.name}"):
                    modules[alias.asname or alias.name] = f"{source}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("rigkit.") and alias.asname:
                    modules[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and _private(node.attr) and isinstance(node.value, ast.Name)
                and modules.get(node.value.id, name) != name):
            taken.append(f"{modules[node.value.id]}.{node.attr}")
    return sorted(set(taken))


def factories_called(path: Path) -> list[str]:
    """The config-to-part factories `path` imports, calls or reads off a module."""
    found = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.ImportFrom):
            found.update(alias.name for alias in node.names if alias.name in FACTORIES)
        elif isinstance(node, ast.Attribute) and node.attr in FACTORIES:
            found.add(node.attr)
        elif isinstance(node, ast.Name) and node.id in FACTORIES:
            found.add(node.id)
    return sorted(found)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _is_module(dotted: str) -> bool:
    relative = Path(*dotted.split(".")[1:])
    return (PACKAGE / relative).with_suffix(".py").exists() or (PACKAGE / relative / "__init__.py").exists()


def top(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


MODULES = sorted(PACKAGE.rglob("*.py"))
CORE_MODULES = [m for m in MODULES if top(module_name(m)) in CORE]
BUILD_MODULES = [m for m in MODULES if top(module_name(m)) in BUILD]


def test_the_package_is_found():
    assert len(MODULES) > 40 and len(CORE_MODULES) > 25 and BUILD_MODULES
    assert {"rigkit.controller", "rigkit.deciders.classifier", "rigkit.queries"} <= {
        module_name(m) for m in CORE_MODULES
    }


def test_every_module_has_a_layer():
    """A new top-level module is placed in a layer here before the rules below cover it."""
    layers = UPPER + BUILD + TEST_KIT + CORE
    assert len(layers) == len(set(layers))
    unplaced = sorted({top(module_name(m)) for m in MODULES} - set(layers) - {""})
    assert not unplaced, f"place {unplaced} in a layer of tests/test_architecture.py"


@pytest.mark.parametrize("path", CORE_MODULES, ids=lambda p: module_name(p))
def test_core_modules_never_import_the_layers_above(path):
    wrong = sorted(m for m in imports_of(path) if top(m) in UPPER + BUILD)
    assert not wrong, f"{module_name(path)} imports {wrong}: core modules sit below them"


@pytest.mark.parametrize("path", BUILD_MODULES, ids=lambda p: module_name(p))
def test_build_never_imports_the_commands(path):
    wrong = sorted(m for m in imports_of(path) if top(m) in UPPER)
    assert not wrong, (f"{module_name(path)} imports {wrong}: build sits below the commands; "
                       "a part they provide is registered in its package's registry")


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_nothing_in_the_package_imports_the_test_kit(path):
    if module_name(path) == "rigkit.testing":
        return
    wrong = sorted(m for m in imports_of(path) if m == "rigkit.testing" or m.startswith("rigkit.testing."))
    assert not wrong, f"{module_name(path)} imports the test kit ({wrong}); it is for tests only"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_no_module_takes_another_modules_private_names(path):
    taken = private_names_taken(path)
    assert not taken, f"{module_name(path)} takes {taken}: make a shared name public where it is defined"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_only_build_turns_a_config_into_parts(path):
    name = module_name(path)
    if top(name) in BUILD or name == "rigkit":  # rigkit/__init__ only names them for lazy export
        return
    wrong = [f for f in factories_called(path) if FACTORIES[f] != top(name)]
    assert not wrong, (f"{name} uses {wrong}: ask rigkit.build (build_run, build_generator, "
                       "build_retriever, build_decider, assemble) instead")


def test_the_checker_sees_lazy_and_relative_imports(tmp_path):
    sample = tmp_path / "probe.py"
    sample.write_text("def f():\n    from rigkit.trigger import model\n    from . import base\n")
    found = imports_of(sample, "rigkit.deciders.probe")
    assert {"rigkit.trigger", "rigkit.trigger.model", "rigkit.deciders.base"} <= found


def test_the_checker_sees_private_names_and_factories(tmp_path):
    sample = tmp_path / "probe.py"
    sample.write_text(
        "from rigkit.markers.parsing import _grammar, word_tag\n"
        "from rigkit import build\n"
        "import rigkit.controller as controller\n"
        "def f():\n"
        "    from rigkit.generation import generator_from_config\n"
        "    return build._with_protocol, controller._accepted_segments, generator_from_config\n"
    )
    assert private_names_taken(sample, "rigkit.serve.probe") == [
        "rigkit.build._with_protocol", "rigkit.controller._accepted_segments",
        "rigkit.markers.parsing._grammar",
    ]
    assert factories_called(sample) == ["generator_from_config"]


def fresh_import(module: str) -> list[str]:
    """The rigkit modules importing `module` from scratch loads, in this process (the modules
    already loaded are set aside and put back, so the rest of the session sees no change)."""
    def ours(name: str) -> bool:
        return name == "rigkit" or name.startswith("rigkit.")

    saved = {name: loaded for name, loaded in sys.modules.items() if ours(name)}
    for name in saved:
        del sys.modules[name]
    try:
        importlib.import_module(module)
        return sorted(name for name in sys.modules if ours(name))
    finally:
        for name in [n for n in sys.modules if ours(n)]:
            del sys.modules[name]
        sys.modules.update(saved)


def test_building_a_query_loads_no_decider():
    assert [m for m in fresh_import("rigkit.queries") if m.startswith("rigkit.deciders")] == []


def test_building_a_run_loads_no_command():
    assert [m for m in fresh_import("rigkit.build") if top(m) in UPPER] == []
