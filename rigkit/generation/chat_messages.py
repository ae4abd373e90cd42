"""The transcript as chat messages, for a model reached only through `/v1/chat/completions`.

No tokenizer or chat template of the served model is known here, so `render_chat` writes a
private markup of its own: each message is `OPEN role SEP content CLOSE`, in Unicode private-use
characters, and an open assistant turn is `OPEN assistant SEP` with no `CLOSE`. The context
manager renders with it as with any template (append-only, data spans marked `plain`), and
`messages_of` reads the pieces back into messages: markup only counts outside data spans and
outside generated text, so a passage holding these characters stays a passage.

Data spans are sent as text, and the server renders its template around them and tokenises the
whole with special tokens parsed anywhere; its tokenizer is not known here, so the special-token
spellings of the common chat templates (`<|...|>` as in ChatML and Llama 3, `<s>`, `[INST]`,
`<start_of_turn>`, `<think>`) are broken in data with a WORD JOINER, as for text prompts
(`rigkit.generation.text_prompts`): a passage cannot close its message or open a system turn.

Reasoning: `split_reasoning` finds a leading `<think>...</think>` block in generated text (models
that write their reasoning inline); servers that send it apart (`reasoning_content`) need no split.

Token counts without the model's tokenizer: `TokenEstimate` guesses from characters (a rate per
script: Latin text ~4 characters a token, CJK ~1.5 tokens a character) and is corrected after every
call by the server's own count of the prompt (`usage.prompt_tokens`).
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from rigkit.text import CJK
from rigkit.transcript import Piece

__all__ = ["OPEN", "SEP", "CLOSE", "render_markup", "messages_of", "split_reasoning", "TokenEstimate",
           "Reasoning", "neutralize_chat_specials"]

OPEN, SEP, CLOSE = "\ue000", "\ue001", "\ue002"
_CJK = re.compile(f"[{CJK}]")
_SPECIAL = re.compile(r"<\|[^<>|\s]{1,48}\|>|</?s>|\[/?INST\]|\[/?SYSTEM_PROMPT\]|<(?:start|end)_of_turn>|</?think>")
_WORD_JOINER = "\u2060"


def neutralize_chat_specials(text: str) -> str:
    """`text` with the common special-token spellings broken after their first character."""
    for _ in range(4):  # breaking one could in principle leave another
        broken = _SPECIAL.sub(lambda m: m.group(0)[0] + _WORD_JOINER + m.group(0)[1:], text)
        if broken == text:
            return text
        text = broken
    return text
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def render_markup(messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
    """`messages` in the private markup; with `add_generation_prompt` an assistant turn is opened."""
    text = "".join(f"{OPEN}{m['role']}{SEP}{m['content']}{CLOSE}" for m in messages)
    return text + (f"{OPEN}assistant{SEP}" if add_generation_prompt else "")


def messages_of(prompt: Sequence[Piece]) -> list[dict[str, str]]:
    """The chat messages a transcript in the private markup holds; the last one is the open
    assistant turn (its content the draft written since the last passages, maybe empty)."""
    messages: list[dict[str, str]] = []
    state = "between"  # between | role | content
    role, content = [], []

    def close() -> None:
        messages.append({"role": "".join(role), "content": "".join(content)})
        role.clear()
        content.clear()

    for piece in prompt:
        runs = [(piece.text, True)] if piece.token_ids is not None else piece.parts()
        for text, data in runs:
            if data:
                if state != "content":
                    raise ValueError("text outside any chat message in the transcript")
                content.append(text if piece.token_ids is not None else neutralize_chat_specials(text))
                continue
            for ch in text:
                if ch == OPEN:
                    if state == "content":
                        close()  # a turn opened without closing the last: treat as closed
                    state = "role"
                elif ch == SEP and state == "role":
                    state = "content"
                elif ch == CLOSE and state == "content":
                    close()
                    state = "between"
                elif state == "role":
                    role.append(ch)
                elif state == "content":
                    content.append(ch)
    if state == "content":
        close()
    return _alternating(messages)


def _alternating(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """Two turns of one role in a row become one: some templates require roles to alternate. (An
    empty assistant turn, a segment set aside for passages, stays: the completions backend's
    transcript has it too, so both send the model the same conversation.)"""
    out: list[dict[str, str]] = []
    for m in messages:
        if out and out[-1]["role"] == m["role"] and m is not messages[-1]:
            out[-1] = {"role": m["role"], "content": out[-1]["content"] + "\n\n" + m["content"]}
        else:
            out.append(dict(m))
    return out


@dataclass
class Reasoning:
    """Where the answer starts in generated text: `start` (characters), and the reasoning before it."""

    start: int
    text: str
    open: bool  # the reasoning block has not ended yet (nothing after it is answer so far)


def split_reasoning(text: str) -> Reasoning:
    """A leading `<think>...</think>` is reasoning, not answer; everything else is answer."""
    lead = len(text) - len(text.lstrip())
    body = text[lead:]
    if not body or THINK_OPEN.startswith(body):
        return Reasoning(len(text), "", open=bool(body))  # may still become "<think>"
    if not body.startswith(THINK_OPEN):
        return Reasoning(0, "", open=False)
    end = body.find(THINK_CLOSE)
    if end < 0:
        return Reasoning(len(text), body[len(THINK_OPEN):], open=True)
    after = lead + end + len(THINK_CLOSE)
    rest = text[after:]
    after += len(rest) - len(rest.lstrip())  # the line break after the block is not the answer's
    return Reasoning(after, body[len(THINK_OPEN):end].strip(), open=False)


@dataclass
class TokenEstimate:
    """Tokens of a text guessed from its characters, scaled by what the server counted."""

    latin_chars_per_token: float = 4.0
    cjk_tokens_per_char: float = 1.5
    scale: float = 1.0
    calls: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def raw(self, text: str) -> float:
        cjk = len(_CJK.findall(text))
        return (len(text) - cjk) / self.latin_chars_per_token + cjk * self.cjk_tokens_per_char

    def count(self, text: str) -> int:
        return math.ceil(self.raw(text) * self.scale) if text else 0

    def correct(self, text: str, server_count: int) -> None:
        """The server counted `server_count` tokens for `text`: move the scale towards that
        (a running mean over the calls, so one odd prompt does not swing it)."""
        raw = self.raw(text)
        if raw <= 0 or server_count <= 0:
            return
        with self._lock:
            self.calls += 1
            self.scale += (server_count / raw - self.scale) / min(self.calls, 20)
