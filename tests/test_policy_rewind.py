"""Policy `rewind`: a flagged segment is kept up to its first flagged word and the model writes on
from there with the passages, so only the doubtful word onward is written again.

The scripted generator's segments carry token probabilities, so the real `prob` decider flags the
word; the prompts it records show what the model read for the continuation.
"""

from __future__ import annotations

import html
import re

import pytest

from rigkit.build import build_run
from rigkit.config import RunConfig
from rigkit.errors import InputError
from rigkit.streaming import StreamEvent, TokenStream
from rigkit.testing import DictRetriever, ScriptedGenerator, make_segment
from rigkit.trace import Action, Hit, Kept, RIGResult, answer_end, kept_segments
from rigkit.widgets import render

PASSAGE = Hit(chunk_id="jaws#0", doc_id="jaws", title="Jaws (film)",
              text="Jaws is a 1975 film directed by Steven Spielberg.", score=1.0)
FLAGGED = make_segment("Jaws was directed by John Smith.", [0.9, 0.9, 0.9, 0.9, 0.1, 0.9])  # "John" at p=.1


def run_with(segments, policy="rewind", layout="prefix", hits=(PASSAGE,), **controller):
    gen = ScriptedGenerator(segments)
    config = RunConfig().override(decider={"name": "prob"}, context={"layout": layout},
                                  controller={"policy": policy, "max_rounds": 1, **controller})
    run = build_run(config, gen, DictRetriever({}, default=list(hits)))
    return gen, run.controller


def test_keeps_the_words_before_the_flag_and_writes_on_from_them():
    gen, controller = run_with([FLAGGED, " Steven Spielberg."])
    result = controller.run("Who directed Jaws?")
    first, second = result.rounds
    assert first.action is Action.REWIND and first.kept is Kept.PREFIX
    assert first.kept_chars == len("Jaws was directed by")
    assert result.answer.startswith("Jaws was directed by Steven Spielberg.")
    assert "John" not in result.answer and "jaws#0" in result.answer  # the sentence cites what it was written from
    assert [s.text for s in kept_segments(result.rounds)] == ["Jaws was directed by", " Steven Spielberg."]
    # the continuation read the passage before the question and the kept words, not the flagged one
    read = "".join(p.text for p in gen.prompts[-1])
    assert read.index("Steven Spielberg") < read.index("Who directed Jaws?") < read.index("Jaws was directed by")
    assert "John" not in read
    # written and not kept: the flagged word and what followed it in its segment, no more
    kept = sum(len(s.token_ids) for s in kept_segments(result.rounds))
    assert kept == 4 + 3 and result.tokens["generated"] - kept == len([" John", " Smith."])
    loaded = RIGResult.from_json(result.to_json())
    assert loaded.rounds[0].kept_chars == first.kept_chars and kept_segments(loaded.rounds)[0].text == "Jaws was directed by"


def test_the_draft_view_and_the_stream_show_the_kept_words_once():
    events: list[StreamEvent] = []
    _, controller = run_with([FLAGGED, " Steven Spielberg."])
    controller.callbacks.append(TokenStream(events.append))
    result = controller.run("Who directed Jaws?")
    shown_text = html.unescape(re.sub(r"<[^>]+>", "", render.draft_html(result.rounds, 1)))
    assert "John" not in shown_text and "Jaws was directed by Steven Spielberg." in shown_text
    shown = ""
    for event in events:
        if event.kind == "token":
            shown += event.text
        elif event.kind == "retract":
            shown = shown[: len(shown) - len(event.text)]
    assert shown.count("Jaws was directed by") == 1 and "John" not in shown
    assert shown.startswith("Jaws was directed by Steven Spielberg.")


def test_a_flag_on_the_first_word_keeps_nothing_and_writes_the_segment_again():
    first_word = make_segment("Smith directed Jaws.", [0.1, 0.9, 0.9])
    _, controller = run_with([first_word, "Spielberg directed Jaws."])
    result = controller.run("Who directed Jaws?")
    assert result.rounds[0].action is Action.REWIND and result.rounds[0].kept is Kept.NOTHING
    assert result.answer.startswith("Spielberg directed Jaws.")
    assert [s.text for s in kept_segments(result.rounds)] == ["Spielberg directed Jaws."]


def test_nothing_new_to_read_keeps_the_segment_whole():
    _, controller = run_with([FLAGGED, " It came out in 1975."], hits=())
    result = controller.run("Who directed Jaws?")
    assert result.rounds[0].action is Action.CONTINUE and result.rounds[0].kept is Kept.SEGMENT
    assert result.answer.startswith("Jaws was directed by John Smith.")


def test_an_empty_continuation_is_asked_to_go_on_then_the_answer_ends_on_a_whole_sentence():
    opening = make_segment("Jaws is a film.", [0.9, 0.9, 0.9, 0.9])
    flagged = make_segment(" It was directed by John Smith.", [0.9, 0.9, 0.9, 0.9, 0.9, 0.1, 0.9])
    empty = make_segment("", finish_reason="end_of_turn")
    _, controller = run_with([opening, flagged, empty, make_segment("", finish_reason="end_of_turn")])
    result = controller.run("Who directed Jaws?")
    actions = [r.action for r in result.rounds]
    assert actions[1] is Action.REWIND and Action.GO_ON in actions and Action.RESTORE not in actions
    assert "John" not in result.answer and result.answer.startswith("Jaws is a film.")
    assert result.trimmed.strip() == "It was directed by"  # the half sentence is not left in the answer
    assert answer_end(result.rounds) == (result.rounds[1].segment, False)  # a rewind's kept start is no repeat cut


def test_rewind_needs_the_prefix_layout():
    with pytest.raises(InputError, match="context.layout=prefix"):
        run_with([FLAGGED], layout="append")


def test_a_saved_run_paused_at_its_search_goes_on_as_the_unsaved_one():
    _, unsaved = run_with([FLAGGED, " Steven Spielberg."])
    expected = unsaved.run("Who directed Jaws?")
    _, controller = run_with([FLAGGED, " Steven Spielberg."])
    run = controller.start("Who directed Jaws?")
    assert run.step().queries  # paused at the search
    saved = run.state().to_json()
    _, again = run_with([" Steven Spielberg."])
    resumed = again.restore(saved)
    resumed.search(again.retriever)
    while resumed.step() is not None:
        pass
    assert resumed.result.answer == expected.answer


@pytest.mark.slow
def test_rewind_with_the_default_model_writes_less_and_keeps_its_prefix(default_generator, demo_retriever):
    """The real model and index: each rewound round keeps the words before its flagged one, the
    continuation follows them in the answer, and the loop writes fewer tokens it then drops."""
    question = "What must I keep when I redistribute Apache-2.0 code?"
    results = {}
    for policy in ("regenerate", "rewind"):
        config = RunConfig().override(decider={"name": "prob", "threshold": 0.3}, context={"layout": "prefix"},
                                      controller={"policy": policy, "pause_at_flag": True},
                                      generator={"max_answer_tokens": 64})
        results[policy] = build_run(config, default_generator, demo_retriever).controller.run(question)
    rewound = [r for r in results["rewind"].rounds if r.action is Action.REWIND]
    assert rewound, "the prob decider at 0.3 flags a word of this answer"
    for r in rewound:
        if r.kept is Kept.PREFIX:
            kept = r.segment.text[: r.kept_chars]
            assert kept.strip() and kept in results["rewind"].rounds[r.index].draft + r.segment.text
    dropped = {p: res.tokens["generated"] - sum(len(s.token_ids) for s in kept_segments(res.rounds))
               for p, res in results.items()}
    assert dropped["rewind"] < dropped["regenerate"] or not any(
        r.action is Action.REGENERATE for r in results["regenerate"].rounds)
