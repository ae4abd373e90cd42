"""Generator mechanics on a tiny random model: KV-cache reuse, crop, pre-fill counts, stops."""

from __future__ import annotations

import pytest

from rigkit.generation import find_stop
from rigkit.transcript import Piece, StopRule
from tests.tiny_model import tiny_generator


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
def test_cache_on_and_off_give_the_same_tokens(seed):
    _, cached = _rounds(tiny_generator(seed, use_cache=True))
    _, fresh = _rounds(tiny_generator(seed, use_cache=False))
    assert [s.token_ids for s in cached] == [s.token_ids for s in fresh]
    for a, b in zip(cached, fresh):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-3)


def test_append_only_rounds_prefill_only_new_tokens():
    generator = tiny_generator(1)
    prompt, segments = _rounds(generator)
    first = segments[0]
    assert first.tokens_reused == 0
    for segment in segments[1:]:
        # all but the last generated token (never fed back through the model) is reused
        assert segment.tokens_prefilled <= 2
        assert segment.tokens_reused > first.tokens_prefilled


def test_regenerating_crops_the_cache_to_the_shared_prefix():
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


def test_segment_evidence_is_parallel_and_finite():
    _, segments = _rounds(tiny_generator(3))
    for segment in segments:
        n = len(segment.token_ids)
        assert len(segment.tokens) == len(segment.logprobs) == len(segment.entropies) == n
        assert "".join(segment.tokens) == segment.text
        assert all(lp <= 0 for lp in segment.logprobs)
        assert all(e >= 0 for e in segment.entropies)


def test_segment_attention_is_square_and_causal():
    generator = tiny_generator(1)
    _, segments = _rounds(generator, n=1)
    attention = generator.segment_attention(segments[0])
    n = len(segments[0].token_ids)
    assert len(attention) == n and all(len(row) == n for row in attention)
    assert all(attention[i][j] == 0 for i in range(n) for j in range(i + 1, n))
    assert len(generator.segment_hidden_state(segments[0])) == generator.model.config.hidden_size


def test_sampling_with_a_fixed_seed_is_reproducible():
    def sample(seed):
        generator = tiny_generator(4)
        generator.temperature, generator.top_p = 1.0, 0.95
        generator.reset(seed)
        return _rounds(generator)[1]

    first, again, other = sample(7), sample(7), sample(8)
    assert [s.token_ids for s in first] == [s.token_ids for s in again]
    assert [s.token_ids for s in first] != [s.token_ids for s in other]
