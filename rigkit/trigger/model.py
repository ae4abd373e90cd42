"""Train the retrieval-trigger classifier; the file it writes is read by the classifier decider.

Logistic regression (balanced class weights: labels are imbalanced) on standardised features by
default; a small MLP as an option. The split is by *question*, never by segment (segments of one
answer share the question and would leak): the data set's stored `splits.json` (shared with the
evaluation, so the classifier never trains on evaluation questions) when the labels come from a
shipped QA set, else a fixed-seed split stratified by whether a question has any positive segment.
The decision threshold is chosen on the dev split (best F1) and stored in the model file.

The file format (`save_trigger` / `load_trigger`, skops under an allow-list) and the
`TriggerModel` it holds live in `rigkit.deciders.trigger_model`, beside the decider that reads
them; they are re-exported here.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import numpy as np

from rigkit.deciders.trigger_features import FeatureExtractor, FeatureInput, FeatureSpec
from rigkit.deciders.trigger_model import (
    MODEL_FORMAT,
    TRUSTED_TYPES,
    TriggerModel,
    check_generator,
    check_weights,
    load_trigger,
    save_trigger,
    weights_fingerprint,
)
from rigkit.errors import InputError
from rigkit.trigger.labelset import LabelledSegment, LabelSet

__all__ = [
    "MODEL_FORMAT",
    "TRUSTED_TYPES",
    "TriggerModel",
    "train_trigger",
    "save_trigger",
    "load_trigger",
    "assign_splits",
    "resolve_set_dir",
    "rows_to_inputs",
    "check_generator",
    "check_weights",
    "weights_fingerprint",
]

MODEL_KINDS = ("logreg", "mlp")


def rows_to_inputs(rows: list[LabelledSegment]) -> list[FeatureInput]:
    return [FeatureInput(r.question, r.segment(), r.hidden) for r in rows]


def assign_splits(labels: LabelSet, seed: int = 0) -> tuple[dict[str, str], str]:
    """qid -> "train" | "dev" | "test", and where the assignment came from."""
    qids = list(dict.fromkeys(r.qid for r in labels.rows))
    stored = _stored_splits(labels)
    if stored is not None:
        missing = [q for q in qids if q not in stored]
        if missing:
            raise InputError(
                f"{len(missing)} labelled questions (e.g. {missing[0]!r}) are in no split of "
                f"{labels.meta.get('set_dir')}/splits.json: labels and data set do not match"
            )
        return {q: stored[q] for q in qids}, "stored splits.json"
    explicit = {r.qid: r.info["split"] for r in labels.rows if r.info.get("split")}
    if explicit and all(q in explicit for q in qids):
        return explicit, "split column"
    # Stratify by whether a question has any positive segment, so each split sees both classes.
    positive = {r.qid for r in labels.rows if r.label}
    rng = random.Random(seed)
    out: dict[str, str] = {}
    for group in ([q for q in qids if q in positive], [q for q in qids if q not in positive]):
        rng.shuffle(group)
        n_test = round(len(group) * 0.2)
        n_dev = round(len(group) * 0.2)
        for i, q in enumerate(group):
            out[q] = "test" if i < n_test else "dev" if i < n_test + n_dev else "train"
    return out, f"computed (seed {seed}, 60/20/20 by question)"


def _stored_splits(labels: LabelSet) -> dict[str, str] | None:
    """The data set's splits.json as qid -> split, or None for sets not made from a data set.

    A set that records its data set folder but whose splits.json cannot be found from here is an
    error, not a silent fresh split: that would train on the evaluation's test questions.
    """
    from rigkit.datasets import load_splits

    set_dir = labels.meta.get("set_dir")
    if not set_dir:
        return None
    found = resolve_set_dir(set_dir, labels.path)
    if found is None:
        raise InputError(
            f"these labels come from {set_dir!r}, whose splits.json is not found from "
            f"{Path.cwd()}; run from the project root or pass set_dir= / --set-dir"
        )
    splits = load_splits(found)
    return {q: name for name in ("train", "dev", "test") for q in splits.get(name, [])}


def resolve_set_dir(set_dir: str | Path, labels_path: str | Path | None = None) -> Path | None:
    """`set_dir` as given, else relative to an ancestor of the cwd or of the labels file
    (a notebook runs in notebooks/, the labels may sit in data/trigger/)."""
    given = Path(set_dir)
    if (given / "splits.json").exists():
        return given
    if given.is_absolute():
        return None
    anchors = [Path.cwd().resolve(), *Path.cwd().resolve().parents]
    if labels_path is not None:
        here = Path(labels_path).resolve().parent
        anchors += [here, *here.parents]
    return next((a / given for a in anchors if (a / given / "splits.json").exists()), None)


def _make_pipeline(kind: str, seed: int):
    from sklearn.linear_model import LogisticRegression
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    if kind == "logreg":
        clf = LogisticRegression(class_weight="balanced", C=0.5, max_iter=2000, random_state=seed)
    elif kind == "mlp":
        clf = MLPClassifier(hidden_layer_sizes=(32,), alpha=1e-2, max_iter=400, random_state=seed)
    else:
        raise InputError(f"unknown model {kind!r}; choose from {list(MODEL_KINDS)}")
    return Pipeline([("scale", StandardScaler()), ("clf", clf)])


def train_trigger(
    labels: LabelSet,
    features: tuple[str, ...] = ("probability", "embedding"),
    model: str = "logreg",
    rule: str | None = None,
    seed: int = 0,
    embedder: Any | None = None,
    set_dir: str | Path | None = None,
) -> TriggerModel:
    """Fit on the train questions, choose the threshold on dev; test is left for `evaluate`.

    `set_dir` points at the data set folder holding splits.json when the recorded one is not
    found from the current directory.
    """
    import sklearn

    labels = labels.relabel(rule) if rule else labels
    if set_dir is not None:
        labels = LabelSet(labels.rows, {**labels.meta, "set_dir": str(set_dir)}, labels.path)
    split_of, split_source = assign_splits(labels, seed)
    spec = _spec_for(labels, features, embedder)
    extractor = FeatureExtractor(spec, embedder)
    parts = {s: [r for r in labels.rows if split_of.get(r.qid) == s] for s in ("train", "dev")}
    y_train = np.array([r.label for r in parts["train"]])
    if len(set(y_train.tolist())) < 2:
        raise InputError(
            f"the train split has {len(y_train)} segments of one class only "
            f"({labels.positives} positives in all): label more questions or another --rule"
        )
    started = time.perf_counter()
    pipeline = _make_pipeline(model, seed)
    pipeline.fit(extractor.transform(rows_to_inputs(parts["train"])), y_train)
    trained = TriggerModel(pipeline, spec, 0.5)
    trained.threshold, threshold_source = _choose_threshold(trained, parts["dev"], extractor)
    trained.meta = {
        "model": model,
        "seed": seed,
        "rule": labels.rule,
        "labels": {k: labels.meta.get(k) for k in ("source", "qa", "data_hash", "generator", "rule")},
        # which weights the features came from: the same name can be Q4 or full precision
        "generator": {"spec": labels.meta.get("generator"),
                      "source": labels.meta.get("generator_source"),
                      "weights": labels.meta.get("generator_weights")},
        "split_source": split_source,
        "split_qids": {
            s: sorted(q for q, v in split_of.items() if v == s) for s in ("train", "dev", "test")
        },
        "counts": {
            s: {"segments": len(rs), "positives": sum(r.label for r in rs)} for s, rs in parts.items()
        },
        "threshold_source": threshold_source,
        "feature_names": extractor.names(),
        "sklearn_version": sklearn.__version__,
        "rigkit_version": _rigkit_version(),
        "train_seconds": round(time.perf_counter() - started, 3),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    return trained


def _spec_for(labels: LabelSet, features: tuple[str, ...], embedder: Any | None) -> FeatureSpec:
    first_hidden = next((r.hidden for r in labels.rows if r.hidden is not None), None)
    hidden_dim = len(first_hidden) if ("hidden" in features and first_hidden) else None
    if "hidden" in features and hidden_dim is None:
        raise InputError("'hidden' features need labels built with hidden states (no --no-hidden)")
    spec = FeatureSpec(
        sets=tuple(features), generator=labels.meta.get("generator"), hidden_dim=hidden_dim
    )
    if "embedding" in features:
        spec = FeatureSpec(**{**spec.__dict__, "embedding_dim": _embedding_dim(spec, embedder)})
    return spec


def _embedding_dim(spec: FeatureSpec, embedder: Any | None) -> int:
    model = FeatureExtractor(spec, embedder).embedder
    get_dim = getattr(model, "get_embedding_dimension", None) or getattr(
        model, "get_sentence_embedding_dimension", None
    )
    dim = get_dim() if callable(get_dim) else None
    if dim is None:
        dim = int(np.asarray(model.encode(["probe"], normalize_embeddings=True)).shape[-1])
    return int(dim)


def _choose_threshold(
    model: TriggerModel, dev: list[LabelledSegment], extractor: FeatureExtractor
) -> tuple[float, str]:
    """Best-F1 threshold on dev; 0.5 with a note when dev cannot tell (empty or one class)."""
    from sklearn.metrics import precision_recall_curve

    y = np.array([r.label for r in dev])
    if len(dev) == 0 or len(set(y.tolist())) < 2:
        return 0.5, f"default 0.5 (dev split has {len(dev)} segments, {int(y.sum())} positive)"
    scores = model.score_rows(dev, extractor)
    precision, recall, thresholds = precision_recall_curve(y, scores)
    f1 = 2 * precision * recall / np.maximum(precision + recall, 1e-12)
    best = int(np.argmax(f1[:-1])) if len(thresholds) else 0
    return float(thresholds[best]), f"best F1 on dev ({f1[best]:.3f}, {len(dev)} segments)"


def _rigkit_version() -> str:
    import rigkit

    return getattr(rigkit, "__version__", "unknown")
