"""One config surface: defaults live in rigkit/config.py, `--set` reaches every key, docs/config.md
is generated from the field comments. No test here loads a model (the embedder is a hash)."""

from __future__ import annotations

import argparse
import ast
import json
from pathlib import Path

import pytest

from rigkit.cli import build_parser, run_config
from rigkit.config import (
    ConfigError,
    RetrievalConfig,
    RunConfig,
    apply_settings,
    config_reference,
    field_docs,
    load_config,
)
from rigkit.errors import InputError, RigkitError

try:
    from tests.conftest_retrieval import DATA, HashEmbedder
except ImportError:
    from conftest_retrieval import DATA, HashEmbedder

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "rigkit"
DEMO = DATA / "demo" / "corpus.jsonl"


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    """A command in-process, as `main` runs it, without main's process-wide logging setup."""
    args = build_parser().parse_args(argv)
    try:
        code = args.func(args)
    except RigkitError as err:
        return 2, "", str(err)
    out = capsys.readouterr()
    return code, out.out, out.err


# -- docs/config.md ---------------------------------------------------------------------------

def test_docs_config_md_is_generated_from_config_py():
    page = (ROOT / "docs" / "config.md").read_text(encoding="utf-8")
    assert page == config_reference(), (
        "docs/config.md is stale: regenerate it with `python -m rigkit.config > docs/config.md`")


def test_every_key_has_a_line_of_documentation_in_the_reference():
    reference = config_reference()
    for section, value in RunConfig().to_dict().items():
        cls = type(getattr(RunConfig(), section))
        docs = field_docs(cls)
        for key in value:
            assert docs[key], f"{section}.{key} has no trailing comment in rigkit/config.py"
            assert f"| `{section}.{key}` |" in reference


def test_reference_shows_types_and_defaults():
    rows = {line.split("|")[1].strip(" `"): line for line in config_reference().splitlines()
            if line.startswith("| `")}
    assert "| integer | `3` |" in rows["retrieval.top_k"]
    assert "| string or null | `null` |" in rows["retrieval.index"]
    assert "| number | `1.5` |" in rows["retrieval.k1"]
    assert "| `auto` |" in rows["retrieval.embedding_model"]  # MiniLM, or e5 for a mostly-Chinese corpus
    assert "| list of decider sections | `[]` |" in rows["decider.members"]
    assert "| mapping | `{}` |" in rows["decider.params"]


# -- --set ------------------------------------------------------------------------------------

def test_settings_are_read_as_yaml_and_checked_like_the_file():
    config = apply_settings(RunConfig(), [
        "retrieval.top_k=5", "decider.params.threshold=0.3", "controller.policy=continue",
        "decider.weights=[2, 1]", "retrieval.index=null", "generator.temperature=1",
        "context.system_prompt=Answer: in one line", "generator.model=org/model-1.5",
    ])
    assert config.retrieval.top_k == 5
    assert config.decider.params == {"threshold": 0.3}
    assert config.controller.policy == "continue"
    assert config.decider.weights == (2.0, 1.0)
    assert config.retrieval.index is None
    assert config.generator.temperature == 1.0 and isinstance(config.generator.temperature, float)
    assert config.context.system_prompt == "Answer: in one line"  # text, not a YAML mapping
    assert config.generator.model == "org/model-1.5"


def test_later_settings_win_and_members_take_mappings():
    config = apply_settings(RunConfig(), [
        "retrieval.top_k=5", "retrieval.top_k=7",
        "decider.name=composite", "decider.members=[{name: prob}, {name: keyword, threshold: 0.5}]",
    ])
    assert config.retrieval.top_k == 7
    assert [m.name for m in config.decider.members] == ["prob", "keyword"]
    assert config.decider.members[1].threshold == 0.5


def test_naming_another_decider_drops_the_files_threshold_for_the_old_one():
    from rigkit.config import DeciderConfig

    prob = RunConfig().override(decider={"threshold": 0.3, "params": {"pause_at": 1}})
    # cpu.yaml's prob threshold must not become the classifier's: its file holds a tuned one
    config = apply_settings(prob, ["decider.trigger_model=m.skops", "decider.name=classifier"])
    assert config.decider == DeciderConfig(name="classifier", trigger_model="m.skops")
    assert apply_settings(prob, ["decider.threshold=0.2", "decider.name=entropy"]).decider.threshold == 0.2
    assert apply_settings(prob, ["decider.name=prob"]).decider.threshold == 0.3  # same decider: kept


@pytest.mark.parametrize("setting, words", [
    ("retrival.top_k=5", ["unknown section 'retrival'", "known: generator, retrieval"]),
    ("retrieval.topk=5", ["unknown key 'topk' in retrieval", "top_k", "embedding_model"]),
    ("retrieval.top_k=five", ["retrieval.top_k", "expected an integer", "five"]),
    ("retrieval.top_k=0", ["retrieval.top_k", "at least 1"]),
    ("decider.threshold=high", ["decider.threshold", "expected a number"]),
    ("controller.max_rounds=[1", ["not valid YAML"]),
    ("retrieval.top_k", ["expected section.key=value"]),
    ("retrieval=5", ["expected section.key=value"]),
    ("retrieval.top_k.deep=1", ["retrieval.top_k is not a mapping"]),
])
def test_bad_settings_name_the_setting_and_what_is_allowed(setting, words):
    with pytest.raises(ConfigError) as err:
        apply_settings(RunConfig(), [setting])
    message = str(err.value)
    assert message.startswith(f"--set {setting}") and "\n" not in message
    for word in words:
        assert word in message, message


def test_precedence_defaults_file_settings_flags(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("retrieval:\n  top_k: 2\n  mode: bm25\ngenerator:\n  model: from-file\n")
    args = build_parser().parse_args(["search", "dir", "q", "--config", str(path), "--set", "retrieval.top_k=4",
                                      "--set", "generator.model=from-set", "--model", "from-flag"])
    config = run_config(args)
    assert config.retrieval.top_k == 4  # --set over the file
    assert config.retrieval.mode == "bm25"  # an unset flag keeps the file's value
    assert config.generator.model == "from-flag"  # the everyday flag over --set
    assert config.retrieval.overlap == RetrievalConfig.overlap  # the default where nothing says
    assert run_config(argparse.Namespace(config=None, settings=[])) == load_config()


# -- the commands -------------------------------------------------------------------------------

COMMANDS = [
    ["ask", "q"], ["search", "dir", "q"], ["index", "build", "--out", "o"],
    ["eval", "--qa", "q", "--out", "o"], ["eval-retrieval", "--qa", "q"], ["serve"], ["mcp"],
    ["trigger", "build-labels", "--qa", "q", "--out", "o"],
    ["trigger", "eval", "--labels", "l", "--trigger-model", "m"],
    ["markers", "build-data", "--qa", "q", "--out", "o"], ["markers", "train", "--data", "d", "--out", "o"],
    ["markers", "eval"], ["config"],
]


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_every_command_that_loads_a_model_or_index_takes_config_and_set(argv):
    args = build_parser().parse_args([*argv, "--config", "c.yaml", "--set", "a.b=1", "--set", "c.d=2"])
    assert args.config == "c.yaml" and args.settings == ["a.b=1", "c.d=2"]


def test_config_command_prints_the_merged_config(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text("retrieval:\n  top_k: 2\n")
    code, out, _ = run(["config", "--config", str(path), "--set", "decider.params.threshold=0.3",
                        "--set", "controller.policy=continue"], capsys)
    printed = RunConfig.from_yaml(out)
    assert code == 0 and printed.retrieval.top_k == 2
    assert printed.decider.params == {"threshold": 0.3} and printed.controller.policy == "continue"
    code, out, _ = run(["config", "--markdown"], capsys)
    assert code == 0 and out == config_reference()


def test_ask_refuses_a_bad_setting_before_loading_anything(capsys):
    code, _, err = run(["ask", "What?", "--set", "retrieval.top_k=zero"], capsys)
    assert code == 2 and "--set retrieval.top_k=zero" in err and "integer" in err
    code, _, err = run(["ask", "What?", "--set", "decider.name=oracle"], capsys)
    assert code == 2 and "unknown decider 'oracle'" in err and "prob" in err
    code, _, err = run(["ask", "What?", "--set", "decider.params.windw=3"], capsys)
    assert code == 2 and "decider.params.windw" in err


def test_index_build_reads_the_retrieval_section(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("rigkit.embeddings.load_embedder", lambda name="", device=None: HashEmbedder())
    config = tmp_path / "run.yaml"
    config.write_text(f"retrieval:\n  corpus: {DEMO}\n  overlap: 16\n")
    out = tmp_path / "index"
    code, printed, _ = run(["index", "build", "--config", str(config), "--out", str(out),
                            "--set", "retrieval.dense_index=hnsw", "--set", "retrieval.k1=1.2",
                            "--chunk-size", "128"], capsys)
    assert code == 0, printed
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["chunking"]["overlap"] == 16 and manifest["chunking"]["chunk_size"] == 128
    assert manifest["dense"]["index"] == "hnsw" and manifest["bm25"]["k1"] == 1.2


def test_index_build_flag_beats_set_and_settings_are_checked(tmp_path, capsys):
    argv = ["index", "build", "--corpus", str(DEMO), "--out", str(tmp_path / "i")]
    code, _, err = run([*argv, "--set", "retrieval.chunk_size=100", "--chunk-size", "512"], capsys)
    assert code == 2 and "256" in err and not (tmp_path / "i").exists()
    code, _, err = run([*argv, "--set", "retrieval.k1=fast"], capsys)
    assert code == 2 and "retrieval.k1" in err and "expected a number" in err
    code, _, err = run(["index", "build", "--out", str(tmp_path / "i")], capsys)
    assert code == 2 and "needs a corpus" in err


# -- one owner per default and per check ------------------------------------------------------

def _string_constants(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)}
    return {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
            and isinstance(node.value, str) and id(node) not in docstrings}


def test_the_default_embedder_is_named_once_in_code():
    named = [str(p.relative_to(ROOT)) for p in sorted(PACKAGE.rglob("*.py"))
             if "all-MiniLM-L6-v2" in _string_constants(p)]
    assert named == ["rigkit/config.py"], named


# parameters named after a config key take their default from the config class, not a literal
# (BM25's `b` is left out: the name is too short to mean only that; `top_k` and `max_words`
# also name other quantities: hits a search returns, a passage's focus window)
SHARED = {"embedding_model", "k1", "bm25_method", "bm25_backend", "overlap", "dense_index",
          "rrf_k", "bm25_top_k", "dense_top_k", "use_cache", "temperature", "top_p", "device",
          "dtype", "attn_implementation", "trust_remote_code", "top_logprobs", "max_retries"}


def test_parameters_named_after_a_config_key_default_to_the_config():
    literal = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "config.py" and path.parent == PACKAGE:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            params = [*node.args.posonlyargs, *node.args.args]
            pairs = list(zip(params[len(params) - len(node.args.defaults):], node.args.defaults))
            pairs += [(a, d) for a, d in zip(node.args.kwonlyargs, node.args.kw_defaults) if d is not None]
            literal += [f"{path.relative_to(ROOT)}:{node.name}({a.arg}={d.value!r})" for a, d in pairs
                        if a.arg in SHARED and isinstance(d, ast.Constant) and d.value is not None]
    assert not literal, literal


def test_one_check_owns_each_name_and_the_question():
    from rigkit.deciders import check_decider_name
    from rigkit.eval.systems import parse_system
    from rigkit.queries import check_query_mode
    from rigkit.text import check_question

    with pytest.raises(InputError, match=r"^unknown decider 'oracle'; known: marker, prob"):
        check_decider_name("oracle")
    with pytest.raises(InputError, match=r"^system 'rig:psychic': unknown decider 'psychic'; known: "):
        parse_system("rig:psychic")  # rig:oracle is a system of its own (rigkit.eval.oracle)
    with pytest.raises(InputError, match=r"^system 'rig:prob:guess': unknown query mode 'guess'"):
        parse_system("rig:prob:guess")
    with pytest.raises(InputError, match=r"^unknown query mode 'guess'; known: auto, marker"):
        check_query_mode("guess")
    for empty in ("", "  \n", None):
        with pytest.raises(InputError, match=r"^the question is empty$"):
            check_question(empty)
    with pytest.raises(InputError, match="UTF-8"):
        check_question("caf\udce9")
    assert check_question(" What? ") == " What? "


def test_eval_applies_settings_over_the_file_and_records_them(tmp_path):
    from rigkit.eval.experiment import evaluate
    from rigkit.testing import ScriptedGenerator

    qa = tmp_path / "qa.jsonl"
    qa.write_text(json.dumps({"dataset": "toy", "id": "q1", "question": "Who?", "answer": "Ann",
                              "answer_aliases": [], "type": "bridge", "supporting_titles": [],
                              "paragraphs": []}) + "\n")
    config = tmp_path / "run.yaml"
    config.write_text("generator:\n  max_answer_tokens: 40\ncontroller:\n  max_rounds: 2\n")
    evaluate(qa, tmp_path / "run", "closed_book", config=config, generator=ScriptedGenerator(["Ann."]),
             settings=["generator.max_answer_tokens=7"], faithfulness=False, progress=False, report=False)
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["config_file"] == str(config)
    assert meta["config"]["generator"]["max_answer_tokens"] == 7  # --set over the file
    assert meta["config"]["controller"]["max_rounds"] == 2  # the file over the default
