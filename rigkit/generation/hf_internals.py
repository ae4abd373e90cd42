"""Model internals of a written segment: last-layer attention and hidden state, by one extra pass."""

from __future__ import annotations

from typing import Any

from rigkit.generation.hf_cache import KVCache
from rigkit.trace import Segment

__all__ = ["SegmentInternals"]


class SegmentInternals:
    """The segments a generator wrote (with the prompts they continued) and their internals.

    Internals are computed for the segment asked about, not for whichever segment happens to be
    the last one; the latest answer is memoised, since attention and hidden state come from one
    pass.
    """

    def __init__(self, model: Any, kv: KVCache, spec: str = ""):
        self.model, self.kv, self.spec = model, kv, spec
        self.history: list[tuple[Segment, list[int]]] = []  # (segment, the prompt ids it continued), newest last
        self.key: tuple[int, ...] | None = None
        self.memo: tuple[list[list[float]], list[float]] | None = None

    def wrote(self, segment: Segment, prompt_ids: list[int]) -> None:
        self.history = self.history[-31:] + [(segment, prompt_ids)]

    def reset(self) -> None:
        self.history = []

    def prompt_of(self, segment: Segment) -> list[int]:
        """The prompt ids `segment` continued; refuse a segment this generator did not write."""
        for known, prompt in reversed(self.history):
            if known is segment:
                return prompt
        matches = [p for s, p in self.history if s.token_ids == segment.token_ids and s.text == segment.text]
        if len(matches) == 1:  # a copy of a segment we wrote (e.g. a trace loaded back)
            return matches[0]
        raise ValueError(
            f"{self.spec or 'generator'}: model internals are available only for segments this "
            "generator wrote since its last reset; this segment is not one of them"
            + (" (or matches several)" if matches else "")
        )

    def of(self, segment: Segment) -> tuple[list[list[float]], list[float]]:
        """(attention among the segment's tokens (n, n), mean hidden state (hidden_size,))."""
        import torch

        if not segment.token_ids:
            return [], [0.0] * self.model.config.hidden_size
        prefix = self.prompt_of(segment)
        seg_ids = list(segment.token_ids)
        key = tuple(prefix + seg_ids)
        if self.key == key and self.memo is not None:
            return self.memo
        cache, start = self._cache_for(prefix)
        feed = (prefix + seg_ids)[start:]  # the uncached prefix tail, then the segment
        previous = self.model.config._attn_implementation
        self.model.set_attn_implementation("eager")
        try:
            with torch.no_grad():
                out = self.model(
                    input_ids=torch.tensor([feed], device=self.model.device),
                    use_cache=True,
                    output_attentions=True,
                    output_hidden_states=True,
                    **{self.kv.kwarg: cache},
                )
        finally:
            self.model.set_attn_implementation(previous)
        if cache is self.kv.cache:
            self.kv.ids = prefix + seg_ids  # the pass appended the segment: reuse it next round
        if not out.attentions or out.attentions[-1] is None:
            raise RuntimeError(f"{self.spec}: the model returned no attention weights")
        n = len(seg_ids)
        attn = out.attentions[-1][0, :, -n:, -n:].mean(0)  # (n, n), averaged over heads
        hidden = out.hidden_states[-1][0, -n:].mean(0)  # (hidden_size,)
        self.key = key
        self.memo = (attn.float().tolist(), hidden.float().tolist())
        return self.memo

    def _cache_for(self, prefix: list[int]) -> tuple[Any, int]:
        """A cache holding a prefix of `prefix`, and how many tokens of it are cached.

        With the run's cache on, that cache itself is used: cropped (usually by one token or
        not at all) to what it shares with `prefix`; the extra pass then appends the segment's
        keys and values, exactly what the next round reuses. No copy of the cache is made.
        Without it, a private cache is filled with `prefix` (default attention, linear cost).
        """
        import torch
        from transformers import DynamicCache

        if self.kv.enabled and self.kv.cache is not None:
            return self.kv.cache, self.kv.crop_to(prefix)
        cache = DynamicCache()
        if prefix:
            with torch.no_grad():
                self.model(
                    input_ids=torch.tensor([prefix], device=self.model.device),
                    use_cache=True,
                    **{self.kv.kwarg: cache},
                )
        return cache, len(prefix)
