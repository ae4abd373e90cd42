"""Build labelled segments from a QA set with gold answers and paragraphs.

The generator answers each question closed-book, sentence by sentence (the controller with a
never-retrieving decider, which records each segment's text, token log-probabilities, entropies,
top-1 minus top-2 margins where the backend gives them and, for the hidden-state probe, the
generator's mean-pooled last-layer state at decision time: exactly what the classifier decider
sees at run time). Then every segment gets a verdict from each
rule below; the set's `label` is the chosen rule's verdict, and all verdicts are stored so a set
can be re-labelled without the model.

- **r1 `answer_gain`** (question level, the retrieval-helps rule): the closed-book answer misses
  the gold answer (cover match: small chat models answer in sentences, so strict EM is ~0) and the
  answer written with the gold paragraphs in context contains it, or its token F1 is higher by
  >= `min_gain`. Every segment of such an answer that carries content is positive.
- **r2 `unsupported_fact`** (segment level, the hallucination rule): the segment states a
  fact-shaped span (date, number, code, proper name; `rigkit.text.fact_words`) that
  neither the question nor any gold paragraph mentions.
- `any` / `all`: r1 or / and r2.
Both are proxies (an F1 gain is not proof that this sentence needed retrieval; a paraphrased fact
can look unsupported), which is why rigkit reports how much they agree (Cohen's kappa).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rigkit.config import RunConfig
from rigkit.deciders.base import DecisionState
from rigkit.errors import InputError
from rigkit.generation.protocol import SupportsHiddenStates
from rigkit.trace import Decision, Hit, RIGResult, Segment
from rigkit.trigger.labelset import LabelledSegment, LabelSet

__all__ = [
    "RULES",
    "RULE_DOCS",
    "build_labels",
    "resumable",
    "label_question",
    "unsupported_facts",
    "answer_gain",
    "agreement",
    "HiddenStateRecorder",
]

RULES = ("r1", "r2", "any", "all")
RULE_DOCS = {
    "r1": "answer_gain: closed-book answer misses the gold answer and the gold-paragraph answer "
    "contains it (or has token F1 higher by >= min_gain); all content segments of that answer",
    "r2": "unsupported_fact: the segment states a date/number/code/name that neither the question "
    "nor any gold paragraph mentions",
    "any": "r1 or r2",
    "all": "r1 and r2",
}


class HiddenStateRecorder:
    """A never-retrieving decider that keeps each segment's hidden state (the probe's input)."""

    def __init__(self, keep_hidden: bool = True):
        self.keep_hidden = keep_hidden
        self.hidden: list[list[float] | None] = []

    def decide(self, segment: Segment, state: DecisionState) -> Decision:
        gen = state.generator
        want = self.keep_hidden and isinstance(gen, SupportsHiddenStates) and bool(segment.token_ids)
        self.hidden.append(list(gen.segment_hidden_state(segment)) if want else None)
        return Decision(False, 0.0, "closed-book labelling run", decider="never")


def answer_gain(closed: str, with_gold: str, golds: Sequence[str], min_gain: float = 0.5) -> dict:
    """r1's question-level verdict and the scores behind it."""
    from rigkit.eval.answers import cover_match, token_f1

    c_cover, g_cover = cover_match(closed, golds), cover_match(with_gold, golds)
    c_f1, g_f1 = token_f1(closed, golds), token_f1(with_gold, golds)
    # "Wrong closed-book" = the gold answer is not in it; then right or much better with gold.
    gain = c_cover == 0 and (g_cover == 1 or g_f1 - c_f1 >= min_gain)
    return {"gain": bool(gain), "closed_cover": c_cover, "gold_cover": g_cover,
            "closed_f1": round(c_f1, 4), "gold_f1": round(g_f1, 4)}


def unsupported_facts(text: str, question: str, paragraphs: Sequence[Hit]) -> list[str]:
    """r2's evidence: fact-shaped spans of `text` that neither question nor paragraphs mention."""
    from rigkit.text import fact_words, passage_mentions

    question_hit = Hit("question", "question", "", question, 0.0)
    out = []
    for word in fact_words(text):
        if not passage_mentions([question_hit, *paragraphs], word.text):
            out.append(word.text)
    return out


def _has_content(text: str) -> bool:
    from rigkit.text import has_content

    return has_content(text)


def _combine(r1: int, r2: int) -> dict[str, int]:
    return {"r1": r1, "r2": r2, "any": int(r1 or r2), "all": int(r1 and r2)}


def label_question(
    record: dict[str, Any],
    closed: RIGResult,
    with_gold: RIGResult,
    hidden: Sequence[list[float] | None] = (),
    rule: str = "any",
    min_gain: float = 0.5,
) -> list[LabelledSegment]:
    """Label the closed-book segments of one question (pure: no model call)."""
    golds = [record["answer"], *record.get("answer_aliases", [])]
    gold_hits = _gold_hits(record)
    r1 = answer_gain(closed.answer, with_gold.answer, golds, min_gain)
    rows = []
    for i, rt in enumerate(closed.rounds):
        seg = rt.segment
        if not seg.text.strip():
            continue
        facts = unsupported_facts(seg.text, record["question"], gold_hits)
        verdicts = _combine(int(r1["gain"] and _has_content(seg.text)), int(bool(facts)))
        rows.append(
            LabelledSegment(
                qid=str(record["id"]), question=record["question"], text=seg.text,
                label=verdicts[rule], index=i, tokens=list(seg.tokens),
                logprobs=list(seg.logprobs), entropies=list(seg.entropies), margins=list(seg.margins),
                hidden=hidden[i] if i < len(hidden) else None, rules=verdicts,
                info={"unsupported": facts, **r1, "type": record.get("type", ""),
                      "closed_answer": closed.answer, "gold_answer": with_gold.answer,
                      "answer": record["answer"]},
            )
        )
    return rows


def _gold_hits(record: dict[str, Any]) -> list[Hit]:
    return [
        Hit(chunk_id=p.get("pid", p["title"]), doc_id=p.get("pid", p["title"]),
            title=p["title"], text=p["text"], score=1.0)
        for p in record.get("paragraphs", []) if p.get("is_supporting")
    ]


def build_labels(
    qa: str | Path | Sequence[dict[str, Any]],
    generator: Any,
    config: RunConfig | None = None,
    limit: int | None = None,
    rule: str = "any",
    hidden: bool = True,
    min_gain: float = 0.5,
    progress: bool = True,
    checkpoint: str | Path | None = None,
    resume: LabelSet | None = None,
    splits: Sequence[str] | None = None,
) -> LabelSet:
    """Run the generator closed-book and with gold paragraphs; label every segment (see above).

    `splits` (e.g. ("train", "dev")): only the questions of those splits of the set's
    splits.json; None: every question in the file.

    With `checkpoint`, the set so far is saved (atomically) after every question, marked
    `complete: false`; passing that set back as `resume` skips the questions it already holds.
    """
    from tqdm.auto import tqdm

    from rigkit.eval.systems import answer_with_passages

    if rule not in RULES:
        raise InputError(f"unknown labelling rule {rule!r}; choose from {list(RULES)}")
    config = config or RunConfig()
    records, meta = _records(qa, limit, splits)
    meta.update(
        rule=rule, rules=RULE_DOCS, min_gain=min_gain, hidden=hidden,
        generator=generator.spec or type(generator).__name__,
        generator_source=generator.source,
        generator_weights=_weights_fingerprint(generator),
        generator_config=config.to_dict()["generator"], complete=False,
    )
    rows = list(resume.rows) if resume is not None else []
    done = set(resume.meta.get("done_qids", [])) if resume is not None else set()
    started = time.perf_counter()
    bar = tqdm(records, desc="labelling questions", unit="q", disable=not progress)
    for record in bar:
        if str(record["id"]) in done:
            continue
        if any(p.get("is_supporting") for p in record.get("paragraphs", [])):  # else: no rule applies
            recorder = HiddenStateRecorder(keep_hidden=hidden)
            closed = _closed_book(generator, record["question"], config, recorder)
            with_gold = answer_with_passages(generator, record["question"], _gold_hits(record), config)
            rows += label_question(record, closed, with_gold, recorder.hidden, rule, min_gain)
        done.add(str(record["id"]))
        bar.set_postfix(segments=len(rows), positives=sum(r.label for r in rows))
        if checkpoint is not None:
            LabelSet(rows, {**meta, "done_qids": sorted(done)}).save(checkpoint)
    meta.update(done_qids=sorted(done), complete=True, created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                seconds=round(time.perf_counter() - started, 1))
    return LabelSet(rows, meta)


def resumable(path: str | Path, qa: str | Path, generator: Any) -> LabelSet | None:
    """The unfinished set at `path` if it was made from this QA file by this generator."""
    from rigkit.trigger.labelset import load_labels

    path = Path(path)
    if not path.exists():
        return None
    try:
        old = load_labels(path)
    except InputError:
        return None
    data_hash = "sha256:" + hashlib.sha256(Path(qa).read_bytes()).hexdigest()[:16]
    same = (old.meta.get("data_hash") == data_hash
            and old.meta.get("generator") == generator.spec)
    return old if same and old.meta.get("complete") is False else None


def _closed_book(generator: Any, question: str, config: RunConfig, recorder: HiddenStateRecorder):
    """The controller with a never-retrieving decider that also records hidden states."""
    from rigkit.build import assemble
    from rigkit.retrieval.base import NoRetriever

    return assemble(config, generator, NoRetriever(), recorder).run(question)


def _records(qa: str | Path | Sequence[dict[str, Any]], limit: int | None, splits: Sequence[str] | None = None):
    from rigkit.datasets import load_qa

    if isinstance(qa, (str, Path)):
        path = Path(qa)
        records = load_qa(path)
        meta = {"qa": str(path), "set_dir": str(path.parent), "source": str(path),
                "data_hash": "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()[:16]}
    else:
        records = list(qa)
        blob = json.dumps([r.get("id") for r in records]).encode()
        meta = {"qa": None, "set_dir": None, "source": "records",
                "data_hash": "ids-sha256:" + hashlib.sha256(blob).hexdigest()[:16]}
    for i, rec in enumerate(records):
        missing = [k for k in ("id", "question", "answer") if k not in rec]
        if missing:
            raise InputError(f"QA record {i + 1} lacks {missing}")
    if splits:
        if not meta.get("set_dir"):
            raise InputError("selecting splits needs a QA file beside its splits.json")
        from rigkit.datasets import load_splits

        stored = load_splits(meta["set_dir"])
        unknown = [s for s in splits if s not in stored]
        if unknown:
            raise InputError(f"unknown split {unknown[0]!r}; choose from {sorted(stored)}")
        wanted = {q for s in splits for q in stored[s]}
        records = [r for r in records if str(r["id"]) in wanted]
    if limit is not None:
        records = _subset(records, limit, meta.get("set_dir"), splits)
    meta.update(questions=len(records), limit=limit, splits=list(splits) if splits else None)
    return records, meta


def _subset(records: list[dict[str, Any]], limit: int, set_dir: str | None,
            only: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """The first `limit` questions in file order, keeping the stored splits' proportions, so a
    small subset still has dev and test questions (the first 60 of 2Wiki hold only 9 test ones)."""
    path = Path(set_dir) / "splits.json" if set_dir else None
    if path is None or not path.exists():
        return records[:limit]
    from rigkit.datasets import load_splits

    splits = {name: ids for name, ids in load_splits(set_dir).items() if not only or name in only}
    split_of = {q: name for name, ids in splits.items() for q in ids}
    total = sum(len(ids) for ids in splits.values()) or 1
    quota = {name: round(limit * len(ids) / total) for name, ids in splits.items()}
    first = next(iter(splits), "train")  # rounding leftovers go to the first (train) split
    quota[first] = quota.get(first, 0) + limit - sum(quota.values())
    chosen = []
    for rec in records:
        name = split_of.get(str(rec["id"]), "train")
        if quota.get(name, 0) > 0:
            quota[name] -= 1
            chosen.append(rec)
    return chosen


def agreement(labels: LabelSet, a: str = "r1", b: str = "r2") -> dict[str, Any]:
    """How much two stored rules agree: % agreement and Cohen's kappa (None when undefined)."""
    from sklearn.metrics import cohen_kappa_score

    pairs = [(r.rules[a], r.rules[b]) for r in labels.rows if a in r.rules and b in r.rules]
    if not pairs:
        raise InputError(f"no rows carry both rules {a!r} and {b!r}")
    xa, xb = [p[0] for p in pairs], [p[1] for p in pairs]
    agree = sum(x == y for x, y in pairs) / len(pairs)
    # kappa is 0/0 when both raters give one constant label: report None, not NaN.
    kappa = None if len(set(xa) | set(xb)) < 2 else float(cohen_kappa_score(xa, xb))
    if kappa is not None and kappa != kappa:
        kappa = None
    return {"rules": [a, b], "segments": len(pairs), "percent_agree": round(100 * agree, 1),
            "cohen_kappa": None if kappa is None else round(kappa, 3),
            "positives": {a: sum(xa), b: sum(xb)}}


def _weights_fingerprint(generator: Any) -> str | None:
    from rigkit.trigger.model import weights_fingerprint

    return weights_fingerprint(generator)
