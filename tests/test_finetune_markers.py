"""Marker fine-tuning: the training transcripts, the label mask, a tiny LoRA run, adapter specs."""

from __future__ import annotations

import copy
import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from rigkit.config import RunConfig
from rigkit.context import ContextManager
from rigkit.datasets import load_qa, load_splits, split_questions
from rigkit.errors import InputError, ModelNotFoundError
from rigkit.finetune.adapters import ADAPTERS_DIR, adapter_spec, load_with_adapter
from rigkit.finetune.data import (
    build_examples,
    build_marker_data,
    encode_example,
    end_of_turn,
    question_steps,
    read_examples,
    render_example,
    write_examples,
)
from rigkit.finetune.train import LoraTrainConfig, train_markers
from rigkit.testing import DictRetriever, ScriptedGenerator, make_segment
from rigkit.trace import Hit
from tests.tiny_model import tiny_generator

DATA = Path(__file__).resolve().parents[1] / "data"
SETS = ("musique", "2wikimultihopqa")


@pytest.fixture(scope="module")
def tiny():
    return tiny_generator()


@pytest.fixture(scope="module")
def built(tiny):
    """build_marker_data per (set, split), built once for the module."""
    cache: dict = {}

    def get(name: str, split: str):
        if (name, split) not in cache:
            cache[name, split] = build_marker_data(DATA / name / "qa.jsonl", split, tiny, max_tokens=4096)
        return cache[name, split]

    return get


def _record(name: str, index: int = 0) -> dict:
    qa = DATA / name / "qa.jsonl"
    train = set(load_splits(qa.parent)["train"])
    return [r for r in load_qa(qa) if r["id"] in train][index]


def _scripted_example(record: dict, kind: str = "retrieve"):
    scripted = ScriptedGenerator([])
    config = RunConfig().override(context={"max_passage_tokens": 80})
    context = ContextManager(config.context, scripted.count_tokens, scripted.render_chat, use_markers=True)
    return render_example(record, question_steps(record), context, kind), config


@pytest.mark.parametrize("name", SETS)
def test_transcript_is_what_the_controller_builds(name):
    """Replaying the example's assistant turns through the real controller (marker decider,
    marker query mode, the gold passage as the only hit) gives the same prompt, piece by piece."""
    from rigkit.build import build_controller

    record = _record(name)
    example, config = _scripted_example(record)
    assert example.markers >= 1
    drafts = [p["text"] for p in example.pieces if p["role"] == "draft"]
    steps = [s for s in question_steps(record) if not s.stated]
    retriever = DictRetriever({s.query: [s.passage] for s in steps})
    segments = [make_segment(text) for text in drafts]
    segments[-1].finish_reason = "end_of_turn"
    generator = ScriptedGenerator(segments)
    config = config.override(
        decider={"name": "marker"}, query={"mode": "marker", "min_marker_words": 1},
        retrieval={"top_k": 1}, controller={"max_rounds": 8},
    )
    controller = build_controller(config, generator=generator, retriever=retriever)
    result = controller.run(example.question)
    assert retriever.queries == [s.query for s in steps]
    replayed = [(p.text, p.role) for p in generator.prompts[-1]] + [(drafts[-1], "draft")]
    assert replayed == [(p["text"], p["role"]) for p in example.pieces]
    assert record["answer"] in result.answer


def test_markers_hold_the_decomposition_queries_with_placeholders_filled():
    record = next(r for r in load_qa(DATA / "musique" / "qa.jsonl")
                  if any("#1" in s["question"] for s in r["question_decomposition"]))
    steps = question_steps(record)
    first = record["question_decomposition"][0]["answer"]
    assert first in steps[1].query and "#1" not in steps[1].query
    example, _ = _scripted_example(record)
    text = example.text
    for step in steps:
        if not step.stated:
            assert f"<retrieve>{step.query}</retrieve>" in text
    assert text.rstrip().endswith(f"So the answer is {record['answer'].rstrip('.')}.")


def test_a_fact_the_question_states_gets_no_marker():
    record = {
        "id": "x", "question": "Where was the father of Ada Lovelace, Lord Byron, born?", "answer": "London",
        "question_decomposition": [
            {"question": "Ada Lovelace >> father", "answer": "Lord Byron", "paragraph_support_idx": 0},
            {"question": "#1 >> place of birth", "answer": "London", "paragraph_support_idx": 1},
        ],
        "paragraphs": [{"pid": "p0", "title": "Ada Lovelace", "text": "Ada was Byron's daughter."},
                       {"pid": "p1", "title": "Lord Byron", "text": "Byron was born in London."}],
    }
    steps = question_steps(record)
    assert [s.stated for s in steps] == [True, False]
    example, _ = _scripted_example(record)
    assert example.markers == 1
    assert "<retrieve>father of Ada Lovelace</retrieve>" not in example.text
    assert "<retrieve>where was Lord Byron born</retrieve>" in example.text


def test_negatives_are_present_and_closed_ones_have_no_marker(built):
    examples, _ = built("musique", "train")
    kinds = {e.kind for e in examples}
    assert kinds == {"retrieve", "stated", "closed", "single"}
    for example in examples:
        drafts = "".join(p["text"] for p in example.pieces if p["role"] == "draft")
        if example.kind == "closed":
            assert example.markers == 0 and "<retrieve>" not in drafts
            assert not any(p["role"] == "passages" for p in example.pieces)
        if example.kind == "stated":
            assert example.markers < example.hops
        assert drafts.count("<retrieve>") == example.markers


@pytest.mark.parametrize("name", SETS)
def test_single_hop_copies_ask_for_one_hop_each(name):
    from rigkit.finetune.data import single_hop_examples, step_question

    record = _record(name)
    scripted = ScriptedGenerator([])
    context = ContextManager(RunConfig().context, scripted.count_tokens, scripted.render_chat, use_markers=True)
    steps = question_steps(record)
    singles = single_hop_examples(record, steps, context)
    asked = [s for s in steps if s.passage is not None and not s.stated]
    assert len(singles) == len(asked) >= 1
    for example, step in zip(singles, asked):
        assert example.kind == "single" and example.markers == 1 and example.source_id == record["id"]
        assert example.question == step_question(step) and example.question.endswith("?")
        drafts = [p["text"] for p in example.pieces if p["role"] == "draft"]
        assert drafts[0] == f"<retrieve>{step.query}</retrieve>"
        assert drafts[-1] == f"{step.statement} So the answer is {step.answer.rstrip('.')}."
        assert [p["text"] for p in example.pieces if p["role"] == "passages"][0].count(step.passage.chunk_id) == 1
    assert step_question(replace(asked[0], query="father of Henry Baring")) == "Who is the father of Henry Baring?"
    assert step_question(replace(asked[0], query="when was Ada born")) == "When was Ada born?"


def test_single_hop_copies_are_optional_and_not_repeated(tiny):
    records = split_questions(load_qa(DATA / "musique" / "qa.jsonl"), DATA / "musique", "train")[:20]
    plain, _ = build_examples(records, tiny, max_tokens=4096, single_hop=False)
    more, _ = build_examples(records, tiny, max_tokens=4096)
    assert "single" not in {e.kind for e in plain}
    singles = [e for e in more if e.kind == "single"]
    assert singles and [e for e in more if e.kind != "single"] == plain
    assert len({e.question for e in singles}) == len(singles)


@pytest.mark.parametrize("name", SETS)
def test_only_train_and_dev_questions_are_used(tiny, built, name):
    qa = DATA / name / "qa.jsonl"
    splits = load_splits(qa.parent)
    for split in ("train", "dev"):
        examples, stats = built(name, split)
        assert examples and stats["questions"] == len(splits[split])
        used = {e.source_id for e in examples}
        assert used <= set(splits[split])
        assert not used & set(splits["test"])
        assert {e.split for e in examples} == {split}
    with pytest.raises(InputError, match="test split"):
        build_marker_data(qa, "test", tiny)


def test_label_mask_covers_only_the_assistant_text(tiny):
    example, _ = _scripted_example(_record("musique"))
    end = end_of_turn(tiny)
    assert end == "<|im_end|>"
    ids, labels = encode_example(tiny.tokenizer, example, end)
    assert len(ids) == len(labels)
    learned = [i for i, label in zip(ids, labels) if label != -100]
    assert all(label in (-100, i) for i, label in zip(ids, labels))
    expected = []
    for piece in example.pieces:
        if piece["role"] == "draft":
            expected += tiny.tokenizer(piece["text"], add_special_tokens=False).input_ids
    assert learned == expected + tiny.tokenizer(end, add_special_tokens=False).input_ids
    # the question and the passages are never learned
    masked = sum(label == -100 for label in labels)
    prompt_tokens = sum(len(tiny.tokenizer(p["text"], add_special_tokens=False).input_ids)
                        for p in example.pieces if p["role"] != "draft")
    assert masked == prompt_tokens > 0


def test_examples_round_trip_and_bad_lines_fail_in_one_line(tmp_path):
    example, _ = _scripted_example(_record("2wikimultihopqa"))
    path = tmp_path / "d.jsonl"
    digest = write_examples(path, [example])
    assert len(digest) == 16 and read_examples(path)[0] == example
    path.write_text("{not json\n")
    with pytest.raises(InputError, match="line 1"):
        read_examples(path)
    with pytest.raises(InputError, match="not found"):
        read_examples(tmp_path / "missing.jsonl")


@pytest.fixture()
def tiny_data(built, tmp_path):
    examples, _ = built("musique", "train")
    dev, _ = built("musique", "dev")
    write_examples(tmp_path / "train.jsonl", examples[:8])
    write_examples(tmp_path / "dev.jsonl", dev[:3])
    return tmp_path / "train.jsonl", tmp_path / "dev.jsonl"


def test_tiny_lora_run_resumes_from_its_checkpoint(tiny, tiny_data, tmp_path):
    train, dev = tiny_data
    config = LoraTrainConfig(max_steps=2, grad_accum=2, save_every=1, eval_every=1, dropout=0.0)
    first = train_markers(train, tmp_path / "a", tiny, config, eval_path=dev, progress=False, base_model="tiny")
    assert first.steps == 2 and first.resumed_from_step == 0 and len(first.train_loss) == 2
    assert (tmp_path / "a" / "checkpoint" / "state.json").exists()
    more = LoraTrainConfig(max_steps=4, grad_accum=2, save_every=1, eval_every=1, dropout=0.0)
    resumed = train_markers(train, tmp_path / "a", tiny, more, eval_path=dev, progress=False, base_model="tiny")
    assert resumed.resumed_from_step == 2 and resumed.steps == 4
    assert resumed.train_loss[:2] == first.train_loss and len(resumed.dev_loss) == 4
    assert resumed.dev_loss[-1][0] == 4 and resumed.best_step in (1, 2, 3, 4)
    # the same four steps in one go give the same losses: resuming loses nothing
    straight = train_markers(train, tmp_path / "b", tiny, more, eval_path=dev, progress=False, base_model="tiny")
    assert [round(x[1], 3) for x in straight.train_loss] == [round(x[1], 3) for x in resumed.train_loss]
    report = json.loads((tmp_path / "a" / "training.json").read_text())
    assert report["data_hash"] == first.data_hash and report["steps"] == 4
    adapter_config = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
    assert adapter_config["base_model_name_or_path"] == "tiny"
    assert not any("lora" in name for name, _ in tiny.model.named_parameters())


def test_keep_last_and_no_early_stopping(tiny, tiny_data, tmp_path):
    from safetensors.torch import load_file

    train, dev = tiny_data
    # a learning rate this high makes the dev loss rise after step 1: patience 1 would stop at
    # step 2 and keep="best" would keep step 1
    config = LoraTrainConfig(max_steps=3, grad_accum=1, save_every=1, eval_every=1, dropout=0.0,
                             learning_rate=0.5, patience=0, keep="last")
    report = train_markers(train, tmp_path / "k", tiny, config, eval_path=dev, progress=False)
    losses = [loss for _, loss in report.dev_loss]
    assert len(losses) == 3 and losses[1] > losses[0] and min(losses) < losses[-1]
    assert report.steps == 3 and report.stopped_because == "planned steps done"
    assert report.best_step == 3
    kept = load_file(tmp_path / "k" / "adapter_model.safetensors")
    last = load_file(tmp_path / "k" / "checkpoint" / "adapter" / "adapter_model.safetensors")
    assert all(kept[k].float().allclose(last[k].float(), atol=1e-2) for k in kept)
    with pytest.raises(InputError, match="keep must be"):
        train_markers(train, tmp_path / "x", tiny, LoraTrainConfig(keep="first"), progress=False)


def test_time_budget_stops_with_a_checkpoint(tiny, tiny_data, tmp_path):
    train, _ = tiny_data
    config = LoraTrainConfig(max_steps=50, grad_accum=1, time_budget_min=1e-9)
    report = train_markers(train, tmp_path / "t", tiny, config, progress=False)
    assert report.steps == 0 and report.stopped_because.startswith("time budget")
    assert (tmp_path / "t" / "checkpoint" / "state.json").exists()


def test_trained_adapter_loads_and_changes_the_model(tiny, tiny_data, tmp_path):
    import torch

    train, _ = tiny_data
    config = LoraTrainConfig(max_steps=3, grad_accum=1, learning_rate=5e-2, dropout=0.0)
    train_markers(train, tmp_path / "ad", tiny, config, progress=False, base_model="tiny")
    base, path = adapter_spec(str(tmp_path / "ad"))
    assert base == "tiny" and path == tmp_path / "ad"
    assert adapter_spec(f"tiny+{tmp_path / 'ad'}") == ("tiny", tmp_path / "ad")
    merged, _, source = load_with_adapter(
        base, path, lambda _: (copy.deepcopy(tiny.model), tiny.tokenizer, "test"))
    assert source == "test + LoRA ad"
    assert not any("lora" in name for name, _ in merged.named_parameters())  # merged: a plain model
    ids = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        assert not torch.allclose(merged(ids).logits, tiny.model(ids).logits)


def test_adapter_specs():
    assert adapter_spec("smollm2-135m-instruct") is None
    shipped = ADAPTERS_DIR / "smollm2-135m-instruct-markers"
    if (shipped / "adapter_config.json").exists():
        assert adapter_spec("smollm2-135m-instruct+markers") == ("smollm2-135m-instruct", shipped)
    with pytest.raises(ModelNotFoundError, match="adapter 'nope'"):
        adapter_spec("smollm2-135m-instruct+nope")


def test_cli_builds_data(tmp_path, monkeypatch):
    from rigkit.cli import main

    monkeypatch.setattr("rigkit.generation.generator_from_config", lambda *a, **k: tiny_generator())
    out = tmp_path / "d.jsonl"
    assert main(["markers", "build-data", "--qa", str(DATA / "2wikimultihopqa" / "qa.jsonl"),
                 "--split", "dev", "--out", str(out), "--max-tokens", "4096"]) == 0
    assert {e.split for e in read_examples(out)} == {"dev"}
    with pytest.raises(SystemExit):  # the test split is not a choice
        main(["markers", "build-data", "--qa", str(DATA / "musique" / "qa.jsonl"),
              "--split", "test", "--out", str(tmp_path / "t.jsonl")])
    assert not (tmp_path / "t.jsonl").exists()


def _run_shipped(question: str, retriever=None):
    from rigkit.build import build_controller
    from rigkit.config import load_config
    from rigkit.generation.loading import load_generator

    config = load_config(Path(__file__).resolve().parents[1] / "configs" / "cpu.yaml").override(
        decider={"name": "marker"}, query={"mode": "marker"},
        generator={"model": "smollm2-135m-instruct+markers"}, controller={"max_rounds": 1},
    )
    generator = load_generator("smollm2-135m-instruct+markers")
    assert "LoRA smollm2-135m-instruct-markers" in generator.source
    retriever = retriever or DictRetriever({}, default=[])
    result = build_controller(config, generator=generator, retriever=retriever).run(question)
    return [r for r in result.rounds if r.decision.retrieve and r.decision.decider == "marker"], result


@pytest.mark.slow
def test_shipped_adapter_writes_a_marker_on_a_held_out_multi_hop_question():
    record = split_questions(load_qa(DATA / "musique" / "qa.jsonl"), DATA / "musique", "test")[1]
    fired, result = _run_shipped(record["question"])
    assert fired, [r.segment.text for r in result.rounds]
    assert fired[0].query is not None and fired[0].query.mode == "marker"


@pytest.mark.slow
def test_shipped_adapter_asks_on_the_demo_question():
    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    demo = re.search(r'^demo:.*?"([^"]+)"', makefile, re.S | re.M).group(1)  # the question `make demo` asks
    assert demo.startswith("Can I use code under the Apache-2.0")
    fired, result = _run_shipped(demo)
    assert fired, [r.segment.text for r in result.rounds]
    assert fired[0].query is not None and fired[0].query.mode == "marker"
    assert "apache" in fired[0].query.text.lower()  # it asks about what the question is about


def test_marker_eval_scores_every_system_with_both_models(monkeypatch, tmp_path):
    import rigkit.generation as generation
    import rigkit.retrieval as retrieval
    from rigkit.finetune.evaluate import evaluate_markers, load_rows

    record = split_questions(load_qa(DATA / "musique" / "qa.jsonl"), DATA / "musique", "train")[0]
    support = next(p for p in record["paragraphs"] if p.get("is_supporting"))
    hit = Hit(f"{support['pid']}#0", support["pid"], support["title"], support["text"], 1.0)
    monkeypatch.setattr(retrieval, "open_retriever", lambda config: DictRetriever({}, default=[hit]))

    class Tuned(ScriptedGenerator):
        """Asks once with a marker; with passages in context, answers and ends the turn."""

        def next_segment(self, prompt, stop, max_new_tokens, on_token=None):
            self.prompts.append(list(prompt))
            if any(p.role == "passages" for p in prompt):
                return make_segment(f"So the answer is {record['answer']}.", finish_reason="end_of_turn")
            return make_segment("<retrieve>who founded it</retrieve>")

    def scripted(config):  # the base model hesitates on "Paris" (probability 0.1)
        if config.model.endswith("+markers"):
            return Tuned([])
        return ScriptedGenerator([make_segment("Paris, surely.", [0.1, 0.9])] * 12)

    monkeypatch.setattr(generation, "generator_from_config", scripted)
    report = evaluate_markers([DATA / "musique" / "qa.jsonl"], split="train", limit=1, end_effect=True,
                              rows_path=tmp_path / "rows.jsonl", progress=False)
    row = report.rows[0]
    assert row.markers == 1 and row.marker_queries == ["who founded it"] and row.marker_query_hits == [True]
    assert set(row.systems) == {f"{s} ({m})" for s in ("rig:prob", "rag", "closed_book") for m in ("base", "tuned")
                                } | {"rig:marker (tuned)"}
    assert row.systems["rig:marker (tuned)"]["cover_em"] == 1.0
    assert row.systems["rig:prob (base)"]["retrievals"] == len(row.flare_queries) >= 1
    assert load_rows(tmp_path / "rows.jsonl")[0].systems == row.systems
    assert "rig:prob (tuned)" in report.table()


def test_marker_eval_table_from_saved_rows(tmp_path, capsys):
    from rigkit.cli import main
    from rigkit.finetune.evaluate import MarkerEvalRow

    for name, markers in (("musique", 2), ("2wikimultihopqa", 0)):
        row = MarkerEvalRow(dataset=name, id="q", hops=2, markers=markers, question_hit=True,
                            systems={"rag (base)": {"cover_em": 1.0, "f1": 0.5, "retrievals": 1.0, "seconds": 2.0}})
        (tmp_path / f"{name}.jsonl").write_text(json.dumps(row.__dict__) + "\n")
    assert main(["markers", "eval", "--rows", str(tmp_path / "musique.jsonl"),
                 str(tmp_path / "2wikimultihopqa.jsonl")]) == 0
    table = capsys.readouterr().out
    assert "| answers with >= 1 well-formed marker | 100% | 0% | 50% |" in table
    assert "| rag (base) | 1.00 / 0.50 | 1.00 / 0.50 | 1.00 / 0.50 | 1.00 | 2.0 |" in table
    assert main(["markers", "eval"]) == 2  # neither --qa nor --rows
