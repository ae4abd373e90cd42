"""Each decider on hand-written segments with known token probabilities (no model)."""

from __future__ import annotations

import math

import pytest

from rigkit.deciders import (
    AlwaysRetrieve,
    EntropyDecider,
    EveryNTokens,
    KeywordDecider,
    MarkerDecider,
    NeverRetrieve,
    ProbabilityDecider,
)
from rigkit.deciders.base import DecisionState
from rigkit.errors import InputError, RigkitError
from rigkit.testing import ScriptedGenerator, make_segment
from rigkit.trace import Decision, Hit, Segment

STATE = DecisionState(question="Who directed the film Nightfall?")
# "Zoltan Brkic" and "1931" are the invented tokens
INVENTED = make_segment(
    "It was directed by Zoltan Brkic in 1931.", [0.9, 0.8, 0.7, 0.6, 0.08, 0.05, 0.5, 0.04]
)
CONFIDENT = make_segment("The answer is clear.", [0.95, 0.9, 0.92, 0.97])
# stop words and punctuation with low probability must not count
UNSURE_STOPWORDS = make_segment("It is the , .", [0.05, 0.05, 0.05, 0.01, 0.01])


def char_segment(text: str, probs: list[float]) -> Segment:
    """A Chinese segment with one token per character."""
    seg = make_segment("x")
    seg.text, seg.tokens = text, list(text)
    seg.token_ids = list(range(len(text)))
    seg.logprobs = [math.log(p) for p in probs]
    seg.entropies = [-math.log(p) for p in probs]
    return seg


def check_decision(d: Decision, name: str) -> None:
    assert isinstance(d.retrieve, bool) and 0.0 <= d.score <= 1.0
    assert d.reason and "\n" not in d.reason and d.decider == name
    for s in d.spans:
        assert 0 <= s.start <= s.end and s.char_start >= 0 and s.char_end >= s.char_start


ALL = [
    ProbabilityDecider(),
    EntropyDecider(),
    KeywordDecider(),
    MarkerDecider(),
    AlwaysRetrieve(),
    EveryNTokens(n=4),
    NeverRetrieve(),
]


@pytest.mark.parametrize("decider", ALL, ids=lambda d: d.name)
@pytest.mark.parametrize("text", ["", "   ", ", . ! ?", "。！？"])
def test_empty_and_punctuation_only_segments_never_retrieve(decider, text):
    seg = make_segment(text) if text.strip() else Segment(text=text)
    d = decider.decide(seg, DecisionState(question="q", tokens_since_retrieval=10))
    if decider.name in ("always", "every_n") and text.strip():
        return  # fixed-schedule baselines ignore content by design
    check_decision(d, decider.name)
    assert not d.retrieve


def test_prob_fires_on_invented_tokens_with_word_spans():
    d = ProbabilityDecider(threshold=0.3).decide(INVENTED, STATE)
    check_decision(d, "prob")
    assert d.retrieve and d.threshold == 0.3
    assert d.score == pytest.approx(1 - 0.04)
    assert [s.text for s in d.spans] == ["Zoltan Brkic", "1931"]  # adjacent words merge
    assert [(s.start, s.end) for s in d.spans] == [(4, 6), (7, 8)]
    for s in d.spans:
        assert INVENTED.text[s.char_start : s.char_end] == s.text
    assert d.intents == ["Zoltan Brkic", "1931"]


def test_prob_ignores_stop_words_and_is_monotone():
    assert not ProbabilityDecider().decide(UNSURE_STOPWORDS, STATE).retrieve
    low = ProbabilityDecider().decide(CONFIDENT, STATE)
    high = ProbabilityDecider().decide(INVENTED, STATE)
    assert not low.retrieve and low.score < high.score
    # retrieve is exactly "score above 1 - threshold"
    for th in (0.01, 0.05, 0.3, 0.95):
        d = ProbabilityDecider(threshold=th).decide(INVENTED, STATE)
        assert d.retrieve == (d.score > 1 - th)


def test_prob_on_subword_tokens_flags_the_whole_word():
    seg = make_segment("x")
    seg.text, seg.tokens = "Born in Parisville.", ["Born", " in", " Paris", "ville", "."]
    seg.logprobs = [math.log(p) for p in (0.9, 0.9, 0.9, 0.1, 0.9)]
    d = ProbabilityDecider().decide(seg, STATE)
    assert [(s.text, s.start, s.end) for s in d.spans] == [("Parisville", 2, 4)]


def test_prob_chinese_text():
    seg = char_segment("他出生于巴黎。", [0.9, 0.9, 0.9, 0.9, 0.1, 0.2, 0.9])
    d = ProbabilityDecider().decide(seg, STATE)
    assert d.retrieve and [s.text for s in d.spans] == ["巴黎"]
    # a low-probability Chinese stop word alone does not fire
    seg = char_segment("他是的。", [0.9, 0.05, 0.05, 0.9])
    assert not ProbabilityDecider().decide(seg, STATE).retrieve


def test_tokens_that_do_not_concatenate_to_the_text_still_align():
    # byte-level BPE pieces (Ġ for spaces) and a CJK character split over two byte tokens
    seg = make_segment("x")
    seg.text = "Born in 巴黎"
    seg.tokens = ["Born", "Ġin", "Ġ", "\ufffd", "\ufffd", "黎"]
    seg.logprobs = [math.log(p) for p in (0.9, 0.9, 0.9, 0.1, 0.1, 0.9)]
    d = ProbabilityDecider().decide(seg, STATE)
    assert d.retrieve and [s.text for s in d.spans] == ["巴黎"]


class AttentionGenerator:
    """Offers segment_attention like HFGenerator; counts calls."""

    def __init__(self, matrix=None, error=None):
        self.matrix, self.error, self.calls = matrix, error, 0

    def segment_attention(self, segment):
        self.calls += 1
        if self.error:
            raise self.error
        n = len(segment.tokens)
        return self.matrix or [[1.0 / (i + 1)] * (i + 1) + [0.0] * (n - i - 1) for i in range(n)]


def test_entropy_refuses_a_generator_without_attention_unless_configured_entropy_only():
    state = DecisionState(question="q", generator=ScriptedGenerator([]))
    with pytest.raises(InputError, match=r"^decider 'entropy' needs the model's attention weights, which "
                                         r"ScriptedGenerator cannot give.*use_attention: false$"):
        EntropyDecider(threshold=2.0).decide(INVENTED, state)
    d = EntropyDecider(threshold=2.0, use_attention=False).decide(INVENTED, state)
    check_decision(d, "entropy")
    assert "entropy only, as configured" in d.reason
    assert d.retrieve and d.extra_forward_passes == 0 and not d.evidence["attention"]
    assert d.evidence["max_rind"] == pytest.approx(-math.log(0.04))
    assert d.score == pytest.approx(1 - math.exp(-d.evidence["max_rind"]))
    assert "1931" in [s.text for s in d.spans] and d.evidence["attended_words"] == []
    assert not EntropyDecider(threshold=2.0, use_attention=False).decide(CONFIDENT, state).retrieve
    assert not EntropyDecider(use_attention=False).decide(UNSURE_STOPWORDS, state).retrieve  # stop words are 0


def test_entropy_alone_when_no_model_is_attached_says_so():
    """Stored segments scored offline (trigger evaluation): no model to ask, and the reason says it."""
    d = EntropyDecider(threshold=2.0).decide(INVENTED, DecisionState(question="q"))
    assert d.retrieve and "entropy only, no model attached" in d.reason and not d.evidence["attention"]


def test_an_in_process_model_that_yields_no_attention_is_an_error_naming_the_decider():
    class NoAttention(AttentionGenerator):
        spec = "tiny-sdpa"

        def segment_attention(self, segment):
            self.calls += 1
            return []

    with pytest.raises(RigkitError, match=r"^decider 'entropy': NoAttention \(tiny-sdpa\) returned no attention"):
        EntropyDecider().decide(make_segment("Paris is nice."), DecisionState("q", generator=NoAttention()))


def test_entropy_with_attention_counts_the_pass_and_stores_qfs_words():
    n = len(INVENTED.tokens)
    # every token attends mostly to token 1 ("was") and 3 ("by"), and a bit to 4 ("Zoltan")
    matrix = [[0.0] * n for _ in range(n)]
    for j in range(n):
        row = {0: 0.1, 1: 0.2, 2: 0.5, 3: 0.1, 4: 0.1}
        for i, w in row.items():
            if i <= j:
                matrix[j][i] = w
    gen = AttentionGenerator(matrix)
    seg = make_segment(INVENTED.text, [math.exp(lp) for lp in INVENTED.logprobs])
    d = EntropyDecider(threshold=1.0).decide(seg, DecisionState(question="q", generator=gen))
    assert gen.calls == 1 and d.extra_forward_passes == 1 and d.evidence["attention"]
    assert seg.attention == matrix  # kept on the segment: a second decider pays nothing
    again = EntropyDecider(threshold=1.0).decide(seg, DecisionState(question="q", generator=gen))
    assert gen.calls == 1 and again.extra_forward_passes == 0
    # attention reweights: "directed" (index 2, weight 0.5) now outranks its low entropy
    trigger = d.evidence["trigger_token"]
    assert d.evidence["rind"][trigger] == max(d.evidence["rind"])
    words = d.evidence["attended_words"]
    assert words and all(w in seg.text for w in words)
    assert words == sorted(words, key=seg.text.index)  # original order
    assert "was" not in words and "by" not in words  # stop words are not query words


def test_entropy_attention_error_propagates():
    gen = AttentionGenerator(error=RuntimeError("model yields no attentions"))
    with pytest.raises(RuntimeError, match="no attentions"):
        EntropyDecider().decide(make_segment("Paris is nice."), DecisionState("q", generator=gen))


def test_entropy_rejects_a_wrong_shape():
    gen = AttentionGenerator(matrix=[[1.0]])
    with pytest.raises(ValueError, match="attention must be"):
        EntropyDecider().decide(make_segment("Paris is nice."), DecisionState("q", generator=gen))


def test_entropy_chinese_text():
    seg = char_segment("他出生于巴黎。", [0.9, 0.9, 0.9, 0.9, 0.05, 0.2, 0.9])
    d = EntropyDecider(threshold=1.5).decide(seg, DecisionState("q"))
    assert d.retrieve and [s.text for s in d.spans] == ["巴黎"]


def test_keyword_hedging_cues_en_and_zh():
    d = KeywordDecider().decide(make_segment("I’m not sure when it was released."), STATE)
    check_decision(d, "keyword")
    assert d.retrieve and d.score == 1.0 and d.evidence["cues"] == ["i'm not sure"]
    assert d.spans[0].text == "I’m not sure"
    zh = KeywordDecider().decide(char_segment("我不确定它的发布时间。", [0.9] * 10), STATE)
    assert zh.retrieve and zh.evidence["cues"] == ["我不确定"]  # the longer cue wins
    zh2 = KeywordDecider().decide(char_segment("根据相关信息，它很好。", [0.9] * 11), STATE)
    assert zh2.retrieve and "根据相关信息" in zh2.evidence["cues"]


def test_keyword_unsupported_facts_and_passage_support():
    seg = make_segment("The KL320 pump was released in 2019 by Acme Corp.")
    d = KeywordDecider().decide(seg, DecisionState(question="When was the KL320 released?"))
    assert d.retrieve and d.evidence["unsupported"] == ["2019", "Acme Corp"]
    assert d.score == pytest.approx(0.75)  # two unsupported facts; KL320 came from the question
    hit = Hit("c1", "d1", "Acme", "Acme Corp. released the KL320 in 2019.", 1.0)
    ok = KeywordDecider().decide(seg, DecisionState(question="q", passages=[hit]))
    assert not ok.retrieve and ok.score == 0.0 and "supported" in ok.reason


def test_keyword_cues_are_configurable(tmp_path):
    cue_file = tmp_path / "cues.txt"
    cue_file.write_text("# mine\nno idea\n", encoding="utf-8")
    decider = KeywordDecider(cue_files=[str(cue_file)], check_facts=False)
    assert decider.decide(make_segment("No idea, sorry."), STATE).retrieve
    assert not decider.decide(make_segment("I'm not sure."), STATE).retrieve
    only = KeywordDecider(cues=["maybe"], extra_cues=["dunno"], check_facts=False)
    assert only.decide(make_segment("dunno really"), STATE).retrieve


def test_keyword_chinese_facts():
    seg = char_segment("KL320型号于2019年5月发布。", [0.9] * 17)
    d = KeywordDecider(cues=[]).decide(seg, DecisionState(question="KL320什么时候发布？"))
    assert d.retrieve and d.evidence["unsupported"] == ["2019年5月"]


def test_marker_decider():
    seg = make_segment("It was <retrieve>Nightfall director</retrieve> and <retrieve>year")
    d = MarkerDecider().decide(seg, STATE)
    check_decision(d, "marker")
    assert d.retrieve and d.score == 1.0 and d.intents == ["Nightfall director", "year"]
    assert [m["closed"] for m in d.evidence["markers"]] == [True, False]
    assert seg.text[d.spans[0].char_start : d.spans[0].char_end].startswith("<retrieve>")
    cut = MarkerDecider().decide(make_segment("It was released in <retr"), STATE)
    assert cut.retrieve and cut.score == 0.75 and cut.intents == []
    zh = MarkerDecider().decide(char_segment("导演是＜retrieve＞导演＜／retrieve＞", [0.9] * 25), STATE)
    assert zh.retrieve and zh.intents == ["导演"]
    assert not MarkerDecider().decide(make_segment("No markers here."), STATE).retrieve
    assert MarkerDecider(tag="search").decide(make_segment("<search>a b</search>"), STATE).retrieve


def test_baselines():
    seg = make_segment("Paris is nice.")
    assert AlwaysRetrieve().decide(seg, STATE).retrieve
    assert not NeverRetrieve().decide(seg, STATE).retrieve
    every = EveryNTokens(n=10)
    assert not every.decide(seg, DecisionState("q", tokens_since_retrieval=9)).retrieve
    d = every.decide(seg, DecisionState("q", tokens_since_retrieval=10))
    assert d.retrieve and d.score == 1.0 and d.threshold == 10
    assert every.decide(seg, DecisionState("q", tokens_since_retrieval=5)).score == 0.5
    with pytest.raises(ValueError):
        EveryNTokens(n=0)


def test_prob_pauses_after_the_first_flagged_content_word_is_whole():
    import math

    from rigkit.deciders.probability import ProbabilityDecider

    decider = ProbabilityDecider(threshold=0.3)
    sure, unsure = math.log(0.9), math.log(0.1)
    tokens = ["He", " was", " born", " in", " Ams", "terdam", " in", " 1990"]
    lps = [sure, sure, sure, sure, unsure, sure, sure, unsure]
    assert decider.pause_at(tokens[:6], lps[:6]) is None  # "Amsterdam" may still go on
    assert decider.pause_at(tokens[:7], lps[:7]) == 6  # the word is whole: keep through "terdam"
    assert decider.pause_at(tokens, [sure] * 8) is None  # nothing below the threshold
    stop_word = [sure, unsure, sure, sure, sure, sure, sure, sure]  # "was" is a stop word
    assert decider.pause_at(tokens, stop_word) is None
    # the decider fires on the paused segment, at that word
    segment = Segment(text="".join(tokens[:6]), tokens=tokens[:6], logprobs=lps[:6])
    decision = decider.decide(segment, DecisionState(question="q"))
    assert decision.retrieve and decision.intents == ["Amsterdam"]
