"""Token-level text for an in-process model: per-token texts, the pause criterion, streaming."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rigkit.generation.stops import find_stop, segment_end
from rigkit.transcript import StopRule, decode_keeping, kept_tag_ids

__all__ = ["StopOnText", "TokenCallbackStreamer", "token_texts", "whole_characters"]


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


class TokenCallbackStreamer:
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
