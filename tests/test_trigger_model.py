"""Features, training, saving and loading of the trigger classifier (no real model)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rigkit.deciders.trigger_features import (
    FeatureExtractor,
    FeatureInput,
    FeatureSpec,
    content_mask,
    parse_feature_sets,
    probability_features,
)
from rigkit.errors import InputError, RigkitError
from rigkit.testing import make_segment
from rigkit.trigger.model import (
    assign_splits,
    check_generator,
    load_trigger,
    save_trigger,
    train_trigger,
)
from tests.conftest_trigger import HashEmbedder, synthetic_labels


def test_probability_features_values():
    seg = make_segment("Paris is the capital.", [0.2, 0.9, 0.95, 0.4], entropies=[2.0, 0.1, 0.1, 1.0])
    min_p, mean_p, max_e, mean_e, share = probability_features(seg, low_prob=0.3)
    assert min_p == pytest.approx(0.2) and mean_p == pytest.approx((0.2 + 0.9 + 0.95 + 0.4) / 4)
    assert max_e == pytest.approx(2.0) and mean_e == pytest.approx(0.8)
    # content tokens: "Paris", "capital." (is/the are stop words); one of two is below 0.3
    assert share == pytest.approx(0.5)


def test_content_mask_skips_stop_words_and_punctuation():
    assert content_mask(["The", " cat", " ,", " is", " 1932", "."]) == [False, True, False, False, True, False]


def test_empty_segment_is_neutral():
    assert probability_features(make_segment("")) == [1.0, 1.0, 0.0, 0.0, 0.0]


def test_feature_spec_validation():
    assert parse_feature_sets("probability+hidden") == ("probability", "hidden")
    with pytest.raises(InputError, match="unknown feature set"):
        parse_feature_sets("probability,vibes")


def test_extractor_columns_and_errors():
    spec = FeatureSpec(sets=("probability", "embedding", "hidden"), embedding_dim=16, hidden_dim=3)
    ex = FeatureExtractor(spec, HashEmbedder())
    X = ex.transform([FeatureInput("q?", make_segment("a b"), [1.0, 2.0, 3.0])])
    assert X.shape == (1, 5 + 16 + 3) and len(ex.names()) == X.shape[1]
    with pytest.raises(RigkitError, match="probe expects 3"):
        ex.transform([FeatureInput("q?", make_segment("a b"), [1.0, 2.0])])
    with pytest.raises(RigkitError, match="hidden state"):
        ex.transform([FeatureInput("q?", make_segment("a b"), None)])
    bare = make_segment("some text")
    bare.logprobs = []
    with pytest.raises(RigkitError, match="log-probabilities"):
        FeatureExtractor(FeatureSpec(sets=("probability",))).transform([FeatureInput("", bare)])


def test_split_is_by_question_and_stratified():
    labels = synthetic_labels(40)
    split_of, source = assign_splits(labels, seed=0)
    assert "computed" in source and set(split_of.values()) == {"train", "dev", "test"}
    for name in ("train", "dev", "test"):  # every split sees positives (stratified)
        assert any(r.label for r in labels.rows if split_of[r.qid] == name)
    assert assign_splits(labels, seed=0)[0] == split_of  # fixed seed, same split


def test_explicit_split_column_wins():
    labels = synthetic_labels(10)
    for r in labels.rows:
        r.info["split"] = "test" if r.qid == "q000" else "train"
    split_of, source = assign_splits(labels)
    assert source == "split column" and split_of["q000"] == "test"


@pytest.mark.parametrize("kind", ["logreg", "mlp"])
def test_train_save_load_round_trip(tmp_path, kind):
    labels = synthetic_labels(40)
    emb = HashEmbedder()
    model = train_trigger(labels, features=("probability", "embedding"), model=kind, embedder=emb)
    assert 0.0 < model.threshold < 1.0 and "dev" in model.meta["threshold_source"]
    qids = model.meta["split_qids"]
    assert not set(qids["train"]) & set(qids["test"]) and not set(qids["dev"]) & set(qids["test"])
    path = save_trigger(model, tmp_path / "trigger.skops")
    loaded = load_trigger(path)
    assert loaded.threshold == pytest.approx(model.threshold)
    assert loaded.spec == model.spec and loaded.meta["sklearn_version"]
    ex = FeatureExtractor(model.spec, emb)
    np.testing.assert_allclose(loaded.score_rows(labels.rows, ex), model.score_rows(labels.rows, ex))
    # the probability features separate the synthetic classes: the classifier must learn that
    test_rows = [r for r in labels.rows if r.qid in set(qids["test"])]
    scores = loaded.score_rows(test_rows, ex)
    pos = [s for s, r in zip(scores, test_rows, strict=True) if r.label]
    neg = [s for s, r in zip(scores, test_rows, strict=True) if not r.label]
    assert min(pos) > max(neg)


def test_one_class_training_is_a_clear_error():
    labels = synthetic_labels(10)
    for r in labels.rows:
        r.label = 0
    with pytest.raises(InputError, match="one class"):
        train_trigger(labels, features=("probability",))


def test_untrusted_types_are_refused(tmp_path):
    import collections

    import skops.io as sio

    path = tmp_path / "evil.skops"
    sio.dump({"format": "rigkit-trigger", "version": 1, "pipeline": collections.Counter(a=1)}, path)
    with pytest.raises(RigkitError, match="collections.Counter"):
        load_trigger(path)


def test_non_skops_file_is_input_error(tmp_path):
    path = tmp_path / "x.skops"
    path.write_text("hello")
    with pytest.raises(InputError, match="not a skops trigger model"):
        load_trigger(path)


class _NoHidden:
    spec = "smollm2-135m-instruct"


class _Hidden(_NoHidden):
    def segment_hidden_state(self, segment):
        return [0.0] * 4


def test_hidden_features_need_the_same_generator(tmp_path):
    labels = synthetic_labels(30, hidden_dim=4)
    labels.meta["generator"] = "smollm2-135m-instruct"
    model = train_trigger(labels, features=("hidden",))
    path = save_trigger(model, tmp_path / "h.skops")
    with pytest.raises(RigkitError, match="cannot produce them"):
        load_trigger(path, generator=_NoHidden())
    other = _Hidden()
    other.spec = "Qwen/Qwen2.5-0.5B-Instruct"
    with pytest.raises(RigkitError, match="meaningless"):
        load_trigger(path, generator=other)
    assert load_trigger(path, generator=_Hidden()).spec.hidden_dim == 4
    check_generator(FeatureSpec(sets=("probability",)), None)  # nothing to check


def test_seeded_training_is_reproducible():
    labels = synthetic_labels(30)
    a = train_trigger(labels, features=("probability",), model="mlp", seed=3)
    b = train_trigger(labels, features=("probability",), model="mlp", seed=3)
    ex = FeatureExtractor(a.spec)
    np.testing.assert_array_equal(a.score_rows(labels.rows, ex), b.score_rows(labels.rows, ex))
    assert not math.isnan(a.threshold)


def _stored_split_labels(tmp_path):
    import json

    set_dir = tmp_path / "data" / "toy"
    set_dir.mkdir(parents=True)
    labels = synthetic_labels(20)
    qids = sorted({r.qid for r in labels.rows})
    splits = {"train": qids[:12], "dev": qids[12:16], "test": qids[16:]}
    (set_dir / "splits.json").write_text(json.dumps(splits))
    labels.meta["set_dir"] = "data/toy"
    return labels, splits


def test_stored_splits_are_found_from_a_subfolder(tmp_path, monkeypatch):
    from rigkit.trigger.labelset import load_labels

    labels, splits = _stored_split_labels(tmp_path)
    path = labels.save(tmp_path / "data" / "trigger" / "labels.jsonl")
    (tmp_path / "notebooks").mkdir()
    monkeypatch.chdir(tmp_path / "notebooks")  # as a notebook runs
    split_of, source = assign_splits(load_labels(path))
    assert source == "stored splits.json"
    assert {q for q, s in split_of.items() if s == "test"} == set(splits["test"])


def test_missing_stored_splits_is_an_error_not_a_fresh_split(tmp_path, monkeypatch):
    labels, _ = _stored_split_labels(tmp_path)
    monkeypatch.chdir("/")
    with pytest.raises(InputError, match="splits.json is not found"):
        train_trigger(labels, features=("probability",))
    model = train_trigger(labels, features=("probability",), set_dir=tmp_path / "data" / "toy")
    assert model.meta["split_source"] == "stored splits.json"
