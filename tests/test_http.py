"""The one HTTP client (`rigkit.http`) and the remote retriever on it, against scripted transports:
retries, `Retry-After` and its cap, and one clear error naming the server."""

from __future__ import annotations

import json

import httpx
import pytest

from rigkit.http import MAX_WAIT, ServerClient
from rigkit.retrieval.remote import RemoteRetrievalError, RemoteRetriever

URL = "http://index.test:8100/retrieve"
HITS = [{"id": "eiffel#0", "doc_id": "eiffel", "title": "Eiffel Tower", "text": "Built 1887-1889.", "score": 2.5}]


class Scripted:
    """Answers each request with the next scripted status (or raises it), then with hits."""

    def __init__(self, *failures, retry_after: str = "0"):
        self.failures, self.retry_after = list(failures), retry_after
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.failures:
            failure = self.failures.pop(0)
            if isinstance(failure, Exception):
                raise failure
            return httpx.Response(failure, text="busy", headers={"Retry-After": self.retry_after})
        queries = json.loads(request.content)["queries"]
        return httpx.Response(200, json={"result": [HITS for _ in queries]})


def _retriever(server: Scripted, **kwargs) -> RemoteRetriever:
    return RemoteRetriever(URL, transport=httpx.MockTransport(server), backoff=0.0, **kwargs)


@pytest.fixture
def waits(monkeypatch) -> list[float]:
    """The waits between tries, recorded instead of slept."""
    slept: list[float] = []
    monkeypatch.setattr("time.sleep", slept.append)
    return slept


def test_the_remote_retriever_posts_the_search_r1_shape_and_reads_hits(monkeypatch):
    monkeypatch.setenv("RIGKIT_TEST_INDEX_KEY", "secret")
    server = Scripted()
    hits = _retriever(server, api_key_env="RIGKIT_TEST_INDEX_KEY").search_many(["Eiffel Tower", "Gustave"], 3)
    request = server.requests[0]
    assert str(request.url) == URL and request.method == "POST"  # the URL as given: no slash added
    assert json.loads(request.content) == {"queries": ["Eiffel Tower", "Gustave"], "topk": 3, "return_scores": True}
    assert request.headers["authorization"] == "Bearer secret"
    assert [[h.chunk_id for h in found] for found in hits] == [["eiffel#0"], ["eiffel#0"]]
    assert hits[0][0].title == "Eiffel Tower" and hits[0][0].score == 2.5


def test_a_busy_server_is_retried_honouring_retry_after_up_to_the_cap(waits):
    server = Scripted(503, 429, retry_after="1")
    assert _retriever(server).search("Eiffel Tower")[0].doc_id == "eiffel"
    assert len(server.requests) == 3 and waits == [1.0, 1.0]
    capped = Scripted(503, retry_after=str(int(MAX_WAIT) + 15))  # asked for within the deadline: waited, capped
    _retriever(capped, timeout=MAX_WAIT + 60).search("Eiffel Tower")
    assert waits[-1] == MAX_WAIT


def test_a_retry_after_asking_past_the_deadline_fails_at_once_though_the_cap_would_fit(waits):
    """`Retry-After: 3600` under a 120 s deadline: no 30 s waits that ask again too early."""
    server = Scripted(429, retry_after="3600")
    with pytest.raises(RemoteRetrievalError, match=r"answered 429 and asked for a wait \(Retry-After: 3600\)"):
        _retriever(server, timeout=120).search("Eiffel Tower")
    assert waits == [] and len(server.requests) == 1


def test_a_retry_after_past_the_deadline_is_not_waited_and_the_error_says_429(waits):
    """The deadline is total: a 30 s Retry-After against a 10 s deadline fails at once."""
    server = Scripted(429, retry_after="30")
    with pytest.raises(RemoteRetrievalError, match=r"answered 429 and asked for a wait \(Retry-After: 30\)") as err:
        _retriever(server, timeout=10).search("Eiffel Tower")
    assert waits == [] and len(server.requests) == 1
    assert "no answer within 10 s" in str(err.value) and err.value.status == 429 and err.value.timed_out


def test_connection_errors_are_retried_then_one_error_names_the_server(waits):
    server = Scripted(*[httpx.ConnectError("refused")] * 3)
    with pytest.raises(RemoteRetrievalError, match=rf"cannot reach the retrieval server at {URL} \(ConnectError"):
        _retriever(server, retries=2).search("Eiffel Tower")
    assert len(server.requests) == 3  # 1 try + 2 retries


def test_other_failures_are_one_line_each(waits):
    with pytest.raises(RemoteRetrievalError, match=rf"retrieval server at {URL} answered 500: busy"):
        _retriever(Scripted(500)).search("q")
    assert waits == []  # a 500 is not retried
    with pytest.raises(RemoteRetrievalError, match="refused the request \\(401\\): check the API key"):
        _retriever(Scripted(401)).search("q")
    not_json = httpx.MockTransport(lambda request: httpx.Response(200, text="<html>"))
    with pytest.raises(RemoteRetrievalError, match="did not answer JSON"):
        RemoteRetriever(URL, transport=not_json).search("q")
    wrong_shape = httpx.MockTransport(lambda request: httpx.Response(200, json={"result": []}))
    with pytest.raises(RemoteRetrievalError, match="one list per query"):
        RemoteRetriever(URL, transport=wrong_shape).search("q")


def test_a_timeout_says_how_long_it_waited():
    slow = httpx.MockTransport(lambda request: (_ for _ in ()).throw(httpx.ReadTimeout("slow")))
    client = ServerClient("http://models.test/v1", name="model server", timeout=3, retries=0, transport=slow)
    with pytest.raises(Exception, match=r"the model server at http://models.test/v1/models did not answer within 3 s"):
        client.request("GET", "/models")


def test_environment_proxies_are_honoured_except_where_no_proxy_says(monkeypatch):
    from rigkit.http import _proxy_for

    monkeypatch.setenv("http_proxy", "http://proxy.test:3128")
    monkeypatch.setenv("no_proxy", "localhost,127.0.0.1")
    assert _proxy_for("http://models.example:8000/v1") == "http://proxy.test:3128"
    assert _proxy_for("http://127.0.0.1:8000/v1") is None
