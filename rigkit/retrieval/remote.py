"""`RemoteRetriever`: search an index served elsewhere (`rigkit serve`'s `POST /retrieve`).

The request/response shape is that of the retrieval servers Search-R1-style training and
evaluation stacks use: `{"queries": [...], "topk": k}` in, `{"result": [[{id, title, text, score},
...], ...]}` out (one list per query), so many generation workers can share one index server.
Requests go through `rigkit.http`: one client, retries on connection errors and busy answers.
A hit that is not an object with text and a numeric score is an error naming the server. What
the hits say is the server's to choose: their ids and texts pass the context manager's checks
like every retriever's (`rigkit.context.held_to_corpus_rules`), not a check of their own here.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from rigkit.errors import RigkitError
from rigkit.http import ServerClient
from rigkit.trace import Hit

__all__ = ["RemoteRetriever", "RemoteRetrievalError", "is_remote"]


class RemoteRetrievalError(RigkitError, ConnectionError):
    """The retrieval server could not be reached or answered something else than hits."""


def is_remote(location: str | None) -> bool:
    """Whether an index location is a retrieval server's URL rather than a folder."""
    return bool(location) and str(location).startswith(("http://", "https://"))


class RemoteRetriever:
    """A `Retriever` whose index lives behind `url` (e.g. http://127.0.0.1:8100/retrieve).

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

    def search(self, query: str, top_k: int = 5) -> list[Hit]:
        return self.search_many([query], top_k)[0]

    def search_many(self, queries: list[str], top_k: int = 5) -> list[list[Hit]]:
        """One request for several queries (how training workers batch their searches)."""
        response = self._client.request("POST", json={"queries": list(queries), "topk": int(top_k)})
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
        return [[self._hit(item) for item in hits] for hits in result]

    def _hit(self, item: Any) -> Hit:
        try:
            if not isinstance(item, dict):
                raise TypeError("not an object")
            chunk_id = str(item.get("id", ""))
            return Hit(
                chunk_id=chunk_id,
                doc_id=str(item.get("doc_id", chunk_id)),
                title=str(item.get("title", "")),
                text=str(item.get("text", item.get("contents", ""))),
                score=_number(item.get("score", 0.0)),
                ranks={"remote": int(item["rank"])} if "rank" in item else {},
            )
        except (TypeError, ValueError) as err:
            shown = " ".join(json.dumps(item, default=str)[:120].split())
            raise RemoteRetrievalError(f"the retrieval server at {self.url} sent the hit {shown} ({err})") from None


def _number(value: Any) -> float:
    score = float(value)  # a number or its text; anything else raises
    if isinstance(value, bool) or not math.isfinite(score):
        raise ValueError(f"score {value!r} is not a finite number")
    return score
