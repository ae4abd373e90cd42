"""Token streaming: the model's raw tokens and the controller's rounds, as answer text events.

The generator hands every token to the controller's `on_token` callbacks as it is written, but
that text is tentative: a flagged segment may be regenerated after retrieval (FLARE-style policy),
the stop rule fires one token late (the whitespace after a full stop is generated, then dropped),
and a retrieval marker is not part of the answer. `TokenStream` is a controller callback that
turns both into events a client can show, in one of two documented modes:

- live (`hold=False`): text is sent as the model writes it, markers already stripped, nothing past
  a segment end; when text the client already has is taken back an explicit `retract` event
  carries exactly the characters to remove from the end. `POST /chat` streams this. A reader sees
  each sentence once: a segment set aside to be written again after retrieval stays on screen
  while its rewrite is written, and the rewrite is held until the loop has judged it. Kept, it
  takes the set-aside text's place (a `retract`, then the rewrite); dropped, the set-aside text
  simply stays and one `note` event says so ("kept the earlier sentence: <why>").
- held (`hold=True`): a segment's text is held until the decider has accepted it and then released
  word by word, so a client never sees text that is later taken back and no `retract` is ever
  needed. The OpenAI-compatible stream uses this (its format cannot take text back).

In both modes the concatenated text equals the final answer without citation tags (`RIGResult.
answer` adds `[[citation:ID]]` after sentences; the final `result` event carries that).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rigkit.controller import RoundCallback
from rigkit.generation.stops import find_stop
from rigkit.markers import MarkerProtocol, clean_answer, resolve_protocol
from rigkit.trace import Action, Kept, RoundTrace
from rigkit.transcript import StopRule

__all__ = ["Cancelled", "StreamEvent", "TokenStream", "clean_answer_text", "dropped_rewrite"]


class Cancelled(BaseException):
    """Raised inside a run to stop it (the client went away, or a stop string was written).

    A `BaseException` like `KeyboardInterrupt`: it is control flow, so the controller's
    per-round error handling (which records a failed retrieval and goes on) must not swallow it.
    """


@dataclass
class StreamEvent:
    """`kind` "token": append `text`; "retract": remove `text` (a suffix of what was sent);
    "note": `text` says what the loop did (a dropped rewrite); it is not answer text."""

    kind: str
    text: str


def clean_answer_text(text: str, marker_tag: str | MarkerProtocol = "retrieve") -> str:
    """The answer as the controller reports it: markers stripped, spaces collapsed, trimmed.

    `marker_tag` is a word tag or the run's `MarkerProtocol` (`<answer>` blocks, reflection tokens)."""
    return re.sub(r"[ \t]+", " ", clean_answer(text, _protocol(marker_tag))).strip()


def dropped_rewrite(trace: RoundTrace) -> str:
    """Why `trace` dropped a rewrite and kept the sentence written before it ("" when it did not):
    the reason's headline only, so no sentence of the answer is quoted again."""
    if trace.kept is Kept.SET_ASIDE or (trace.action is Action.GROUND and trace.fallback):
        return (trace.fallback or "the rewrite came back empty").split(":")[0]
    return ""


def _protocol(marker_tag: str | MarkerProtocol) -> MarkerProtocol:
    return resolve_protocol(None, marker_tag) if isinstance(marker_tag, str) else marker_tag


class TokenStream(RoundCallback):
    """A controller callback (`on_round_start`, `on_token`, `on_round_end`) emitting `StreamEvent`s.

    `should_stop()` is checked before every round and every token; when it returns True the run
    is aborted with `Cancelled`, so a disconnected client stops its generation within one token.
    """

    def __init__(
        self,
        emit: Callable[[StreamEvent], None],
        *,
        hold: bool = False,
        marker_tag: str | MarkerProtocol = "retrieve",
        should_stop: Callable[[], bool] | None = None,
    ):
        self.emit, self.hold, self.marker_tag = emit, hold, marker_tag
        self.should_stop = should_stop or (lambda: False)
        self.stop = StopRule(sentence=True, marker_close=_protocol(marker_tag).stop_string)
        self.sent = ""  # the text the client holds now
        self.committed = ""  # the accepted answer text after the last round
        self.raw = ""  # tokens of the segment being written
        self.rewriting = False  # this round writes a segment again: held until the loop judges it
        self.aside = ""  # live: the set-aside segment's text, shown while its rewrite is written

    # -- controller callbacks ------------------------------------------------------------------
    def on_round_start(self, index: int, state: Any) -> None:
        self._check()
        self.raw = ""
        self.rewriting = getattr(state, "rewrite_of", None) is not None

    def on_token(self, text: str) -> None:
        self._check()
        if self.hold or self.rewriting:  # a rewrite shown live and then dropped is a sentence seen twice
            return
        self.raw += text
        cut = find_stop(self.raw, self.stop)  # past a segment end is the token the rule drops
        visible = self.raw if cut is None else self.raw[:cut]
        if self.committed and visible[:1] and not visible[0].isspace():
            visible = " " + visible  # as the draft joins a turn that starts after passages
        self._sync(clean_answer_text(self.committed + visible, self.marker_tag))

    def on_round_end(self, trace: RoundTrace) -> None:
        self.committed, self.raw = trace.draft, ""
        if self.hold:
            self._sync(trace.draft)
            return
        if trace.action is Action.REGENERATE:  # set aside: it stays shown until its rewrite is judged
            text = trace.segment.text
            self.aside = text if not trace.draft or text[:1].isspace() else " " + text
        elif trace.kept is not Kept.WAITING:  # (a go-on turn: the set-aside segment still waits)
            self.aside = ""
        self._sync(clean_answer_text(trace.draft + self.aside, self.marker_tag) if self.aside else trace.draft)
        if why := dropped_rewrite(trace):
            self.emit(StreamEvent("note", f"kept the earlier sentence: {why}"))

    # -- helpers -------------------------------------------------------------------------------
    def _check(self) -> None:
        if self.should_stop():
            raise Cancelled("generation stopped")

    def _sync(self, target: str) -> None:
        """Bring the client's text to `target`: retract what differs, then send the rest."""
        if target == self.sent:
            return
        common = 0
        limit = min(len(self.sent), len(target))
        while common < limit and self.sent[common] == target[common]:
            common += 1
        if common < len(self.sent):
            self.emit(StreamEvent("retract", self.sent[common:]))
        new = target[common:]
        self.sent = target
        if not new:
            return
        for piece in re.findall(r"\s*\S+|\s+$", new) if self.hold else [new]:
            self.emit(StreamEvent("token", piece))
