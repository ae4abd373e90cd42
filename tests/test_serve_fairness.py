"""Big search batches share the index with RIG answers: slices in turn, the loop's searches first.

The retriever is scripted and gated: its first batch query blocks until the test lets it go, so
every other search is known to be waiting at that moment. Assertions are on the order in which
the retriever saw the queries, never on times.
"""

from __future__ import annotations

import threading
import time

import pytest

from rigkit.serve.searcher import SEARCH_SLICE, SharedSearcher
from rigkit.trace import Hit
from tests.conftest import ROOT, hang_limit

HIT = Hit("c1", "d1", "Eiffel Tower", "The Eiffel Tower is 330 metres tall and stands in Paris.", 1.0)


class GatedRetriever:
    """Logs each query; the first query of a batch (`batch ...`) waits for `gate`."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.gate, self.entered = threading.Event(), threading.Event()

    def search(self, query: str, top_k: int = 5) -> list[Hit]:
        if query.startswith("batch") and not self.gate.is_set():
            self.entered.set()
            assert self.gate.wait(hang_limit(5)), "the test never opened the gate"
        self.log.append(query)
        return [HIT]


def _wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + hang_limit(5)
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.01)


def _in_thread(fn, *args) -> threading.Thread:
    thread = threading.Thread(target=fn, args=args, daemon=True)
    thread.start()
    return thread


def test_a_rig_search_waits_for_one_slice_of_a_big_batch_not_the_whole_batch():
    inner = GatedRetriever()
    searcher = SharedSearcher(inner)
    batch = _in_thread(searcher.search_many, [f"batch a{i}" for i in range(4 * SEARCH_SLICE)], 3)
    assert inner.entered.wait(hang_limit(5))
    rig = _in_thread(searcher.search, "who designed it", 3)
    _wait_until(lambda: searcher.turns.waiting == 1, "the RIG search waits")
    inner.gate.set()
    batch.join(hang_limit(5))
    rig.join(hang_limit(5))
    assert inner.log.index("who designed it") == SEARCH_SLICE  # right after the slice that was running
    assert len(inner.log) == 4 * SEARCH_SLICE + 1


def test_two_batches_take_their_slices_in_turn():
    inner = GatedRetriever()
    searcher = SharedSearcher(inner)
    first = _in_thread(searcher.search_many, [f"batch a{i}" for i in range(3 * SEARCH_SLICE)], 3)
    assert inner.entered.wait(hang_limit(5))
    second = _in_thread(searcher.search_many, [f"other b{i}" for i in range(2 * SEARCH_SLICE)], 3)
    _wait_until(lambda: searcher.turns.waiting == 1, "the second batch waits")
    inner.gate.set()
    first.join(hang_limit(5))
    second.join(hang_limit(5))
    owners = [q.split()[1][0] for q in inner.log[::SEARCH_SLICE]]  # whose slice ran, slice by slice
    assert owners == ["a", "b", "a", "b", "a"]


def test_each_batch_keeps_its_own_queries_in_order():
    searcher = SharedSearcher(GatedRetriever())
    searcher.inner.gate.set()
    queries = [f"batch {i}" for i in range(2 * SEARCH_SLICE + 3)]
    assert len(searcher.search_many(queries, 3)) == len(queries)
    assert searcher.inner.log == queries


def test_a_remote_index_gets_each_slice_as_one_batch():
    class Remote(GatedRetriever):
        def __init__(self):
            super().__init__()
            self.batches: list[int] = []

        def search_many(self, queries, top_k=5):
            self.batches.append(len(queries))
            return [[HIT] for _ in queries]

    remote = Remote()
    assert len(SharedSearcher(remote).search_many(["q"] * (SEARCH_SLICE + 1), 3)) == SEARCH_SLICE + 1
    assert remote.batches == [SEARCH_SLICE, 1]


def test_a_chat_beside_a_big_retrieve_call_searches_before_the_batch_ends():
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from rigkit.config import RunConfig
    from rigkit.serve.app import create_app
    from rigkit.serve.schemas import MAX_QUERIES
    from rigkit.serve.service import RigService
    from rigkit.testing import ScriptedGenerator, make_segment

    inner = GatedRetriever()
    script = [make_segment("The tower is 330 metres tall.", probs=[0.9, 0.9, 0.9, 0.05, 0.9, 0.9]),
              make_segment("The Eiffel Tower is 330 metres tall.", finish_reason="end_of_turn")]
    service = RigService(RunConfig.from_dict({"decider": {"name": "prob", "threshold": 0.3}}),
                         generator=ScriptedGenerator(script), retriever=inner)
    outcome: dict[str, int] = {}
    with TestClient(create_app(service), base_url="http://127.0.0.1") as client:
        def retrieve() -> None:
            queries = [f"batch {i}" for i in range(MAX_QUERIES)]
            outcome["retrieve"] = client.post("/retrieve", json={"queries": queries, "topk": 1}).status_code

        def chat() -> None:
            outcome["chat"] = client.post("/chat", json={"question": "How tall is the Eiffel Tower?"}).status_code

        batch = _in_thread(retrieve)
        assert inner.entered.wait(hang_limit(5))
        asker = _in_thread(chat)
        _wait_until(lambda: service.retriever.turns.waiting == 1, "the chat's search waits")
        inner.gate.set()
        batch.join(hang_limit(5))
        asker.join(hang_limit(5))
    assert outcome == {"retrieve": 200, "chat": 200}
    rig = [i for i, q in enumerate(inner.log) if not q.startswith("batch")]
    assert rig == [SEARCH_SLICE]  # one RIG search, after one slice of the 256 queries


def test_the_serving_docs_state_the_batch_bound_and_the_slice():
    from rigkit.serve.schemas import MAX_QUERIES

    text = (ROOT / "docs" / "serving.md").read_text(encoding="utf-8")
    assert f"at most {MAX_QUERIES} queries" in text and f"searches {SEARCH_SLICE} at a time" in text
