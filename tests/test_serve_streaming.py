"""Token streaming in the core: the generator's `on_token`, `TokenStream`, `rigkit ask`, the stepper.

Uses a tiny random-weight model for the transformers streamer (built from a config, no download)
and `rigkit.testing.ScriptedGenerator` for the logic around it.
"""

from __future__ import annotations

import io

import pytest

from rigkit.config import ContextConfig, ControllerConfig
from rigkit.context import ContextManager
from rigkit.controller import RIGController
from rigkit.queries import build_query_builder
from rigkit.streaming import StreamEvent, TokenStream
from rigkit.testing import DictRetriever, NeverDecider, ScriptedGenerator
from rigkit.transcript import Piece, StopRule


def controller(generator, decider=None, callbacks=()):
    from rigkit.config import QueryConfig

    context = ContextManager(ContextConfig(), generator.count_tokens, generator.render_chat, context_limit=4096)
    return RIGController(generator, DictRetriever({}), decider or NeverDecider(),
                         build_query_builder(QueryConfig(), generator), context,
                         config=ControllerConfig(), callbacks=callbacks)


def test_hf_generator_streams_the_tokens_it_returns():
    from tests.tiny_model import tiny_generator

    generator = tiny_generator()
    streamed: list[str] = []
    prompt = [Piece("Hello there, how are you today?")]
    segment = generator.next_segment(prompt, StopRule(sentence=False), 8, on_token=streamed.append)
    generator.reset()
    plain = generator.next_segment(prompt, StopRule(sentence=False), 8)
    assert segment.token_ids == plain.token_ids  # streaming changes nothing about the segment
    assert "".join(streamed).startswith(segment.text) and streamed


def test_generators_that_do_not_stream_still_work():
    class OldGenerator(ScriptedGenerator):
        def next_segment(self, prompt, stop, max_new_tokens, on_token=None):  # ignores on_token
            return super().next_segment(prompt, stop, max_new_tokens)

    events: list[StreamEvent] = []
    c = controller(OldGenerator(["One.", " Two."]), callbacks=[TokenStream(events.append)])
    assert c.run("Q?").answer == "One. Two."
    assert "".join(e.text for e in events) == "One. Two."  # sent at each round's end instead


@pytest.mark.parametrize(
    ("tokens", "shown"),
    [
        # the stop rule fires one token late (it needs the space after the full stop): not shown
        (["Paris", " is", " big.", " The"], "Paris is big."),
        # a marker, even half written, is never shown
        (["Paris", " is", " <retr", "ieve>size of", " Paris</retrieve>"], "Paris is"),
    ],
)
def test_live_stream_shows_only_answer_text(tokens, shown):
    events: list[StreamEvent] = []
    stream = TokenStream(events.append)
    stream.on_round_start(0, None)
    for token in tokens:
        stream.on_token(token)
    assert all(e.kind == "token" for e in events)  # nothing had to be taken back
    assert "".join(e.text for e in events) == shown


def test_rigkit_ask_prints_tokens_as_they_come():
    from rigkit.cli.ask import _TokenPrinter

    out = io.StringIO()
    printer = _TokenPrinter(out)
    c = controller(ScriptedGenerator(["One sentence.", " Two sentences."]),
                   callbacks=[printer.stream("retrieve")])
    lines = []
    for _ in c.stream("Q?"):
        printer.end_line()
        lines.append(out.getvalue())
    assert lines[0] == "writing   One sentence.\n"
    assert lines[1].endswith("writing    Two sentences.\n")


def test_round_stepper_shows_the_segment_being_written():
    pytest.importorskip("ipywidgets")
    from rigkit.widgets import RoundStepper

    seen: list[str] = []

    class Spy:
        def on_token(self, text):
            seen.append(stepper.writing_pane.value)

    c = controller(ScriptedGenerator(["Alpha beta gamma.", " Delta."]))
    stepper = RoundStepper.live(c, "Q?", start=False)
    c.callbacks.append(Spy())
    stepper.next()
    assert any("Alpha beta" in value and "writing" in value for value in seen)
    assert stepper.writing_pane.value == ""  # cleared once the round is shown


def ended(index: int, text: str, draft: str, **fields):
    """A round's record as the stream reads it at the round's end."""
    from rigkit.testing import make_segment
    from rigkit.trace import Decision, RoundTrace

    return RoundTrace(index, make_segment(text), Decision(False, 0.0, ""), draft=draft, **fields)


def test_a_turn_that_starts_after_passages_is_joined_like_the_draft():
    events: list[StreamEvent] = []
    stream = TokenStream(events.append)
    stream.on_round_start(0, None)
    stream.on_token("First.")
    stream.on_round_end(ended(0, "First.", "First."))
    stream.on_round_start(1, None)
    for token in ["Second", " one."]:  # a new assistant turn after the passages: no leading space
        stream.on_token(token)
    stream.on_round_end(ended(1, "Second one.", "First. Second one."))
    assert all(e.kind == "token" for e in events)
    assert "".join(e.text for e in events) == "First. Second one."


# -- the OpenAI-compatible stream with `stop`, read by the official SDK ------------------------
FULL_ANSWER = "Paris is the capital of France. The Eiffel Tower is 330 metres tall."


@pytest.fixture
def sdk():
    """(official openai SDK client, service) over the scripted app, in-process."""
    pytest.importorskip("fastapi")
    from rigkit.serve.app import create_app
    from tests.test_serve_protocol import (
        LoopingScript,
        local_client,
        make_service,
        script,
        sdk_client,
    )

    segments = script()
    for segment in segments:
        segment.tokens_prefilled = 40  # as a model reports the prompt it read
    service = make_service(generator=LoopingScript(segments))
    with local_client(create_app(service, mcp=False)) as client:
        yield sdk_client(client), service


def _plain_and_streamed(sdk, stop, **stream_options):
    client, service = sdk
    ask = {"model": service.model_name, "messages": [{"role": "user", "content": "How tall is the Eiffel Tower?"}],
           "stop": stop}
    plain = client.chat.completions.create(**ask)
    return plain, list(client.chat.completions.create(**ask, stream=True, **stream_options))


@pytest.mark.parametrize(
    ("stop", "shown"),
    [
        (["capital of"], "Paris is the "),  # the stop string spans two streamed pieces
        (["s the cap"], "Paris i"),  # ... and starts inside one
        (["capital city"], FULL_ANSWER),  # "capital" looked like its start: held, then sent
        (["tall. The end"], FULL_ANSWER),  # the answer ends on a stop string's start: sent at the end
    ],
)
def test_a_streamed_stop_string_never_leaks_and_the_stream_matches_the_answer(sdk, stop, shown):
    plain, chunks = _plain_and_streamed(sdk, stop)
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert "".join(pieces) == shown
    content = plain.choices[0].message.content  # the same text, with citation tags when whole
    assert content == shown if shown != FULL_ANSWER else content.startswith(FULL_ANSWER)
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]


@pytest.mark.parametrize("stop", [None, ["capital of"]])
def test_streamed_usage_is_the_non_streamed_usage(sdk, stop):
    plain, chunks = _plain_and_streamed(sdk, stop, stream_options={"include_usage": True})
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and all(c.usage is None for c in chunks[:-1])
    assert usage.model_dump() == plain.usage.model_dump()
    assert usage.prompt_tokens > 0 and usage.completion_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_the_stop_hold_back_is_the_longest_end_that_starts_a_stop_string():
    from rigkit.serve.openai_compat import stop_prefix_length

    assert stop_prefix_length("Paris is the capital", ["capital of"]) == len("capital")
    assert stop_prefix_length("Paris is the capital", ["capital of", "the capital city"]) == len("the capital")
    assert stop_prefix_length("Paris is the", ["capital"]) == 0
    assert stop_prefix_length("xa", ["b", "abc"]) == 1  # a one-character stop string is never held
    assert stop_prefix_length("", ["x"]) == 0


# -- each sentence is streamed once -------------------------------------------------------------
def shown(events: list[StreamEvent]) -> tuple[str, str]:
    """(every text a reader was ever shown, one after another; the text left on screen)."""
    ever, screen = "", ""
    for event in events:
        if event.kind == "token":
            ever, screen = ever + event.text, screen + event.text
        elif event.kind == "retract":
            assert screen.endswith(event.text)
            screen = screen[: -len(event.text)]
    return ever, screen


def flagging_run(segments, **controller):
    """The answer-check controller (a NOTICE-flagging decider, NOTICE and licence passages) with a
    live `TokenStream`; returns (result, the stream's events)."""
    from tests.test_answer_checks import FlagWord, make

    events: list[StreamEvent] = []
    c = make(ScriptedGenerator(segments), FlagWord("NOTICE"), **controller)
    c.callbacks.append(TokenStream(events.append))
    return c.run("What must I ship with Apache-2.0 code?"), events


def test_a_dropped_rewrite_is_never_shown_and_no_sentence_is_streamed_twice():
    from rigkit.text import split_sentences, strip_citations
    from tests.test_answer_checks import DEMO

    result, events = flagging_run(DEMO)
    assert [r.action for r in result.rounds] == ["accept", "accept", "regenerate", "fallback", "accept"]
    ever, screen = shown(events)
    sentences = [s.strip() for s in split_sentences(ever)]
    assert len(sentences) == len(set(sentences)) == 4  # the NOTICE sentence once, the repeat never
    assert "retract" not in [e.kind for e in events]  # the set-aside sentence stayed on screen
    # one short marker says what happened instead of writing the sentence again
    assert [e.text for e in events if e.kind == "note"] == ["kept the earlier sentence: the rewrite repeats accepted text"]
    assert screen == strip_citations(result.answer).replace("  ", " ").strip()


def test_a_kept_rewrite_takes_the_set_aside_sentence_back_once_it_is_judged():
    old, rewrite = "You must include a NOTICE text file.", "Every redistribution of Apache-2.0 works must include the file."
    result, events = flagging_run([old, rewrite, " Done."])
    assert [r.action for r in result.rounds][:2] == ["regenerate", "accept"]
    kinds = [e.kind for e in events]
    retract = kinds.index("retract")
    # the old sentence stays shown while the rewrite is written; the rewrite appears whole, after it is kept
    assert "".join(e.text for e in events[:retract]) == old and events[retract].text == old
    assert events[retract + 1] == StreamEvent("token", rewrite) and "note" not in kinds
    ever, screen = shown(events)
    assert ever.count(old) == ever.count(rewrite) == 1 and screen == f"{rewrite} Done."


def test_a_dropped_grounded_rewrite_is_held_and_noted():
    from types import SimpleNamespace

    from rigkit.testing import make_segment
    from rigkit.trace import Action

    events: list[StreamEvent] = []
    stream = TokenStream(events.append)
    stream.on_round_start(0, SimpleNamespace(rewrite_of=None))
    stream.on_token("Mars has two moons.")
    stream.on_round_end(ended(0, "Mars has two moons.", "Mars has two moons."))
    # written again under the strict grounding prompt
    stream.on_round_start(1, SimpleNamespace(rewrite_of=make_segment("Mars has two moons.")))
    stream.on_token(" Mars has two moons, Phobos and Deimos.")
    assert [e.kind for e in events] == ["token"]  # held while it is judged
    why = "the grounded rewrite is not supported either: 'Mars has two moons, Phobos and Deimos.'"
    stream.on_round_end(ended(1, "Mars has two moons, Phobos and Deimos.", "Mars has two moons.",
                              action=Action.GROUND, fallback=why))
    # the reason's headline only: the note quotes no sentence again
    assert events[1:] == [StreamEvent("note", "kept the earlier sentence: the grounded rewrite is not supported either")]


def test_rigkit_ask_prints_a_note_and_a_late_take_back_on_lines_of_their_own():
    from rigkit.cli.ask import _TokenPrinter

    out = io.StringIO()
    printer = _TokenPrinter(out)
    printer(StreamEvent("token", "It needs XYZ."))
    printer.end_line()  # the round block is printed here
    for event in (StreamEvent("note", "kept the earlier sentence: the rewrite repeats accepted text"),
                  StreamEvent("retract", "It needs XYZ."), StreamEvent("token", "It needs NOTICE.")):
        printer(event)
    printer.end_line()
    assert out.getvalue().splitlines() == ["writing   It needs XYZ.",
                                           "writing   [kept the earlier sentence: the rewrite repeats accepted text]",
                                           "writing   [taken back: 13 characters]",
                                           "writing   It needs NOTICE."]


def test_the_stepper_labels_a_rewrite_as_a_candidate():
    pytest.importorskip("ipywidgets")
    from rigkit.widgets import RoundStepper

    labels: list[str] = []

    class Spy:
        def on_token(self, text):
            labels.append(stepper.writing_pane.value.split("</i>")[0])

    from tests.test_answer_checks import FlagWord, make

    c = make(ScriptedGenerator(["You must include a NOTICE text file.", "Every redistribution must include the file."]),
             FlagWord("NOTICE"))
    stepper = RoundStepper.live(c, "What must I ship?", start=False)
    c.callbacks.append(Spy())
    stepper.next()
    stepper.next()
    assert any(label.endswith("<i>writing…") for label in labels)
    assert any("writing again with the passages" in label for label in labels)
