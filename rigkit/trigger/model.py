"""Train, save and load the retrieval-trigger classifier.

Logistic regression (balanced class weights: labels are imbalanced) on standardised features by
default; a small MLP as an option. The split is by *question*, never by segment (segments of one
answer share the question and would leak): the data set's stored `splits.json` (shared with the
evaluation, so the classifier never trains on evaluation questions) when the labels come from a
shipped QA set, else a fixed-seed split stratified by whether a question has any positive segment.
The decision threshold is chosen on the dev split (best F1) and stored in the model file.

Files are written with skops, never pickle, and loaded against an explicit allow-list of the
types rigkit itself writes: a file holding anything else is refused with the types named, never
trusted wholesale.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rigkit.errors import InputError, RigkitError
from rigkit.files import atomic_write
from rigkit.generation.protocol import SupportsHiddenStates
from rigkit.trace import Segment
from rigkit.trigger.features import FeatureExtractor, FeatureInput, FeatureSpec
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

MODEL_FORMAT = 1
MODEL_KINDS = ("logreg", "mlp")
# Every non-builtin type a rigkit trigger file contains. Extend deliberately, never with
# skops' get_untrusted_types() of the file being loaded.
TRUSTED_TYPES = [
    "sklearn.pipeline.Pipeline",
    "sklearn.preprocessing._data.StandardScaler",
    "sklearn.linear_model._logistic.LogisticRegression",
    "sklearn.neural_network._multilayer_perceptron.MLPClassifier",
    "sklearn.neural_network._stochastic_optimizers.AdamOptimizer",
    "sklearn.neural_network._stochastic_optimizers.SGDOptimizer",
]


@dataclass
class TriggerModel:
    """A fitted pipeline with the feature spec it needs and the threshold chosen on dev."""

    pipeline: Any
    spec: FeatureSpec
    threshold: float
    meta: dict[str, Any] = field(default_factory=dict)
    path: str | None = None
    embedder: Any | None = field(default=None, repr=False, compare=False)  # None: the spec's model
    _extractor: FeatureExtractor | None = field(default=None, init=False, repr=False, compare=False)

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        """(n,) probability that each segment needs retrieval."""
        return self.pipeline.predict_proba(X)[:, 1]

    # -- the classifier decider's `TriggerScorer` contract ------------------------------------
    @property
    def name(self) -> str:
        return Path(self.path).name if self.path else ""

    @property
    def low_prob(self) -> float:
        return self.spec.low_prob

    @property
    def needs_hidden(self) -> bool:
        return "hidden" in self.spec.sets

    @property
    def feature_sets(self) -> tuple[str, ...]:
        return tuple(self.spec.sets)

    def probability(self, question: str, segment: Segment, hidden: Sequence[float] | None = None) -> float:
        """p(needs retrieval) of one segment, from the features the spec names."""
        if self._extractor is None:
            self._extractor = FeatureExtractor(self.spec, self.embedder)
        X = self._extractor.transform([FeatureInput(question, segment, hidden)])
        return float(self.predict_proba(X)[0])

    def check_generator(self, generator: Any | None) -> None:
        """Raise a clear error when `generator` cannot produce the features this model needs."""
        check_generator(self.spec, generator)
        check_weights(self.meta, generator)

    def score_rows(self, rows: list[LabelledSegment], extractor: FeatureExtractor) -> np.ndarray:
        return self.predict_proba(extractor.transform(rows_to_inputs(rows)))


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


def save_trigger(model: TriggerModel, path: str | Path) -> Path:
    """One skops file: pipeline, feature spec, threshold, metadata; written atomically."""
    import skops.io as sio

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": "rigkit-trigger",
        "version": MODEL_FORMAT,
        "pipeline": model.pipeline,
        "spec": model.spec.to_dict(),
        "threshold": float(model.threshold),
        "meta": model.meta,
    }
    with atomic_write(path, binary=True) as fh:
        fh.write(sio.dumps(payload))
    model.path = str(path)
    return path


def load_trigger(path: str | Path, generator: Any | None = None, embedder: Any | None = None) -> TriggerModel:
    """Load a trigger file, refusing types outside `TRUSTED_TYPES` and features `generator` lacks.

    `embedder` replaces the spec's sentence-embedding model (tests pass a small stand-in)."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"trigger model not found: {path}")
    payload = _load_restricted(path)
    if not isinstance(payload, dict) or payload.get("format") != "rigkit-trigger":
        raise InputError(f"{path} is a skops file but not a rigkit trigger model")
    if int(payload.get("version", 0)) > MODEL_FORMAT:
        raise InputError(f"{path}: trigger format {payload['version']} is newer than this rigkit")
    _check_structure(path, payload)
    model = TriggerModel(
        payload["pipeline"],
        FeatureSpec.from_dict(payload["spec"]),
        float(payload["threshold"]),
        dict(payload.get("meta", {})),
        str(path),
        embedder=embedder,
    )
    _warn_version(model)
    if generator is not None:
        check_generator(model.spec, generator)
        check_weights(model.meta, generator)
    return model


# Plain containers and arrays a saved pipeline holds besides TRUSTED_TYPES' estimators.
_DATA_TYPES = {
    "builtins.dict", "builtins.list", "builtins.tuple", "builtins.str", "builtins.int",
    "builtins.float", "builtins.bool", "builtins.NoneType", "numpy.ndarray", "numpy.float64",
    "numpy.float32", "numpy.int64", "numpy.int32", "numpy.bool_", "numpy.dtype",
    "numpy.random.mtrand.RandomState", "sklearn.preprocessing._label.LabelBinarizer",
}


def _load_restricted(path: Path) -> Any:
    """skops load that trusts exactly rigkit's types: none of skops' own default trust list.

    skops trusts many scikit-learn estimators by default, so a file holding e.g. a constant
    DummyClassifier would load; here every node of the file's tree is checked first."""
    import io
    from zipfile import BadZipFile, ZipFile

    import skops.io as sio
    from skops.io._persist import get_tree, read_schema  # the tree skops itself audits

    data = path.read_bytes()
    try:
        with ZipFile(io.BytesIO(data)) as archive:
            schema, context = read_schema(archive)
            tree = get_tree(schema, context, trusted=None)
    except (BadZipFile, KeyError, ValueError, TypeError) as err:
        raise InputError(f"{path} is not a skops trigger model ({type(err).__name__}: {err})") from None
    found = _tree_types(tree)
    allowed = set(TRUSTED_TYPES) | _DATA_TYPES
    unexpected = sorted(found - allowed)
    if unexpected:
        raise RigkitError(
            f"{path} contains types rigkit does not trust: {unexpected}. Refusing to load; inspect "
            "the file with skops.io.get_untrusted_types and load it yourself only if you trust it"
        )
    return sio.loads(data, trusted=sorted(found))


def _tree_types(node: Any, seen: set[int] | None = None) -> set[str]:
    """Every `module.Class` named in a skops node tree."""
    seen = set() if seen is None else seen
    if id(node) in seen:
        return set()
    seen.add(id(node))
    found: set[str] = set()
    if hasattr(node, "module_name") and hasattr(node, "children"):
        found.add(f"{node.module_name}.{node.class_name}")
        children = node.children.values()
    elif isinstance(node, (list, tuple)):
        children = node
    elif isinstance(node, dict):
        children = node.values()
    else:
        return found
    for child in children:
        found |= _tree_types(child, seen)
    return found


def _check_structure(path: Path, payload: dict[str, Any]) -> None:
    """The pipeline must be rigkit's: scale -> logreg | mlp, taking the spec's feature count."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    pipeline = payload.get("pipeline")
    steps = getattr(pipeline, "steps", None) if isinstance(pipeline, Pipeline) else None
    shape = [(name, type(step)) for name, step in steps] if steps else []
    if (len(shape) != 2 or shape[0] != ("scale", StandardScaler) or shape[1][0] != "clf"
            or shape[1][1] not in (LogisticRegression, MLPClassifier)):
        raise RigkitError(f"{path}: the pipeline is not a rigkit trigger pipeline (scale -> "
                          f"logistic regression or MLP); found {[(n, t.__name__) for n, t in shape]}")
    try:
        spec = FeatureSpec.from_dict(payload["spec"])
        float(payload["threshold"])
    except (KeyError, TypeError, ValueError) as err:
        raise InputError(f"{path}: the feature spec or threshold is malformed ({err})") from None
    n_in = getattr(pipeline, "n_features_in_", None)
    expected = _feature_count(spec)
    if n_in is None or (expected is not None and int(n_in) != expected):
        raise RigkitError(f"{path}: the pipeline takes {n_in} features, its feature spec "
                          f"{list(spec.sets)} makes {expected}")
    if list(getattr(pipeline, "classes_", [])) != [0, 1]:
        raise RigkitError(f"{path}: the classifier's classes are {list(getattr(pipeline, 'classes_', []))}, "
                          "expected [0, 1] (no retrieval / retrieval)")


def _feature_count(spec: FeatureSpec) -> int | None:
    """Columns the spec's extractor makes, or None when a dimension is not recorded."""
    from rigkit.trace import Segment
    from rigkit.trigger.features import probability_features

    sizes = {"probability": len(probability_features(Segment(text="x", token_ids=[0], logprobs=[0.0],
                                                               entropies=[0.0], tokens=["x"]))),
             "embedding": spec.embedding_dim, "hidden": spec.hidden_dim}
    parts = [sizes[s] for s in spec.sets]
    return None if any(p is None for p in parts) else sum(parts)


def weights_fingerprint(generator: Any) -> str | None:
    """A cheap SHA-256 of an in-process model's weights (names, shapes, dtypes, edge values).

    Tells the Q4-dequantised copy of a model from its full-precision hub weights under one name.
    None for a generator without in-process weights (a served model)."""
    import hashlib

    model = getattr(generator, "model", None)
    if model is None or not hasattr(model, "state_dict"):
        return None
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        flat = tensor.detach().reshape(-1)
        edges = flat[:64].float().cpu().numpy().tobytes() + flat[-64:].float().cpu().numpy().tobytes()
        h.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode() + edges)
    return h.hexdigest()


def check_weights(meta: dict[str, Any], generator: Any | None) -> None:
    """Refuse a generator whose weights differ from the ones the training features came from."""
    recorded = (meta.get("generator") or {}).get("weights")
    if generator is None or not recorded:
        return
    current = weights_fingerprint(generator)
    if current is not None and current != recorded:
        trained = meta.get("generator") or {}
        raise RigkitError(
            f"this trigger model was trained on features of {trained.get('spec')!r} "
            f"({trained.get('source')}), but the current generator {getattr(generator, 'spec', '?')!r} "
            f"({getattr(generator, 'source', '?')}) has other weights; its probabilities and hidden "
            "states differ, so retrain the trigger on labels built with this generator"
        )


def check_generator(spec: FeatureSpec, generator: Any | None) -> None:
    """Raise a clear error when `generator` cannot produce the features `spec` needs."""
    if "hidden" not in spec.sets:
        return
    if not isinstance(generator, SupportsHiddenStates):
        name = type(generator).__name__ if generator is not None else "no generator"
        raise RigkitError(
            f"this trigger model uses hidden-state features of {spec.generator!r}, and {name} "
            "cannot produce them (in-process HFGenerator only); retrain without 'hidden'"
        )
    current = getattr(generator, "spec", None)
    if spec.generator and current and current != spec.generator:
        raise RigkitError(
            f"this trigger model probes the hidden states of {spec.generator!r}, but the current "
            f"generator is {current!r}; hidden states of another model are meaningless to it"
        )


def _warn_version(model: TriggerModel) -> None:
    import warnings

    import sklearn

    saved = model.meta.get("sklearn_version")
    if saved and saved != sklearn.__version__:
        warnings.warn(
            f"trigger model {model.path} was trained with scikit-learn {saved}, running "
            f"{sklearn.__version__}: predictions may differ slightly",
            stacklevel=3,
        )


def _rigkit_version() -> str:
    import rigkit

    return getattr(rigkit, "__version__", "unknown")
