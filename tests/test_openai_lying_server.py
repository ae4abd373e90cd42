"""`--backend openai` (`/v1/completions`) against a completions server that lies or overruns, a
scripted one on a loopback port (`tests/test_backend_faults.py`'s): a second choice woven into
the stream or the helper reply, tokens without their log-probabilities, more scored tokens than
the text has bytes, `max_tokens` ignored. Each is read as the protocol says or refused in one line
naming the server, as `--backend chat` does (tests/test_chat_lying_server.py)."""

from __future__ import annotations

import io
import json
import threading
import time

import pytest

from rigkit.generation.openai import OpenAIGenerator, ServerError
from rigkit.transcript import Piece, StopRule
from tests.conftest import CliRun, local_http_server, stream_endlessly
from tests.test_backend_faults import Misbehaving, _ask, _events, _token
from tests.tiny_model import tiny_generator

MODEL = "smollm2-135m-instruct"  # what Misbehaving's /models lists


class LyingCompletions(Misbehaving):
    """`Misbehaving`, where `self.server.script` says: a list streams those events; `endless`
    streams words until the client hangs up (it ignores `max_tokens`); a dict is the reply to a
    helper call (not streamed)."""

    def do_POST(self) -> None:
        script = self.server.script
        raw = self.rfile.read(int(self.headers["content-length"]))
        self.rfile = io.BytesIO(raw)  # read again by Misbehaving.do_POST
        body = json.loads(raw)
        if script is None or not self.path.endswith("/completions"):
            return super().do_POST()
        self.server.seen.append((time.monotonic(), "POST", self.path))
        self.server.bodies.append(body)
        if not body.get("stream"):
            return self._send(200, json.dumps(self.server.helper).encode())
        if script == "endless":
            return self._endless(20_000)  # 40 s of words at least, were it read to the end
        self._send(200, _events(*script), "text/event-stream")

    def _endless(self, words: int) -> None:
        stream_endlessly(self, (_token(f" w{i}") for i in range(words)))


@pytest.fixture
def server():
    with local_http_server(LyingCompletions, fault="", seen=[], client_left=None, script=None, helper=None,
                           bodies=[], written=0, ended=threading.Event()) as httpd:
        yield httpd


def _generator(server) -> OpenAIGenerator:
    return OpenAIGenerator(f"{server.url}/v1", MODEL, tiny_generator(0).tokenizer, max_retries=0)


def _segment(server, max_new_tokens: int = 32, stop: StopRule | None = None):
    generator = _generator(server)
    prompt = [Piece(generator.render_chat([{"role": "user", "content": "Which licence?"}], True))]
    return generator.next_segment(prompt, stop or StopRule(), max_new_tokens)


def _choice(index: int, text: str, finish: str | None = None) -> dict:
    event = _token(text, finish=finish)
    event["choices"][0]["index"] = index
    return event


# -- a lying server: choice 0 only ------------------------------------------------------------------

def test_a_second_choice_woven_into_the_stream_never_reaches_the_answer(server):
    server.script = [_choice(0, "MIT"), _choice(1, " EVIL"), _choice(0, " is"), _choice(1, " EVIL"),
                     _choice(0, " a"), _choice(1, " EVIL", finish="stop"), _choice(0, " licence", finish="stop")]
    segment = _segment(server)
    assert segment.text == "MIT is a licence" and "EVIL" not in "".join(segment.tokens)
    assert segment.finish_reason == "end_of_turn" and len(segment.logprobs) == 4


def test_two_choices_both_numbered_zero_are_one_line(server):
    both = {"choices": [_token("MIT")["choices"][0], _token("EVIL")["choices"][0]]}
    server.script = [both, _token(".", finish="stop")]
    with pytest.raises(ServerError, match=rf"{server.url}/v1/completions sent 2 choices numbered 0"):
        _segment(server)


def test_a_helper_reply_is_read_from_choice_zero(server):
    server.script = []
    server.helper = {"choices": [{"index": 1, "text": "EVIL query"}, {"index": 0, "text": " lakes of Finland\n"}]}
    assert _generator(server).generate("Rewrite the question as a search query.") == "lakes of Finland"


# -- scores missing or misaligned: the answer is read from them -------------------------------------

def _no_scores(text: str, logprobs) -> dict:
    event = _token(text)
    event["choices"][0]["logprobs"] = logprobs
    return event


@pytest.mark.parametrize("event, words", [
    (_no_scores(" is", None), ["sent the text 'is' without log-probabilities"]),
    (_no_scores(" is", {"tokens": [], "token_logprobs": [], "top_logprobs": []}),
     ["sent the text 'is' without log-probabilities"]),
    (_no_scores(" is", {"tokens": [" is"], "token_logprobs": [None], "top_logprobs": [None]}),
     ["the log-probability 'null', not a finite number"]),  # read as p = 1 it would hide every doubt
], ids=["none", "no-tokens", "null-score"])
def test_scores_missing_after_the_first_token_are_an_error_naming_the_server(cli, server, event, words):
    server.script = [_token("It"), event, _token(" one.", finish="stop")]
    CliRun.error_line(_ask(cli, server, ""), f"{server.url}/v1/completions", *words)


def test_five_hundred_scores_for_one_word_are_refused(cli, server):
    flood = _token("Paris")
    scores = flood["choices"][0]["logprobs"]
    scores["tokens"] *= 500
    scores["token_logprobs"] *= 500
    scores["top_logprobs"] *= 500
    server.script = [flood, _token(".", finish="stop")]
    CliRun.error_line(_ask(cli, server, ""), f"{server.url}/v1/completions",
                      "sent 500 token scores for the text 'Paris'")


# -- a server past its limits -----------------------------------------------------------------------

def test_a_server_that_ignores_max_tokens_is_cut_at_the_cap_and_its_stream_closed(server):
    server.script = "endless"
    segment = _segment(server, max_new_tokens=16, stop=StopRule(sentence=False))
    assert server.bodies[-1]["max_tokens"] == 16  # it was told
    assert len(segment.tokens) == 16 and segment.finish_reason == "length"
    assert server.ended.wait(30)  # the server saw the connection close ...
    assert server.written < 20_000  # ... long before its last word


def test_tokens_longer_than_any_token_are_cut_at_the_cap(server):
    server.script = [_token("x" * 200) for _ in range(3)] + [_token(".", finish="stop")]
    segment = _segment(server, max_new_tokens=4, stop=StopRule(sentence=False))
    assert segment.tokens == ["x" * 200] and segment.finish_reason == "length"  # nothing read past 4 * 32 characters
