"""Marker protocols as data: which tags a model writes to ask for retrieval, and how the
passages come back.

Trained retrieval-tag checkpoints each learned their own vocabulary:
- `openrig` (default): `<retrieve>need</retrieve>`, passages as a new user message (the OpenRIG
  design; rigkit's own LoRA adapter writes this format);
- `search-r1` (Jin et al. 2025): `<search>query</search>`, results inline in the assistant turn
  between `<information>` and `</information>`, final answer in `<answer>…</answer>`;
- `r1-searcher` (Song et al. 2025): `<|begin_of_search|>query<|end_of_search|>`, results inline
  between `<|begin_of_documents|>` and `<|end_of_documents|>`;
- `self-rag` (Asai et al. 2024), reduced to its retrieval token: the model writes `[Retrieval]`
  (no phrase: the query comes from the query builder's fallback), one `<paragraph>…</paragraph>`
  block follows inline, and every reflection token (`[No Retrieval]`, `[Relevant]`,
  `[Fully supported]`, `[Utility:5]`, ...) is removed from the answer. The critique tokens are
  not scored: rigkit does not run Self-RAG's segment-level beam search.

A protocol file (YAML or JSON, the same fields as `MarkerProtocol`) describes a new one; the
stop rule, passage neutralisation, answer cleaning, the marker decider and query builder, the
system prompt and the notebook widgets all read the protocol object.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from rigkit.errors import InputError
from rigkit.markers.parsing import check_tags, strip_markers, tidy_spacing, word_tag
from rigkit.prompts import MARKER_SYSTEM_PROMPT

__all__ = [
    "MarkerProtocol",
    "MarkerProtocolError",
    "PRESETS",
    "DEFAULT_PROTOCOL",
    "openrig_style",
    "load_protocol",
    "resolve_protocol",
    "clean_answer",
    "marker_evidence",
    "marker_spec",
    "format_passages",
    "render_results",
]

RESULT_MODES = ("message", "inline")
MAX_TAG_CHARS = 64  # longer than any trained checkpoint's tag (R1-Searcher's are 22)
_TAG_FIELDS = ("open", "close", "results_open", "results_close", "answer_open", "answer_close")
_PASSAGE_FIELDS = {"index": 1, "id": "doc#0", "title": "Title", "text": "text"}


class MarkerProtocolError(InputError):
    """A marker protocol name or file that rigkit cannot use; the message is one line."""


@dataclass(frozen=True)
class MarkerProtocol:
    """One tag vocabulary. `close` "" means the marker is a single token carrying no phrase."""

    name: str
    open: str  # e.g. "<retrieve>"
    close: str = ""  # e.g. "</retrieve>"; generation pauses right after it (or after `open` if "")
    results: str = "message"  # message: passages as a new user message | inline: in the assistant turn
    results_open: str = ""  # inline: e.g. "<information>"
    results_close: str = ""  # inline: e.g. "</information>"
    passage_format: str = "{title}: {text}"  # inline: one passage; fields index, id, title, text
    answer_open: str = ""  # the final answer sits between these when the model writes them
    answer_close: str = ""
    strip: tuple[str, ...] = ()  # other tokens removed from the answer (reflection tokens, <think>)
    system_prompt: Mapping[str, str] = field(default_factory=dict)  # language -> prompt ("en" fallback)
    description: str = ""

    def __post_init__(self) -> None:
        _check(self)

    @property
    def stop_string(self) -> str:
        """The string generation pauses after: matched on text, never on a token id."""
        return self.close or self.open

    @property
    def tags(self) -> tuple[str, ...]:
        """Every tag the model may write: decoded text must keep them even as special tokens."""
        return tuple(t for t in (self.open, self.close, self.results_open, self.results_close,
                                 self.answer_open, self.answer_close) if t)

    @property
    def inline(self) -> bool:
        return self.results == "inline"

    @property
    def tag(self) -> str | None:
        """The word of a `<word>…</word>` protocol ("retrieve"), None for literal tags."""
        return word_tag(self.open, self.close)

    def prompt(self, language: str) -> str:
        """The system prompt that teaches the protocol, in `language` (else English)."""
        prompts = self.system_prompt
        return prompts.get(language) or prompts.get("en") or next(iter(prompts.values()), "")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["strip"], data["system_prompt"] = list(self.strip), dict(self.system_prompt)
        return data

    @classmethod
    def from_dict(cls, data: Any, where: str = "marker protocol") -> MarkerProtocol:
        """Validated construction; every problem is a one-line `MarkerProtocolError`."""
        if not isinstance(data, Mapping):
            raise MarkerProtocolError(f"{where}: expected a mapping of fields, got {type(data).__name__}")
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise MarkerProtocolError(f"{where}: unknown field(s) {', '.join(unknown)}; known: {', '.join(known)}")
        for required in ("name", "open"):
            if not data.get(required):
                raise MarkerProtocolError(f"{where}: field {required!r} is required")
        values = dict(data)
        prompt = values.get("system_prompt", {})
        if isinstance(prompt, str):
            prompt = {"en": prompt}
        if not isinstance(prompt, Mapping) or not all(isinstance(v, str) for v in prompt.values()):
            raise MarkerProtocolError(f"{where}: system_prompt must be a text or a mapping language -> text")
        values["system_prompt"] = dict(prompt)
        strip = values.get("strip", ())
        if isinstance(strip, str) or not all(isinstance(s, str) for s in strip):
            raise MarkerProtocolError(f"{where}: strip must be a list of strings")
        values["strip"] = tuple(strip)
        for name in known:
            if name not in ("strip", "system_prompt") and name in values and not isinstance(values[name], str):
                raise MarkerProtocolError(f"{where}: {name} must be a string, got {type(values[name]).__name__}")
        try:
            return cls(**values)
        except MarkerProtocolError as err:
            raise MarkerProtocolError(f"{where}: {err}") from None


def _check(p: MarkerProtocol) -> None:
    _check_tag_texts(p)  # first: a huge tag would make the parsers below slow to build
    if p.results not in RESULT_MODES:
        raise MarkerProtocolError(f"results must be one of {', '.join(RESULT_MODES)}, got {p.results!r}")
    try:
        check_tags(p)
    except ValueError as err:
        raise MarkerProtocolError(str(err)) from None
    if p.inline and not (p.results_open and p.results_close):
        raise MarkerProtocolError("results: inline needs results_open and results_close")
    if bool(p.answer_open) != bool(p.answer_close):
        raise MarkerProtocolError("answer_open and answer_close go together")
    try:
        _check_widths(p.passage_format)
        p.passage_format.format(**_PASSAGE_FIELDS)
    except (KeyError, IndexError, ValueError) as err:
        shown = p.passage_format if len(p.passage_format) <= 80 else p.passage_format[:80] + "..."
        raise MarkerProtocolError(
            f"passage_format {shown!r} is not a format with fields index, id, title, text ({err})"
        ) from None


MAX_FIELD_WIDTH = 1000  # a passage_format field's width or precision: padding beyond it only wastes context
MAX_FORMAT_CHARS = 500  # a passage_format's own length: its text is repeated for every passage
MAX_FORMAT_FIELDS = 8  # replacement fields in one passage_format


def _check_widths(template: str) -> None:
    """Bound a passage_format before it formats any passage: its length, its number of fields,
    the passage text at most once, field names that are the four fields themselves (no attribute
    or index access: `{text.__class__}`), and no width or precision over `MAX_FIELD_WIDTH`
    (`{text:>100000000}` would pad every passage to 100 MB) nor taken from another field."""
    import string

    if len(template) > MAX_FORMAT_CHARS:
        raise ValueError(f"it is {len(template)} characters long; at most {MAX_FORMAT_CHARS}")
    names = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    if len(names) > MAX_FORMAT_FIELDS:
        raise ValueError(f"it has {len(names)} fields; at most {MAX_FORMAT_FIELDS}")
    if names.count("text") > 1:
        raise ValueError("it holds {text} more than once; every passage would be repeated")
    for _, name, spec, _ in string.Formatter().parse(template):
        if name is None:
            continue
        if name not in _PASSAGE_FIELDS:
            raise ValueError(f"the field {{{name}}} is not one of {', '.join(_PASSAGE_FIELDS)}")
        if not spec:
            continue
        if "{" in spec:
            raise ValueError(f"the field {{{name}:{spec}}} takes its format from another field")
        for number in re.findall(r"\d+", spec):
            if int(number) > MAX_FIELD_WIDTH:
                raise ValueError(f"the field {{{name}:{spec}}} has a width of {int(number)}; "
                                 f"at most {MAX_FIELD_WIDTH}")


def _check_tag_texts(p: MarkerProtocol) -> None:
    """Each tag and `strip` entry short and holding a letter or digit; the tags distinct."""
    named = [(n, getattr(p, n)) for n in _TAG_FIELDS if getattr(p, n)]
    named += [(f"strip[{i}]", token) for i, token in enumerate(p.strip)]
    for name, text in named:
        if not text.strip():
            raise MarkerProtocolError(f"{name} is empty: a tag must be visible text")
        if len(text) > MAX_TAG_CHARS:
            raise MarkerProtocolError(f"{name} is {len(text)} characters long; a tag has at most {MAX_TAG_CHARS}")
        if not any(ch.isalnum() for ch in text):
            raise MarkerProtocolError(f"{name} {text!r} holds no letter or digit: it would match ordinary text")
    seen: dict[str, str] = {}
    for name, text in named[: len(named) - len(p.strip)]:
        if text.lower() in seen:  # tags are matched case-insensitively
            raise MarkerProtocolError(f"{seen[text.lower()]} and {name} tags must differ, both are {text!r}")
        seen[text.lower()] = name


def openrig_style(tag: str = "retrieve") -> MarkerProtocol:
    """rigkit's own protocol, `<tag>need</tag>` with passages as a new message."""
    if not re.fullmatch(r"[\w-]+", tag or ""):
        raise MarkerProtocolError(f"marker tag must be a word, got {tag!r}")
    return MarkerProtocol(
        name="openrig" if tag == "retrieve" else f"openrig-{tag}",
        open=f"<{tag}>",
        close=f"</{tag}>",
        system_prompt={lang: text.format(tag=tag) for lang, text in MARKER_SYSTEM_PROMPT.items()},
        description="rigkit / OpenRIG: the model writes <retrieve>need</retrieve>; passages follow as a message.",
    )


_SEARCH_R1_PROMPT = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time "
    "you get new information. After reasoning, if you find you lack some knowledge, you can call a search "
    "engine by <search> query </search> and it will return the top searched results between <information> "
    "and </information>. You can search as many times as your want. If you find no further external "
    "knowledge needed, you can directly provide the answer inside <answer> and </answer>, without detailed "
    "illustrations. For example, <answer> Beijing </answer>."
)
_R1_SEARCHER_PROMPT = (
    "The User asks a question, and the Assistant solves it. The Assistant first thinks about the reasoning "
    "process in the mind and then provides the User with the final answer. The output format of reasoning "
    "process and final answer are enclosed within <think> </think> and <answer> </answer> tags, "
    'respectively, i.e., "<think> reasoning process here </think><answer> final answer here </answer>". '
    "During the thinking process, the Assistant can perform searching for uncertain knowledge if necessary "
    'with the format of "<|begin_of_search|> search query (only list keywords, such as "keyword_1 '
    'keyword_2 ...")<|end_of_search|>". A query must involve only a single triple. Then, the search system '
    'will provide the Assistant with the retrieval information with the format of "<|begin_of_documents|> '
    '...search results... <|end_of_documents|>".'
)
_SELF_RAG_PROMPT = (
    "You are a careful assistant. Answer the question in a few short, factual sentences. Before a sentence "
    "that needs a fact missing from the context, write [Retrieval] and stop: evidence will follow between "
    "<paragraph> and </paragraph>. When no evidence is needed, write [No Retrieval] and go on."
)
SELF_RAG_TOKENS = (
    "[No Retrieval]", "[Continue to Use Evidence]", "[Relevant]", "[Irrelevant]", "[Fully supported]",
    "[Partially supported]", "[No support / Contradictory]",
    *(f"[Utility:{i}]" for i in range(1, 6)),
)

DEFAULT_PROTOCOL = openrig_style()
PRESETS: dict[str, MarkerProtocol] = {
    "openrig": DEFAULT_PROTOCOL,
    "search-r1": MarkerProtocol(
        name="search-r1", open="<search>", close="</search>", results="inline",
        results_open="<information>", results_close="</information>",
        passage_format="Doc {index}(Title: {title}) {text}",
        answer_open="<answer>", answer_close="</answer>", strip=("<think>", "</think>"),
        system_prompt={"en": _SEARCH_R1_PROMPT},
        description="Search-R1: <search>q</search>, results inline in <information>…</information>.",
    ),
    "r1-searcher": MarkerProtocol(
        name="r1-searcher", open="<|begin_of_search|>", close="<|end_of_search|>", results="inline",
        results_open="<|begin_of_documents|>", results_close="<|end_of_documents|>",
        passage_format="({index}) {title}: {text}",
        answer_open="<answer>", answer_close="</answer>", strip=("<think>", "</think>"),
        system_prompt={"en": _R1_SEARCHER_PROMPT},
        description="R1-Searcher: <|begin_of_search|>q<|end_of_search|>, results in <|begin_of_documents|>…",
    ),
    "self-rag": MarkerProtocol(
        name="self-rag", open="[Retrieval]", results="inline",
        results_open="<paragraph>", results_close="</paragraph>", passage_format="{title}\n{text}",
        strip=SELF_RAG_TOKENS, system_prompt={"en": _SELF_RAG_PROMPT},
        description="Self-RAG retrieval token: [Retrieval] (no phrase), evidence in <paragraph>…</paragraph>.",
    ),
}


def load_protocol(path: str | Path) -> MarkerProtocol:
    """A protocol from a YAML or JSON file (the fields of `MarkerProtocol`)."""
    path = Path(path)
    if not path.is_file():
        raise MarkerProtocolError(f"marker protocol file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise MarkerProtocolError(f"{path}: not UTF-8 text (byte {err.start})") from None
    kind = "JSON" if path.suffix.lower() == ".json" else "YAML"
    try:
        data = json.loads(text) if kind == "JSON" else yaml.safe_load(text)
    except json.JSONDecodeError as err:
        raise MarkerProtocolError(f"{path}:{err.lineno}: not valid JSON: {err.msg} (column {err.colno})") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(err, "problem", None) or str(err).strip().splitlines()[0]
        context = getattr(err, "context", None)
        raise MarkerProtocolError(f"{where}: not valid YAML: {problem}" + (f" ({context})" if context else "")) from None
    return MarkerProtocol.from_dict(data, where=str(path))


def resolve_protocol(spec: str | MarkerProtocol | None = None, tag: str = "retrieve") -> MarkerProtocol:
    """A preset name, a protocol file path or a protocol; `tag` customises the openrig preset."""
    if isinstance(spec, MarkerProtocol):
        return spec
    if spec in (None, "", "openrig"):
        try:
            return DEFAULT_PROTOCOL if tag == "retrieve" else openrig_style(tag)
        except MarkerProtocolError as err:
            raise MarkerProtocolError(f"marker_tag {tag!r}: {err}") from None
    if tag != "retrieve":
        raise MarkerProtocolError(
            f"marker_tag {tag!r} customises the openrig protocol only; protocol {spec!r} names its own tags"
        )
    if spec in PRESETS:
        return PRESETS[spec]
    if Path(spec).suffix.lower() in (".yaml", ".yml", ".json") or Path(spec).exists():
        return load_protocol(spec)
    raise MarkerProtocolError(
        f"unknown marker protocol {spec!r}; presets: {', '.join(PRESETS)}, or a .yaml/.json protocol file"
    )


def marker_evidence(protocol: MarkerProtocol) -> dict[str, str]:
    """What a decision records about its protocol, so a query builder strips the same tags."""
    evidence = {"protocol": protocol.name, "open": protocol.open, "close": protocol.close}
    return {**({"tag": protocol.tag} if protocol.tag else {}), **evidence}


def marker_spec(evidence: Mapping[str, Any]) -> str | tuple[str, str]:
    """The tags a decision's evidence names: (open, close), else its word tag ("retrieve")."""
    if evidence.get("open"):
        return (str(evidence["open"]), str(evidence.get("close") or ""))
    return str(evidence.get("tag") or "retrieve")


def clean_answer(text: str, protocol: MarkerProtocol = DEFAULT_PROTOCOL) -> str:
    """The answer a reader sees: the `<answer>` block when the protocol has one and the model
    wrote it, without markers, result blocks the model wrote itself, or reflection tokens."""
    if protocol.answer_open:
        start = text.lower().rfind(protocol.answer_open.lower())
        if start >= 0:
            inner = text[start + len(protocol.answer_open) :]
            end = inner.lower().find(protocol.answer_close.lower())
            text = inner if end < 0 else inner[:end]
    if protocol.results_open:
        block = re.escape(protocol.results_open) + r".*?(?:" + re.escape(protocol.results_close) + r"|$)"
        text = re.sub(block, " ", text, flags=re.DOTALL | re.IGNORECASE)
    text = strip_markers(text, protocol)
    for token in protocol.strip:
        text = re.sub(re.escape(token), " ", text, flags=re.IGNORECASE)
    return tidy_spacing(text) if protocol.answer_open or protocol.results_open or protocol.strip else text


def format_passages(protocol: MarkerProtocol, passages: Sequence[tuple[str, str, str]]) -> str:
    """Passages `(id, title, text)` in the protocol's `passage_format`, one per line."""
    return "".join(
        protocol.passage_format.format(index=i, id=cid, title=title, text=text) + "\n"
        for i, (cid, title, text) in enumerate(passages, 1)
    )


def render_results(protocol: MarkerProtocol, passages: Sequence[tuple[str, str, str]]) -> str:
    """Passages inline in the assistant turn, between the protocol's result tags (Search-R1:
    `\\n\\n<information>Doc 1(Title: T) text\\n</information>\\n\\n`)."""
    body = format_passages(protocol, passages)
    return f"\n\n{protocol.results_open}{body}{protocol.results_close}\n\n"
