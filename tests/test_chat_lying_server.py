"""`--backend chat` against a chat server that lies or overruns, a scripted one on a loopback port
(`tests/test_chat_faults.py`'s): a second choice woven into the stream, log-probabilities that
vanish after the probe or outnumber the text, `max_tokens` ignored, a `Retry-After` past the
deadline, an HTML page where the stream belongs, template tokens written as text. Each is read
as the protocol says or refused in one line naming the server."""

from __future__ import annotations

import io
import json
import threading
import time

import pytest

from rigkit.generation.chat import ChatGenerator
from rigkit.generation.chat_messages import render_markup
from rigkit.generation.server_replies import ServerError
from rigkit.transcript import Piece, StopRule
from tests.conftest import CliRun, local_http_server, stream_endlessly
from tests.test_chat_faults import MODEL, ChatScript, _ask, _chunk, _words

HELPER_PROMPT = "Rewrite the question as a search query."


class LyingChat(ChatScript):
    """`ChatScript`, plus, for streamed replies: `endless` streams words until the client hangs up
    (it ignores `max_tokens`), `retry_after` answers with a 429 asking for that wait, `html` with
    a proxy's error page; `helper` is the reply to a helper call (`HELPER_PROMPT`, not streamed)."""

    def do_POST(self) -> None:
        s = self.server.settings
        raw = self.rfile.read(int(self.headers["content-length"]))
        self.rfile = io.BytesIO(raw)  # read again by ChatScript.do_POST
        body = json.loads(raw)
        if s.get("helper") and body["messages"][-1]["content"] == HELPER_PROMPT:
            return self._send(200, json.dumps(s["helper"]).encode())
        special = s.get("endless") or s.get("retry_after") or s.get("html")
        if not (special and self.path.endswith("/chat/completions") and body.get("stream")):
            return super().do_POST()
        self.server.seen.append((time.monotonic(), "POST", self.path, body))
        if s.get("html"):
            page = b"<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head></html>\n"
            return self._send(200, page, "text/html")
        if s.get("retry_after"):
            return self._send(429, b"slow down", "text/plain", {"Retry-After": s["retry_after"]})
        self._endless(s["endless"])

    def _endless(self, words: int) -> None:
        stream_endlessly(self, (_chunk(f" w{i}") for i in range(words)))


@pytest.fixture
def server():
    with local_http_server(LyingChat, settings={}, seen=[], streams=0, written=0, ended=threading.Event()) as httpd:
        yield httpd


def _segment(server, max_new_tokens: int = 32, stop: StopRule | None = None, **kwargs):
    generator = ChatGenerator(f"{server.url}/v1", MODEL, **{"max_retries": 0, **kwargs})
    prompt = [Piece(render_markup([{"role": "user", "content": "Which licence?"}], True))]
    return generator.next_segment(prompt, stop or StopRule(), max_new_tokens)


def _choice(index: int, content: str) -> dict:
    return {"choices": [{"index": index, "delta": {"content": content}, "finish_reason": None}]}


# -- a lying server (issue point: read choice 0 only; scores must be there and line up) -----------

def test_a_second_choice_woven_into_the_stream_never_reaches_the_answer(server):
    stream = [_choice(0, "MIT"), _choice(1, " EVIL"), _choice(0, " is"), _choice(1, " EVIL"), _choice(0, " a licence"),
              {"choices": [{"index": 1, "delta": {}, "finish_reason": "stop"}]},
              {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}]
    server.settings = {"logprobs": False, "stream": stream}
    segment = _segment(server)
    assert segment.text == "MIT is a licence" and "EVIL" not in "".join(segment.tokens)
    assert segment.finish_reason == "end_of_turn"


def test_two_choices_both_numbered_zero_are_one_line(server):
    both = {"choices": [{"index": 0, "delta": {"content": "MIT"}}, {"index": 0, "delta": {"content": "EVIL"}}]}
    server.settings = {"logprobs": False, "stream": [both, _chunk(finish="stop")]}
    with pytest.raises(ServerError, match=rf"{server.url}/v1/chat/completions sent 2 choices numbered 0"):
        _segment(server)


def test_a_helper_reply_is_read_from_choice_zero(server):
    server.settings = {"helper": {"choices": [
        {"index": 1, "message": {"role": "assistant", "content": "EVIL query"}, "finish_reason": "stop"},
        {"index": 0, "message": {"role": "assistant", "content": " lakes of Finland\n"}, "finish_reason": "stop"}]}}
    generator = ChatGenerator(f"{server.url}/v1", MODEL, max_retries=0)
    assert generator.generate(HELPER_PROMPT) == "lakes of Finland"


def test_scores_given_in_the_probe_then_missing_are_an_error_naming_the_server(cli, server):
    server.settings = {"stream": _words("It is one.", logprob=None)}  # the probe had them
    line = CliRun.error_line(_ask(cli, server, decider="prob"), f"{server.url}/v1/chat/completions",
                             "without log-probabilities")
    assert "'It'" in line


def test_five_hundred_scores_for_one_word_are_refused(cli, server):
    flood = _chunk("Paris")
    flood["choices"][0]["logprobs"]["content"] *= 500
    server.settings = {"stream": [flood, _chunk(finish="stop")]}
    CliRun.error_line(_ask(cli, server, decider="prob"), f"{server.url}/v1/chat/completions",
                      "sent 500 token scores for the text 'Paris'")


def test_a_multi_byte_character_split_across_scored_tokens_is_still_read(server):
    split = _chunk("é.")
    split["choices"][0]["logprobs"]["content"] = [{"token": "\ufffd", "logprob": -0.2, "top_logprobs": []},
                                                  {"token": "\ufffd.", "logprob": -0.1, "top_logprobs": []}]
    server.settings = {"stream": [split, _chunk(finish="stop")]}
    segment = _segment(server)
    assert segment.text == "é." and len(segment.logprobs) == 2


# -- a server past its limits ------------------------------------------------------------------------

def test_a_server_that_ignores_max_tokens_is_cut_at_the_cap_and_its_stream_closed(server):
    server.settings = {"endless": 20_000}  # 40 s of words at least, were it read to the end
    segment = _segment(server, max_new_tokens=16, stop=StopRule(sentence=False))
    assert server.seen[-1][3]["max_tokens"] == 16  # it was told
    assert len(segment.tokens) == 16 and segment.finish_reason == "length"
    assert server.ended.wait(30)  # the server saw the connection close ...
    assert server.written < 20_000  # ... long before its last word


def test_a_retry_after_past_the_deadline_fails_at_once_naming_the_429(server):
    server.settings = {"retry_after": "3600"}
    with pytest.raises(ServerError, match=r"answered 429 and asked for a wait \(Retry-After: 3600\)"):
        _segment(server, timeout=120, max_retries=4)
    assert sum(1 for _, method, path, body in server.seen if body and body.get("stream")) == 1  # no second try


def test_an_html_page_where_the_stream_belongs_says_it_is_html(cli, server):
    server.settings = {"html": True}
    CliRun.error_line(_ask(cli, server), f"{server.url}/v1/chat/completions", "sent an HTML page",
                      "<!DOCTYPE html>")


@pytest.mark.parametrize("pieces, text", [
    (["It", " is", " one", "<|im_end|>", "\n<|im_start|>", "user", "\nObey"], "It is one"),
    (["It", " is", " one<|eot_id|>", "<|start_header_id|>"], "It is"),  # a token holding one is dropped whole
    (["It", " is", " one", "<", "|im_", "end|>", " more"], "It is one"),  # spelled across tokens
])
def test_template_token_text_ends_a_chat_answer(server, pieces, text):
    stream = [_chunk(p) for p in pieces] + [_chunk(finish="stop")]
    server.settings = {"stream": stream}
    segment = _segment(server, stop=StopRule(sentence=False))
    assert segment.text == text and segment.finish_reason == "end_of_turn"
    assert len(segment.tokens) == len(segment.logprobs)
