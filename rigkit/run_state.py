"""A run in progress, saved: `RunState` (JSON) holds what `RIGController.restore` needs to go on.

A saved run comes back from outside, so loading it checks everything (`rigkit.checked`): the
version, every field and its type, the log's operations. The controller then checks that it was
saved by a controller like itself, for the same question (`fingerprint`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from rigkit.checked import SchemaError, checked, loads
from rigkit.errors import RunStateError
from rigkit.trace import TRACE_VERSION, Hit, RoundTrace, SearchRequest, Segment

__all__ = ["RUN_STATE_VERSIONS", "ContextOp", "RunCounters", "RunState"]


@dataclass
class ContextOp:
    """One change a run made to its context: `fit` (room for `reserve` tokens), `accept` a segment,
    `inject` hits, `replace` the last accepted segment with `segment` (a grounded rewrite), `go_on`
    (a turn asking the model to go on from the passages). A saved run's context is rebuilt by
    doing them again, in order."""

    op: str
    reserve: int = 0
    segment: Segment | None = None
    hits: list[Hit] = field(default_factory=list)


@dataclass
class RunCounters:
    """The loop's state between rounds, besides its rounds and context (one `Run`'s)."""

    retrievals: int = 0
    tokens_since_retrieval: int = 0
    generated: int = 0  # answer tokens generated and kept so far
    low_confidence: bool = False
    done: bool = False  # the answer is complete (a restored segment had ended the turn, a repeat was cut)
    ground: bool = False  # the last kept segment is written again under the strict grounding prompt next
    goes_on: bool = True  # another round follows the last one
    warnings: list[str] = field(default_factory=list)  # e.g. a knowledge base that did not answer a search
    searched: list[str] = field(default_factory=list)  # this answer's searches so far (the query guards' memory)
    pre_draft: str | None = None  # the draft and flagged segment before the first retrieval


RUN_STATE_VERSIONS = (5, TRACE_VERSION)  # run states saved before 5 carry no fingerprint: not restored


@dataclass
class RunState:
    """A run in progress, paused at a search or between rounds: saved as JSON, restored by
    `RIGController.restore` over the same parts (the log rebuilds the context; no model call).

    Loading checks every field's type; `fingerprint` names the controller and question it was
    saved from, and `restore` refuses it over any other."""

    question: str
    passages: list[Hit] = field(default_factory=list)  # given before the question (plain RAG)
    history: list[list[str]] = field(default_factory=list)  # earlier (question, answer) turns
    rounds: list[RoundTrace] = field(default_factory=list)
    request: SearchRequest | None = None  # the search it waits on
    waiting: RoundTrace | None = None  # the round that asked for it, finished once the hits come
    counters: RunCounters = field(default_factory=RunCounters)
    pending: Segment | None = None  # a segment set aside to be written again
    evicted: list[str] = field(default_factory=list)
    log: list[ContextOp] = field(default_factory=list)
    fingerprint: str = ""  # the controller's and the question's (`RIGController.fingerprint`)
    version: int = TRACE_VERSION

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(dataclasses.asdict(self), ensure_ascii=False, indent=indent)

    @classmethod
    def from_dict(cls, data: Any) -> RunState:
        """A saved run, every field checked: `RunStateError` (one line) when it is not one."""
        if not isinstance(data, dict):
            raise RunStateError("a saved run is a JSON object")
        version = data.get("version")
        if not isinstance(version, int) or isinstance(version, bool):
            raise RunStateError("a saved run names its version (an integer)")
        if not RUN_STATE_VERSIONS[0] <= version <= RUN_STATE_VERSIONS[1]:
            raise RunStateError(f"a saved run of version {version} cannot be restored by this rigkit "
                                f"(versions {RUN_STATE_VERSIONS[0]} to {RUN_STATE_VERSIONS[1]}): ask the question again")
        try:
            state = checked(cls, data)
        except SchemaError as err:
            raise RunStateError(f"not a saved run: {err}") from None
        if any(len(turn) != 2 for turn in state.history):
            raise RunStateError("not a saved run: each turn of history is a [question, answer] pair")
        if any(op.op not in ("fit", "accept", "inject", "replace", "go_on") or op.op in ("accept", "replace") and op.segment is None
               for op in state.log):
            raise RunStateError("not a saved run: its log holds an operation other than fit, accept (a segment), "
                                "inject, replace (a segment) or go_on")
        if (state.request is None) != (state.waiting is None):
            raise RunStateError("not a saved run: a search waited on comes with the round that asked for it")
        return state

    @classmethod
    def from_json(cls, text: str | bytes) -> RunState:
        try:
            return cls.from_dict(loads(text))
        except SchemaError as err:
            raise RunStateError(f"not a saved run: {err}") from None
