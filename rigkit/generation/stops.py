"""Where a segment pauses: the stop rule checked on generated text, shared by every backend."""

from __future__ import annotations

import re

from rigkit.transcript import StopRule

__all__ = ["SENTENCE_END", "find_stop"]

# Terminal punctuation followed by whitespace (so "1." or "Apache-2.0" do not end a sentence),
# or CJK terminal punctuation, which needs no space after it.
SENTENCE_END = re.compile(r"[.!?…][\"'”’)\]]*(?=\s)|[。！？]")


def find_stop(text: str, stop: StopRule) -> int | None:
    """Character offset where a segment of `text` should end, or None if it should go on."""
    ends = []
    if stop.marker_close and stop.marker_close in text:
        ends.append(text.index(stop.marker_close) + len(stop.marker_close))
    if stop.sentence and (m := SENTENCE_END.search(text)):
        ends.append(m.end())
    return min(ends) if ends else None
