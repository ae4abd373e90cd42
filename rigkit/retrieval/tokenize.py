"""Language-aware tokenisation for BM25 (English word tokens + stop words, jieba for Chinese).

English follows bm25s's default tokenizer exactly (regex ``\\b\\w\\w+\\b``, lowercased, bm25s's
English stop words), which is what reproduces the reference retrieval figures. A text that
contains Han ideographs goes through `jieba` instead: bm25s's regex would keep a whole Chinese
sentence as one token. Both paths lowercase first, so "KL320" in an English query matches "kl320"
in a Chinese document; Chinese function words ("是", "的") are dropped with bm25s's Chinese
stop-word list so they cannot outrank a model-code match. The script is chosen per text.
Only Han runs go to jieba (not kana): the tokens are pinned by `TOKENIZER_VERSION`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from rigkit.text import HAN, cjk_words, has_cjk, stop_words

__all__ = ["TOKENIZER_VERSION", "tokenize", "tokenize_many"]

# Recorded in index manifests: change it whenever tokens for the same text would change.
TOKENIZER_VERSION = "rigkit-bm25-tokens-2"

_WORD = re.compile(r"(?u)\b\w\w+\b")  # bm25s's default token pattern
_HAN_RUN = re.compile(f"([{HAN}]+)")


def tokenize(text: str) -> list[str]:
    """BM25 tokens of one text: lowercased words without stop words, jieba for Chinese."""
    english, chinese = stop_words("en", source="bm25s"), stop_words("zh", source="bm25s")
    text = text.lower()
    if not has_cjk(text, kana=False):
        return [t for t in _WORD.findall(text) if t not in english]
    tokens: list[str] = []
    # Runs of Han ideographs go to jieba; everything between them ("KL320", "Dúgū", "Apache")
    # gets exactly the English treatment, so mixed texts keep bm25s's Latin tokens.
    for run in _HAN_RUN.split(text):
        if not run:
            continue
        if has_cjk(run, kana=False):
            # Single characters are words in Chinese, so no length floor here.
            tokens.extend(w for w in cjk_words(run) if w.strip() and w not in chinese)
        else:
            tokens.extend(t for t in _WORD.findall(run) if t not in english)
    return tokens


def tokenize_many(texts: Iterable[str]) -> list[list[str]]:
    return [tokenize(t) for t in texts]
