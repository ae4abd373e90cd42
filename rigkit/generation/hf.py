"""Generators: produce the answer one segment at a time, with per-token evidence.

`HFGenerator` runs a Hugging Face causal LM in-process through `model.generate`: pauses are a
`StoppingCriteria` on the decoded tail, per-token log-probabilities and entropies come from the
raw logits (`output_logits=True`: processed scores hold -inf under sampling), and the KV cache is
kept across calls. Each call crops the cache to the longest common prefix of what is cached and
the new prompt (`hf_cache`).
Every tensor is made on the model's device (`model.device`: the first shard under a
`device_map`), so the same code runs on CPU, CUDA and MPS.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rigkit.config import DEFAULT_CONTEXT_LIMIT, GeneratorConfig
from rigkit.generation.hf_cache import KVCache, crop_cache
from rigkit.generation.hf_internals import SegmentInternals
from rigkit.generation.hf_scoring import score_continuations
from rigkit.generation.hf_tokens import (
    StopOnText,
    TokenCallbackStreamer,
    token_texts,
    whole_characters,
)
from rigkit.generation.stops import segment_end
from rigkit.trace import Segment
from rigkit.transcript import Piece, PieceTokens, StopRule, encode_transcript, kept_tag_ids

__all__ = ["HFGenerator", "StopOnText", "crop_cache", "token_texts", "whole_characters"]

TOP_ALTERNATIVES = 3  # the choices each token records beside its own, shown on hover


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
        self.kv = KVCache(model, use_cache)
        self.internals = SegmentInternals(model, self.kv, spec)
        self._last_prompt_ids: list[int] = []
        self._piece_tokens = PieceTokens(tokenizer)  # scaffold text, tokenised once
        # The token a stopped segment generated past its end (the stop rule needs the whitespace
        # after a full stop) and its logits, for the prompt that segment ends: when the next call
        # continues exactly that prompt, this token is its first, without a forward pass.
        self._carry: tuple[list[int], int, Any] | None = None
        self.carried: list[int] = []  # the tokens the latest call started with, carried over

    @property
    def _cache(self) -> Any:
        """The run's transformers cache (None before the first call or when disabled)."""
        return self.kv.cache

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
        reused = self.kv.prepare(ids + first)
        kwargs = self._sampling_kwargs()
        if on_token is not None:
            kwargs["streamer"] = TokenCallbackStreamer(self.tokenizer, on_token, first)
        if self.use_cache:
            kwargs[self.kv.kwarg] = self.kv.cache
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
            self.kv.grown(out, ids + new_ids)
        self._last_prompt_ids = ids
        segment = self._to_segment(new_ids, logits, stop, max_new_tokens)
        segment.tokens_prefilled, segment.tokens_reused = len(inputs) - reused, reused
        keep = len(segment.token_ids)
        if segment.finish_reason == "stop" and keep < len(new_ids) and new_ids[keep] not in self.eos_token_ids:
            self._carry = (ids + new_ids[:keep], new_ids[keep], logits[keep].detach().clone())
        self.internals.wrote(segment, ids)
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
        """Mean log-probability per token of each continuation after its prompt, (n,) (`hf_scoring`)."""
        return score_continuations(self.model, self.tokenizer, self.eos_token_ids[0], prompts,
                                   continuations, batch_size)

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
        return self.internals.of(segment)[0]

    def segment_hidden_state(self, segment: Segment) -> list[float]:
        """Mean-pooled last-layer hidden state of `segment`'s tokens, (hidden_size,)."""
        return self.internals.of(segment)[1]

    def reset(self, seed: int | None = None) -> None:
        """Forget the cache (a new question) and reseed sampling."""
        import torch

        self.kv.reset()
        self.internals.reset()
        self._carry = None
        if seed is not None:
            torch.manual_seed(seed)

    # -- helpers ---------------------------------------------------------------------------
    def encode(self, prompt: Sequence[Piece]) -> list[int]:
        """Token ids of the prompt: generated pieces verbatim, text pieces tokenised once."""
        return encode_transcript(prompt, self.tokenizer, self._piece_tokens)

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
        top = logprobs.exp().topk(min(TOP_ALTERNATIVES, logprobs.shape[-1]), dim=-1)  # (keep, k)
        top2 = top.values[:, :2]
        alternatives = [{self.tokenizer.decode([i]): round(p, 4) for i, p in zip(ids, probs)}
                        for ids, probs in zip(top.indices.tolist(), top.values.tolist())]
        return Segment(
            text="".join(texts[:keep]),
            tokens=texts[:keep],
            token_ids=new_ids[:keep],
            logprobs=token_lp.tolist(),
            entropies=entropy.tolist(),
            margins=(top2[:, 0] - top2[:, 1]).tolist(),
            alternatives=alternatives,
            finish_reason=finish,
        )


def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    ids = model.generation_config.eos_token_id
    ids = list(ids) if isinstance(ids, (list, tuple)) else ([ids] if ids is not None else [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids
