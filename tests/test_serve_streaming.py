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


def test_a_turn_that_starts_after_passages_is_joined_like_the_draft():
    from types import SimpleNamespace

    events: list[StreamEvent] = []
    stream = TokenStream(events.append)
    stream.on_round_start(0, None)
    stream.on_token("First.")
    stream.on_round_end(SimpleNamespace(draft="First."))
    stream.on_round_start(1, None)
    for token in ["Second", " one."]:  # a new assistant turn after the passages: no leading space
        stream.on_token(token)
    stream.on_round_end(SimpleNamespace(draft="First. Second one."))
    assert all(e.kind == "token" for e in events)
    assert "".join(e.text for e in events) == "First. Second one."
