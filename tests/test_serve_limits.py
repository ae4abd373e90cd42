"""What one client can make a real server (uvicorn on a loopback port, scripted model) hold or
grow: `/metrics` series under made-up methods and refused requests, JSON-RPC batches, and a
burst of clients on five routes, counted exactly."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from rigkit.serve.app import create_app  # noqa: E402
from tests.conftest import hang_limit  # noqa: E402
from tests.test_search_r1_protocol import serving  # noqa: E402
from tests.test_serve_metrics import delta, idle, scrape, scrape_when  # noqa: E402
from tests.test_serve_protocol import QUESTION, make_service  # noqa: E402

KEY = "s3cret"


@pytest.fixture(scope="module")
def base():
    with serving(create_app(make_service(max_queue=64), mcp=False)) as url:
        yield url


@pytest.fixture(scope="module")
def keyed():
    with serving(create_app(make_service(), api_key=KEY, mcp=False)) as url:
        yield url


# -- /metrics stays bounded -------------------------------------------------------------------------
def test_made_up_methods_share_one_label(base):
    httpx.get(f"{base}/metrics")  # the scrape's own series exist from here on
    size = len(scrape_when(base, lambda s: True) and httpx.get(f"{base}/metrics").content)
    with httpx.Client(timeout=hang_limit(1)) as http:
        for i in range(200):
            assert http.request(f"MADEUP{i}", f"{base}/chat").status_code in (404, 405)
    seen = scrape_when(base, lambda s: sum(v for (name, labels), v in s.items() if name == "rigkit_requests_total"
                                           and ("method", "other") in labels) >= 200)
    counted = {labels: v for (name, labels), v in seen.items() if name == "rigkit_requests_total"
               and ("method", "other") in labels}
    assert sum(counted.values()) == 200 and len(counted) == 1, counted
    assert not any(("method", "MADEUP0") in labels for _, labels in seen)
    # one new counter and one histogram (17 lines), not 200 of each
    assert len(httpx.get(f"{base}/metrics").content) - size < 4_000


def test_refused_requests_add_no_series(keyed):
    auth = {"Authorization": f"Bearer {KEY}"}
    scrape_keyed(keyed, auth)  # a first scrape makes the series of scrapes and of observed requests
    before = scrape_keyed(keyed, auth)
    with httpx.Client(timeout=hang_limit(1)) as http:
        for i in range(100):
            method = ("GET", "POST", f"MADE{i}")[i % 3]
            assert http.request(method, f"{keyed}/no/such/{i}", headers={"Authorization": f"Bearer no{i}"}
                                ).status_code == 401
        assert http.get(f"{keyed}/health", headers={"Host": "evil.example", **auth}).status_code == 421
    after = scrape_keyed(keyed, auth)
    assert delta(after, before, "rigkit_refused_requests_total", reason="key") == 100
    assert delta(after, before, "rigkit_refused_requests_total", reason="host") == 1
    assert set(after) == set(before)  # the same series: none added


def scrape_keyed(base: str, headers: dict[str, str]) -> dict:
    from prometheus_client import parser

    text = httpx.get(f"{base}/metrics", headers=headers).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in parser.text_string_to_metric_families(text) for s in family.samples
            if not s.name.endswith("_bucket")}


# -- JSON-RPC batches ---------------------------------------------------------------------------------
def search(i: int, **params) -> dict:
    return {"jsonrpc": "2.0", "id": i, "method": "rig.search", "params": {"query": "Eiffel Tower", **params}}


def test_a_batch_over_64_calls_is_one_invalid_request_error(base):
    reply = httpx.post(f"{base}/rpc", json=[search(i) for i in range(1000)], timeout=hang_limit(1))
    error = reply.json()["error"]
    assert reply.status_code == 200 and error["code"] == -32600 and reply.json()["id"] is None
    assert "a batch of 1000 calls, over the limit of 64" in error["message"]
    assert error["data"] == {"limit": 64, "calls": 1000}
    answered = httpx.post(f"{base}/rpc", json=[search(i) for i in range(64)], timeout=hang_limit(2)).json()
    assert sorted(r["id"] for r in answered) == list(range(64)) and all("result" in r for r in answered)


def test_a_batch_asking_more_queries_than_one_retrieve_call_is_refused(base):
    batch = [search(i, queries=["Eiffel Tower"] * 200) for i in range(2)]
    error = httpx.post(f"{base}/rpc", json=batch, timeout=hang_limit(1)).json()["error"]
    assert error["code"] == -32600 and "400 queries, over the limit of 256" in error["message"]


# -- a burst ----------------------------------------------------------------------------------------
ROUTES = [
    ("POST", "/chat", {"question": QUESTION}),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": QUESTION}]}),
    ("POST", "/retrieve", {"queries": ["Eiffel Tower"], "topk": 1}),
    ("POST", "/rpc", search(1)),
    ("GET", "/v1/models", None),
]


@pytest.mark.timeout(hang_limit(10))  # every wait below is bounded too: this bounds their sum
def test_a_burst_of_20_clients_loses_nothing_and_is_counted_exactly(base):
    before = scrape(base)

    def client(i: int) -> list[tuple[str, str, int, bool]]:
        outcomes = []
        with httpx.Client(timeout=hang_limit(5)) as http:
            for j in range(5):
                method, route, body = ROUTES[(i + j) % len(ROUTES)]
                r = http.request(method, f"{base}{route}", json=body)
                outcomes.append((method, route, r.status_code, bool(r.content) and "error" not in r.json()))
        return outcomes

    with ThreadPoolExecutor(20) as pool:
        outcomes = [o for per_client in pool.map(client, range(20)) for o in per_client]
    assert len(outcomes) == 100
    assert {status for _, _, status, _ in outcomes} == {200} and all(ok for *_, ok in outcomes), outcomes
    sent = {(m, r): sum(1 for o in outcomes if o[:2] == (m, r)) for m, r, _ in ROUTES}
    assert set(sent.values()) == {20}
    after = scrape_when(base, lambda seen: idle(seen) and all(
        delta(seen, before, "rigkit_requests_total", method=m, route=r, status="200") >= n for (m, r), n in sent.items()))
    for (method, route), n in sent.items():
        assert delta(after, before, "rigkit_requests_total", method=method, route=route, status="200") == n
        assert delta(after, before, "rigkit_request_duration_seconds_count", method=method, route=route) == n
    assert httpx.get(f"{base}/health").json()["queue"] == 0
