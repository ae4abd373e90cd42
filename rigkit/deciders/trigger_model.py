"""The trained retrieval-trigger model as the classifier decider reads it: one skops file.

`load_trigger(path)` opens a file `rigkit trigger train` wrote (`save_trigger`) and returns the
`TriggerModel` the classifier decider scores with; training itself lives in `rigkit.trigger`.

Files are written with skops, never pickle, and loaded against an explicit allow-list of the
types rigkit itself writes: a file holding anything else is refused with the types named, never
trusted wholesale. A model that reads hidden states or was trained on one generator's numbers
checks the generator it is given (`check_generator`, `check_weights`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rigkit.deciders.trigger_features import FeatureExtractor, FeatureInput, FeatureSpec
from rigkit.errors import InputError, RigkitError
from rigkit.files import atomic_write
from rigkit.generation.protocol import SupportsHiddenStates
from rigkit.trace import Segment

__all__ = [
    "MODEL_FORMAT",
    "TRUSTED_TYPES",
    "TriggerModel",
    "save_trigger",
    "load_trigger",
    "check_generator",
    "check_weights",
    "weights_fingerprint",
]

MODEL_FORMAT = 1
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

    def score_rows(self, rows: Sequence[Any], extractor: FeatureExtractor) -> np.ndarray:
        """(n,) probabilities of labelled rows (anything with `question`, `segment()`, `hidden`)."""
        inputs = [FeatureInput(r.question, r.segment(), r.hidden) for r in rows]
        return self.predict_proba(extractor.transform(inputs))


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
    from rigkit.deciders.trigger_features import probability_features

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
    for name, value in sorted(model.state_dict().items()):
        for tensor in _tensors(value):
            flat = (tensor.dequantize() if tensor.is_quantized else tensor).detach().reshape(-1)
            edges = flat[:64].float().cpu().numpy().tobytes() + flat[-64:].float().cpu().numpy().tobytes()
            h.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode() + edges)
    return h.hexdigest()


def _tensors(value: Any) -> list[Any]:
    """The tensors of one state-dict entry: int8 Linear layers store theirs packed in a tuple."""
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _tensors(item)]
    return []


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
