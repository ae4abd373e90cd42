"""A server you can watch: a real HTTP server (uvicorn on a loopback port, one per module) over the
demo index and a scripted model whose segments say what they cost. Each request writes one
access-log line whose id is the answer's `request_id`; `/metrics` is scraped and read with
prometheus_client's own text parser, before and after, and the differences are checked against
the answers' own counts. Host, Origin and key rules for `/metrics`: test_serve_exposure.py."""

from __future__ import annotations

import re
import threading
import time

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
parser = pytest.importorskip("prometheus_client.parser")

from rigkit.config import RunConfig  # noqa: E402
from rigkit.serve.app import create_app  # noqa: E402
from rigkit.serve.service import RigService  # noqa: E402
from rigkit.trace import RIGResult  # noqa: E402
from tests.conftest import hang_limit  # noqa: E402
from tests.test_search_r1_protocol import serving  # noqa: E402
from tests.test_serve_protocol import QUESTION, LoopingScript, script  # noqa: E402

ACCESS = re.compile(r"request_id=(\S+) method=(\S+) route=(\S+) status=(\d+) ms=([\d.]+) retrievals=(\d+) "
                    r"prompt_tokens=(\d+) generated_tokens=(\d+)")


class GatedScript(LoopingScript):
    """The scripted model, each segment costing 40 prefilled and 12 reused prompt tokens; it
    waits while `gate` is clear, so a test can see a request running; `reached` is set once a
    request is inside the model (so on a model thread, counted as running)."""

    def __init__(self):
        segments = script()
        for segment in segments:
            segment.tokens_prefilled, segment.tokens_reused = 40, 12
        super().__init__(segments)
        self.gate = threading.Event()
        self.gate.set()
        self.reached = threading.Event()

    def next_segment(self, prompt, stop, max_new_tokens, on_token=None):
        self.reached.set()
        self.gate.wait(hang_limit(10))
        return super().next_segment(prompt, stop, max_new_tokens, on_token)


@pytest.fixture(scope="module")
def watched(demo_retriever):
    generator = GatedScript()
    config = RunConfig.from_dict({"decider": {"name": "prob", "threshold": 0.3}})
    service = RigService(config, generator=generator, retriever=demo_retriever)
    with serving(create_app(service, mcp=False)) as base:
        yield base, generator


def scrape(base: str) -> dict[tuple[str, tuple], float]:
    """(sample name, sorted labels) -> value, from the text format as Prometheus reads it."""
    text = httpx.get(base + "/metrics").text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in parser.text_string_to_metric_families(text) for s in family.samples}


def scrape_when(base: str, ready) -> dict[tuple[str, tuple], float]:
    """A scrape once `ready(seen)` holds, or the last one at the hang limit. A request is counted
    after its response has gone out, so a client can scrape before its own last request shows."""
    deadline = time.monotonic() + hang_limit(5)
    while not ready(seen := scrape(base)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return seen


def idle(seen) -> bool:
    return seen[("rigkit_queue_depth", ())] == 0 and seen[("rigkit_requests_running", ())] == 0


def delta(after, before, name: str, **labels) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


def access_lines(caplog, request_id: str) -> list[re.Match]:
    """The access-log lines of one request; written as its response ends, so waited for."""
    deadline = time.monotonic() + hang_limit(5)
    while True:
        found = [m for r in caplog.records if r.name == "rigkit.serve.access"
                 and (m := ACCESS.fullmatch(r.getMessage())) and m.group(1) == request_id]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.02)


def test_each_request_writes_one_access_line_with_the_id_of_its_trace(watched, caplog):
    base, _ = watched
    caplog.set_level("INFO", logger="rigkit.serve.access")
    reply = httpx.post(base + "/chat", json={"question": QUESTION}, headers={"X-Request-ID": "trace-42"}, timeout=60)
    result = RIGResult.from_json(reply.text)
    assert reply.status_code == 200 and reply.headers["x-request-id"] == "trace-42" == result.request_id
    [line] = access_lines(caplog, "trace-42")
    assert line.group(2, 3, 4) == ("POST", "/chat", "200") and float(line.group(5)) > 0
    assert int(line.group(6)) == result.used_retrieval_times >= 1
    assert (int(line.group(7)), int(line.group(8))) == (result.tokens["prompt"], result.tokens["generated"])
    # no id, or one that is not a short token: a new one; a refused request is logged too
    odd = httpx.post(base + "/chat", json={"question": 7}, headers={"X-Request-ID": "a b\tc" * 30})
    new_id = odd.headers["x-request-id"]
    assert odd.status_code == 422 and re.fullmatch(r"[0-9a-f]{16}", new_id)
    [refused] = access_lines(caplog, new_id)
    assert refused.group(3, 4, 6, 7) == ("/chat", "422", "0", "0")


def test_metrics_count_requests_latency_retrievals_tokens_and_cache_reuse(watched):
    base, _ = watched
    before = scrape(base)
    results = [RIGResult.from_json(httpx.post(base + "/chat", json={"question": QUESTION}, timeout=60).text)
               for _ in range(2)]
    assert httpx.post(base + "/retrieve", json={"queries": ["MIT licence", "Apache NOTICE", "GPL"]}).status_code == 200
    assert httpx.get(base + "/no/such/page").status_code == 404
    counted = (("POST", "/chat", "200", 2), ("POST", "/retrieve", "200", 1), ("GET", "unmatched", "404", 1))
    after = scrape_when(base, lambda seen: idle(seen) and all(
        delta(seen, before, "rigkit_requests_total", method=m, route=r, status=s) >= n for m, r, s, n in counted))
    assert delta(after, before, "rigkit_requests_total", method="POST", route="/chat", status="200") == 2
    assert delta(after, before, "rigkit_requests_total", method="GET", route="unmatched", status="404") == 1
    assert delta(after, before, "rigkit_request_duration_seconds_count", method="POST", route="/chat") == 2
    assert delta(after, before, "rigkit_request_duration_seconds_bucket", method="POST", route="/chat", le="+Inf") == 2
    assert delta(after, before, "rigkit_request_duration_seconds_sum", method="POST", route="/chat") > 0
    assert delta(after, before, "rigkit_retrievals_total") == sum(r.used_retrieval_times for r in results) + 3
    passages = sum(len(rnd.hits) for r in results for rnd in r.rounds)
    assert delta(after, before, "rigkit_retrieved_passages_total", source="default") == passages > 0
    for kind in ("prompt", "generated"):
        assert delta(after, before, "rigkit_tokens_total", kind=kind) == sum(r.tokens[kind] for r in results) > 0
    for kind in ("reused", "prefilled"):
        assert delta(after, before, "rigkit_cache_tokens_total", kind=kind) == sum(r.tokens[kind] for r in results) > 0
    assert idle(after)


def test_queue_depth_shows_a_request_at_work(watched):
    base, generator = watched
    generator.gate.clear()
    generator.reached.clear()
    asking = threading.Thread(target=httpx.post, args=(base + "/chat",), kwargs={"json": {"question": QUESTION},
                                                                                  "timeout": hang_limit(10)})
    asking.start()
    try:
        # the queue counts a request before a model thread takes it; wait until the model holds it
        assert generator.reached.wait(hang_limit(5)), "the request never reached the model"
        seen = scrape(base)
        assert seen[("rigkit_queue_depth", ())] == 1 and seen[("rigkit_requests_running", ())] == 1
    finally:
        generator.gate.set()
        asking.join(hang_limit(10))
    assert not asking.is_alive()
    assert idle(scrape_when(base, idle))  # the job leaves the running set just after its answer is sent
