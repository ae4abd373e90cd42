"""Language-aware tokenisation for BM25 (English word tokens + stop words, jieba for Chinese).

English follows bm25s's default tokenizer exactly (regex ``\\b\\w\\w+\\b``, lowercased, bm25s's
English stop words), which is what reproduces the reference retrieval figures. A text that
contains Han ideographs goes through `jieba` instead: bm25s's regex would keep a whole Chinese
sentence as one token. Both paths lowercase first, so "KL320" in an English query matches "kl320"
in a Chinese document; Chinese function words ("是", "的") are dropped with bm25s's Chinese
stop-word list so they cannot outrank a model-code match. The script is chosen per text.
Only Han runs go to jieba (not kana): the tokens are pinned by `TOKENIZER_VERSION`.

Domain terms jieba does not know ("空气净化器" -> 空气 / 净化器) come whole from a user dictionary
(`retrieval.user_dict`, jieba's format: `word [freq] [tag]` a line). Like jieba's own dictionary
it is one per process: `use_user_dict` sets it, for building and querying alike; an index records
its hash (`user_dict_record`) and refuses to open under another (`check_user_dict`).
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from rigkit.errors import IndexMismatchError, InputError
from rigkit.text import HAN, cjk_words, has_cjk, stop_words

__all__ = [
    "TOKENIZER_VERSION",
    "tokenize",
    "tokenize_many",
    "use_user_dict",
    "user_dict_record",
    "check_user_dict",
]

# Recorded in index manifests: change it whenever tokens for the same text would change.
TOKENIZER_VERSION = "rigkit-bm25-tokens-2"

_WORD = re.compile(r"(?u)\b\w\w+\b")  # bm25s's default token pattern
_HAN_RUN = re.compile(f"([{HAN}]+)")
_user_dict: tuple[str, str] | None = None  # (path, sha256 of its bytes) in use; None: jieba's own


def use_user_dict(path: str | Path | None) -> None:
    """Tokenise Chinese with jieba plus the user dictionary at `path` from now on (None: without)."""
    global _user_dict
    if path is None:
        _user_dict = None
        return
    file = Path(path)
    if not file.is_file():
        raise InputError(f"retrieval.user_dict: {file} not found (a jieba dictionary, one "
                         "`word [freq] [tag]` a line)")
    _user_dict = (str(file.resolve()), hashlib.sha256(file.read_bytes()).hexdigest())


def user_dict_record() -> dict[str, Any]:
    """What an index manifest's `bm25` section records of the user dictionary ({} without one)."""
    if _user_dict is None:
        return {}
    return {"user_dict": {"name": Path(_user_dict[0]).name, "sha256": _user_dict[1]}}


def check_user_dict(bm25_manifest: Mapping[str, Any], where: str | Path) -> None:
    """IndexMismatchError unless the index's BM25 tokens used the user dictionary in use now."""
    built = (bm25_manifest.get("user_dict") or {}).get("sha256")
    now = _user_dict[1] if _user_dict else None
    if built != now:
        had = f"user dictionary {bm25_manifest['user_dict']['name']}" if built else "no user dictionary"
        asked = f"{Path(_user_dict[0]).name}" if _user_dict else "none"
        raise IndexMismatchError(
            f"{where}: BM25 tokens were made with {had}, retrieval.user_dict is {asked} "
            f"(or that file changed); set retrieval.user_dict to the index's or rebuild the index"
        )


@lru_cache(maxsize=4)
def _jieba_with(path: str, digest: str):
    """A jieba tokenizer of its own with the user dictionary loaded (the module-level one stays
    as it is for everything else that reads Chinese). `digest` keys the cache to the content."""
    import jieba

    jieba.setLogLevel(logging.WARNING)
    tokenizer = jieba.Tokenizer()
    tokenizer.load_userdict(path)
    return tokenizer


def _chinese_words(run: str) -> list[str]:
    if _user_dict is None:
        return cjk_words(run)
    return _jieba_with(*_user_dict).lcut(run, HMM=True)


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
            tokens.extend(w for w in _chinese_words(run) if w.strip() and w not in chinese)
        else:
            tokens.extend(t for t in _WORD.findall(run) if t not in english)
    return tokens


def tokenize_many(texts: Iterable[str]) -> list[list[str]]:
    return [tokenize(t) for t in texts]
