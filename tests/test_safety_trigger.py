"""Trusted loading that really restricts: exactly rigkit's types, and rigkit's pipeline shape.

skops trusts many scikit-learn estimators by default; a file holding one of those in place of
rigkit's classifier must still be refused, as must a pipeline of the wrong shape or width.
"""

from __future__ import annotations

import numpy as np
import pytest
import skops.io as sio

from rigkit.errors import RigkitError
from rigkit.trigger.model import load_trigger, save_trigger, train_trigger
from tests.conftest_trigger import HashEmbedder, synthetic_labels


@pytest.fixture(scope="module")
def trained():
    return train_trigger(synthetic_labels(40), features=("probability", "embedding"),
                         model="logreg", embedder=HashEmbedder())


def _payload_with(trained, pipeline) -> dict:
    return {"format": "rigkit-trigger", "version": 1, "pipeline": pipeline,
            "spec": trained.spec.to_dict(), "threshold": 0.5, "meta": trained.meta}


def test_a_default_trusted_estimator_is_refused(tmp_path, trained):
    from sklearn.dummy import DummyClassifier
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    width = trained.pipeline.n_features_in_
    X, y = np.random.default_rng(0).random((20, width)), np.array([0, 1] * 10)
    dummy = Pipeline([("scale", StandardScaler()), ("clf", DummyClassifier(strategy="constant", constant=1))]).fit(X, y)
    path = tmp_path / "dummy.skops"
    data = _payload_with(trained, dummy)
    sio.dump(data, path)
    assert sio.get_untrusted_types(file=path) == []  # skops itself would load it without a word
    with pytest.raises(RigkitError, match="sklearn.dummy.DummyClassifier"):
        load_trigger(path)


def test_a_pipeline_of_another_shape_is_refused(tmp_path, trained):
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline

    width = trained.pipeline.n_features_in_
    X, y = np.random.default_rng(0).random((20, width)), np.array([0, 1] * 10)
    bare = Pipeline([("clf", LogisticRegression())]).fit(X, y)
    path = tmp_path / "bare.skops"
    sio.dump(_payload_with(trained, bare), path)
    with pytest.raises(RigkitError, match="not a rigkit trigger pipeline"):
        load_trigger(path)


def test_a_pipeline_of_the_wrong_width_is_refused(tmp_path, trained):
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    X, y = np.random.default_rng(0).random((20, 3)), np.array([0, 1] * 10)
    narrow = Pipeline([("scale", StandardScaler()), ("clf", LogisticRegression())]).fit(X, y)
    path = tmp_path / "narrow.skops"
    sio.dump(_payload_with(trained, narrow), path)
    with pytest.raises(RigkitError, match="takes 3 features"):
        load_trigger(path)


def test_rigkit_own_models_still_load(tmp_path, trained):
    path = save_trigger(trained, tmp_path / "ok.skops")
    assert load_trigger(path).threshold == pytest.approx(trained.threshold)


def test_trigger_model_records_and_checks_the_generator_weights(tmp_path):
    from rigkit.trigger.model import weights_fingerprint
    from tests.tiny_model import tiny_generator

    labelled_with, other = tiny_generator(seed=0), tiny_generator(seed=1)
    assert weights_fingerprint(labelled_with) == weights_fingerprint(tiny_generator(seed=0))
    labels = synthetic_labels(40)
    labels.meta.update(generator="tiny-random", generator_source="test",
                       generator_weights=weights_fingerprint(labelled_with))
    model = train_trigger(labels, features=("probability",), model="logreg")
    path = save_trigger(model, tmp_path / "t.skops")
    assert load_trigger(path).meta["generator"] == {
        "spec": "tiny-random", "source": "test", "weights": weights_fingerprint(labelled_with)}
    load_trigger(path, generator=labelled_with)  # the same weights: fine
    with pytest.raises(RigkitError, match="other weights"):
        load_trigger(path, generator=other)  # same name, other numbers


def test_split_all_scores_labels_of_another_set_and_refuses_overlap(trained):
    from rigkit.errors import InputError
    from rigkit.trigger.evaluate import resolve_split, split_rows

    other = synthetic_labels(12, seed=3)
    for row in other.rows:
        row.qid = f"musique-{row.qid}"  # questions the model never saw
    assert resolve_split(other, trained, None) == "all"
    assert len(split_rows(other, trained, "all")) == len(other.rows)
    from rigkit.trigger.evaluate import evaluate_trigger

    report = evaluate_trigger(other, trained, deciders=["prob"], split=None, embedder=HashEmbedder())
    assert report.split == "all" and len(report.labels) == len(other.rows)
    own = synthetic_labels(40)
    assert resolve_split(own, trained, None) == "test"
    with pytest.raises(InputError, match="--split all"):
        resolve_split(own, trained, "all")


def test_an_int8_model_has_a_weights_fingerprint_of_its_own():
    # int8 Linear layers keep their weights packed in tuples inside the state dict
    from rigkit.generation.loading import _int8 as quantize_int8
    from rigkit.trigger.model import weights_fingerprint
    from tests.tiny_model import tiny_generator

    plain, packed = tiny_generator(seed=0), tiny_generator(seed=0)
    packed.model = quantize_int8(packed.model)
    assert weights_fingerprint(packed) == weights_fingerprint(packed)
    assert weights_fingerprint(packed) != weights_fingerprint(plain)
