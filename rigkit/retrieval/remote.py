"""The retrieval-server protocol of Search-R1, spoken both ways: `RemoteRetriever` searches an
index served elsewhere, and `search_result` is what `rigkit serve`'s `POST /retrieve` answers.

The protocol is Search-R1's (`search_r1/search/retrieval_server.py`, also what FlashRAG-style
stacks put in front of wiki-18): the request is `{"queries": [...], "topk": k, "return_scores":
bool}`; the response is `{"result": [one list per query]}`, each item `{"document": {...},
"score": s}` when scores are asked for, else the document itself. A document is a corpus row,
`{"id", "contents"}` with the title as the first line of `contents`, in quotes as wiki-18 writes it
(`"Title"\\ntext`); Search-R1's BM25 server adds `title` and `text` and may leave out `id`.
rigkit's server answers that shape and puts its own fields beside, in the document: `doc_id`,
`title`, `text`, `score`, `metadata` (`id` is rigkit's chunk id).

`RemoteRetriever` asks for scores and reads either shape from any such server, rigkit's or
Search-R1's: `title` and `text` where the document has them, else the title and text of
`contents`; a document without an id gets `passage-<hash of its contents>`, so the context still
tells passages apart. Requests go through `rigkit.http`: one client, retries on connection errors
and busy answers. A hit that is not a document with text and a numeric score is an error naming
the server. An id a corpus would refuse (`[[`, `]]`, control characters, over-long) becomes
`passage-<hash>` as the hit is read (`rigkit.corpus.held_to_corpus_rules`, the context manager's
rule too), so `/retrieve`, `rig.search` and MCP never pass one on; texts pass the context
manager's checks like every retriever's.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Sequence
from typing import Any

from rigkit.corpus import held_to_corpus_rules, split_contents
from rigkit.errors import UpstreamError
from rigkit.http import ServerClient
from rigkit.retrieval.filters import Filters, parse_filters
from rigkit.trace import Hit

__all__ = ["RemoteRetriever", "RemoteRetrievalError", "is_remote", "search_result", "hit_document"]


class RemoteRetrievalError(UpstreamError, ConnectionError):
    """The retrieval server could not be reached or answered something else than hits."""


def is_remote(location: str | None) -> bool:
    """Whether an index location is a retrieval server's URL rather than a folder."""
    return bool(location) and str(location).startswith(("http://", "https://"))


# -- the server's side ---------------------------------------------------------------------------
def hit_document(hit: Hit) -> dict[str, Any]:
    """`hit` as a Search-R1 document (`id`, `contents`), rigkit's own fields beside."""
    title = " ".join(hit.title.split())  # the first line of `contents` is the title: no newline in it
    return {"id": hit.chunk_id, "contents": f'"{title}"\n{hit.text}', "doc_id": hit.doc_id,
            "title": hit.title, "text": hit.text, "score": hit.score, "metadata": hit.metadata}


def search_result(hits: Sequence[Sequence[Hit]], return_scores: bool) -> dict[str, Any]:
    """The `/retrieve` response for hits per query: Search-R1's `{"result": [...]}`."""
    def item(hit: Hit) -> dict[str, Any]:
        document = hit_document(hit)
        return {"document": document, "score": hit.score} if return_scores else document

    return {"result": [[item(hit) for hit in per_query] for per_query in hits]}


# -- the client's side ---------------------------------------------------------------------------
class RemoteRetriever:
    """A `Retriever` whose index lives behind `url` (e.g. http://127.0.0.1:8100/retrieve): a
    `rigkit serve` or any server speaking Search-R1's retrieval protocol (module docstring).

    `api_key_env` names an environment variable holding a bearer token for servers started
    with `--api-key-env`.
    """

    name = "remote"

    def __init__(self, url: str, timeout: float = 30.0, api_key_env: str | None = None,
                 retries: int = 4, backoff: float = 0.5, transport: Any = None):
        if not is_remote(url):
            raise RemoteRetrievalError(f"not an http(s) URL: {url!r}")
        self.url, self.timeout = url, timeout
        self.api_key = os.environ.get(api_key_env) if api_key_env else os.environ.get("RIGKIT_API_KEY")
        self._client = ServerClient(url, name="retrieval server", error=RemoteRetrievalError, api_key=self.api_key,
                                    timeout=timeout, retries=retries, backoff=backoff, transport=transport)

    def close(self) -> None:
        self._client.close()

    def search(self, query: str, top_k: int = 5, filters: Any = None) -> list[Hit]:
        return self.search_many([query], top_k, filters)[0]

    def search_many(self, queries: list[str], top_k: int = 5, filters: Any = None) -> list[list[Hit]]:
        """One request for several queries (how training workers batch their searches).

        `filters` travel as the request's `filters` field; every hit that comes back is checked
        against them, since a server that does not filter (Search-R1's) ignores the field."""
        filters = parse_filters(filters)
        payload: dict[str, Any] = {"queries": list(queries), "topk": int(top_k), "return_scores": True}
        if filters:
            payload["filters"] = filters.to_json()
        response = self._client.request("POST", json=payload)
        try:
            data = response.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise RemoteRetrievalError(f"the retrieval server at {self.url} did not answer JSON ({err})") from None
        result = data.get("result") if isinstance(data, dict) else None
        if not isinstance(result, list) or len(result) != len(queries):
            raise RemoteRetrievalError(
                f"the retrieval server at {self.url} answered something else than {{'result': [one list per query]}}"
            )
        if not all(isinstance(hits, list) for hits in result):
            raise RemoteRetrievalError(f"the retrieval server at {self.url} answered a result that is not a list of hits")
        found = [[self._hit(item) for item in hits] for hits in result]
        if filters:
            self._check_filtered(found, filters)
        return found

    def _check_filtered(self, found: list[list[Hit]], filters: Filters) -> None:
        for hit in (h for hits in found for h in hits):
            if not filters.matches({"doc_id": hit.doc_id, "title": hit.title, **hit.metadata}):
                raise RemoteRetrievalError(
                    f"the retrieval server at {self.url} sent {hit.chunk_id!r}, which fails the filter "
                    f"{filters}: that server does not apply filters (rigkit serve does)")

    def _hit(self, item: Any) -> Hit:
        try:
            if not isinstance(item, dict):
                raise TypeError("not an object")
            document = item.get("document", item)  # {"document": ..., "score": s}, or the document
            if not isinstance(document, dict):
                raise TypeError("its document is not an object")
            title, text = _title_and_text(document)
            chunk_id = str(document["id"]) if document.get("id") not in (None, "") else _stand_in_id(title, text)
            metadata = document.get("metadata")
            return held_to_corpus_rules(Hit(
                chunk_id=chunk_id,
                doc_id=str(document.get("doc_id", chunk_id)),
                title=title,
                text=text,
                score=_number(item.get("score", document.get("score", 0.0))),
                ranks={"remote": int(item["rank"])} if "rank" in item else {},
                metadata=dict(metadata) if isinstance(metadata, dict) else {},
            ))
        except (TypeError, ValueError) as err:
            shown = " ".join(json.dumps(item, default=str)[:120].split())
            raise RemoteRetrievalError(f"the retrieval server at {self.url} sent the hit {shown} ({err})") from None


def _title_and_text(document: dict[str, Any]) -> tuple[str, str]:
    """The document's `title` and `text` where it has them, else those of its `contents`."""
    if "text" in document:
        return str(document.get("title", "")), str(document["text"])
    contents = document.get("contents")
    if not isinstance(contents, str):
        raise TypeError("no 'text' and no 'contents' text")
    title, text = split_contents(contents)
    return str(document.get("title", title)), text


def _stand_in_id(title: str, text: str) -> str:
    # the same passage gets the same id in every answer, so the context's de-duplication works
    return "passage-" + hashlib.sha256(f"{title}\n{text}".encode("utf-8", "surrogatepass")).hexdigest()[:12]


def _number(value: Any) -> float:
    score = float(value)  # a number or its text; anything else raises
    if isinstance(value, bool) or not math.isfinite(score):
        raise ValueError(f"score {value!r} is not a finite number")
    return score
