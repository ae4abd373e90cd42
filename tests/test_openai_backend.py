"""The OpenAI-compatible generator against a scripted transport: protocol, stop rule, logprobs,
retries, timeouts and error messages. (The real-server test is test_openai_backend_server.py.)"""

from __future__ import annotations

import json
import math
import threading

import httpx
import pytest

from rigkit.generation.openai import OpenAIGenerator, ServerError, truncated_entropy
from rigkit.transcript import Piece, StopRule
from tests.tiny_model import tiny_generator

URL = "http://models.test/v1"


def _tokenizer():
    return tiny_generator(0).tokenizer


def _sse(events: list[dict]) -> bytes:
    return "".join(f"data: {json.dumps(e)}\n\n" for e in events).encode() + b"data: [DONE]\n\n"


def _token_event(text: str, logprob: float = -0.5, top: dict | None = None, finish=None) -> dict:
    top = top if top is not None else {text: logprob, "other": -1.5}
    return {"choices": [{"text": text, "index": 0, "finish_reason": finish,
                         "logprobs": {"tokens": [text], "token_logprobs": [logprob], "top_logprobs": [top]}}]}


class Server:
    """A scripted OpenAI-compatible server: `/models` and streamed `/completions`."""

    def __init__(self, tokens=(), owned_by="llamacpp", model="m", usage=None, failures=()):
        self.tokens, self.owned_by, self.model, self.usage = list(tokens), owned_by, model, usage
        self.failures = list(failures)  # status codes (or exceptions) to answer first
        self.requests: list[dict] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if self.failures:
            failure = self.failures.pop(0)
            if isinstance(failure, Exception):
                raise failure
            return httpx.Response(failure, text="busy", headers={"retry-after": "0"})
        if request.url.path.endswith("/models"):
            return httpx.Response(200, json={"data": [{"id": self.model, "owned_by": self.owned_by}]})
        body = json.loads(request.content)
        self.requests.append(body)
        events = [_token_event(t) for t in self.tokens]
        if events:
            events[-1]["choices"][0]["finish_reason"] = "stop"
        if self.usage is not None:
            events.append({"choices": [], "usage": self.usage})
        return httpx.Response(200, content=_sse(events), headers={"content-type": "text/event-stream"})


def _generator(server: Server, **kwargs) -> OpenAIGenerator:
    kwargs.setdefault("backoff", 0.0)
    return OpenAIGenerator(URL, "m", _tokenizer(), transport=httpx.MockTransport(server), **kwargs)


def _prompt(generator):
    return [Piece(generator.render_chat([{"role": "user", "content": "what licence"}], True))]


def test_segments_end_where_the_stop_rule_says():
    server = Server(["It", " is", " mit", ".", " The", " code"])
    generator = _generator(server)
    segment = generator.next_segment(_prompt(generator), StopRule(), 20)
    # the same cut as the in-process backend: the token holding "." is kept, " The" is not
    assert segment.text == "It is mit." and segment.finish_reason == "stop"
    assert segment.tokens == ["It", " is", " mit", "."]
    assert len(segment.token_ids) == len(segment.logprobs) == len(segment.entropies) == 4
    body = server.requests[0]
    assert body["prompt"].startswith("<|im_start|>user") and body["logprobs"] == 20
    assert body["stream"] is True and "stop" not in body  # llama.cpp would strip the kept "."


def test_end_of_turn_and_length():
    generator = _generator(Server(["It", " is", " mit"]))
    assert generator.next_segment(_prompt(generator), StopRule(), 20).finish_reason == "end_of_turn"


def test_marker_close_ends_a_segment():
    generator = _generator(Server(["<retrieve>", "mit", " terms", "</retrieve>", " and"]))
    segment = generator.next_segment(_prompt(generator), StopRule(marker_close="</retrieve>"), 20)
    assert segment.text.endswith("</retrieve>") and segment.finish_reason == "stop"


def test_vllm_gets_token_ids_and_stop_strings():
    """vLLM: token-id prompts, token ids back, stop strings kept in the output (at most 4)."""
    tokenizer = _tokenizer()
    ids = [tokenizer.convert_tokens_to_ids(w) for w in ("it", " ", "is", ".", " ", "the")]

    def vllm(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models"):
            return httpx.Response(200, json={"data": [{"id": "m", "owned_by": "vllm"}]})
        seen.append(json.loads(request.content))
        events = [_token_event(f"token_id:{i}", top={f"token_id:{i}": -0.1}) for i in ids]
        events.append({"choices": [], "usage": {"prompt_tokens": 30, "prompt_tokens_details": {"cached_tokens": 16}}})
        return httpx.Response(200, content=_sse(events))

    seen: list[dict] = []
    generator = OpenAIGenerator(URL, "m", tokenizer, transport=httpx.MockTransport(vllm))
    prompt = _prompt(generator) + [Piece("it is", (ids[0], ids[1], ids[2]))]
    segment = generator.next_segment(prompt, StopRule(marker_close="</retrieve>"), 20)
    body = seen[0]
    assert body["prompt"] == generator.encode(prompt)  # token ids, generated ones verbatim
    assert body["prompt"][-3:] == ids[:3]
    assert body["stop"] == ["</retrieve>", ". ", "? ", "! "] and body["include_stop_str_in_output"]
    assert body["return_tokens_as_token_ids"] is True
    assert segment.token_ids == ids[:4] and segment.text == "it is."
    assert segment.tokens_reused == 16 and segment.tokens_prefilled == 14
    assert "token-id prompts" in generator.source


def test_the_end_of_turn_token_vllm_sends_is_not_kept():
    """As in-process: a turn that ends leaves no `<|im_end|>` id (nor its log-probability) behind."""
    tokenizer = _tokenizer()
    ids = [tokenizer.convert_tokens_to_ids(w) for w in ("it", " ", "is")] + [tokenizer.eos_token_id]

    def vllm(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models"):
            return httpx.Response(200, json={"data": [{"id": "m", "owned_by": "vllm"}]})
        events = [_token_event(f"token_id:{i}", top={f"token_id:{i}": -0.1}) for i in ids]
        events[-1]["choices"][0]["finish_reason"] = "stop"
        return httpx.Response(200, content=_sse(events))

    generator = OpenAIGenerator(URL, "m", tokenizer, transport=httpx.MockTransport(vllm))
    segment = generator.next_segment(_prompt(generator), StopRule(), 20)
    assert segment.finish_reason == "end_of_turn" and segment.text == "it is"
    assert segment.token_ids == ids[:3] and len(segment.tokens) == len(segment.logprobs) == 3


def test_cached_tokens_unknown_when_the_server_does_not_say():
    generator = _generator(Server(["It", "."], usage={"prompt_tokens": 12}))
    segment = generator.next_segment(_prompt(generator), StopRule(), 20)
    assert segment.tokens_reused is None and segment.tokens_prefilled == 12
    assert "text prompts" in generator.source and "truncated top-20" in generator.source


def test_prob_decider_works_unchanged_on_server_logprobs():
    from rigkit.deciders import ProbabilityDecider
    from rigkit.deciders.base import DecisionState

    server = Server(["It", " is", " mit", "."])
    server.tokens = ["It", " is", " mit", "."]
    generator = _generator(server)
    segment = generator.next_segment(_prompt(generator), StopRule(), 20)
    segment.logprobs[2] = math.log(0.05)  # a low-probability token
    decision = ProbabilityDecider().decide(segment, DecisionState(question="what licence", draft=""))
    assert decision.retrieve and decision.spans


def test_truncated_entropy_is_a_lower_bound():
    probs = [0.5, 0.25, 0.125, 0.0625, 0.0625]
    exact = -sum(p * math.log(p) for p in probs)
    estimate = truncated_entropy([math.log(p) for p in probs[:2]])
    assert 0 < estimate <= exact
    assert truncated_entropy([math.log(p) for p in probs]) == pytest.approx(exact)
    assert truncated_entropy([0.0]) == 0.0


def test_retries_on_429_and_503_then_succeeds():
    server = Server(["It", "."], failures=[429, 503])
    generator = _generator(server, max_retries=3)
    assert generator.next_segment(_prompt(generator), StopRule(), 20).text == "It."


def test_retries_on_connection_errors_then_names_the_url():
    server = Server(failures=[httpx.ConnectError("refused")] * 3)
    generator = _generator(server, max_retries=2)
    with pytest.raises(ServerError, match=r"cannot reach the model server at http://models.test/v1/models"):
        generator.next_segment(_prompt(generator), StopRule(), 20)
    assert server.failures == []  # 1 try + 2 retries


def test_a_timeout_is_one_clear_error():
    server = Server(failures=[httpx.ReadTimeout("slow")] * 2)
    generator = _generator(server, max_retries=1, timeout=3)
    with pytest.raises(ServerError, match=r"did not answer within 3 s"):
        generator.next_segment(_prompt(generator), StopRule(), 20)


def test_a_wrong_model_name_lists_what_is_served():
    generator = OpenAIGenerator(URL, "llama-3-8b", _tokenizer(), transport=httpx.MockTransport(Server(model="m")))
    with pytest.raises(ServerError, match=r"model 'llama-3-8b' is not served at http://models.test/v1; it serves: m"):
        generator.next_segment([Piece("hi")], StopRule(), 5)


def test_other_http_errors_name_the_url_and_status():
    generator = _generator(Server(failures=[401]))
    with pytest.raises(ServerError, match=r"models.test/v1/models refused the request \(401\)"):
        generator.next_segment([Piece("hi")], StopRule(), 5)


def test_no_logprobs_from_the_server_is_an_error_not_a_guess():
    def bare(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models"):
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        return httpx.Response(200, content=_sse([{"choices": [{"text": "It", "logprobs": None}]}]))

    generator = OpenAIGenerator(URL, "m", _tokenizer(), transport=httpx.MockTransport(bare))
    with pytest.raises(ServerError, match="sent the text .It. without log-probabilities"):
        generator.next_segment([Piece("hi")], StopRule(), 5)


def test_one_instance_serves_several_threads():
    server = Server(["It", " is", "."])
    generator = _generator(server)
    results, errors = [], []

    def ask():
        try:
            results.append(generator.next_segment(_prompt(generator), StopRule(), 20).text)
        except Exception as err:  # noqa: BLE001 - collected for the assertion
            errors.append(err)

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and results == ["It is."] * 8


def test_attention_deciders_refuse_a_served_model_at_build_time():
    from rigkit.config import DeciderConfig
    from rigkit.deciders import check_decider_support
    from rigkit.errors import InputError
    from rigkit.generation import SupportsAttention, SupportsHiddenStates

    generator = _generator(Server())
    assert not isinstance(generator, SupportsAttention) and not isinstance(generator, SupportsHiddenStates)
    with pytest.raises(InputError, match=r"decider 'entropy' needs the model's attention weights"):
        check_decider_support(DeciderConfig(name="entropy"), generator)
    composite = DeciderConfig(name="composite", members=(DeciderConfig(name="prob"), DeciderConfig(name="entropy")))
    with pytest.raises(InputError, match="decider 'entropy'"):
        check_decider_support(composite, generator)
    check_decider_support(DeciderConfig(name="entropy", params={"use_attention": False}), generator)
    check_decider_support(DeciderConfig(name="prob"), generator)


def test_config_and_cli_reach_the_backend(monkeypatch):
    from rigkit.config import RunConfig
    from rigkit.errors import InputError
    from rigkit.generation import generator_from_config
    from rigkit.generation import openai as backend

    monkeypatch.setattr(backend, "load_tokenizer", lambda name, trust=False: _tokenizer())
    config = RunConfig.from_yaml(
        "generator:\n  backend: openai\n  base_url: http://models.test/v1\n  model: m\n"
        "  api_key_env: RIGKIT_TEST_KEY\n  top_logprobs: 5\n"
    )
    with pytest.raises(InputError, match="RIGKIT_TEST_KEY"):
        generator_from_config(config.generator)
    monkeypatch.setenv("RIGKIT_TEST_KEY", "secret")
    generator = generator_from_config(config.generator)
    assert isinstance(generator, OpenAIGenerator) and generator.top_logprobs == 5
    assert generator._client.headers["authorization"] == "Bearer secret"
    with pytest.raises(InputError, match="base_url"):
        generator_from_config(RunConfig.from_yaml("generator:\n  backend: openai\n").generator)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--backend", "openai"], "--backend openai needs --base-url"),
        (["--device", "gpu"], "unknown device 'gpu'"),
        (["--attn-implementation", "fast"], "unknown attn_implementation 'fast'"),
    ],
)
def test_ask_refuses_bad_generator_flags_before_loading(flags, message, capsys):
    from rigkit.cli import main

    assert main(["ask", *flags, "What licence is it?"]) == 2
    assert message in capsys.readouterr().err


# -- token streaming and kept special-token tags ---------------------------------------------------

class StreamedServer(Server):
    """Sends the completion one event at a time, recording how many it has sent so far."""

    def __init__(self, tokens, **kwargs):
        super().__init__(tokens, **kwargs)
        self.sent = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models"):
            return super().__call__(request)
        self.requests.append(json.loads(request.content))

        def body():
            for i, token in enumerate(self.tokens):
                self.sent = i + 1
                event = _token_event(token, finish="stop" if i == len(self.tokens) - 1 else None)
                yield f"data: {json.dumps(event)}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return httpx.Response(200, content=body(), headers={"content-type": "text/event-stream"})


def test_on_token_gets_text_as_the_stream_delivers_it_and_nothing_past_the_stop():
    server = StreamedServer(["It", " is", " mit", ".", " The", " code"])
    generator = _generator(server)
    seen: list[tuple[str, int]] = []
    segment = generator.next_segment(_prompt(generator), StopRule(), 20,
                                     on_token=lambda text: seen.append((text, server.sent)))
    assert [text for text, _ in seen] == segment.tokens == ["It", " is", " mit", "."]
    # each token was handed on while the server was still sending, not after the stream ended
    assert [sent for _, sent in seen] == [1, 2, 3, 4]
    assert server.sent < len(server.tokens)  # the stream was closed at the stop, not read out


def test_a_raising_on_token_aborts_the_request():
    from rigkit.streaming import Cancelled

    server = StreamedServer(["It", " is", " mit", ".", " The"])
    generator = _generator(server)

    def on_token(text: str) -> None:
        if text == " is":
            raise Cancelled("client went away")

    with pytest.raises(Cancelled):
        generator.next_segment(_prompt(generator), StopRule(), 20, on_token=on_token)
    assert server.sent == 2


def test_the_controller_streams_tokens_over_a_served_model():
    from rigkit.build import build_controller
    from rigkit.config import RunConfig
    from rigkit.testing import DictRetriever

    generator = _generator(StreamedServer(["It", " is", " mit", "."]))
    streamed: list[str] = []

    class Listener:
        def on_token(self, text: str) -> None:
            streamed.append(text)

    config = RunConfig.from_dict({"decider": {"name": "never"}})
    controller = build_controller(config, generator=generator, retriever=DictRetriever({}), callbacks=[Listener()])
    result = controller.run("what licence")
    assert "".join(streamed) == "It is mit." and result.answer.startswith("It is mit.")


def test_special_token_tags_are_kept_over_vllm_and_requested_from_sglang():
    tokenizer = _tokenizer()
    tag = "<|im_start|>"  # a special token of the test tokenizer, standing in for <|begin_of_search|>
    ids = [tokenizer.convert_tokens_to_ids(w) for w in ("it", " ", "is")] + [tokenizer.convert_tokens_to_ids(tag)]

    def vllm(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models"):
            return httpx.Response(200, json={"data": [{"id": "m", "owned_by": "vllm"}]})
        seen.append(json.loads(request.content))
        # vLLM stops on the tag (a stop string) and says so on its last token
        return httpx.Response(200, content=_sse([_token_event(f"token_id:{i}", top={},
                                                               finish="stop" if i == ids[-1] else None)
                                                 for i in ids]))

    seen: list[dict] = []
    generator = OpenAIGenerator(URL, "m", tokenizer, transport=httpx.MockTransport(vllm))
    streamed: list[str] = []
    segment = generator.next_segment(_prompt(generator), StopRule(marker_close=tag, keep=(tag,)), 20,
                                     on_token=streamed.append)
    assert segment.text == f"it is{tag}" and "".join(streamed) == segment.text
    assert seen[0]["skip_special_tokens"] is False and seen[0]["stop"][0] == tag

    sglang = Server(["it", " is", tag], owned_by="sglang")
    generator = _generator(sglang)
    segment = generator.next_segment(_prompt(generator), StopRule(marker_close=tag, keep=(tag,)), 20)
    assert sglang.requests[0]["skip_special_tokens"] is False and segment.text.endswith(tag)
    assert "may be dropped" not in generator.source


def test_a_server_that_cannot_be_asked_to_keep_special_tokens_says_so_in_source():
    server = Server(["it", " is", "."])
    generator = _generator(server)
    generator.next_segment(_prompt(generator), StopRule(), 20)
    assert "may be dropped" not in generator.source  # no special-token tags in this protocol
    generator.next_segment(_prompt(generator), StopRule(keep=("<|im_start|>",)), 20)
    assert "skip_special_tokens" not in server.requests[-1]  # llama.cpp's server has no such field
    assert "special-token marker tags may be dropped" in generator.source


def test_every_command_loads_its_model_with_the_configs_device_dtype_and_backend(tmp_path, monkeypatch):
    """`rigkit serve`, `rigkit trigger`, `rigkit markers build-data` and the marker evaluation go
    through `generator_from_config`, so `generator.device` / `dtype` / `backend` reach them."""
    import rigkit.generation as generation
    from rigkit.cli import main
    from rigkit.config import load_config
    from rigkit.errors import InputError
    from rigkit.finetune.evaluate import evaluate_markers
    from rigkit.serve.service import RigService
    from rigkit.testing import DictRetriever

    seen = []

    def recorder(config):
        seen.append((config.model, config.device, config.dtype, config.backend))
        raise InputError("stop here: the model was asked for")

    monkeypatch.setattr(generation, "generator_from_config", recorder)
    cfg = tmp_path / "run.yaml"
    cfg.write_text("generator:\n  model: some-model\n  device: cuda:1\n  dtype: bfloat16\n")
    qa = tmp_path / "qa.jsonl"
    qa.write_text("")
    assert main(["trigger", "build-labels", "--qa", str(qa), "--out", str(tmp_path / "l.jsonl"),
                 "--config", str(cfg)]) == 2
    assert main(["markers", "build-data", "--qa", str(qa), "--out", str(tmp_path / "d.jsonl"),
                 "--config", str(cfg)]) == 2
    with pytest.raises(InputError, match="stop here"):
        RigService(load_config(cfg), retriever=DictRetriever({}))
    with pytest.raises(InputError, match="stop here"):
        evaluate_markers([qa], model="tuned", config_path=cfg, progress=False)
    assert seen[:3] == [("some-model", "cuda:1", "bfloat16", "hf")] * 3
    assert seen[3] == ("tuned", "cuda:1", "bfloat16", "hf")


def test_a_sampled_question_gets_a_seed_per_request_and_each_run_its_own():
    server = Server(["It", " is", "."])
    generator = _generator(server, temperature=0.7, top_p=0.9, seed=0)

    def seeds(run_seed):
        generator.reset(run_seed)
        for _ in range(3):
            generator.next_segment(_prompt(generator), StopRule(), 20)
        return [r["seed"] for r in server.requests[-3:]]

    first, again, next_run = seeds(0), seeds(0), seeds(1)
    assert first == again  # a run repeats exactly
    assert len(set(first)) == 3  # the rounds of one answer do not replay one random stream
    assert not set(first) & set(next_run)  # nor does the next run reuse this run's seeds
    assert all(0 <= s < 2**31 for s in first + next_run)
    assert {r["temperature"] for r in server.requests} == {0.7}


def test_greedy_requests_carry_no_seed():
    server = Server(["It", "."])
    generator = _generator(server, seed=3)
    generator.reset(3)
    generator.next_segment(_prompt(generator), StopRule(), 20)
    assert server.requests[-1]["temperature"] == 0.0 and "seed" not in server.requests[-1]


def test_evaluation_runs_over_a_served_model_sample_with_their_own_seeds():
    from rigkit.config import RunConfig
    from rigkit.eval.systems import _seeded, answer_closed_book

    server = Server(["It", " is", "."])
    generator = _generator(server, temperature=0.7, top_p=0.9)
    for run_seed in (0, 1, 0):
        answer_closed_book(generator, "what licence?", _seeded(RunConfig(), run_seed))
    by_run = [r["seed"] for r in server.requests]
    per_answer = len(by_run) // 3
    run0, run1, run0_again = (by_run[i * per_answer:(i + 1) * per_answer] for i in range(3))
    assert run0 == run0_again and run0 != run1


def test_what_a_decider_needs_is_read_off_its_class(monkeypatch):
    """A decider of your own declares its needs on the class; nothing lists decider names."""
    from rigkit.config import DeciderConfig
    from rigkit.deciders import (
        DECIDERS,
        EntropyDecider,
        ProbabilityDecider,
        check_decider_support,
        decider_needs,
    )
    from rigkit.errors import InputError
    from rigkit.generation.protocol import ATTENTION, EXTRA_PASSES, LOGPROBS
    from rigkit.testing import NeverDecider

    assert decider_needs(ProbabilityDecider) == {LOGPROBS}
    assert decider_needs(EntropyDecider) == {LOGPROBS, ATTENTION, EXTRA_PASSES}
    assert decider_needs(EntropyDecider, {"use_attention": False}) == {LOGPROBS}
    assert decider_needs(DECIDERS["marker"]) == frozenset()

    class LooksAtAttention(NeverDecider):
        name = "mine"
        needs = frozenset({ATTENTION})

    monkeypatch.setitem(DECIDERS._entries, "mine", LooksAtAttention)
    with pytest.raises(InputError, match=r"decider 'mine' needs the model's attention weights"):
        check_decider_support(DeciderConfig(name="mine"), _generator(Server()))
