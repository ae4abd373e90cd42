"""Conversations kept on the server, for clients that send only the new question.

Stateless is the default: a client sends its history with every request. A request that names
`conversation: "new"` gets an id back (`conversation` in the reply); later requests that name it
have its turns put before their own history, and their answer is added to it. Bounds: at most
`max_conversations` (the least recently used goes first), each kept `max_age_s` seconds after its
last turn, holding its newest `MAX_HISTORY_TURNS` turns within `MAX_HISTORY_BYTES` (the per-request
history bounds; the context's own budget then summarises what does not fit). An id that is
unknown or has expired is a 404 naming it.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict

from rigkit.serve.schemas import MAX_HISTORY_BYTES, MAX_HISTORY_TURNS, RequestError

__all__ = ["Conversations", "NEW"]

NEW = "new"  # the id a request gives to start a conversation


class Conversations:
    """Conversation id -> (last use, turns), bounded in number, age and size."""

    def __init__(self, max_conversations: int = 1024, max_age_s: float = 3600.0):
        self.max_conversations, self.max_age_s = max_conversations, max_age_s
        self._turns: OrderedDict[str, tuple[float, list[tuple[str, str]]]] = OrderedDict()
        self._lock = threading.Lock()

    def open(self, conversation: str, param: str = "conversation") -> tuple[str, list[tuple[str, str]]]:
        """The id to answer under and the turns kept so far; `NEW` starts one."""
        with self._lock:
            self._expire(time.monotonic())
            if conversation == NEW:
                return f"conv_{uuid.uuid4().hex[:24]}", []
            kept = self._turns.get(conversation)
        if kept is None:
            minutes = f"{self.max_age_s / 60:g}"
            raise RequestError(f"conversation {conversation[:64]!r} is unknown or expired (kept {minutes} minutes "
                               f"after its last turn); start one with {NEW!r} and send the history again",
                               param, status=404, code="conversation_not_found")
        return conversation, list(kept[1])

    def add(self, conversation: str, question: str, answer: str) -> None:
        """`conversation` gains a turn; its oldest go beyond the size bounds."""
        with self._lock:
            turns = list(self._turns.pop(conversation, (0.0, []))[1]) + [(question, answer)]
            size = sum(len(q.encode()) + len(a.encode()) for q, a in turns)
            while len(turns) > MAX_HISTORY_TURNS or (size > MAX_HISTORY_BYTES and len(turns) > 1):
                q, a = turns.pop(0)
                size -= len(q.encode()) + len(a.encode())
            self._turns[conversation] = (time.monotonic(), turns)
            while len(self._turns) > self.max_conversations:
                self._turns.popitem(last=False)

    def _expire(self, now: float) -> None:
        while self._turns and now - next(iter(self._turns.values()))[0] > self.max_age_s:
            self._turns.popitem(last=False)
