"""Attribution: which passage, if any, supports each sentence of an answer.

A sentence is attributed to a passage sharing content words with it (jieba words for Chinese,
stop words skipped): at least `min_shared` of them and at least `min_share` of the sentence's
content words; among the passages that pass, the one that entered the context last (the one the
sentence was written from), then the one sharing most. A sentence no passage supports gets no
citation. A sentence may only cite a passage that was in context when it was written (`visible`),
so a passage retrieved a round later cannot vouch for it. Citation tags the model wrote itself
(or copied from a passage) are removed first: the answer carries only the tags placed here.

A lexical check, not an entailment model: cheap, deterministic and the same for every system.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from rigkit.text import citation_tag, content_words, has_cjk, sentence_spans, strip_citations
from rigkit.trace import Attribution, Hit

__all__ = ["attribute", "arrival_order", "cite", "written_with", "visible_at", "insert_tags", "source_label"]


def source_label(hit: Hit) -> str:
    """Where a hit comes from, for a person: `handbook.pdf p. 12`, `notes.md § Install`.

    A record of a JSONL file, whose file names no single document, and a hit without a
    `source` (an index built before sources were recorded, a remote server) are named by their
    title, else their document id. A hit from one of several knowledge bases starts with its
    name: `manuals: pump.pdf p. 3`."""
    meta = hit.metadata or {}
    source = meta.get("source")
    label = source if isinstance(source, str) and hit.doc_id == source else hit.title or hit.doc_id
    if meta.get("page") is not None:
        label += f" p. {meta['page']}"
    if meta.get("section"):
        label += f" § {meta['section']}"
    return f"{hit.source}: {label}" if hit.source else label


def attribute(
    answer: str,
    passages: Sequence[Hit],
    visible: Sequence[tuple[int, Collection[str] | None]] = (),
    min_shared: int = 2,
    min_share: float = 0.5,
) -> list[Attribution]:
    """Attribute each sentence of `answer` (citation tags removed) to a supporting passage.

    `visible` lists (offset, chunk ids): from that character offset of the answer on, the text
    was written with those passages in context; sorted by offset. Empty: every passage was. A
    sentence may cite what was in context when its end was written.
    """
    text = strip_citations(answer)
    words = {h.chunk_id: content_words(f"{h.title} {h.text}") for h in passages}
    arrived = arrival_order(passages, visible)
    out = []
    for start, end in sentence_spans(text):
        # what was in context when its last words were written: a sentence finished after passages
        # arrived (a rewind, a marker mid-sentence) may rest on them
        seen = visible_at(max(start, end - 1), visible, words)
        sentence_words = content_words(text[start:end])
        item = Attribution(text[start:end], start, end, visible=seen)
        shared = {cid: len(sentence_words & words[cid]) for cid in seen}
        backing = [cid for cid, n in shared.items() if n >= min_shared and n >= min_share * len(sentence_words)]
        # the newest passage that supports the sentence is the one it was written from: a
        # sentence written after the NOTICE passage arrived rests on it, not on an older passage
        # that shares a word more
        best = max(backing, key=lambda cid: (arrived.get(cid, -1), shared[cid]), default=None)
        if best is not None:
            item.cited, item.shared = best, shared[best]
        out.append(item)
    return out


def arrival_order(passages: Sequence[Hit], visible: Sequence[tuple[int, Collection[str] | None]]) -> dict[str, int]:
    """Rank of each chunk id by when it entered the context (0 first): the piece of `visible`
    where it first shows, then its place there; without `visible`, the order of `passages`."""
    order: dict[str, int] = {}
    for _, ids in visible:
        for cid in ids or ():
            order.setdefault(cid, len(order))
    for hit in passages:
        order.setdefault(hit.chunk_id, len(order))
    return order


def visible_at(
    offset: int, visible: Sequence[tuple[int, Collection[str] | None]], known: dict[str, set[str]]
) -> list[str]:
    """Chunk ids visible to the text at `offset`: those of the last piece starting at or before it."""
    ids: Collection[str] | None = None if not visible else ()
    for start, chunk_ids in visible:
        if start > offset:
            break
        ids = chunk_ids
    return list(known) if ids is None else [cid for cid in ids if cid in known]


def written_with(
    parts: Sequence[tuple[str, Collection[str] | None]], clean: Callable[[str], str]
) -> list[tuple[int, Collection[str] | None]]:
    """Where each raw draft piece starts in the cleaned answer, with the passages it could see.

    `parts` are (raw text, chunk ids in context when it was written) in draft order; `clean` is
    what turns the raw draft into the answer. A piece starts where the cleaned text of the
    pieces before it ends (cleaning is local: markers and spacing). None ids: unknown, so every
    passage counts as visible there (traces older than version 2).
    """
    out: list[tuple[int, Collection[str] | None]] = []
    raw = ""
    for text, ids in parts:
        out.append((len(clean(raw)), ids))
        raw += text
    return out


def cite(
    answer: str,
    passages: Sequence[Hit],
    visible: Sequence[tuple[int, Collection[str] | None]] = (),
    tags: bool = True,
) -> tuple[str, list[str], list[Attribution]]:
    """(answer with a `[[citation:ID]]` after each supported sentence, cited ids, attributions).

    With `tags=False` the answer carries no tags; the ids and attributions are the same.
    """
    text = strip_citations(answer)
    attributions = attribute(text, passages, visible)
    cited = list(dict.fromkeys(a.cited for a in attributions if a.cited))
    if not tags:
        return text, cited, attributions
    return insert_tags(text, attributions), cited, attributions


def insert_tags(text: str, attributions: Sequence[Attribution]) -> str:
    """`text` with a `[[citation:ID]]` after each sentence for what it cites: the passages the
    model cited itself (`model_cites`) when it did, else the attributed one (`cited`)."""
    pieces, cursor = [], 0
    for item in attributions:
        ids = item.model_cites or ([item.cited] if item.cited else [])
        if ids:
            # a space after Latin text; none after CJK punctuation, which is written without one
            space = "" if has_cjk(text[item.end - 1 : item.end]) or text[item.end - 1] in "。！？" else " "
            pieces += [text[cursor : item.end], space, "".join(map(citation_tag, ids))]
            cursor = item.end
    pieces.append(text[cursor:])
    return "".join(pieces)
