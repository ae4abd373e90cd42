"""The context manager: what the model sees, built as an append-only list of prompt pieces.

Layouts:
- `append` (default): system, question, segment, passages (their own message), next segment...
  Every round only appends, so the generator's KV cache is reused; an eviction re-renders the
  block that held the evicted passage and the cache re-fills from there.
- `prefix`: the passages are rebuilt in front of the question every round, as FLARE and DRAGIN
  do; only the system prompt can be reused.
With an inline marker protocol (Search-R1 `<information>`, R1-Searcher, Self-RAG) a block of
passages goes inside the open assistant turn, between the protocol's result tags, instead of in a
user message of its own: still appended, so the KV cache is reused the same way.

Passages are de-duplicated by chunk id and by a content fingerprint, capped per passage, kept
within `max_retrieval_tokens` (evicting those least related to the draft), and sanitised so that
no passage can open or close a retrieval marker or plant a citation. Every retriever's hits pass
the same checks where they enter the context (`store.py`), so a remote retrieval server or a
notebook's own retriever cannot skip what a local corpus is held to.

Budgets are the same for every system: `max_retrieval_tokens` bounds the tokens the passages
occupy as the model reads them (citation ids, titles, texts, the header and turn tokens of their
message), whether they came up front (plain RAG: the lowest-ranked are dropped first) or were
injected mid-answer. A passage cut to `max_passage_tokens` is listed in `Injection.truncated`.
`fit` keeps system + question + passages + draft + the next segment within the model's context
by evicting injected passages, and refuses with an `InputError` when that is not enough.

Relevance (`rigkit.compression`): `passage_share` can bound the passages by a share of the
model's context; `allocate: score` drops the lowest-scored passage first; `compress` shortens
each passage once on its way in (`Injection.compressed`); `order` sets the reading order within
a block; earlier turns beyond `max_history_tokens` become one summary turn (`history_fit`).

The parts, one module each: `store` (what a passage goes through on its way in, and the passages
seen this question), `layout` (where passages and segments sit), `render` (the prompt pieces and
what the passages cost), `manager` (`ContextManager`: the question, the budget and eviction, over
the three).
"""

from rigkit.context.manager import ContextManager
from rigkit.context.store import fingerprint, held_to_corpus_rules, near_duplicate

__all__ = ["ContextManager", "fingerprint", "near_duplicate", "held_to_corpus_rules"]
