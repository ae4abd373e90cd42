"""Supervised examples that teach a model to write its own retrieval markers.

Each example is the transcript the RIG controller produces in the `append` layout, built by
driving the real `ContextManager`: system prompt with the marker instruction, the question, the
assistant's text up to the next missing fact, `<retrieve>query</retrieve>`, the gold paragraph for
that fact injected exactly as `ContextManager.inject` renders it, the continuation, and at the end
the short final answer.

Queries come from MuSiQue's `question_decomposition` steps ("Van Hook Township >> located in ...",
or a sub-question) and 2Wiki's `evidences` triples, with `#1` placeholders filled by the previous
step's answer. Negatives teach the model when *not* to ask:
- a step whose answer the question already names is stated, not retrieved;
- `stated`: the first hop's fact is written into the question, so only the later hops are asked;
- `closed`: every hop's fact is in the question, so the answer comes without any marker.

Only questions of the `train` and `dev` splits of `splits.json` are used; asking for `test` is an
error, so a model trained on these files can still be measured on the test split.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from rigkit.build import build_context
from rigkit.config import ContextConfig
from rigkit.context import ContextManager
from rigkit.datasets import load_qa, split_questions
from rigkit.errors import InputError
from rigkit.files import iter_jsonl, write_jsonl_atomic
from rigkit.trace import Hit, Segment

__all__ = [
    "Step",
    "MarkerExample",
    "TRAINABLE_SPLITS",
    "question_steps",
    "render_example",
    "build_examples",
    "build_marker_data",
    "encode_example",
    "end_of_turn",
    "write_examples",
    "read_examples",
    "data_hash",
]

TRAINABLE_SPLITS = ("train", "dev")
KINDS = ("retrieve", "stated", "closed", "single")
_PLACEHOLDER = re.compile(r"#(\d+)")
_WH = re.compile(r"^(who|whom|whose|what|which|when|where|why|how|in what|in which|the)\b", re.I)

# Relation phrasings for MuSiQue "subject >> relation" steps and 2Wiki triples that read badly
# in the generic "the {relation} of {subject}" form: (query, statement).
_RELATIONS = {
    "located in the administrative territorial entity": ("where is {s} located", "{s} is located in {a}."),
    "shares border with": ("what borders {s}", "{s} shares a border with {a}."),
    "member of sports team": ("team of {s}", "{s} played for {a}."),
    "member of political party": ("political party of {s}", "{s} was a member of {a}."),
    "member of": ("what is {s} a member of", "{s} is a member of {a}."),
    "part of": ("what is {s} part of", "{s} is part of {a}."),
    "owned by": ("owner of {s}", "{s} is owned by {a}."),
    "educated at": ("where was {s} educated", "{s} was educated at {a}."),
    "employer": ("employer of {s}", "{s} worked for {a}."),
    "capital of": ("what is {s} the capital of", "{s} is the capital of {a}."),
    "named after": ("what is {s} named after", "{s} is named after {a}."),
    "country of citizenship": ("nationality of {s}", "{s} is a citizen of {a}."),
    "inception": ("when was {s} founded", "{s} was founded in {a}."),
    "publication date": ("when was {s} released", "{s} was released in {a}."),
    "date of birth": ("when was {s} born", "{s} was born on {a}."),
    "date of death": ("when did {s} die", "{s} died on {a}."),
    "place of birth": ("where was {s} born", "{s} was born in {a}."),
    "place of death": ("where did {s} die", "{s} died in {a}."),
    "located on terrain feature": ("where is {s}", "{s} is on {a}."),
    "contains administrative territorial entity": ("what does {s} contain", "{s} contains {a}."),
}


@dataclass
class Step:
    """One hop: the query the model should write, the fact it learns, and the gold passage."""

    query: str
    answer: str
    statement: str  # the sentence the answer writes once the passage is in context
    passage: Hit | None
    stated: bool = False  # the question already gives this fact: no marker


@dataclass
class MarkerExample:
    """One training transcript: `pieces` in prompt order, `train` marks the assistant's text."""

    id: str
    source_id: str
    dataset: str
    split: str
    kind: str  # retrieve | stated | closed
    question: str
    answer: str
    hops: int
    markers: int
    pieces: list[dict[str, Any]] = field(default_factory=list)  # {"text", "role", "train"}

    @property
    def text(self) -> str:
        return "".join(p["text"] for p in self.pieces)


# -- steps --------------------------------------------------------------------------------------
def _fill(text: str, answers: Sequence[str]) -> str:
    def sub(match: re.Match[str]) -> str:
        index = int(match.group(1)) - 1
        return answers[index] if 0 <= index < len(answers) else match.group(0)

    return _PLACEHOLDER.sub(sub, text)


def _sentence(subject: str, relation: str, answer: str) -> tuple[str, str]:
    relation = relation.strip()
    if relation in _RELATIONS:
        query, statement = _RELATIONS[relation]
        return query.format(s=subject), statement.format(s=subject, a=answer)
    return f"{relation} of {subject}", f"The {relation} of {subject} is {answer}."


def _capitalised(text: str) -> str:
    return text[:1].upper() + text[1:]


_SENTENCES = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"(])")


def focus_passage(text: str, answer: str, max_words: int = 45) -> str:
    """The paragraph cut to its first sentence and the sentences naming `answer`.

    Keeps training transcripts short (sequence length is the cost on a CPU) while the fact the
    answer then states is still in the passage.
    """
    sentences = _SENTENCES.split(text.strip())
    if len(text.split()) <= max_words or len(sentences) < 2:
        return text
    wanted = _norm(answer)
    keep = [0] + [i for i, s in enumerate(sentences) if i and wanted and wanted in _norm(s)]
    out: list[str] = []
    for i in keep:
        if out and len(" ".join(out + [sentences[i]]).split()) > max_words:
            break
        out.append(sentences[i])
    return " ".join(out)


def _hit(paragraph: dict[str, Any], answer: str = "", max_words: int = 45) -> Hit:
    # The same chunk id the corpus loader gives a paragraph's first chunk.
    pid = str(paragraph.get("pid") or paragraph.get("id"))
    return Hit(chunk_id=f"{pid}#0", doc_id=pid, title=paragraph.get("title", ""),
               text=focus_passage(paragraph.get("text", ""), answer, max_words), score=1.0)


def _musique_steps(record: dict[str, Any]) -> list[Step]:
    paragraphs = record.get("paragraphs", [])
    steps: list[Step] = []
    for raw in record.get("question_decomposition") or []:
        answers = [s.answer for s in steps]
        text, answer = _fill(str(raw["question"]), answers), str(raw["answer"]).strip()
        if ">>" in text:
            subject, relation = (part.strip() for part in text.split(">>", 1))
            query, statement = _sentence(subject, relation, answer)
        else:
            query = text.strip().rstrip("?").strip()
            statement = f"{_capitalised(query)}: {answer}."
        index = raw.get("paragraph_support_idx")
        passage = _hit(paragraphs[index], answer) if isinstance(index, int) and 0 <= index < len(paragraphs) else None
        steps.append(Step(query, answer, statement, passage))
    return steps


def _twowiki_steps(record: dict[str, Any]) -> list[Step]:
    by_title = {p.get("title"): p for p in record.get("paragraphs", [])}
    steps = []
    for subject, relation, answer in record.get("evidences") or []:
        query, statement = _sentence(str(subject), str(relation), str(answer))
        paragraph = by_title.get(subject)
        steps.append(Step(query, str(answer), statement, _hit(paragraph, str(answer)) if paragraph else None))
    return steps


def _norm(text: str) -> str:
    return " ".join(re.findall(r"\w+", text.lower()))


def question_steps(record: dict[str, Any]) -> list[Step]:
    """The hops of a MuSiQue or 2Wiki record; a hop whose answer the question names is `stated`."""
    if record.get("question_decomposition"):
        steps = _musique_steps(record)
    elif record.get("evidences"):
        steps = _twowiki_steps(record)
    else:
        return []
    question = f" {_norm(record['question'])} "
    for step in steps:
        answer = _norm(step.answer)
        step.stated = bool(answer) and f" {answer} " in question
    return steps


# -- transcripts --------------------------------------------------------------------------------
def final_answer_sentence(answer: str) -> str:
    return f"So the answer is {answer.strip().rstrip('.')}."


def render_example(
    record: dict[str, Any],
    steps: Sequence[Step],
    context: ContextManager,
    kind: str = "retrieve",
    tag: str = "retrieve",
) -> MarkerExample:
    """Drive `context` through the rounds the controller would run for these steps.

    `stated` hops (and every hop of a `closed` example) are written into the question and the
    answer states them without a marker; the others are asked for with a marker, and their
    gold paragraph is injected before the answer goes on.
    """
    if kind not in KINDS:
        raise InputError(f"unknown example kind {kind!r}; known: {', '.join(KINDS)}")
    given = [s for s in steps if kind == "closed" or s.stated or (kind == "stated" and s is steps[0])]
    question = record["question"].strip()
    if kind != "retrieve":
        question = " ".join([s.statement for s in given if not s.stated] + [question])
    context.start(question)
    # The marker as the context's protocol writes it (openrig: <retrieve>query</retrieve>).
    protocol = getattr(context, "protocol", None)
    opening, closing = (protocol.open, protocol.close) if protocol else (f"<{tag}>", f"</{tag}>")
    pending, markers = "", 0
    for step in steps:
        if step in given or step.passage is None:
            pending += step.statement + " "
            continue
        segment = pending + opening + step.query + closing
        context.accept(Segment(text=segment))
        context.inject([step.passage])
        markers += 1
        pending = step.statement + " "
    if not (kind == "closed" and len(steps) > 1):
        pending += final_answer_sentence(record["answer"])
    else:  # everything is in the question: the answer alone, no restating
        pending = final_answer_sentence(record["answer"])
    context.accept(Segment(text=pending, finish_reason="end_of_turn"))
    pieces = [
        {"text": p.text, "role": p.role, "train": p.role == "draft"} for p in context.pieces()
    ]
    return MarkerExample(
        id=f"{record['id']}:{kind}", source_id=str(record["id"]), dataset=str(record.get("dataset", "")),
        split=str(record.get("split", "")), kind=kind, question=question, answer=str(record["answer"]),
        hops=len(steps), markers=markers, pieces=pieces,
    )


_QUESTION_WORDS = {"who", "whom", "whose", "what", "when", "where", "which", "why", "how", "is", "are",
                   "was", "were", "did", "does", "do", "in"}
_PERSON_RELATIONS = {"father", "mother", "spouse", "sibling", "child", "director", "composer", "performer",
                     "producer", "screenwriter", "founder", "author", "creator", "editor", "lyricist"}


def step_question(step: Step) -> str:
    """One hop asked as a question of its own ("father of X" -> "Who is the father of X?")."""
    query = step.query.strip().rstrip("?").strip()
    first = query.split(" ", 1)[0].lower()
    if first in _QUESTION_WORDS:
        return f"{_capitalised(query)}?"
    return f"{'Who' if first in _PERSON_RELATIONS else 'What'} is the {query}?"


def single_hop_examples(record: dict[str, Any], steps: Sequence[Step], context: ContextManager,
                        tag: str = "retrieve") -> list[MarkerExample]:
    """Each hop with a gold passage as a one-hop question: ask, read, state, answer.

    More (and shorter) questions of more shapes than the multi-hop ones alone, so the model learns
    to ask on a question it does not know rather than on the look of a multi-hop question.
    """
    out = []
    for i, step in enumerate(steps):
        if step.passage is None or step.stated:
            continue
        hop = {**record, "id": f"{record['id']}:hop{i + 1}", "question": step_question(step), "answer": step.answer}
        example = render_example(hop, [replace(step, stated=False)], context, "retrieve", tag)
        example.kind, example.source_id, example.id = "single", str(record["id"]), f"{record['id']}:single{i + 1}"
        out.append(example)
    return out


def _kind_for(record_id: str, seed: int, closed_share: float, stated_share: float, hops: int) -> str:
    draw = random.Random(f"{seed}:{record_id}").random()
    if draw < closed_share:
        return "closed"
    if hops > 1 and draw < closed_share + stated_share:
        return "stated"
    return "retrieve"


def build_examples(
    records: Iterable[dict[str, Any]],
    generator: Any,
    *,
    context_config: ContextConfig | None = None,
    closed_share: float = 0.15,
    stated_share: float = 0.2,
    single_hop: bool = True,
    seed: int = 0,
    max_tokens: int = 512,
) -> tuple[list[MarkerExample], dict[str, int]]:
    """Examples for `records` with the generator's chat template and tokenizer.

    Every question yields a `retrieve` example; a seeded share also yields a `stated` or `closed`
    negative; `single_hop` adds each hop as a question of its own (`single_hop_examples`).
    Examples longer than `max_tokens` are skipped (counted in the returned stats).
    """
    config = context_config or ContextConfig(max_passage_tokens=80)
    context = build_context(config, generator, markers=True)
    examples: list[MarkerExample] = []
    stats = {"questions": 0, "no_steps": 0, "too_long": 0}
    single_questions: set[str] = set()
    for record in records:
        stats["questions"] += 1
        steps = question_steps(record)
        if not steps:
            stats["no_steps"] += 1
            continue
        kinds = ["retrieve"]
        extra = _kind_for(str(record["id"]), seed, closed_share, stated_share, len(steps))
        if extra != "retrieve":
            kinds.append(extra)
        candidates = [render_example(record, steps, context, kind, config.marker_tag) for kind in kinds]
        if single_hop and len(steps) > 1:
            for example in single_hop_examples(record, steps, context, config.marker_tag):
                if example.question not in single_questions:  # hops shared by two questions once
                    single_questions.add(example.question)
                    candidates.append(example)
        for example in candidates:
            ids, _ = encode_example(generator.tokenizer, example, end_of_turn(generator))
            if len(ids) > max_tokens:
                stats["too_long"] += 1
                continue
            examples.append(example)
    return examples, stats


def end_of_turn(generator: Any) -> str:
    """What the chat template writes after an assistant message ("<|im_end|>" for ChatML)."""
    sentinel = "\u2063END\u2063"
    text = generator.render_chat(
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": sentinel}], False
    )
    return text[text.index(sentinel) + len(sentinel):].strip()


def encode_example(tokenizer: Any, example: MarkerExample, end_text: str) -> tuple[list[int], list[int]]:
    """Token ids and labels, tokenised piece by piece as `HFGenerator.encode` does.

    Labels are -100 everywhere but the assistant's own text and the end-of-turn token after the
    final answer: the model learns to write markers and answers, never passages or questions.
    """
    ids: list[int] = []
    labels: list[int] = []
    for piece in example.pieces:
        piece_ids = tokenizer(piece["text"], add_special_tokens=False).input_ids
        ids += piece_ids
        labels += piece_ids if piece["train"] else [-100] * len(piece_ids)
    end_ids = tokenizer(end_text, add_special_tokens=False).input_ids if end_text else []
    ids += end_ids
    labels += end_ids
    return ids, labels


def build_marker_data(
    qa_path: str | Path,
    split: str,
    generator: Any,
    **options: Any,
) -> tuple[list[MarkerExample], dict[str, int]]:
    """Examples for one split (`train` or `dev`) of the QA set at `qa_path` (splits.json beside it)."""
    if split not in TRAINABLE_SPLITS:
        raise InputError(
            f"split {split!r} cannot be used for training data; choose {' or '.join(TRAINABLE_SPLITS)} "
            "(the test split is kept for measuring)"
        )
    qa_path = Path(qa_path)
    records = split_questions(load_qa(qa_path), qa_path.parent, split)
    dataset = qa_path.parent.name
    for record in records:
        record.setdefault("dataset", dataset)
        record["split"] = split  # the splits file decides, not the record's own field
    return build_examples(records, generator, **options)


def write_examples(path: str | Path, examples: Sequence[MarkerExample]) -> str:
    """Write the examples as JSONL (atomic); return the data hash."""
    write_jsonl_atomic(path, (asdict(e) for e in examples))
    return data_hash(path)


def read_examples(path: str | Path) -> list[MarkerExample]:
    """Examples written by `write_examples`; a bad line is a one-line InputError."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: marker data not found (build it with `rigkit markers build-data`)")
    examples = []
    for lineno, record in iter_jsonl(path, InputError):
        try:
            examples.append(MarkerExample(**record))
        except TypeError as err:
            raise InputError(f"{path}, line {lineno}: not a marker example ({err})") from None
    if not examples:
        raise InputError(f"{path}: no examples")
    return examples


def data_hash(path: str | Path) -> str:
    """sha256 of the data file's bytes (first 16 hex digits): names the data a model saw."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
