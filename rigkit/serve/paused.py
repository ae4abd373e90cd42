"""Client-tool runs paused at a search, kept until the client's results come back.

`PausedRuns` keeps each paused `rigkit.controller.Run` under the ids of the calls it asked for (at
most `MAX_PAUSED` ids, each for `PAUSED_SECONDS`); `take` hands it to the one continuation that
answers them. `PerNeedQueries` wraps a run's query builder so a round with several needs asks for
one call per need.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import OrderedDict
from typing import Any

from rigkit.serve.schemas import RequestError
from rigkit.trace import Hit

__all__ = ["PausedRuns", "PerNeedQueries", "SPLIT_QUERY_MODES", "MAX_PAUSED", "PAUSED_SECONDS"]

MAX_PAUSED = 256  # tool call ids of paused runs kept; the oldest go first
PAUSED_SECONDS = 900.0  # how long a paused run waits for its tool results


class PausedRuns:
    """Paused runs by call id, with the hits of the searches the server ran for the same round."""

    def __init__(self) -> None:
        self._runs: OrderedDict[str, tuple[float, str, Any, list[Hit]]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._runs)

    def keep(self, run: Any, call_ids: list[str], served: list[Hit]) -> None:
        with self._lock:
            now = time.monotonic()
            for call_id in call_ids:  # a client may answer the calls of one message in any order
                self._runs[call_id] = (now, run.question, run, served)
            while self._runs and (len(self._runs) > MAX_PAUSED
                                  or now - next(iter(self._runs.values()))[0] > PAUSED_SECONDS):
                self._runs.popitem(last=False)

    def take(self, question: str, call_ids: list[str]) -> tuple[Any, list[Hit]] | None:
        """The paused run `call_ids` answer and its served hits (taken: one continuation resumes
        it); None when it is gone. Results for another question's calls are refused (422)."""
        with self._lock:
            found = {id(e[2]): e for c in call_ids if (e := self._runs.get(c)) is not None}
            if len(found) > 1:
                raise RequestError("messages: the tool results answer the calls of different answers; send the "
                                   "results of one assistant message's tool calls", "messages")
            if not found:
                return None
            when, asked, run, served = next(iter(found.values()))
            if asked != question:
                raise RequestError(f"messages: tool call {call_ids[0]!r} was asked for another question "
                                   f"({asked[:80]!r})", "messages")
            for c in [c for c, e in self._runs.items() if e[2] is run]:
                del self._runs[c]
        return None if time.monotonic() - when > PAUSED_SECONDS else (run, served)


# Query builders whose query is made from the decision's intents themselves: several intents
# are several searches. The others (masked, rewrite, attention) search for the whole sentence.
SPLIT_QUERY_MODES = ("marker", "keywords")


class PerNeedQueries:
    """The run's query builder, remembering the last round so its needs can be asked one by one.

    `queries()` builds one query per need of that round (each marker, else each intent, alone),
    distinct and in order; empty when the round has one need or the builder does not split."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.mode = getattr(inner, "mode", "")
        self.last: tuple[Any, ...] | None = None

    def build(self, question: str, draft: str, decision: Any, state: Any = None) -> Any:
        self.last = (question, draft, decision, state)
        return self.inner.build(question, draft, decision, state)

    def queries(self) -> list[str]:
        if self.last is None or self.mode not in SPLIT_QUERY_MODES:
            return []
        question, draft, decision, state = self.last
        needs = _needs(decision)
        if len(needs) < 2:
            return []
        texts: list[str] = []
        for need in needs:
            text = self.inner.build(question, draft, need, state).text.strip()
            if text and text not in texts:
                texts.append(text)
        return texts

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _needs(decision: Any) -> list[Any]:
    """The decision split into one decision per need: per marker, else per intent."""
    markers = [m for m in (decision.evidence.get("markers") or []) if m.get("phrase")]
    if len(markers) > 1:
        return [dataclasses.replace(decision, intents=[m["phrase"]],
                                    evidence={**decision.evidence, "markers": [m]}) for m in markers]
    intents = decision.intents
    if len(intents) > 1:
        aligned = len(decision.spans) == len(intents)
        return [dataclasses.replace(decision, intents=[intent],
                                    spans=[decision.spans[i]] if aligned else list(decision.spans))
                for i, intent in enumerate(intents)]
    return [decision]


