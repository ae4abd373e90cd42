"""Import rules, checked by reading every module's imports (top level and inside functions).

The rows of docs/architecture.md, lowest first (`TIERS`): a module imports modules of its own
row or below, never above; bench/ sits under `cli`. No import circle crosses a folder, and the
circles left inside a folder are listed (`IN_FOLDER_CIRCLES`). `rigkit.build` is the one module
that turns a config into parts; no module reaches into another's private names. Each check is a
function of a package folder, and the tests at the end plant violations in a copy to see it fail.
"""

from __future__ import annotations

import ast
import functools
import importlib
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "rigkit"
BENCH = ROOT / "bench"
# docs/architecture.md, bottom row first. Arrows inside a row are allowed when they close no
# circle across folders (e.g. readers -> corpus, grounding -> citations, queries -> deciders).
TIERS = (
    ("trace", "config", "text", "truncation", "transcript", "prompts", "markers", "datasets", "files", "errors"),
    ("http", "readers", "corpus", "embeddings", "citations", "grounding", "compression", "guards",
     "short_answer"),
    ("generation",),
    ("deciders", "queries", "context", "retrieval"),
    ("controller", "callbacks", "answer_checks"),
    ("build", "streaming"),
    ("eval",),
    ("serve", "widgets", "trigger", "finetune"),
    ("cli",),
)
TEST_KIT = ("testing",)  # scripted parts for tests: reads the parts' row and below, imported by tests only
UPPER = tuple(m for row in TIERS[TIERS.index(("build", "streaming")) + 1 :] for m in row)
CORE = tuple(m for row in TIERS[: TIERS.index(("controller", "callbacks", "answer_checks")) + 1] for m in row)
BENCH_TIER = len(TIERS) - 2  # the benchmarks drive the library, not the commands
# Circles inside one folder that are still there (the modules of each); a new one fails the test,
# and so does one of these once it is gone, so the list stays true.
IN_FOLDER_CIRCLES = {
    # opening an index dispatches on its kind to attach, which builds on index and storage
    frozenset({"rigkit.retrieval.attach", "rigkit.retrieval.index", "rigkit.retrieval.reuse",
               "rigkit.retrieval.storage"}),
}
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


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _tree(path: Path) -> ast.AST:
    return _parse(path, path.read_text(encoding="utf-8"))


@functools.cache  # each rule reads every file: parse each text once (a planted line is a new text)
def _parse(path: Path, text: str) -> ast.AST:
    return ast.parse(text, filename=str(path))


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


def _is_module(dotted: str, package: Path = PACKAGE) -> bool:
    relative = Path(*dotted.split(".")[1:])
    return (package / relative).with_suffix(".py").exists() or (package / relative / "__init__.py").exists()


def top(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


def tier(name: str) -> int | None:
    """The row of a module's top-level name; the package root (lazy exports only) is below all."""
    if top(name) in TEST_KIT:
        return TIERS.index(("deciders", "queries", "context", "retrieval"))
    return next((i for i, row in enumerate(TIERS) if top(name) in row), None)


def modules_of(package: Path) -> list[Path]:
    return sorted(p for p in package.rglob("*.py") if "__pycache__" not in p.parts)


def upward_imports(package: Path = PACKAGE) -> list[str]:
    """`a imports b` for every import that reaches a higher row than the importer's."""
    wrong = []
    for path in modules_of(package):
        name = module_name(path, package)
        own = tier(name)
        if own is None:
            continue  # the root package; an unplaced module fails test_every_module_has_a_tier
        for target in sorted(imports_of(path, name)):
            theirs = tier(target) if _is_module(f"rigkit.{top(target)}", package) else None
            if theirs is not None and theirs > own:
                wrong.append(f"{name} imports {target}: {top(target)} sits above {top(name)}")
    return wrong


def bench_imports(bench: Path = BENCH) -> list[str]:
    """What bench/ must not reach: the commands, the test kit, private names."""
    wrong = []
    for path in sorted(bench.glob("*.py")):
        name = f"bench.{path.stem}"
        for target in sorted(imports_of(path, name)):
            level = tier(target)
            if top(target) in TEST_KIT or (level is not None and level > BENCH_TIER):
                wrong.append(f"{name} imports {target}: benchmarks drive the library, not "
                             f"{'the test kit' if top(target) in TEST_KIT else 'the commands'}")
        wrong += [f"{name} takes {taken}" for taken in private_names_taken(path, name)]
    return wrong


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return getattr(test, "id", getattr(test, "attr", "")) == "TYPE_CHECKING"


def _runtime_imports(path: Path, name: str, package: Path) -> set[str]:
    """The rigkit modules `path` loads when it runs: an import under `if TYPE_CHECKING` does not
    count, and `from pkg import module` where `pkg` holds the importer is the module alone (the
    package is loaded before any module in it)."""
    found: set[str] = set()
    skip = {id(n) for node in ast.walk(_tree(path)) if isinstance(node, ast.If) and _type_checking(node)
            for part in node.body for n in ast.walk(part)}
    for node in ast.walk(_tree(path)):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("rigkit."))
        elif isinstance(node, ast.ImportFrom):
            module = _from_module(node, path, name)
            if not module.startswith("rigkit"):
                continue
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                found.add(sub if _is_module(sub, package) else module)
    resolved = set()
    for target in found:
        while target.count(".") and not _is_module(target, package):
            target = target.rsplit(".", 1)[0]
        resolved.add(target)
    return resolved - {name, "rigkit"}


def import_circles(package: Path = PACKAGE) -> list[frozenset[str]]:
    """The modules of every import circle (strongly connected, two modules or more)."""
    graph = {module_name(p, package): p for p in modules_of(package)}
    edges = {n: _runtime_imports(p, n, package) & graph.keys() for n, p in graph.items()}
    order, low, stack, circles = {}, {}, [], []

    def visit(v: str) -> None:  # Tarjan
        order[v] = low[v] = len(order)
        stack.append(v)
        for w in edges[v]:
            if w not in order:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], order[w])
        if low[v] == order[v]:
            circle = {stack.pop()}
            while v not in circle:
                circle.add(stack.pop())
            if len(circle) > 1:
                circles.append(frozenset(circle))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph)))
    try:
        for v in sorted(graph):
            if v not in order:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return circles


def folder(name: str, package: Path = PACKAGE) -> str:
    """The folder a module lives in (a package's `__init__` lives in the package's folder)."""
    return name if (package / Path(*name.split(".")[1:]) / "__init__.py").exists() else name.rsplit(".", 1)[0]


def crosses_folders(circle: frozenset[str], package: Path = PACKAGE) -> bool:
    return len({folder(m, package) for m in circle}) > 1


MODULES = modules_of(PACKAGE)
CORE_MODULES = [m for m in MODULES if top(module_name(m)) in CORE]
BUILD_MODULES = [m for m in MODULES if top(module_name(m)) == "build"]


def test_the_package_is_found():
    assert len(MODULES) > 40 and len(CORE_MODULES) > 25 and BUILD_MODULES
    assert {"rigkit.controller", "rigkit.deciders.classifier", "rigkit.queries"} <= {
        module_name(m) for m in CORE_MODULES
    }
    assert len(list(BENCH.glob("*.py"))) > 5


def test_every_module_has_a_tier():
    """A new top-level module is placed in a row here (and in docs/architecture.md) first."""
    placed = [m for row in TIERS for m in row] + list(TEST_KIT)
    assert len(placed) == len(set(placed))
    unplaced = sorted({top(module_name(m)) for m in MODULES} - set(placed) - {""})
    assert not unplaced, f"place {unplaced} in a row of TIERS in tests/test_architecture.py"


def test_the_tiers_are_the_documented_rows():
    """Every row of TIERS is drawn in docs/architecture.md's diagram, in the same order."""
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    drawing = doc[doc.index("```text") : doc.index("```", doc.index("```text") + 7)]
    lines = [set(line.split()) for line in drawing.splitlines()]
    rows = [next(i for i, words in enumerate(lines) if set(row) <= words) for row in TIERS]
    assert rows == sorted(rows, reverse=True), "the diagram draws the rows top (cli) to bottom"


def test_no_module_imports_a_higher_tier():
    wrong = upward_imports()
    assert not wrong, "\n".join(wrong)


def test_bench_drives_the_library_only():
    wrong = bench_imports()
    assert not wrong, "\n".join(wrong)


def test_no_import_circle_crosses_a_folder():
    crossing = [sorted(c) for c in import_circles() if crosses_folders(c)]
    assert not crossing, f"import circles across folders: {crossing}"


def test_the_circles_inside_a_folder_are_the_listed_ones():
    circles = {c for c in import_circles() if not crosses_folders(c)}
    assert circles == IN_FOLDER_CIRCLES, (
        f"new: {[sorted(c) for c in circles - IN_FOLDER_CIRCLES]}; "
        f"gone (take them off IN_FOLDER_CIRCLES): {[sorted(c) for c in IN_FOLDER_CIRCLES - circles]}")


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
    if top(name) == "build" or name == "rigkit":  # rigkit/__init__ only names them for lazy export
        return
    wrong = [f for f in factories_called(path) if FACTORIES[f] != top(name)]
    assert not wrong, (f"{name} uses {wrong}: ask rigkit.build (build_run, build_generator, "
                       "build_retriever, build_decider, assemble) instead")


# -- the checks catch what they are for: violations planted in a copy of the package ------------
@pytest.fixture(scope="module")
def copied(tmp_path_factory) -> Path:
    """A copy of rigkit/ and bench/ to plant violations in (the checks only read files)."""
    where = tmp_path_factory.mktemp("planted")
    shutil.copytree(PACKAGE, where / "rigkit", ignore=shutil.ignore_patterns("__pycache__", "resources"))
    shutil.copytree(BENCH, where / "bench", ignore=shutil.ignore_patterns("__pycache__", "results*"))
    return where


def _plant(path: Path, line: str) -> None:
    path.write_text(path.read_text(encoding="utf-8") + "\n" + line + "\n", encoding="utf-8")


@pytest.mark.parametrize("module, line, expected", [
    ("trace.py", "from rigkit.controller import RIGController", "rigkit.trace imports rigkit.controller"),
    ("text.py", "def later():\n    from rigkit.generation import HFGenerator",
     "rigkit.text imports rigkit.generation"),
    ("generation/stops.py", "from rigkit.context import ContextManager",
     "rigkit.generation.stops imports rigkit.context"),
    ("deciders/base.py", "import rigkit.controller", "rigkit.deciders.base imports rigkit.controller"),
    ("eval/metrics.py", "from rigkit.cli import main", "rigkit.eval.metrics imports rigkit.cli"),
    ("controller.py", "from rigkit.build import build_run", "rigkit.controller imports rigkit.build"),
])
def test_a_planted_upward_import_fails_the_check(copied, module, line, expected):
    package = copied / "rigkit"
    assert upward_imports(package) == []
    target = package / module
    before = target.read_text(encoding="utf-8")
    _plant(target, line)
    try:
        assert any(w.startswith(expected) for w in upward_imports(package)), expected
    finally:
        target.write_text(before, encoding="utf-8")


def test_a_planted_circle_across_folders_fails_the_check(copied):
    package = copied / "rigkit"
    target = package / "corpus.py"
    before = target.read_text(encoding="utf-8")
    assert not [c for c in import_circles(package) if crosses_folders(c, package)]
    _plant(target, "def later():\n    from rigkit.readers import read_files")
    try:
        crossing = [c for c in import_circles(package) if crosses_folders(c, package)]
        assert crossing and {"rigkit.corpus", "rigkit.readers"} <= set().union(*crossing)
    finally:
        target.write_text(before, encoding="utf-8")


def test_a_type_checking_import_closes_no_circle(copied):
    package = copied / "rigkit"
    target = package / "corpus.py"
    before = target.read_text(encoding="utf-8")
    _plant(target, "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rigkit.readers import Reader")
    try:
        assert not [c for c in import_circles(package) if crosses_folders(c, package)]
    finally:
        target.write_text(before, encoding="utf-8")


def test_a_planted_bench_import_of_the_commands_fails_the_check(copied):
    bench = copied / "bench"
    assert bench_imports(bench) == []
    _plant(bench / "latency.py", "from rigkit.cli import main")
    _plant(bench / "cache.py", "from rigkit.testing import ScriptedGenerator")
    found = bench_imports(bench)
    assert any(w.startswith("bench.latency imports rigkit.cli") for w in found)
    assert any(w.startswith("bench.cache imports rigkit.testing") for w in found)


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
