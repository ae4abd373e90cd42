"""Generators: produce the answer one segment at a time, with per-token evidence.

`HFGenerator` runs a Hugging Face causal LM in-process through `model.generate`: pauses are a
`StoppingCriteria` on the decoded tail, per-token log-probabilities and entropies come from the
raw logits (`output_logits=True`: processed scores hold -inf under sampling), and the KV cache is
kept across calls. Each call crops the cache to the longest common prefix of what is cached and
the new prompt, so an append-only transcript pre-fills only its new tokens, a regenerated segment
costs a crop, and a changed prefix (eviction, `prefix` layout) re-fills from the first change.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Sequence
from typing import Any

from rigkit.generation.stops import find_stop
from rigkit.trace import Segment
from rigkit.transcript import Piece, StopRule

__all__ = ["HFGenerator"]


class _StopOnText:
    """StoppingCriteria: stop once the decoded new tokens contain a segment end.

    Written by hand because transformers' `stop_strings` matches plain strings, and a sentence
    end is a pattern (punctuation followed by whitespace) that spans tokens.
    """

    def __init__(self, tokenizer: Any, prompt_len: int, stop: StopRule):
        self.tokenizer, self.prompt_len, self.stop = tokenizer, prompt_len, stop

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        text = self.tokenizer.decode(input_ids[0, self.prompt_len :], skip_special_tokens=True)
        done = find_stop(text, self.stop) is not None
        return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)


class HFGenerator:
    """An in-process transformers causal LM with a KV cache kept across rounds."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        spec: str = "",
        source: str = "",
        use_cache: bool = True,
        temperature: float = 0.0,
        top_p: float = 1.0,
    ):
        self.model, self.tokenizer = model.eval(), tokenizer
        self.spec, self.source = spec, source
        self.use_cache, self.temperature, self.top_p = use_cache, temperature, top_p
        self.eos_token_ids = _eos_ids(model, tokenizer)
        self._cache: Any = None
        self._cache_ids: list[int] = []  # the token ids whose keys/values the cache holds
        self._last_prompt_ids: list[int] = []
        self._piece_ids: dict[str, list[int]] = {}
        self._internals_key: tuple[int, ...] | None = None
        self._internals: tuple[list[list[float]], list[float]] | None = None
        self._cache_kwarg = _cache_kwarg_name(model)

    # -- the Generator protocol ------------------------------------------------------------
    def next_segment(
        self, prompt: Sequence[Piece], stop: StopRule, max_new_tokens: int
    ) -> Segment:
        import torch
        from transformers import StoppingCriteriaList

        ids = self.encode(prompt)
        reused = self._prepare_cache(ids)
        kwargs = self._sampling_kwargs()
        if self.use_cache:
            kwargs[self._cache_kwarg] = self._cache
        with torch.no_grad():
            out = self.model.generate(
                input_ids=torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=max_new_tokens,
                stopping_criteria=StoppingCriteriaList([_StopOnText(self.tokenizer, len(ids), stop)]),
                return_dict_in_generate=True,
                output_logits=True,
                eos_token_id=self.eos_token_ids,
                pad_token_id=self.eos_token_ids[0],
                **kwargs,
            )
        new_ids = out.sequences[0, len(ids) :].tolist()
        logits = torch.stack(out.logits, dim=1)[0].float()  # (n_new, vocab)
        if self.use_cache:
            returned = getattr(out, self._cache_kwarg, None)  # the same object, grown
            self._cache = returned if returned is not None else self._cache
            self._cache_ids = (ids + new_ids)[: self._cache.get_seq_length()]
        self._last_prompt_ids = ids
        segment = self._to_segment(new_ids, logits, stop, max_new_tokens)
        segment.tokens_prefilled, segment.tokens_reused = len(ids) - reused, reused
        return segment

    def generate(self, prompt: str, max_new_tokens: int = 48) -> str:
        """One greedy helper reply to `prompt` as a user message; the run's cache is untouched."""
        import torch

        text = self.render_chat([{"role": "user", "content": prompt}], add_generation_prompt=True)
        ids = self.tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
        with torch.no_grad():
            out = self.model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=self.eos_token_ids,
                pad_token_id=self.eos_token_ids[0],
            )
        return self.tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True).strip()

    def count_tokens(self, text: str) -> int:
        return len(self._piece_tokens(text))

    def render_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    # -- model internals that only an in-process model offers -------------------------------
    def segment_attention(self, segment: Segment) -> list[list[float]]:
        """Last-layer attention among `segment`'s tokens, (n, n), averaged over heads.

        One extra forward pass over the segment's tokens only, through the KV cache of the
        prompt, with eager attention for that pass (SDPA returns no attention weights).
        """
        return self._segment_internals(segment)[0]

    def segment_hidden_state(self, segment: Segment) -> list[float]:
        """Mean-pooled last-layer hidden state of `segment`'s tokens, (hidden_size,)."""
        return self._segment_internals(segment)[1]

    def reset(self, seed: int | None = None) -> None:
        """Forget the cache (a new question) and reseed sampling."""
        import torch

        self._cache, self._cache_ids = None, []
        if seed is not None:
            torch.manual_seed(seed)

    # -- helpers ---------------------------------------------------------------------------
    def encode(self, prompt: Sequence[Piece]) -> list[int]:
        """Token ids of the prompt: generated pieces verbatim, text pieces tokenised once."""
        ids: list[int] = []
        for piece in prompt:
            ids.extend(piece.token_ids if piece.token_ids is not None else self._piece_tokens(piece.text))
        return ids

    def _piece_tokens(self, text: str) -> list[int]:
        if text not in self._piece_ids:
            if len(self._piece_ids) > 4096:
                self._piece_ids.clear()
            self._piece_ids[text] = self.tokenizer(text, add_special_tokens=False).input_ids
        return self._piece_ids[text]

    def _prepare_cache(self, ids: list[int]) -> int:
        """Crop the cache to what the new prompt shares with it; return tokens reused."""
        from transformers import DynamicCache

        if not self.use_cache:
            return 0
        if self._cache is None:
            self._cache, self._cache_ids = DynamicCache(), []
        shared = 0
        limit = min(len(self._cache_ids), len(ids) - 1)  # generate needs >= 1 uncached token
        while shared < limit and self._cache_ids[shared] == ids[shared]:
            shared += 1
        _crop(self._cache, shared)
        self._cache_ids = self._cache_ids[:shared]
        return shared

    def _sampling_kwargs(self) -> dict[str, Any]:
        if self.temperature <= 0:
            return {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
        return {"do_sample": True, "temperature": self.temperature, "top_p": self.top_p, "top_k": None}

    def _to_segment(self, new_ids: list[int], logits: Any, stop: StopRule, limit: int) -> Segment:
        import torch

        finish = "length"
        if new_ids and new_ids[-1] in self.eos_token_ids:
            new_ids, finish = new_ids[:-1], "end_of_turn"
        texts = _token_texts(self.tokenizer, new_ids)
        keep = len(new_ids)
        cut = find_stop("".join(texts), stop)
        if cut is not None:
            # The criterion fires one token late (it needs the whitespace after the full stop);
            # drop that token: the next segment regenerates it from the cache.
            finish, seen = "stop", 0
            for i, piece in enumerate(texts):
                seen += len(piece)
                if seen >= cut:
                    keep = i + 1
                    break
        logprobs = torch.log_softmax(logits[:keep], dim=-1)  # (keep, vocab)
        chosen = torch.tensor(new_ids[:keep], dtype=torch.long)
        token_lp = logprobs[torch.arange(keep), chosen]
        entropy = -(logprobs.exp() * logprobs).sum(-1)  # (keep,)
        return Segment(
            text="".join(texts[:keep]),
            tokens=texts[:keep],
            token_ids=new_ids[:keep],
            logprobs=token_lp.tolist(),
            entropies=entropy.tolist(),
            finish_reason=finish,
        )

    def _segment_internals(self, segment: Segment) -> tuple[list[list[float]], list[float]]:
        import torch

        key = tuple(self._last_prompt_ids + list(segment.token_ids))
        if self._internals_key == key and self._internals is not None:
            return self._internals
        prefix = self._last_prompt_ids
        if not segment.token_ids:
            return [], [0.0] * self.model.config.hidden_size
        cache = self._prefix_cache(prefix)
        previous = self.model.config._attn_implementation
        self.model.set_attn_implementation("eager")
        try:
            with torch.no_grad():
                out = self.model(
                    input_ids=torch.tensor([segment.token_ids]),
                    use_cache=True,
                    output_attentions=True,
                    output_hidden_states=True,
                    **{self._cache_kwarg: cache},
                )
        finally:
            self.model.set_attn_implementation(previous)
        if not out.attentions or out.attentions[-1] is None:
            raise RuntimeError(f"{self.spec}: the model returned no attention weights")
        n = len(segment.token_ids)
        attn = out.attentions[-1][0, :, :, -n:].mean(0)  # (n, n), averaged over heads
        hidden = out.hidden_states[-1][0].mean(0)  # (hidden_size,)
        self._internals_key = key
        self._internals = (attn.float().tolist(), hidden.float().tolist())
        return self._internals

    def _prefix_cache(self, prefix: list[int]) -> Any:
        """A private cache holding exactly `prefix`, copied from the run's cache when possible."""
        import torch
        from transformers import DynamicCache

        if self._cache is not None and self._cache_ids[: len(prefix)] == prefix:
            cache = copy.deepcopy(self._cache)
            _crop(cache, len(prefix))
            return cache
        cache = DynamicCache()
        with torch.no_grad():
            self.model(input_ids=torch.tensor([prefix]), use_cache=True, **{self._cache_kwarg: cache})
        return cache


def _crop(cache: Any, length: int) -> None:
    """Keep the first `length` positions (a negative count removes tokens in 4.x and 5.x)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def _token_texts(tokenizer: Any, ids: list[int]) -> list[str]:
    """Per-token text whose concatenation equals the decoded text (multi-byte safe)."""
    texts, previous = [], ""
    for i in range(len(ids)):
        current = tokenizer.decode(ids[: i + 1], skip_special_tokens=True)
        if current.endswith("\ufffd"):  # an incomplete multi-byte character: wait for the rest
            texts.append("")
            continue
        texts.append(current[len(previous) :])
        previous = current
    return texts


def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    ids = model.generation_config.eos_token_id
    ids = list(ids) if isinstance(ids, (list, tuple)) else ([ids] if ids is not None else [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


def _cache_kwarg_name(model: Any) -> str:
    """transformers 5 renamed `past_key_values` to `cache`; accept both lines."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"
