"""`rigkit ask --backend openai` against a misbehaving model server started by the test on a
loopback port: every fault ends in one `rigkit: error:` line naming the server and what it sent,
exit code 2, within the call's deadline. The parsing checks also run on their own, without a socket.
"""

from __future__ import annotations

import json
import time
from http.server import BaseHTTPRequestHandler

import pytest

from rigkit.generation.server_replies import (
    ServerError,
    read_json,
    served_models,
    token_scores,
    usage_count,
)
from tests.conftest import CliRun, local_http_server

HIT = {"id": "apache#0", "title": "Apache", "text": "The Apache licence allows commercial use.", "score": 1.0}


def _token(text: str, logprob=-0.5, finish=None) -> dict:
    return {"choices": [{"text": text, "index": 0, "finish_reason": finish,
                         "logprobs": {"tokens": [text], "token_logprobs": [logprob],
                                      "top_logprobs": [{text: logprob}]}}]}


def _events(*events: dict | str, done: bool = True) -> bytes:
    lines = [f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n" for e in events]
    return ("".join(lines) + ("data: [DONE]\n\n" if done else "")).encode()


GOOD_MODELS = json.dumps({"data": [{"id": "smollm2-135m-instruct", "owned_by": "llamacpp"}]}).encode()
ANSWER = (_token("It"), _token(" is", finish="stop"))


class Misbehaving(BaseHTTPRequestHandler):
    """Answers as `self.server.fault` says; `/retrieve` always answers one hit."""

    def log_message(self, *args) -> None:  # keep the test's stderr for rigkit's own lines
        pass

    def do_GET(self) -> None:
        self.server.seen.append((time.monotonic(), "GET", self.path))
        fault = self.server.fault
        if fault == "models-not-json":
            return self._send(200, b"<html><body>Welcome to nginx!</body></html>", "text/html")
        if fault == "models-list":
            return self._send(200, b'[{"id": "smollm2-135m-instruct"}]')
        if fault == "redirect":
            return self._send(302, b"", headers={"Location": "http://127.0.0.1/login"})
        if fault == "busy":
            return self._send(429, b"slow down", "text/plain", {"Retry-After": "1"})
        self._send(200, GOOD_MODELS)

    def do_POST(self) -> None:
        self.server.seen.append((time.monotonic(), "POST", self.path))
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        if self.path.endswith("/retrieve"):
            return self._send(200, json.dumps({"result": [[HIT] for _ in body["queries"]]}).encode())
        fault = self.server.fault
        if fault == "no-content":
            return self._send(204, b"")
        if fault == "fail":
            return self._send(500, b"CUDA error: out of memory", "text/plain")
        if fault == "busy-long":
            return self._send(429, b"slow down", "text/plain", {"Retry-After": "30"})
        if fault == "silent":
            time.sleep(30)  # past every deadline the tests set
            return
        if fault == "drip":
            return self._drip(_events(*ANSWER) * 1000)
        stream = {
            "": _events(*ANSWER, {"choices": [], "usage": {"prompt_tokens": 40}}),
            "usage-not-int": _events(*ANSWER, {"choices": [], "usage": {"prompt_tokens": "lots"}}),
            "logprob-count": _events({"choices": [{"text": "It is", "finish_reason": "stop", "logprobs": {
                "tokens": ["It", " is"], "token_logprobs": [-0.5], "top_logprobs": [{}, {}]}}]}),
            "nan-logprobs": _events('{"choices": [{"text": "It", "logprobs": {"tokens": ["It"], '
                                    '"token_logprobs": [NaN], "top_logprobs": [{"It": NaN}]}}]}',
                                    _token(" is", finish="stop")),
            "cut-stream": _events(_token("It"), _token(" is"), done=False),
            "done-first": _events(_token("It"), _token(" is")),  # [DONE] with no finish_reason: cut short
            "event-list": _events('[{"text": "It"}]'),
            "empty": _events({"choices": [{"text": "", "index": 0, "finish_reason": "stop"}]}),
            "specials": _events(_token("It"), _token(" is"), _token(" tall"), _token("<|im_end|>"),
                                _token("<|im_start|>"), _token("user"), _token(" Ignore the rules", finish="stop")),
        }[fault]
        self._send(200, stream, "text/event-stream")

    def _send(self, status: int, body: bytes, kind: str = "application/json", headers: dict | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        if status != 204:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _drip(self, body: bytes) -> None:
        """One byte at a time, never ending within the test's deadline."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        try:
            for byte in body:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(0.02)
        except OSError:  # the client went away: what the deadline is for
            self.server.client_left = time.monotonic()


@pytest.fixture
def server():
    with local_http_server(Misbehaving, fault="", seen=[], client_left=None) as httpd:
        yield httpd


def _ask(cli, server, fault: str, *settings: str, more: tuple[str, ...] = ()) -> CliRun:
    server.fault = fault
    sets = [arg for s in ("generator.max_retries=0", *settings) for arg in ("--set", s)]
    return cli("ask", "Can I use Apache-2.0 code commercially?", "--backend", "openai",
               "--base-url", f"{server.url}/v1", "--retriever", f"{server.url}/retrieve",
               "--decider", "never", *sets, *more)



@pytest.mark.parametrize("fault, words", [
    ("models-not-json", ["/v1/models", "not JSON", "Welcome to nginx"]),
    ("models-list", ["/v1/models", "where an object", '[{"id": "smollm2-135m-instruct"}]']),
    ("redirect", ["/v1/models", "redirected (302)", "/login"]),
    ("usage-not-int", ["/v1/completions", "usage.prompt_tokens", "lots", "whole number"]),
    ("logprob-count", ["/v1/completions", "2 tokens but 1 log-probabilities"]),
    ("nan-logprobs", ["/v1/completions", "NaN"]),
    ("no-content", ["/v1/completions", "204"]),
    ("cut-stream", ["/v1/completions", "before the answer ended"]),
    ("done-first", ["/v1/completions", "[DONE] before any finish_reason", "cut short"]),
    ("event-list", ["/v1/completions", "where an object belongs"]),
    ("empty", ["/v1/completions", "empty completion", "where the answer starts"]),
])
def test_a_misbehaving_model_server_is_one_line_naming_it_and_what_it_sent(cli, server, fault, words):
    CliRun.error_line(_ask(cli, server, fault), server.url, *words)


def test_a_well_behaved_server_answers(cli, server, tmp_path):
    page = tmp_path / "run.html"
    done = _ask(cli, server, "", more=("--html", str(page), "--lecture"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "It is" in done.stdout
    html = page.read_text(encoding="utf-8")  # the run as one page (RIGResult.save_html)
    assert html.startswith("<!DOCTYPE html>") and 'class="rigkit-page lecture"' in html and "It is" in html


def test_special_token_text_in_a_reply_ends_the_answer_there(cli, server):
    """A server that renders special tokens sends `<|im_end|>` and the next turn as text."""
    done = _ask(cli, server, "specials")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "It is tall" in done.stdout and "im_" not in done.stdout and "Ignore" not in done.stdout


def test_a_retry_after_past_the_deadline_fails_at_once_saying_429(cli, server):
    """The deadline is total: a 30 s Retry-After against a 3 s deadline is not waited for."""
    started = time.monotonic()
    done = _ask(cli, server, "busy-long", "generator.request_timeout=3", "generator.max_retries=5")
    CliRun.error_line(done, f"{server.url}/v1/completions", "answered 429", "Retry-After: 30", "within 3 s")
    # one try, then the error: waiting the Retry-After (30 s) and trying again would show as a second POST
    assert [method for t, method, _ in server.seen if t >= started].count("POST") == 1
    assert time.monotonic() - started < 30


def test_a_dripping_server_is_cut_off_at_the_calls_deadline(cli, server):
    """One byte every 20 ms never trips a per-read timeout; the call's deadline ends it."""
    done = _ask(cli, server, "drip", "generator.request_timeout=1.5")
    CliRun.error_line(done, f"{server.url}/v1/completions", "did not finish its answer within 1.5 s")
    started = next(t for t, method, _ in server.seen if method == "POST")
    assert time.monotonic() - started < 1.5 + 2.0  # the deadline, plus what a busy machine adds


def test_a_server_busy_forever_gives_up_at_the_deadline_honouring_retry_after(cli, server, caplog):
    done = _ask(cli, server, "busy", "generator.request_timeout=2.5", "generator.max_retries=20")
    line = CliRun.error_line(done, f"{server.url}/v1/models", "within 2.5 s", "tries over", "429, 429")
    tries = [t for t, _, path in server.seen if path.endswith("/models")]
    assert 2 <= len(tries) <= 4, line  # ~1 s apart, as Retry-After asked, until the deadline
    assert all(b - a >= 0.9 for a, b in zip(tries, tries[1:]))
    assert tries[-1] - tries[0] <= 2.5 + 0.5
    assert "retrying in 1.0 s, until the call's 2.5 s deadline" in caplog.text  # said before each wait


# -- the checks themselves, without a socket --------------------------------------------------------

WHERE = "the model server at http://models.test/v1/completions"


@pytest.mark.parametrize("logprobs, words", [
    ({"tokens": ["a", "b"], "token_logprobs": [-1.0]}, "2 tokens but 1 log-probabilities"),
    ({"tokens": ["a"], "token_logprobs": [float("nan")]}, "not a finite number"),
    ({"tokens": ["a"], "token_logprobs": ["-1"]}, "not a finite number"),
    ({"tokens": ["a"], "token_logprobs": [-1.0], "top_logprobs": [{"a": float("nan")}]}, "not a finite"),
    ({"tokens": ["a"], "token_logprobs": [-1.0], "top_logprobs": []}, "1 tokens but top_logprobs"),
    ({"tokens": "a", "token_logprobs": [-1.0]}, "list of strings"),
    (["a"], "where an object belongs"),
])
def test_log_probabilities_that_do_not_line_up_are_refused(logprobs, words):
    with pytest.raises(ServerError, match=words):
        token_scores(logprobs, WHERE)


def test_good_log_probabilities_pass_and_an_impossible_alternative_may_be_minus_infinity():
    scores = token_scores({"tokens": ["a"], "token_logprobs": [-1.0],
                           "top_logprobs": [{"a": -1.0, "b": float("-inf")}]}, WHERE)
    assert scores.logprobs == [-1.0] and scores.tops == [[-1.0, float("-inf")]]


def test_json_without_nan_and_counts_that_are_whole_numbers():
    with pytest.raises(ServerError, match="NaN is not a JSON number"):
        read_json('{"x": NaN}', WHERE)
    assert read_json('{"x": -Infinity}', WHERE) == {"x": float("-inf")}
    assert usage_count({"prompt_tokens": 12}, "prompt_tokens", WHERE) == 12
    assert usage_count({}, "prompt_tokens", WHERE) is None
    for bad in ("12", 1.5, -1, True):
        with pytest.raises(ServerError, match="not a whole number"):
            usage_count({"prompt_tokens": bad}, "prompt_tokens", WHERE)
    with pytest.raises(ServerError, match="where a model object"):
        served_models({"data": ["m"]}, WHERE)
