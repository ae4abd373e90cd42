"""Language-aware tokenisation for BM25 (English word tokens + stop words, jieba for Chinese).

English follows bm25s's default tokenizer exactly (regex ``\\b\\w\\w+\\b``, lowercased, bm25s's
English stop words), which is what reproduces the reference retrieval figures. A text that
contains Chinese characters goes through `jieba` instead: bm25s's regex would keep a whole Chinese
sentence as one token. Both paths lowercase first, so "KL320" in an English query matches "kl320"
in a Chinese document; Chinese function words ("是", "的") are dropped with bm25s's Chinese
stop-word list so they cannot outrank a model-code match. The script is chosen per text.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from functools import lru_cache

__all__ = ["TOKENIZER_VERSION", "has_cjk", "tokenize", "tokenize_many"]

# Recorded in index manifests: change it whenever tokens for the same text would change.
TOKENIZER_VERSION = "rigkit-bm25-tokens-2"

_WORD = re.compile(r"(?u)\b\w\w+\b")  # bm25s's default token pattern
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_CJK_RUN = re.compile(r"([\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+)")


def has_cjk(text: str) -> bool:
    """True if the text holds any CJK ideograph (the per-text script choice)."""
    return _CJK.search(text) is not None


@lru_cache(maxsize=1)
def _stopwords() -> tuple[frozenset[str], frozenset[str]]:
    from bm25s.stopwords import STOPWORDS_CHINESE, STOPWORDS_EN

    return frozenset(STOPWORDS_EN), frozenset(STOPWORDS_CHINESE)


@lru_cache(maxsize=1)
def _jieba():
    import jieba

    jieba.setLogLevel(logging.WARNING)  # its dictionary-loading chatter is not our log
    return jieba


def tokenize(text: str) -> list[str]:
    """BM25 tokens of one text: lowercased words without stop words, jieba for Chinese."""
    english, chinese = _stopwords()
    text = text.lower()
    if not has_cjk(text):
        return [t for t in _WORD.findall(text) if t not in english]
    tokens: list[str] = []
    # Runs of CJK ideographs go to jieba; everything between them ("KL320", "Dúgū", "Apache")
    # gets exactly the English treatment, so mixed texts keep bm25s's Latin tokens.
    for run in _CJK_RUN.split(text):
        if not run:
            continue
        if has_cjk(run):
            # Single characters are words in Chinese, so no length floor here.
            tokens.extend(w for w in _jieba().lcut(run) if w.strip() and w not in chinese)
        else:
            tokens.extend(t for t in _WORD.findall(run) if t not in english)
    return tokens


def tokenize_many(texts: Iterable[str]) -> list[list[str]]:
    return [tokenize(t) for t in texts]
