"""The KV cache an in-process model keeps across rounds, and the token ids it holds.

Each call crops the cache to the longest common prefix of what is cached and the new prompt, so
an append-only transcript pre-fills only its new tokens, a regenerated segment costs a crop, and a
changed prefix (eviction, `prefix` layout) re-fills from the first change.
"""

from __future__ import annotations

import inspect
from typing import Any

__all__ = ["KVCache", "cache_kwarg_name", "crop_cache", "shared_prefix"]


class KVCache:
    """A transformers `DynamicCache` (or none, when disabled) and the ids whose keys/values it holds."""

    def __init__(self, model: Any, enabled: bool):
        self.enabled = enabled
        self.kwarg = cache_kwarg_name(model)
        self.cache: Any = None
        self.ids: list[int] = []

    def prepare(self, ids: list[int]) -> int:
        """Crop the cache to what the new prompt shares with it; return tokens reused."""
        from transformers import DynamicCache

        if not self.enabled:
            return 0
        if self.cache is None:
            self.cache, self.ids = DynamicCache(), []
        return self.crop_to(ids, limit=len(ids) - 1)  # generate needs >= 1 new token

    def crop_to(self, ids: list[int], limit: int | None = None) -> int:
        """Keep the longest prefix shared with `ids` (at most `limit` tokens); return its length."""
        shared = shared_prefix(self.ids, ids, limit=len(ids) if limit is None else limit)
        crop_cache(self.cache, shared)
        self.ids = self.ids[:shared]
        return shared

    def grown(self, out: Any, ids: list[int]) -> None:
        """After `generate`: the cache it returned now holds `ids` (as far as its length)."""
        returned = getattr(out, self.kwarg, None)  # the same object, grown
        self.cache = returned if returned is not None else self.cache
        self.ids = ids[: self.cache.get_seq_length()]

    def reset(self) -> None:
        self.cache, self.ids = None, []


def shared_prefix(cached: list[int], ids: list[int], limit: int) -> int:
    shared, limit = 0, min(len(cached), limit)
    while shared < limit and cached[shared] == ids[shared]:
        shared += 1
    return shared


def crop_cache(cache: Any, length: int) -> None:
    """Keep the first `length` positions (a negative count removes tokens in 4.x and 5.x)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def cache_kwarg_name(model: Any) -> str:
    """transformers 5 renamed `past_key_values` to `cache`; accept both lines."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"
