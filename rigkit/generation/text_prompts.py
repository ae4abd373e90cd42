"""Prompts as text, for servers that take no token ids (llama.cpp's server tokenises the string).

In-process and over token-id prompts, document text is tokenised with special-token parsing off
(`rigkit.transcript.tokenize_plain`), so `<|im_end|>` in a passage stays six ordinary tokens.
A server that tokenises a text prompt itself parses special tokens anywhere in it, and a passage
could close its own message and open a system turn. So in the prompt's data spans (`Piece.plain`:
passages, the question) every special or added token string of the model's tokenizer is broken
with a WORD JOINER (U+2060) after its first character: it reads the same and matches no token.
The chat template's own markup, outside those spans, keeps its real special tokens.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from rigkit.transcript import Piece

__all__ = ["special_strings", "neutralize_special_tokens", "text_prompt"]

_WORD_JOINER = "\u2060"


def special_strings(tokenizer: Any) -> tuple[str, ...]:
    """Every string the tokenizer turns into one special or added token (longest first)."""
    found = {str(t) for t in getattr(tokenizer, "all_special_tokens", None) or []}
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}  # {id: AddedToken}
    found |= {str(getattr(t, "content", t)) for t in added.values()}
    return tuple(sorted((s for s in found if len(s) > 1), key=len, reverse=True))


def neutralize_special_tokens(text: str, specials: Sequence[str]) -> str:
    """`text` in which none of `specials` occurs: each occurrence gets a WORD JOINER after its
    first character (`<|im_end|>` -> `<\u2060|im_end|>`). Repeated until nothing matches, since
    breaking one string could in principle leave another."""
    if not specials:
        return text
    pattern = re.compile("|".join(map(re.escape, specials)))
    for _ in range(8):
        broken = pattern.sub(lambda m: m.group(0)[0] + _WORD_JOINER + m.group(0)[1:], text)
        if broken == text:
            break
        text = broken
    return text


def text_prompt(prompt: Sequence[Piece], specials: Sequence[str]) -> str:
    """The prompt as one string, with special-token strings neutralised in its data spans."""
    return "".join(
        neutralize_special_tokens(text, specials) if plain else text
        for piece in prompt for text, plain in piece.parts()
    )
