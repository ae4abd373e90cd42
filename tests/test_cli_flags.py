"""One flag table (rigkit/cli/flags.py): every flag that sets a config key has one meaning on every
command, shows the config's default in --help, and reaches the config as a setting after --set."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from rigkit.cli import build_parser, main, run_config
from rigkit.cli.flags import FLAGS, GENERATOR, help_text
from rigkit.config import DeciderConfig, RunConfig, config_default, default_text

ROOT = Path(__file__).resolve().parents[1]

# Flags that set no config key yet appear on several commands: each is one meaning, reviewed here.
# A new name on a second command fails the walk until it is added with what it means.
SHARED_MEANINGS = {
    "--config": "the YAML run config", "--set": "one config key", "--out": "where the command writes",
    "--json": "JSON on stdout", "--host": "the address a server binds", "--port": "the port a server listens on", "--qa": "a QA JSONL file", "--limit": "only the first N questions",
    "--split": "a stored split of the data set", "--seed": "the command's random seed",
    "--no-progress": "no progress bar", "--labels": "a labelled trigger set",
    "--features": "the trigger classifier's feature sets", "--classifier": "logreg | mlp",
    "--rule": "the trigger labelling rule", "--deciders": "decider baselines to score",
    "--bootstrap": "bootstrap resamples", "--fresh": "start over instead of resuming",
    "--end-effect": "also answer questions end to end", "--corpus": "the corpus",
    "--model": "the model that generates",
    "--tool-result-tokens": "cap on each tool result shown to the model",
    "--systems": "the systems an evaluation compares", "--concurrency": "questions answered at once",
    "--index": "a saved index (ask, serve, mcp: NAME=PATH, repeatable, for several sources)",
    "--retriever": "a retrieval server's URL (NAME=URL, repeatable, for several sources)",
    "--html": "write a self-contained HTML page here (ask: the run; compare: the comparison; trigger eval: "
    "the ROC / PR figure)",
    "--lecture": "with --html: large type for a projector",
    "--force": "go on although a check refuses (eval-merge: replace the evaluation in --out; index attach: "
    "rows that do not match their vectors)",
}


def _commands(parser: argparse.ArgumentParser, name: str = "rigkit"):
    """(command name, parser) for every command that takes options, sub-commands included."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield name, parser
    for sub in subs:
        for child, p in sub.choices.items():
            yield from _commands(p, f"{name} {child}")


def _visible(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if action.help is argparse.SUPPRESS or not action.option_strings or action.dest == "help":
            continue
        yield action


COMMANDS = list(_commands(build_parser()))


def test_the_walk_reaches_every_command():
    names = {name for name, _ in COMMANDS}
    assert {"rigkit ask", "rigkit index build", "rigkit search", "rigkit serve", "rigkit mcp", "rigkit eval",
            "rigkit trigger eval", "rigkit markers train", "rigkit config"} <= names


def test_every_table_flags_help_shows_the_config_default_as_docs_config_md_does():
    reference = (ROOT / "docs" / "config.md").read_text(encoding="utf-8")
    seen = set()
    for command, parser in COMMANDS:
        for action in _visible(parser):
            flag = FLAGS.get(action.option_strings[0])
            if flag is None or not hasattr(action, "config_key"):
                continue
            seen.add(flag.name)
            if flag.sets:
                for key, value in flag.sets:
                    assert value != config_default(key), f"{command} {flag.name} sets {key} to its default"
                    assert f"{key}={default_text(value)}" in action.help
                continue
            shown = re.search(r"\(([\w.]+), default: (.*)\)$", action.help)
            assert shown, f"{command} {flag.name}: no default in {action.help!r}"
            key, default = shown.groups()
            assert key == flag.key and default == default_text(config_default(flag.key)), (command, flag.name)
            assert f"| `{key}` |" in reference and f"| `{default}` |" in reference.split(f"| `{key}` |")[1].split("\n")[0]
            assert action.default is None, f"{command} {flag.name}: a literal default ({action.default!r})"
    assert seen == set(FLAGS), f"table flags no command takes: {set(FLAGS) - seen}"


def test_no_flag_name_has_two_meanings_across_commands():
    meanings: dict[str, set[str]] = {}
    where: dict[str, set[str]] = {}
    for command, parser in COMMANDS:
        for action in _visible(parser):
            for name in action.option_strings:
                meaning = SHARED_MEANINGS.get(name) or getattr(action, "config_key", None) or command
                meanings.setdefault(name, set()).add(meaning)
                where.setdefault(name, set()).add(command)
    for name, found in meanings.items():
        if name in FLAGS and name not in SHARED_MEANINGS:
            assert found == {FLAGS[name].key or ", ".join(k for k, _ in FLAGS[name].sets)}, (name, found)
        assert len(found) == 1, f"{name} means {len(found)} things: {sorted(found)} on {sorted(where[name])}"


def test_every_command_that_generates_takes_the_generator_flags():
    generating = {"rigkit ask", "rigkit eval", "rigkit serve", "rigkit mcp", "rigkit search",
                  "rigkit eval-retrieval", "rigkit trigger build-labels", "rigkit trigger eval",
                  "rigkit markers build-data", "rigkit markers train", "rigkit markers eval", "rigkit ladder"}
    # kept for one release by a deprecated spelling of another meaning, or the command's own --model
    left_out = {("rigkit serve", "--api-key-env"), ("rigkit trigger eval", "--model"),
                ("rigkit markers eval", "--model"), ("rigkit ladder", "--model")}
    for command, parser in COMMANDS:
        if command not in generating:
            continue
        table = {a.option_strings[0] for a in _visible(parser) if hasattr(a, "config_key")}
        missing = {n for n in GENERATOR if n not in table and (command, n) not in left_out}
        assert not missing, f"{command} lacks {sorted(missing)}"


def test_flags_are_settings_applied_after_the_file_and_set(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("decider:\n  name: prob\n  threshold: 0.3\nretrieval:\n  top_k: 2\n")
    args = build_parser().parse_args([
        "ask", "q", "--config", str(path), "--set", "retrieval.top_k=4", "--set", "decider.params.top_words=2",
        "--decider", "entropy", "--device", "cpu", "--no-cache", "--grounded", "--filter", "lang=en"])
    config = run_config(args)
    assert config.retrieval.top_k == 4
    # another decider starts from its defaults; the --set decider keys still apply
    assert config.decider == DeciderConfig(name="entropy", params={"top_words": 2})
    assert config.generator.device == "cpu" and config.generator.use_cache is False
    assert (config.context.grounding, config.context.cite) == ("strict", "model")
    assert config.retrieval.filters == ("lang=en",)
    args = build_parser().parse_args(["ask", "q", "--config", str(path), "--max-rounds", "1"])
    assert run_config(args).decider.threshold == 0.3  # the same decider keeps the file's section


def test_with_decider_is_the_one_home_of_the_reset_rule():
    config = RunConfig().override(decider={"threshold": 0.3, "params": {"pause_at": 1}})
    assert config.with_decider("prob") is config and config.with_decider(None) is config
    assert config.with_decider("entropy").decider == DeciderConfig(name="entropy")
    rule = "DeciderConfig(name="
    users = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "rigkit").rglob("*.py"))
             if rule in p.read_text(encoding="utf-8") and p.name != "config.py"]
    # the trained classifier's own decider (rigkit/trigger/decider.py) and one probe are not resets
    assert set(users) <= {"rigkit/trigger/decider.py", "rigkit/trigger/evaluate.py"}, users


def test_search_top_k_defaults_to_retrieval_top_k():
    args = build_parser().parse_args(["search", "dir", "q"])
    assert run_config(args).retrieval.top_k == RunConfig().retrieval.top_k
    args = build_parser().parse_args(["search", "dir", "q", "--top-k", "7"])
    assert run_config(args).retrieval.top_k == 7


@pytest.mark.parametrize("old, new, argv", [
    ("--backend", "dense_backend", ["index", "build", "--out", "o", "--backend", "milvus"]),
    ("--api-key-env", "server_key_env", ["serve", "--api-key-env", "KEY"]),
    ("--model", "classifier", ["trigger", "train", "--labels", "l", "--out", "o", "--model", "mlp"]),
    ("--model", "trigger_model", ["trigger", "eval", "--labels", "l", "--model", "m.skops"]),
])
def test_an_old_spelling_still_works_for_one_release_with_a_one_line_warning(old, new, argv, capsys):
    args = build_parser().parse_args(argv)
    assert getattr(args, new) == argv[-1]
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{old} is deprecated" in err and new.replace("_", "-") in err
    command = "rigkit " + " ".join(argv[:2] if argv[0] in ("index", "trigger") else argv[:1])
    shown = [name for a in _visible(dict(COMMANDS)[command]) for name in a.option_strings]
    assert old not in shown, f"{old} shown in {command} --help"


def test_index_build_takes_the_old_backend_spelling_into_retrieval_dense_backend(capsys):
    args = build_parser().parse_args(["index", "build", "--out", "o", "--backend", "milvus"])
    assert run_config(args).retrieval.dense_backend == "milvus"


def test_config_refuses_a_decider_param_as_ask_does(capsys):
    bad = ["--set", "decider.params.nope=1"]
    assert main(["config", *bad]) == 2
    config_err = capsys.readouterr().err
    assert main(["ask", "What?", *bad]) == 2
    ask_err = capsys.readouterr().err
    assert config_err == ask_err and config_err.count("\n") == 1 and "decider.params.nope" in config_err
    assert main(["config", "--set", "decider.name=oracle"]) == 2
    assert "unknown decider 'oracle'" in capsys.readouterr().err


def test_help_text_reads_the_default_from_the_config():
    assert help_text(FLAGS["--top-k"]).endswith(f"(retrieval.top_k, default: {RunConfig().retrieval.top_k})")


def test_only_build_assembles_in_bench_notebooks_and_the_commands():
    """bench/, the notebooks and rigkit/cli build generators, retrievers and query builders through
    rigkit.build (which keeps the config's backend, device and dtype), never by hand."""
    by_hand = ("load_generator(", "open_retriever(", "open_index(", "MultiQuery(")
    files = [*sorted((ROOT / "bench").glob("*.py")), *sorted((ROOT / "notebooks").glob("*.ipynb")),
             *sorted((ROOT / "rigkit" / "cli").glob("*.py"))]
    found = [f"{p.relative_to(ROOT)}: {call}" for p in files for call in by_hand
             if call in p.read_text(encoding="utf-8")]
    assert not found, found
    import rigkit
    import rigkit.generation

    assert "load_generator" not in rigkit.__all__ and "load_generator" not in rigkit.generation.__all__


def _parsers(parser: argparse.ArgumentParser):
    """Every parser of the command line: the root, each command group and each command."""
    yield parser
    for sub in (a for a in parser._actions if isinstance(a, argparse._SubParsersAction)):
        for child in sub.choices.values():
            yield from _parsers(child)


def _stand_ins(parser: argparse.ArgumentParser) -> list[str]:
    """Values for a command's positional arguments and required options, enough for it to parse."""
    values: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) or (action.option_strings and not action.required):
            continue
        count = {None: 1, "+": 1, "*": 0, "?": 0}.get(action.nargs, action.nargs)
        value = str(next(iter(action.choices))) if action.choices else "x"
        values += [*action.option_strings[:1], *[value] * count]
    return values


def _prefix_flag(parser: argparse.ArgumentParser) -> str | None:
    """A long flag cut by one letter that is no flag itself (`--mode` of `--model`)."""
    names = {s for a in parser._actions for s in a.option_strings}
    cut = sorted(s[:-1] for s in names if s.startswith("--") and len(s) > 4 and s != "--help")
    return next((c for c in cut if c not in names), None)


def test_no_parser_matches_a_flag_by_its_prefix():
    assert all(p.allow_abbrev is False for p in _parsers(build_parser()))


@pytest.mark.parametrize("name, parser", [(n, p) for n, p in COMMANDS if _prefix_flag(p)],
                         ids=[n for n, p in COMMANDS if _prefix_flag(p)])
def test_a_flags_prefix_is_an_unknown_flag_that_exits_2_and_is_named(name, parser, capsys):
    prefix = _prefix_flag(parser)
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args([*name.split()[1:], *_stand_ins(parser), prefix])
    assert done.value.code == 2
    assert f"unrecognized arguments: {prefix}" in capsys.readouterr().err


def test_ask_mode_is_not_ask_model(capsys):
    with pytest.raises(SystemExit) as done:
        main(["ask", "Who wrote it?", "--mode", "bm25"])
    assert done.value.code == 2 and "unrecognized arguments: --mode bm25" in capsys.readouterr().err


@pytest.mark.parametrize("old, new, dest", [
    (["ladder", "--qa", "q", "--out", "o", "--model", "a", "--model", "b"],
     ["ladder", "--qa", "q", "--out", "o", "--rung", "a", "--rung", "b"], "models"),
    (["markers", "eval", "--qa", "q", "--model", "m+markers"], ["markers", "eval", "--qa", "q", "--tuned-model", "m+markers"],
     "model"),
    (["index", "attach", "--faiss", "f", "--corpus", "c", "--encoder", "e", "--out", "o"],
     ["index", "attach", "--faiss", "f", "--faiss-corpus", "c", "--encoder", "e", "--out", "o"], "faiss_corpus"),
])
def test_the_renamed_flags_keep_their_old_spelling_for_a_release_with_a_warning(old, new, dest, capsys):
    parser = build_parser()
    assert getattr(parser.parse_args(old), dest) == getattr(parser.parse_args(new), dest)
    err = capsys.readouterr().err
    assert err.count("is deprecated") == sum(f in ("--model", "--corpus") for f in old)  # once per use
    assert f"use {new[old.index(next(f for f in old if f in ('--model', '--corpus')))]}" in err


def test_ladder_index_is_the_tables_index():
    action = next(a for name, p in COMMANDS if name == "rigkit ladder" for a in p._actions if "--index" in a.option_strings)
    assert action.config_key == "retrieval.index"
