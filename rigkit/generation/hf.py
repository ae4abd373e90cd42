"""Generators: produce the answer one segment at a time, with per-token evidence.

`HFGenerator` runs a Hugging Face causal LM in-process through `model.generate`: pauses are a
`StoppingCriteria` on the decoded tail, per-token log-probabilities and entropies come from the
raw logits (`output_logits=True`: processed scores hold -inf under sampling), and the KV cache is
kept across calls. Each call crops the cache to the longest common prefix of what is cached and
the new prompt, so an append-only transcript pre-fills only its new tokens, a regenerated segment
costs a crop, and a changed prefix (eviction, `prefix` layout) re-fills from the first change.
Every tensor is made on the model's device (`model.device`: the first shard under a
`device_map`), so the same code runs on CPU, CUDA and MPS.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from rigkit.config import DEFAULT_CONTEXT_LIMIT, GeneratorConfig
from rigkit.generation.stops import find_stop, segment_end
from rigkit.trace import Segment
from rigkit.transcript import (
    Piece,
    PieceTokens,
    StopRule,
    decode_keeping,
    encode_transcript,
    kept_tag_ids,
)

__all__ = ["HFGenerator", "StopOnText", "crop_cache", "token_texts"]


class StopOnText:
    """StoppingCriteria: stop once the new tokens reach a segment end (`segment_end`).

    Written by hand because transformers' `stop_strings` matches plain strings, and a sentence
    end is a pattern (punctuation followed by whitespace) that spans tokens. With an `early` rule
    the raw log-probability of each new token is read from the output layer by a forward hook
    (`scores` here are processed, -inf under top-p), `first` being the carried token's logits.
    """

    def __init__(self, tokenizer: Any, prompt_len: int, stop: StopRule, model: Any = None,
                 first: Any = None):
        self.tokenizer, self.prompt_len, self.stop = tokenizer, prompt_len, stop
        self.keep = kept_tag_ids(tokenizer, stop)
        self.texts: list[str] = []  # per new token, as `token_texts` makes them
        self.decoded = ""
        self.logprobs: list[float] = []
        self.steps: list[Any] = [] if first is None else [first]  # next-token logits, oldest first
        self.hook = None
        if stop.early is not None and model is not None:
            self.hook = model.get_output_embeddings().register_forward_hook(
                lambda module, args, out: self.steps.append(out[0, -1].detach().float()))

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        new = input_ids[0, self.prompt_len :].tolist()
        text = decode_keeping(self.tokenizer, new, self.keep)
        if self.stop.early is None:
            done = find_stop(text, self.stop) is not None
        else:
            self._add_tokens(new, text)
            done = segment_end(self.texts, self.logprobs, self.stop) is not None
        return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)

    def _add_tokens(self, new: list[int], text: str) -> None:
        import torch

        while len(self.texts) < len(new):
            i = len(self.texts)
            step = self.steps[i] if i < len(self.steps) else None
            self.logprobs.append(float(torch.log_softmax(step, dim=-1)[new[i]]) if step is not None else 0.0)
            if i < len(new) - 1:  # an older token the criterion did not see (the carried one)
                self.texts.append(token_texts(self.tokenizer, new[: i + 1], self.keep)[-1])
                self.decoded = "".join(self.texts)
                continue
            if text.endswith("\ufffd"):  # an incomplete multi-byte character: wait for the rest
                self.texts.append("")
                continue
            self.texts.append(text[len(self.decoded):])
            self.decoded = text

    def close(self) -> None:
        if self.hook is not None:
            self.hook.remove()


class HFGenerator:
    """An in-process transformers causal LM with a KV cache kept across rounds."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        spec: str = "",
        source: str = "",
        use_cache: bool = GeneratorConfig.use_cache,
        temperature: float = GeneratorConfig.temperature,
        top_p: float = GeneratorConfig.top_p,
    ):
        self.model, self.tokenizer = model.eval(), tokenizer
        self.spec, self.source = spec, source
        self.use_cache, self.temperature, self.top_p = use_cache, temperature, top_p
        self.eos_token_ids = _eos_ids(model, tokenizer)
        self._cache: Any = None
        self._cache_ids: list[int] = []  # the token ids whose keys/values the cache holds
        self._last_prompt_ids: list[int] = []
        # (segment, the prompt ids it continued), newest last: model internals are computed for
        # the segment asked about, not for whichever segment happens to be the last one.
        self._history: list[tuple[Segment, list[int]]] = []
        self._piece_tokens = PieceTokens(tokenizer)  # scaffold text, tokenised once
        self._internals_key: tuple[int, ...] | None = None
        self._internals: tuple[list[list[float]], list[float]] | None = None
        self._cache_kwarg = _cache_kwarg_name(model)
        # The token a stopped segment generated past its end (the stop rule needs the whitespace
        # after a full stop) and its logits, for the prompt that segment ends: when the next call
        # continues exactly that prompt, this token is its first, without a forward pass.
        self._carry: tuple[list[int], int, Any] | None = None
        self.carried: list[int] = []  # the tokens the latest call started with, carried over

    @property
    def device(self) -> Any:
        """Where input tensors go: the model's (first) device."""
        return self.model.device

    @property
    def dtype(self) -> str:
        return str(self.model.dtype).removeprefix("torch.")

    @property
    def context_limit(self) -> int:
        """The model config's `max_position_embeddings`; `DEFAULT_CONTEXT_LIMIT` when it has none."""
        stated = getattr(self.model.config, "max_position_embeddings", None)  # not every architecture names it
        return int(stated or DEFAULT_CONTEXT_LIMIT)

    # -- the Generator protocol ------------------------------------------------------------
    def next_segment(
        self, prompt: Sequence[Piece], stop: StopRule, max_new_tokens: int,
        on_token: Callable[[str], None] | None = None,
    ) -> Segment:
        import torch
        from transformers import StoppingCriteriaList

        ids = self.encode(prompt)
        carry, self._carry = self._carry, None
        if not (carry and self.use_cache and max_new_tokens > 1 and carry[0] == ids):
            carry = None
        first = [carry[1]] if carry else []  # fed as input: the model goes on after it
        self.carried = first
        reused = self._prepare_cache(ids + first)
        kwargs = self._sampling_kwargs()
        if on_token is not None:
            kwargs["streamer"] = _TokenCallbackStreamer(self.tokenizer, on_token, first)
        if self.use_cache:
            kwargs[self._cache_kwarg] = self._cache
        inputs = ids + first
        criterion = StopOnText(self.tokenizer, len(ids), stop, self.model, carry[2] if carry else None)
        try:
            with torch.no_grad():
                out = self.model.generate(
                    input_ids=torch.tensor([inputs], device=self.device),
                    attention_mask=torch.ones(1, len(inputs), dtype=torch.long, device=self.device),
                    max_new_tokens=max_new_tokens - len(first),
                    stopping_criteria=StoppingCriteriaList([criterion]),
                    return_dict_in_generate=True,
                    output_logits=True,
                    eos_token_id=self.eos_token_ids,
                    pad_token_id=self.eos_token_ids[0],
                    **kwargs,
                )
        finally:
            criterion.close()
        new_ids = out.sequences[0, len(ids) :].tolist()  # the carried token first
        steps = [step[0].float() for step in out.logits]
        logits = torch.stack([carry[2], *steps] if carry else steps)  # (n_new, vocab)
        if self.use_cache:
            returned = getattr(out, self._cache_kwarg, None)  # the same object, grown
            self._cache = returned if returned is not None else self._cache
            self._cache_ids = (ids + new_ids)[: self._cache.get_seq_length()]
        self._last_prompt_ids = ids
        segment = self._to_segment(new_ids, logits, stop, max_new_tokens)
        segment.tokens_prefilled, segment.tokens_reused = len(inputs) - reused, reused
        keep = len(segment.token_ids)
        if segment.finish_reason == "stop" and keep < len(new_ids) and new_ids[keep] not in self.eos_token_ids:
            self._carry = (ids + new_ids[:keep], new_ids[keep], logits[keep].detach().clone())
        self._history = self._history[-31:] + [(segment, ids)]
        return segment

    def generate(self, prompt: str, max_new_tokens: int = 48) -> str:
        """One greedy helper reply to `prompt` as a user message; the run's cache is untouched."""
        import torch

        text = self.render_chat([{"role": "user", "content": prompt}], add_generation_prompt=True)
        ids = self.tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids.to(self.device)
        self.carried = []
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

    def score_continuations(
        self, prompts: Sequence[str], continuations: Sequence[str], batch_size: int = 8,
    ) -> list[float]:
        """Mean log-probability per token of each continuation after its prompt, (n,).

        Plain text, no chat template (query likelihood works for base and instruct models).
        Batched forward passes without the run's cache: rows are left-padded so every
        continuation ends its row, positions follow the attention mask (padding does not shift
        them, so a batched score equals the one-by-one score), and only the continuation's
        logits are computed where the model takes `logits_to_keep`.
        """
        import torch

        if len(prompts) != len(continuations):
            raise ValueError(f"{len(prompts)} prompts but {len(continuations)} continuations")
        rows = [
            (self.tokenizer(p).input_ids, self.tokenizer(c, add_special_tokens=False).input_ids)
            for p, c in zip(prompts, continuations)
        ]
        if any(not cont for _, cont in rows):
            raise ValueError("every continuation needs at least one token")
        keep_kwarg = "logits_to_keep" in inspect.signature(self.model.forward).parameters
        # batches of similar length waste little on padding; scores go back in the given order
        order = sorted(range(len(rows)), key=lambda i: len(rows[i][0]) + len(rows[i][1]))
        scores = [0.0] * len(rows)
        for start in range(0, len(rows), max(1, batch_size)):
            where = order[start : start + batch_size]
            batch = [rows[i] for i in where]
            width = max(len(p) + len(c) for p, c in batch)
            tail = max(len(c) for _, c in batch) + 1  # logits that predict any continuation token
            pad = self.eos_token_ids[0]
            ids = torch.tensor([[pad] * (width - len(p) - len(c)) + p + c for p, c in batch],
                               device=self.device)  # (b, width)
            mask = torch.tensor([[0] * (width - len(p) - len(c)) + [1] * (len(p) + len(c))
                                 for p, c in batch], device=self.device)
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            extra = {"logits_to_keep": tail} if keep_kwarg else {}
            with torch.inference_mode():
                logits = self.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                                    use_cache=False, **extra).logits[:, -tail:].float()  # (b, tail, vocab)
            logprobs = torch.log_softmax(logits[:, :-1], dim=-1)  # position i predicts token i + 1
            for row, (i, (_, cont)) in enumerate(zip(where, batch)):
                target = torch.tensor(cont, device=logprobs.device)
                picked = logprobs[row, -len(cont):].gather(-1, target[:, None]).squeeze(-1)  # (n,)
                scores[i] = float(picked.mean())
        return scores

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
        `segment` must be one this generator produced since its last `reset`.
        """
        return self._segment_internals(segment)[0]

    def segment_hidden_state(self, segment: Segment) -> list[float]:
        """Mean-pooled last-layer hidden state of `segment`'s tokens, (hidden_size,)."""
        return self._segment_internals(segment)[1]

    def reset(self, seed: int | None = None) -> None:
        """Forget the cache (a new question) and reseed sampling."""
        import torch

        self._cache, self._cache_ids, self._history, self._carry = None, [], [], None
        if seed is not None:
            torch.manual_seed(seed)

    # -- helpers ---------------------------------------------------------------------------
    def encode(self, prompt: Sequence[Piece]) -> list[int]:
        """Token ids of the prompt: generated pieces verbatim, text pieces tokenised once."""
        return encode_transcript(prompt, self.tokenizer, self._piece_tokens)

    def _prepare_cache(self, ids: list[int]) -> int:
        """Crop the cache to what the new prompt shares with it; return tokens reused."""
        from transformers import DynamicCache

        if not self.use_cache:
            return 0
        if self._cache is None:
            self._cache, self._cache_ids = DynamicCache(), []
        shared = _shared_prefix(self._cache_ids, ids, limit=len(ids) - 1)  # generate needs >= 1 new token
        crop_cache(self._cache, shared)
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
        kept_ids = kept_tag_ids(self.tokenizer, stop)
        texts = token_texts(self.tokenizer, new_ids, kept_ids)
        keep = whole_characters(self.tokenizer, new_ids, texts, kept_ids)  # a cut character: the next segment writes it whole
        all_lp = torch.log_softmax(logits[: len(new_ids)], dim=-1)  # (n, vocab)
        chosen = torch.tensor(new_ids, dtype=torch.long, device=all_lp.device)
        token_lp = all_lp[torch.arange(len(new_ids), device=all_lp.device), chosen]
        end = segment_end(texts, token_lp.tolist(), stop)
        if end is not None:
            # The criterion fires one token late (it needs the whitespace after the full stop, or
            # the start of the next word); drop that token: the next segment writes it again.
            finish, keep = "stop", min(end, keep)
        logprobs = all_lp[:keep]  # (keep, vocab)
        token_lp = token_lp[:keep]
        entropy = -(logprobs.exp() * logprobs).nan_to_num().sum(-1)  # (keep,); 0*log0 -> 0
        top2 = logprobs.exp().topk(2, dim=-1).values  # (keep, 2)
        return Segment(
            text="".join(texts[:keep]),
            tokens=texts[:keep],
            token_ids=new_ids[:keep],
            logprobs=token_lp.tolist(),
            entropies=entropy.tolist(),
            margins=(top2[:, 0] - top2[:, 1]).tolist(),
            finish_reason=finish,
        )

    def _prompt_of(self, segment: Segment) -> list[int]:
        """The prompt ids `segment` continued; refuse a segment this generator did not write."""
        for known, prompt in reversed(self._history):
            if known is segment:
                return prompt
        matches = [p for s, p in self._history if s.token_ids == segment.token_ids and s.text == segment.text]
        if len(matches) == 1:  # a copy of a segment we wrote (e.g. a trace loaded back)
            return matches[0]
        raise ValueError(
            f"{self.spec or 'generator'}: model internals are available only for segments this "
            "generator wrote since its last reset; this segment is not one of them"
            + (" (or matches several)" if matches else "")
        )

    def _segment_internals(self, segment: Segment) -> tuple[list[list[float]], list[float]]:
        import torch

        if not segment.token_ids:
            return [], [0.0] * self.model.config.hidden_size
        prefix = self._prompt_of(segment)
        seg_ids = list(segment.token_ids)
        key = tuple(prefix + seg_ids)
        if self._internals_key == key and self._internals is not None:
            return self._internals
        cache, start = self._internals_cache(prefix, seg_ids)
        feed = (prefix + seg_ids)[start:]  # the uncached prefix tail, then the segment
        previous = self.model.config._attn_implementation
        self.model.set_attn_implementation("eager")
        try:
            with torch.no_grad():
                out = self.model(
                    input_ids=torch.tensor([feed], device=self.device),
                    use_cache=True,
                    output_attentions=True,
                    output_hidden_states=True,
                    **{self._cache_kwarg: cache},
                )
        finally:
            self.model.set_attn_implementation(previous)
        if cache is self._cache:
            self._cache_ids = prefix + seg_ids  # the pass appended the segment: reuse it next round
        if not out.attentions or out.attentions[-1] is None:
            raise RuntimeError(f"{self.spec}: the model returned no attention weights")
        n = len(seg_ids)
        attn = out.attentions[-1][0, :, -n:, -n:].mean(0)  # (n, n), averaged over heads
        hidden = out.hidden_states[-1][0, -n:].mean(0)  # (hidden_size,)
        self._internals_key = key
        self._internals = (attn.float().tolist(), hidden.float().tolist())
        return self._internals

    def _internals_cache(self, prefix: list[int], seg_ids: list[int]) -> tuple[Any, int]:
        """A cache holding a prefix of `prefix`, and how many tokens of it are cached.

        With the run's cache on, that cache itself is used: cropped (usually by one token or
        not at all) to what it shares with `prefix`; the extra pass then appends the segment's
        keys and values, exactly what the next round reuses. No copy of the cache is made.
        Without it, a private cache is filled with `prefix` (default attention, linear cost).
        """
        import torch
        from transformers import DynamicCache

        if self.use_cache and self._cache is not None:
            shared = _shared_prefix(self._cache_ids, prefix, limit=len(prefix))
            crop_cache(self._cache, shared)
            self._cache_ids = self._cache_ids[:shared]
            return self._cache, shared
        cache = DynamicCache()
        if prefix:
            with torch.no_grad():
                self.model(
                    input_ids=torch.tensor([prefix], device=self.device),
                    use_cache=True,
                    **{self._cache_kwarg: cache},
                )
        return cache, len(prefix)


def _shared_prefix(cached: list[int], ids: list[int], limit: int) -> int:
    shared, limit = 0, min(len(cached), limit)
    while shared < limit and cached[shared] == ids[shared]:
        shared += 1
    return shared


def crop_cache(cache: Any, length: int) -> None:
    """Keep the first `length` positions (a negative count removes tokens in 4.x and 5.x)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def whole_characters(tokenizer: Any, ids: list[int], texts: list[str], keep: frozenset[int] = frozenset()) -> int:
    """How many leading tokens end on a whole character: trailing tokens holding the first bytes
    of a character the budget cut (their text is "" and the decoded text ends in U+FFFD) wait;
    a skipped special token (also "") is whole."""
    n = len(ids)
    while n and texts[n - 1] == "" and decode_keeping(tokenizer, ids[:n], keep).endswith("\ufffd"):
        n -= 1
    return n


def token_texts(tokenizer: Any, ids: list[int], keep: frozenset[int] = frozenset()) -> list[str]:
    """Per-token text whose concatenation equals the decoded text (multi-byte safe)."""
    texts, previous = [], ""
    for i in range(len(ids)):
        current = decode_keeping(tokenizer, ids[: i + 1], keep)
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


class _TokenCallbackStreamer:
    """A transformers streamer (`put` / `end`) that hands each new token's text to a callback.

    `generate` first puts the prompt ids, which are skipped. Text is decoded from all new ids so
    far, so multi-byte characters split across tokens arrive whole. The callback may raise to
    abort the generation (a client that went away).
    """

    def __init__(self, tokenizer: Any, on_token: Callable[[str], None], first: Sequence[int] = ()):
        self.tokenizer, self.on_token = tokenizer, on_token
        self.ids: list[int] = list(first)  # a carried token: part of the prompt, yet new text
        self.sent = ""
        self.prompt_seen = False

    def put(self, value: Any) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        self.ids.extend(int(i) for i in value.reshape(-1).tolist())
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd") or not text.startswith(self.sent):
            return
        new, self.sent = text[len(self.sent) :], text
        if new:
            self.on_token(new)

    def end(self) -> None:
        pass
