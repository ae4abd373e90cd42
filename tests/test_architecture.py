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
import json
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "rigkit"
BENCH = ROOT / "bench"
# docs/architecture.md, bottom row first. Arrows inside a row are allowed when they close no
# circle across folders (e.g. readers -> corpus, grounding -> citations, queries -> deciders).
TIERS = (
    ("trace", "run_state", "checked", "config", "text", "transcript", "prompts", "markers", "datasets", "files", "errors"),
    ("http", "readers", "corpus", "embeddings", "citations", "grounding", "compression", "guards",
     "short_answer", "models", "truncation"),
    ("generation",),
    ("deciders", "queries", "query_text", "context", "context_log", "retrieval"),
    ("controller", "run", "callbacks", "answer_checks"),
    ("build", "streaming"),
    ("eval",),
    ("serve", "widgets", "trigger", "finetune", "classroom"),
    ("cli",),
)
TEST_KIT = ("testing",)  # scripted parts for tests: reads the parts' row and below, imported by tests only
UPPER = tuple(m for row in TIERS[TIERS.index(("build", "streaming")) + 1 :] for m in row)
CORE = tuple(m for row in TIERS[: TIERS.index(("controller", "run", "callbacks", "answer_checks")) + 1] for m in row)
BENCH_TIER = len(TIERS) - 2  # the benchmarks drive the library, not the commands
# Circles inside one folder that are still there (the modules of each); a new one fails the test,
# and so does one of these once it is gone, so the list stays true.
IN_FOLDER_CIRCLES = {
    # opening an index dispatches on its kind to attach, which builds on index and storage
    frozenset({"rigkit.retrieval.attach", "rigkit.retrieval.index", "rigkit.retrieval.index_build",
               "rigkit.retrieval.index_manifest", "rigkit.retrieval.reuse", "rigkit.retrieval.storage"}),
}
# Turning a config into a part: the defining package and rigkit.build call these, nobody else.
# The one upward arrow: `RIGResult.to_html()` loads the page view when it is called, by an import
# inside the method, so loading the trace still loads no view. The same import at module level,
# or another view, still fails.
DEFERRED_UPWARD = {"rigkit.trace": "rigkit.widgets.page"}
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


def imports_of(path: Path, name: str | None = None, at_load: bool = False) -> set[str]:
    """Every rigkit module `path` (module `name`) imports, anywhere in the file (lazy ones too);
    `at_load`: only the imports that run when the module loads (none inside a function)."""
    found: set[str] = set()
    for node in (_outside_functions(_tree(path)) if at_load else ast.walk(_tree(path))):
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


def _outside_functions(tree: ast.AST) -> Iterator[ast.AST]:
    """`ast.walk` that does not enter a function's body (nor a lambda's)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(node))


def deferred_allowed(path: Path, name: str) -> set[str]:
    """The upward imports of `name` that DEFERRED_UPWARD allows: its listed module, imported only
    inside functions (an import of it at module level allows nothing)."""
    allowed = DEFERRED_UPWARD.get(name)
    if allowed is None:
        return set()

    def of_it(found: set[str]) -> set[str]:
        return {m for m in found if m == allowed or m.startswith(f"{allowed}.")}

    return set() if of_it(imports_of(path, name, at_load=True)) else of_it(imports_of(path, name))


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
    """The config-to-part factories `path` imports, calls or reads off a module (naming one as a
    type, in an annotation or an import under `if TYPE_CHECKING`, builds nothing)."""
    found, tree = set(), _tree(path)
    typed = [n for n in ast.walk(tree) if isinstance(n, ast.If) and _type_checking(n)]
    typed += [n.annotation for n in ast.walk(tree) if isinstance(n, (ast.arg, ast.AnnAssign)) and n.annotation]
    typed += [n.returns for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.returns]
    skip = {id(n) for part in typed for n in ast.walk(part)}
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom):
            found.update(alias.name for alias in node.names if alias.name in FACTORIES)
        elif isinstance(node, ast.Attribute) and node.attr in FACTORIES:
            found.add(node.attr)
        elif isinstance(node, ast.Name) and node.id in FACTORIES:
            found.add(node.id)
    return sorted(found)


def deciders_reset_by_hand(tree: ast.AST) -> list[int]:
    """Lines that give a config another decider by hand (`replace(config, decider=...)`) instead of
    `RunConfig.with_decider`, where the rule for what carries over lives."""
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) == "replace"
            and any(k.arg == "decider" for k in node.keywords)]


def notebook_code(path: Path) -> str:
    """A notebook's code cells as one module (IPython's `%` and `!` lines left out)."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    return "\n".join(line for line in code.splitlines() if not line.lstrip().startswith(("%", "!")))


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
        return TIERS.index(("deciders", "queries", "query_text", "context", "context_log", "retrieval"))
    return next((i for i, row in enumerate(TIERS) if top(name) in row), None)


def modules_of(package: Path) -> list[Path]:
    return sorted(p for p in package.rglob("*.py") if "__pycache__" not in p.parts)


# "Which segments make up the answer" is read from what each round recorded it kept
# (rigkit.trace.kept_order); the loop that decides it sets the actions. Anywhere else, a test of
# a round's action against several actions, or against restore / fallback, is a second rule.
KEPT_RULE_HOMES = ("rigkit.trace", "rigkit.controller")
_ACTION_WORDS = {"accept", "continue", "regenerate", "skip", "restore", "fallback", "repeat", "ground"}
_PUT_BACK = {"restore", "fallback"}


def _action_word(node: ast.AST) -> str | None:
    """`Action.RESTORE` or the plain word "restore": the action it names."""
    if isinstance(node, ast.Attribute) and node.attr.lower() in _ACTION_WORDS:
        return node.attr.lower()
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in _ACTION_WORDS:
        return node.value
    return None


def _reads_action(node: ast.AST) -> bool:
    """`r.action`, `r["action"]`, `r.get("action")`."""
    if isinstance(node, ast.Attribute):
        return node.attr == "action"
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "action"
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
            and bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value == "action")


def kept_rules(package: Path = PACKAGE) -> list[str]:
    """`module:line` for each test of a round's action that decides which segments were kept."""
    found = []
    for path in modules_of(package):
        name = module_name(path, package)
        if name in KEPT_RULE_HOMES:
            continue
        tree = _tree(path)
        named = {}  # module-level names bound to a collection of actions, e.g. KEPT = ("accept", ...)
        for node in tree.body if isinstance(tree, ast.Module) else ():
            if isinstance(node, ast.Assign) and isinstance(node.value, (ast.Tuple, ast.Set, ast.List)):
                words = {w for e in node.value.elts if (w := _action_word(e))}
                named.update({t.id: words for t in node.targets if isinstance(t, ast.Name) and words})
        for node in ast.walk(tree):
            if not isinstance(node, ast.Compare) or not any(map(_reads_action, [node.left, *node.comparators])):
                continue
            words: set[str] = set()
            for side in [node.left, *node.comparators]:
                if isinstance(side, (ast.Tuple, ast.Set, ast.List)):
                    words |= {w for e in side.elts if (w := _action_word(e))} | ({"several"} if len(side.elts) > 1 else set())
                elif isinstance(side, ast.Name) and side.id in named:
                    words |= named[side.id] | {"several"}
                elif (word := _action_word(side)) is not None:
                    words.add(word)
            if words & _PUT_BACK or ("several" in words and len(words) > 2):
                found.append(f"{name}:{node.lineno}")
    return found


def upward_imports(package: Path = PACKAGE) -> list[str]:
    """`a imports b` for every import that reaches a higher row than the importer's."""
    wrong = []
    for path in modules_of(package):
        name = module_name(path, package)
        own = tier(name)
        if own is None:
            continue  # the root package; an unplaced module fails test_every_module_has_a_tier
        for target in sorted(imports_of(path, name) - deferred_allowed(path, name)):
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
    # an allowed deferred import runs when its function is called, after both modules loaded
    edges = {n: (_runtime_imports(p, n, package) - deferred_allowed(p, n)) & graph.keys()
             for n, p in graph.items()}
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


NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", [*sorted(BENCH.glob("*.py")), *NOTEBOOKS], ids=lambda p: p.name)
def test_bench_and_notebooks_build_through_build_and_reset_deciders_with_with_decider(path):
    text = notebook_code(path) if path.suffix == ".ipynb" else path.read_text(encoding="utf-8")
    found, reset = built_by_hand(_parse(path, text))
    assert not found, f"{path.name} uses {found}: build parts through rigkit.build"
    assert not reset, f"{path.name}: another decider by hand (line {reset[0]}); use config.with_decider(name)"


# Parts that rigkit.build composes from a config: a script or notebook that makes one wires by hand.
COMPOSED = ("HybridRetriever", "RerankedRetriever", "FilteredRetriever", "SourcesRetriever", "ContextManager")


def built_by_hand(tree: ast.AST) -> tuple[list[str], list[int]]:
    """The config-to-part factories and composed parts a script or notebook names, and where it
    resets a decider by hand."""
    found = {f for n in ast.walk(tree) for f in (*FACTORIES, *COMPOSED)
             if isinstance(n, ast.Name) and n.id == f or isinstance(n, ast.Attribute) and n.attr == f
             or isinstance(n, ast.ImportFrom) and any(a.name == f for a in n.names)}
    return sorted(found), deciders_reset_by_hand(tree)


def test_a_planted_decider_reset_or_factory_in_bench_fails_the_check():
    planted = "import dataclasses\nfrom rigkit.generation import load_generator\n" \
              "config = dataclasses.replace(config, decider=DeciderConfig(name='prob'))\n" \
              "hybrid = retrieval.hybrid.HybridRetriever({'bm25': bm25, 'dense': dense})\n"
    found, reset = built_by_hand(ast.parse(planted))
    assert found == ["HybridRetriever", "load_generator"] and reset == [3]


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_the_package_resets_deciders_with_with_decider(path):
    if module_name(path) == "rigkit.config":
        return
    assert not deciders_reset_by_hand(_tree(path)), f"{module_name(path)}: use config.with_decider(name)"


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


@contextmanager
def planted(path: Path, line: str) -> Iterator[None]:
    """`line` added to the copied file for the block, then the file as it was."""
    before = path.read_text(encoding="utf-8")
    _plant(path, line)
    try:
        yield
    finally:
        path.write_text(before, encoding="utf-8")


@pytest.mark.parametrize("module, line, expected", [
    ("trace.py", "from rigkit.controller import RIGController", "rigkit.trace imports rigkit.controller"),
    ("text.py", "def later():\n    from rigkit.generation import HFGenerator",
     "rigkit.text imports rigkit.generation"),
    ("generation/stops.py", "from rigkit.context import ContextManager",
     "rigkit.generation.stops imports rigkit.context"),
    ("deciders/base.py", "import rigkit.controller", "rigkit.deciders.base imports rigkit.controller"),
    ("eval/metrics.py", "from rigkit.cli import main", "rigkit.eval.metrics imports rigkit.cli"),
    ("controller.py", "from rigkit.build import build_run", "rigkit.controller imports rigkit.build"),
    # the deferred page import of RIGResult.to_html is the one exception, and only as it is
    ("trace.py", "from rigkit.widgets.page import run_page", "rigkit.trace imports rigkit.widgets.page"),
    ("trace.py", "def later():\n    from rigkit.widgets.stepper import RoundStepper",
     "rigkit.trace imports rigkit.widgets.stepper"),
    ("text.py", "def later():\n    from rigkit.widgets.page import run_page", "rigkit.text imports rigkit.widgets.page"),
])
def test_a_planted_upward_import_fails_the_check(copied, module, line, expected):
    package = copied / "rigkit"
    assert upward_imports(package) == []
    target = package / module
    with planted(target, line):
        assert any(w.startswith(expected) for w in upward_imports(package)), expected


def test_a_planted_circle_across_folders_fails_the_check(copied):
    package = copied / "rigkit"
    target = package / "corpus.py"
    assert not [c for c in import_circles(package) if crosses_folders(c, package)]
    with planted(target, "def later():\n    from rigkit.readers import read_files"):
        crossing = [c for c in import_circles(package) if crosses_folders(c, package)]
        assert crossing and {"rigkit.corpus", "rigkit.readers"} <= set().union(*crossing)


def test_the_deferred_view_import_is_the_listed_one_and_loads_nothing_on_import():
    """RIGResult.to_html imports the page inside the method: the exception is in use (so the list
    stays true), and loading the trace loads no view."""
    assert deferred_allowed(PACKAGE / "trace.py", "rigkit.trace") == {
        "rigkit.widgets.page", "rigkit.widgets.page.run_page"}
    assert [m for m in fresh_import("rigkit.trace") if top(m) in UPPER] == []


def test_the_deferred_view_import_at_module_level_closes_a_circle(copied):
    package = copied / "rigkit"
    target = package / "trace.py"
    with planted(target, "from rigkit.widgets.page import run_page"):
        crossing = [c for c in import_circles(package) if crosses_folders(c, package)]
        assert crossing and {"rigkit.trace", "rigkit.widgets.page"} <= set().union(*crossing)


def test_a_type_checking_import_closes_no_circle(copied):
    package = copied / "rigkit"
    target = package / "corpus.py"
    with planted(target, "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rigkit.readers import Reader"):
        assert not [c for c in import_circles(package) if crosses_folders(c, package)]


def test_the_kept_segments_are_read_in_one_place():
    assert kept_rules() == [], "read rigkit.trace.kept_order / kept_segments instead of the rounds' actions"


@pytest.mark.parametrize("line", [
    "from rigkit.trace import Action\n"
    "def kept(rounds):\n"
    "    return [r.segment for r in rounds if r.action in (Action.ACCEPT, Action.CONTINUE, Action.SKIP)]",
    "KEPT = ('accept', 'continue', 'skip')\n"
    "def kept(rows):\n"
    "    return [r['text'] for r in rows if r.get('action') in KEPT]",
    "def put_back(rounds, i):\n"
    "    return rounds[i].action == 'restore'",
])
def test_a_planted_second_kept_segment_rule_fails_the_check(copied, line):
    target = copied / "rigkit" / "eval" / "metrics.py"
    with planted(target, line):
        assert [w for w in kept_rules(copied / "rigkit") if w.startswith("rigkit.eval.metrics:")]


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
        "    return build._with_protocol, controller._private_rule, generator_from_config\n"
    )
    assert private_names_taken(sample, "rigkit.serve.probe") == [
        "rigkit.build._with_protocol", "rigkit.controller._private_rule",
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
