"""What the `/retrieve` caps cost: one call at the limits (256 queries, `topk` 100) against one
query at the default `topk` 3, through the searcher every `/retrieve` and `rig.search` call uses
(the demo index, hybrid retrieval, the default embedding model), with the JSON reply built.

    .venv/bin/python bench/retrieve_caps.py
"""

from __future__ import annotations

import json
import time

from common import ROOT, parser  # (also puts the source tree on sys.path)

from rigkit.build import build_retriever
from rigkit.config import RetrievalConfig
from rigkit.retrieval.remote import search_result
from rigkit.serve.schemas import MAX_QUERIES
from rigkit.serve.searcher import SharedSearcher


def _questions() -> list[str]:
    rows = [json.loads(line) for line in (ROOT / "data" / "demo" / "questions.jsonl").read_text().splitlines()
            if line.strip()]
    texts = [r["question"] for r in rows]
    return [f"{texts[i % len(texts)]} ({i})" for i in range(MAX_QUERIES)]  # distinct: no cache hits


def _timed(searcher: SharedSearcher, queries: list[str], top_k: int) -> float:
    started = time.perf_counter()
    json.dumps(search_result(searcher.search_many(queries, top_k), True))
    return time.perf_counter() - started


def main() -> None:
    parser(__doc__).parse_args()
    searcher = SharedSearcher(build_retriever(RetrievalConfig()))
    queries = _questions()
    _timed(searcher, queries[:2], 3)  # load the models and the index
    one = min(_timed(searcher, [q], 3) for q in queries[:3])
    full = _timed(searcher, queries, 100)
    print(f"1 query, topk 3: {one:.3f} s")
    print(f"{MAX_QUERIES} queries, topk 100: {full:.2f} s ({full / one:.0f}x one query)")


if __name__ == "__main__":
    main()
