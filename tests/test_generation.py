"""Generator mechanics on a tiny random model: KV-cache reuse, crop, pre-fill counts, stops.

Every model test runs under each placement: CPU float32, CPU bfloat16, and CUDA (float32 and
bfloat16; `pytest -m gpu`) where a GPU is present, skipped with the reason otherwise.
"""

from __future__ import annotations

import functools

import pytest

from rigkit.generation import find_stop
from rigkit.transcript import Piece, StopRule
from tests import tiny_model


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


_no_gpu = pytest.mark.skipif(not _cuda(), reason="no CUDA GPU here (torch.cuda.is_available() is False)")
PLACEMENTS = [
    pytest.param(("cpu", "float32"), id="cpu-float32"),
    pytest.param(("cpu", "bfloat16"), id="cpu-bfloat16"),
    pytest.param(("cuda", "float32"), id="cuda-float32", marks=[pytest.mark.gpu, _no_gpu]),
    pytest.param(("cuda", "bfloat16"), id="cuda-bfloat16", marks=[pytest.mark.gpu, _no_gpu]),
]


@pytest.fixture(params=PLACEMENTS)
def place(request):
    return request.param


@pytest.fixture
def tiny_generator(place):
    """`tests.tiny_model.tiny_generator` on this test's device and dtype."""
    device, dtype = place
    return functools.partial(tiny_model.tiny_generator, device=device, dtype=dtype)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("It is MIT. Then", 10),
        ("Version 1. of it", 10),  # "1." followed by a space still ends: the rule is punctuation + space
        ("Apache-2.0 is a licence", None),
        ("See 3.5", None),
        ("好的。然后", 3),
        ("Done!", None),  # no whitespace yet: the model may still be writing "!?" or a quote
        ('He said "yes." Then', 14),
    ],
)
def test_sentence_end(text, expected):
    assert find_stop(text, StopRule(sentence=True)) == expected


def test_marker_close_stops_before_sentence_end():
    text = "I need <retrieve>the MIT terms</retrieve> and more. Then"
    assert find_stop(text, StopRule(sentence=True, marker_close="</retrieve>")) == text.index("and") - 1


def _rounds(generator, n=3):
    chat = generator.render_chat([{"role": "user", "content": "what licence"}], True)
    prompt, segments = [Piece(chat)], []
    for _ in range(n):
        segment = generator.next_segment(prompt, StopRule(), 12)
        segments.append(segment)
        prompt.append(Piece(segment.text, tuple(segment.token_ids)))
        if segment.finished:
            break
    return prompt, segments


@pytest.mark.parametrize("seed", [1, 2])
def test_cache_on_and_off_give_the_same_tokens(seed, tiny_generator, place):
    _, cached = _rounds(tiny_generator(seed, use_cache=True))
    _, fresh = _rounds(tiny_generator(seed, use_cache=False))
    assert len(cached) == 3  # later rounds are the ones that go through the cache
    assert [s.token_ids for s in cached] == [s.token_ids for s in fresh]
    for a, b in zip(cached, fresh):
        # cache on vs off: float32 log-probabilities differ by ~1e-5 (the same sums in another
        # order), bfloat16 ones by up to 0.04 measured (it keeps ~3 digits)
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-3 if place[1] == "float32" else 0.1)


def test_append_only_rounds_prefill_only_new_tokens(tiny_generator):
    generator = tiny_generator(1)
    prompt, segments = _rounds(generator)
    assert len(segments) == 3  # otherwise the loop below checks nothing
    first = segments[0]
    assert first.tokens_reused == 0
    for segment in segments[1:]:
        # all but the last generated token (never fed back through the model) is reused
        assert segment.tokens_prefilled <= 2
        assert segment.tokens_reused > first.tokens_prefilled


def test_regenerating_crops_the_cache_to_the_shared_prefix(tiny_generator):
    generator = tiny_generator(2)
    chat = generator.render_chat([{"role": "user", "content": "what licence"}], True)
    head = [Piece(chat)]
    first = generator.next_segment(head, StopRule(), 12)
    passages = Piece("<|im_end|>\n<|im_start|>user\nthe apache licence<|im_end|>\n<|im_start|>assistant\n")
    again = generator.next_segment(head + [passages], StopRule(), 12)
    head_len = len(generator.encode(head))
    assert again.tokens_reused == head_len  # the flagged segment was cropped away, the head kept
    assert again.tokens_prefilled == len(generator.encode([passages]))
    # the same prompt from a cold cache gives the same continuation
    cold = tiny_generator(2, use_cache=False).next_segment(head + [passages], StopRule(), 12)
    assert cold.token_ids == again.token_ids
    assert first.token_ids  # sanity: the first call generated something


def test_segment_evidence_is_parallel_and_finite(tiny_generator):
    _, segments = _rounds(tiny_generator(3))
    for segment in segments:
        n = len(segment.token_ids)
        assert len(segment.tokens) == len(segment.logprobs) == len(segment.entropies) == n
        assert "".join(segment.tokens) == segment.text
        assert all(lp <= 0 for lp in segment.logprobs)
        assert all(e >= 0 for e in segment.entropies)


def test_segment_attention_is_square_and_causal(tiny_generator):
    generator = tiny_generator(1)
    _, segments = _rounds(generator, n=1)
    attention = generator.segment_attention(segments[0])
    n = len(segments[0].token_ids)
    assert len(attention) == n and all(len(row) == n for row in attention)
    assert all(attention[i][j] == 0 for i in range(n) for j in range(i + 1, n))
    assert len(generator.segment_hidden_state(segments[0])) == generator.model.config.hidden_size


def test_sampling_with_a_fixed_seed_is_reproducible(tiny_generator):
    def sample(seed):
        generator = tiny_generator(4)
        generator.temperature, generator.top_p = 1.0, 0.95
        generator.reset(seed)
        return _rounds(generator)[1]

    first, again, other = sample(7), sample(7), sample(8)
    assert len(first) >= 2  # sampling state must carry across rounds, not just one call
    assert [s.token_ids for s in first] == [s.token_ids for s in again]
    assert [s.token_ids for s in first] != [s.token_ids for s in other]


def _tensor_devices(generator):
    return {p.device.type for p in generator.model.parameters()}


def test_segments_and_internals_stay_on_the_model_device(tiny_generator, place):
    generator = tiny_generator(3)
    assert _tensor_devices(generator) == {place[0]}
    _, segments = _rounds(generator, n=2)
    assert len(segments) == 2  # the test needs a second round to go through the cache
    assert generator._cache.layers[0].keys.device.type == place[0]
    assert len(generator.segment_attention(segments[-1])) == len(segments[-1].token_ids)
    assert generator.generate("what licence", max_new_tokens=4) is not None


def test_attention_is_computed_for_the_segment_passed_in(tiny_generator):
    """An earlier segment's internals are its own, not those of the last one generated."""
    generator = tiny_generator(1)
    _, segments = _rounds(generator, n=3)
    assert len(segments) == 3
    first, last = segments[0], segments[-1]
    hidden_first = generator.segment_hidden_state(first)
    hidden_last = generator.segment_hidden_state(last)
    assert hidden_first != hidden_last
    # the same segment judged by a fresh generator that wrote only that segment
    fresh = tiny_generator(1)
    (alone,) = _rounds(fresh, n=1)[1]
    assert alone.token_ids == first.token_ids
    flat = lambda rows: [x for row in rows for x in row]  # noqa: E731
    assert flat(generator.segment_attention(first)) == pytest.approx(flat(fresh.segment_attention(alone)), abs=1e-3)
    assert hidden_first == pytest.approx(fresh.segment_hidden_state(alone), abs=1e-3)


def test_internals_of_a_segment_it_never_wrote_are_refused(tiny_generator):
    from rigkit.trace import Segment

    generator = tiny_generator(1)
    _rounds(generator, n=1)
    with pytest.raises(ValueError, match="segments this generator wrote"):
        generator.segment_attention(Segment(text=" the", tokens=[" the"], token_ids=[999]))


def test_attention_pass_keeps_the_cache_and_the_next_round(tiny_generator, place):
    """The attention pass re-uses the run's cache (no copy) and leaves what the next round needs."""
    plain, judged = tiny_generator(4), tiny_generator(4)
    chat = plain.render_chat([{"role": "user", "content": "what licence"}], True)
    prompts = {id(plain): [Piece(chat)], id(judged): [Piece(chat)]}
    rounds = {id(plain): [], id(judged): []}
    for _ in range(3):
        for generator in (plain, judged):
            segment = generator.next_segment(prompts[id(generator)], StopRule(), 12)
            if generator is judged:
                generator.segment_attention(segment)
            rounds[id(generator)].append(segment)
            prompts[id(generator)].append(Piece(segment.text, tuple(segment.token_ids)))
    a, b = rounds[id(plain)], rounds[id(judged)]
    assert len(a) == 3 and len(b) == 3
    if place[1] == "float32":
        # the eager pass's keys/values equal SDPA's to float32 rounding: the same answer follows.
        # (In bfloat16 they differ at its rounding level, which a random model can amplify.)
        assert [s.token_ids for s in a] == [s.token_ids for s in b]
    # after a judged round the segment's keys/values are already cached: nothing more is pre-filled
    assert all(s.tokens_prefilled <= 1 for s in b[1:])


@pytest.mark.parametrize("seed", [3, 5])
def test_bfloat16_gives_the_same_rounds_as_float32(seed):
    full = _rounds(tiny_model.tiny_generator(seed), 3)[1]
    half = _rounds(tiny_model.tiny_generator(seed, dtype="bfloat16"), 3)[1]
    assert len(full) >= 2 and len(full) == len(half)
    assert [s.token_ids for s in full] == [s.token_ids for s in half]
    assert [s.finish_reason for s in full] == [s.finish_reason for s in half]
    for a, b in zip(full, half):
        # bfloat16 keeps ~3 significant digits; measured here: logprobs within 0.18, entropies 0.28
        assert b.logprobs == pytest.approx(a.logprobs, abs=0.35)
        assert b.entropies == pytest.approx(a.entropies, abs=0.35)


@pytest.mark.slow
def test_a_stopped_segment_carries_its_extra_token_into_the_next_call():
    """The stop rule sees the token after a full stop; the next segment starts with that token
    instead of computing it again: one forward pass per generated token, as in one `generate`."""
    import torch

    from rigkit.generation.loading import load_generator

    question = "Describe the MIT licence and the Apache-2.0 licence in four sentences."
    runs = {}
    for use_cache in (True, False):
        generator = load_generator(use_cache=use_cache)
        passes = []
        handle = generator.model.register_forward_pre_hook(lambda *_, passes=passes: passes.append(1))
        try:
            with torch.no_grad():
                prompt, segments = [Piece(generator.render_chat([{"role": "user", "content": question}], True))], []
                for _ in range(3):
                    segment = generator.next_segment(prompt, StopRule(), 40)
                    segments.append(segment)
                    prompt.append(Piece(segment.text, tuple(segment.token_ids)))
                    if segment.finished:
                        break
        finally:
            handle.remove()
        runs[use_cache] = segments, len(passes)
    (cached, cached_passes), (fresh, _) = runs[True], runs[False]
    assert cached[0].finish_reason == "stop" and len(cached) >= 2  # a boundary to carry over
    assert [s.token_ids for s in cached] == [s.token_ids for s in fresh]
    # one pass per token kept, plus the end-of-turn token or the last segment's look-ahead token;
    # before, each boundary cost one more (the look-ahead token was thrown away and recomputed)
    assert cached_passes == sum(len(s.token_ids) for s in cached) + 1


class PauseAfter:
    """An early rule: keep `keep` tokens once `seen` have been written; records what it was shown."""

    def __init__(self, keep: int, seen: int):
        self.keep, self.seen, self.calls = keep, seen, []

    def __call__(self, texts, logprobs):
        self.calls.append((list(texts), list(logprobs)))
        return self.keep if len(texts) >= self.seen else None


def test_an_early_rule_pauses_the_segment_and_sees_the_raw_logprobs(tiny_generator):
    generator = tiny_generator(3)
    chat = generator.render_chat([{"role": "user", "content": "what licence"}], True)
    free = generator.next_segment([Piece(chat)], StopRule(sentence=False), 6)
    rule = PauseAfter(keep=2, seen=3)
    paused = generator.next_segment([Piece(chat)], StopRule(sentence=False, early=rule), 6)
    assert paused.token_ids == free.token_ids[:2] and paused.finish_reason == "stop"
    texts, logprobs = rule.calls[-1]  # what the criterion saw while generating: the same evidence
    assert texts == free.tokens[:3] and logprobs == pytest.approx(free.logprobs[:3], abs=2e-2)
    # the dropped look-ahead token is carried into the next call, as after a sentence end
    after = generator.next_segment([Piece(chat), Piece(paused.text, tuple(paused.token_ids))],
                                   StopRule(sentence=False), 4)
    assert after.token_ids == free.token_ids[2:6]


def test_segment_end_takes_the_earlier_of_text_and_early_rule():
    from rigkit.generation.stops import segment_end

    texts = ["It", " is", " MIT", ".", " Then", " more"]
    assert segment_end(texts, [0.0] * 6, StopRule()) == 4
    assert segment_end(texts, [0.0] * 6, StopRule(early=lambda t, lp: 2)) == 2
    assert segment_end(texts[:3], [0.0] * 3, StopRule(early=lambda t, lp: None)) is None
