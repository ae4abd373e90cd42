"""The `entropy` decider and the attention query against DRAGIN's own code (tests/peers/dragin_rind.py).

DRAGIN (Su et al., 2024) scores each word of a sentence by its entropy times the attention later
words pay it, normalised to mean 1 over the sentence (RIND), flags words above a threshold, and
searches for the real words the flagged words attend to most in the preceding text (QFS,
`query_formulation: real_words`). Both sides read the same model outputs: one sentence of
one-token words, the logits of each step and the last layer's attention, drawn from a fixed seed.
DRAGIN's code runs as it is, behind a shim for what it would load (tests/peers/dragin_rind.py):
a model that answers `generate` and the forward pass with these arrays, a word-level tokenizer,
and spaCy's sentence split and part-of-speech tags given as data. The tests named
`test_departure_*` show, each on one sentence, where rigkit differs on purpose and why.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import tests.peers.dragin_rind as dragin
from rigkit.deciders.base import DecisionState
from rigkit.deciders.entropy import EntropyDecider
from rigkit.queries import AttentionQuery
from rigkit.text import is_stop
from rigkit.trace import Segment

WORDS = ("Eiffel Tower Paris iron lattice engineer Gustave completed March 1889 height metres "
         "visitors world fair Seine Champ tallest structure radio antenna painted bronze "
         "Montmartre Louvre museum Napoleon river bridge granite").split()
POS = {w: ("NUM" if w.isdigit() else "PROPN" if w[0].isupper() else "NOUN") for w in WORDS}
POS.update({"the": "DET", "of": "ADP", "was": "AUX", "by": "ADP", "tall": "ADJ", "built": "VERB", "faces": "VERB"})
SPACE = "\u2581"  # the word-start mark of a Llama tokenizer, DRAGIN's `space_token`
THRESHOLD = 1.5  # RIND threshold (DRAGIN's `hallucination_threshold`)


# -- the shim: what DRAGIN's code would load -------------------------------------------------------
class WordTokenizer:
    """One token per word, written with the word-start mark, as a Llama tokenizer writes words."""

    def __init__(self, words):
        self.vocab = list(words)
        self.ids = {w: i + 100 for i, w in enumerate(self.vocab)}  # clear of 13, Llama's newline

    def encode(self, text, return_tensors=None):
        ids = [self.ids[w] for w in text.split()]
        return torch.tensor([ids]) if return_tensors == "pt" else ids

    def convert_ids_to_tokens(self, ids):  # "##piece" continues the word before it
        words = [self.vocab[int(i) - 100] for i in ids]
        return [w[2:] if w.startswith("##") else SPACE + w for w in words]

    def decode(self, ids):
        return "".join(t.replace(SPACE, " ") for t in self.convert_ids_to_tokens(ids)).strip()


class GivenModel:
    """`generate` gives the chosen words and each step's logits; a forward pass gives the given
    last-layer attention for the ids it reads."""

    device = "cpu"

    def __init__(self, words, logits, attention):
        self.words, self.logits, self.attention = words, logits, attention  # attention(ids) -> (heads, L, L)

    def generate(self, input_ids, attention_mask, max_new_tokens, return_dict_in_generate, output_scores):
        chosen = torch.tensor([[TOKENIZER.ids[w] for w in self.words]])
        return SimpleNamespace(sequences=torch.cat([input_ids, chosen], dim=1),
                               scores=tuple(torch.tensor(step)[None] for step in self.logits))

    def __call__(self, ids, output_attentions=True):
        return SimpleNamespace(attentions=[torch.tensor(self.attention(ids[0].tolist()))[None]])


class Doc:
    """spaCy's Doc as far as DRAGIN reads it: one sentence, and each word's part of speech."""

    def __init__(self, text):
        self.text = text
        self.sents = [SimpleNamespace(text=text.strip())]

    def __iter__(self):
        return iter(SimpleNamespace(text=w, pos_=POS.get(w, "X")) for w in self.text.split())


TOKENIZER = WordTokenizer(list(WORDS) + ["the", "of", "was", "by", "tall", "built", "Question", "faces", "Mont", "##martre"])


@pytest.fixture(autouse=True)
def spacy_stand_in(monkeypatch):
    monkeypatch.setattr(dragin, "nlp", Doc)


# -- one sentence, on both sides ------------------------------------------------------------------
def salience_attention(n: int, rng: random.Random, heads: int = 1, noise: float = 0.0) -> np.ndarray:
    """Causal attention where every query spreads over the earlier keys by each key's salience
    (with `noise`, each head and query its own share): (heads, n, n), rows summing to 1."""
    salience = [rng.uniform(0.05, 1.0) for _ in range(n)]
    att = np.zeros((heads, n, n))
    for h in range(heads):
        for j in range(n):
            row = np.array([salience[k] * (1 + noise * rng.random()) for k in range(j + 1)])
            att[h, j, : j + 1] = row / row.sum()
    return att


def draw(rng: random.Random, heads: int = 1, noise: float = 0.0, length: tuple[int, int] = (5, 11)):
    """Words with near-certain steps and, about one in eight, a near-flat one (high entropy)."""
    words = rng.sample(WORDS, rng.randint(*length))
    scales = [0.3 if rng.random() < 0.12 else 25.0 for _ in words]
    logits = np.array([[rng.gauss(0, s) for _ in TOKENIZER.vocab] for s in scales])
    return words, logits, salience_attention(len(words), rng, heads, noise)


def dragin_rind(words, logits, attention, threshold=THRESHOLD):
    """DRAGIN's `generate_attn` and `modifier` on these arrays: (flagged word indices, sentence words, hit)."""
    generator = dragin.BasicGenerator.__new__(dragin.BasicGenerator)
    generator.tokenizer, generator.space_token = TOKENIZER, SPACE
    generator.model = GivenModel(words, logits, lambda ids: attention)
    text, seqlist, attns, _, entropies = generator.generate_attn("Question", len(words), use_entropy=True)
    rag = dragin.AttnWeightRAG.__new__(dragin.AttnWeightRAG)
    rag.generator, rag.hallucination_threshold, rag.check_real_words = generator, threshold, True
    hallucinated, _, curr_tokens, hit = rag.modifier(text, seqlist, attns, entropies)
    flagged = [i for i, h in enumerate(hit) if h] if hallucinated else []
    return flagged, rag, curr_tokens, hit


def dragin_query(rag, curr_tokens, hit, attention, top_k, question=""):
    """DRAGIN's QFS for the first sentence of an answer: `prev_text` is question + text + ptext,
    the last two empty (with no question only the sentence itself is read)."""
    rag.retrieve_keep_top_k = top_k
    rag.generator.model.attention = lambda ids: attention
    return rag.keep_real_words(prev_text=question + " " + "" + " " + "", curr_tokens=curr_tokens, curr_hit=hit)


def rigkit_segment(words, logits, attention) -> Segment:
    """The segment rigkit's HF generator would make of the same step logits and attention:
    entropies from the raw logits, attention averaged over heads."""
    logp = torch.log_softmax(torch.tensor(logits), dim=-1)
    entropies = (-(logp.exp() * logp).sum(-1)).tolist()
    tokens = [words[0]] + [" " + w for w in words[1:]]
    return Segment(text="".join(tokens), tokens=tokens, token_ids=list(range(len(tokens))),
                   logprobs=[0.0] * len(tokens), entropies=entropies,
                   attention=attention.mean(axis=0).tolist())


def rigkit_decide(segment, top_words=3, threshold=THRESHOLD):
    return EntropyDecider(threshold, top_words=top_words).decide(segment, DecisionState(question=""))


def test_the_vocabulary_reads_alike_on_both_sides():
    """Content words for rigkit's stop list are real words for DRAGIN's part-of-speech filter,
    and no word holds another (DRAGIN matches real words by substring)."""
    assert not [w for w in WORDS if is_stop(w)] and all(POS[w] in ("NOUN", "PROPN", "NUM") for w in WORDS)
    assert not [(a, b) for a in WORDS for b in WORDS if a != b and a in b]


def test_entropy_flags_the_words_dragin_flags():
    """RIND on 200 sentences from seed 36: the same words above the threshold, no more, no fewer."""
    rng = random.Random(36)
    fired = 0
    for _ in range(200):
        words, logits, attention = draw(rng)
        flagged, *_ = dragin_rind(words, logits, attention)
        decision = rigkit_decide(rigkit_segment(words, logits, attention))
        ours = [i for s in decision.spans for i in range(s.start, s.end)]
        assert ours == flagged
        assert decision.retrieve == bool(flagged)
        fired += bool(flagged)
    assert 20 < fired < 180  # both verdicts are exercised


def test_attention_query_is_dragins_real_words_query():
    """QFS where one word fires: the words it attends to most, in text order, are DRAGIN's
    `real_words` query (top 3) and rigkit's `attention` query (top_words 3, no question terms)."""
    rng = random.Random(7)
    compared = 0
    for _ in range(200):
        words, logits, attention = draw(rng, length=(8, 12))
        flagged, rag, curr_tokens, hit = dragin_rind(words, logits, attention)
        if len(flagged) != 1 or flagged[0] < 4:
            continue  # one trigger with at least top_k words before it: see the departures
        decision = rigkit_decide(rigkit_segment(words, logits, attention))
        ours = AttentionQuery(include_question=False).build("", "", decision).text
        assert ours == dragin_query(rag, curr_tokens, hit, attention, top_k=3)
        compared += 1
    assert compared > 20


def test_departure_heads_are_averaged_before_the_column_max():
    """DRAGIN takes each head's largest attention to a word, then the mean over heads; rigkit's
    generator gives the head-averaged attention (one (n, n) matrix per segment, what a trace
    stores), so the largest is taken after the mean. With one head they agree (above); with
    heads that disagree the weights differ."""
    rng = random.Random(11)
    words, logits, attention = draw(rng, heads=4, noise=3.0)
    generator = dragin.BasicGenerator.__new__(dragin.BasicGenerator)
    generator.tokenizer, generator.space_token = TOKENIZER, SPACE
    generator.model = GivenModel(words, logits, lambda ids: attention)
    _, _, attns, _, _ = generator.generate_attn("Question", len(words), use_entropy=True)
    mean_then_max = [max(attention.mean(axis=0)[j][i] for j in range(i, len(words))) for i in range(len(words))]
    assert np.allclose(attns, attention.max(axis=1).mean(axis=0))
    assert not np.allclose(attns, mean_then_max)


def test_departure_rind_scores_tokens_not_words():
    """DRAGIN merges a word's tokens (attention summed, entropy averaged) and flags words; rigkit
    scores tokens and widens a flagged token to its word. A word written in two pieces, the
    second one a guess, is flagged by rigkit on that piece (RIND 1.62); DRAGIN's average over
    the pieces halves the entropy (RIND 1.45) and stays below the threshold, 1.53."""
    pieces = ["Louvre", "museum", "faces", "Mont", "##martre"]
    n = len(pieces)
    attention = np.zeros((1, n, n))
    for j in range(n):
        attention[0, j, : j + 1] = 1.0 / (j + 1)
    logits = np.zeros((n, len(TOKENIZER.vocab)))
    logits[:4, 0] = 30.0  # near-certain steps; the last piece is a guess over the vocabulary
    flagged, *_ = dragin_rind(pieces, logits, attention, threshold=1.53)
    tokens = ["Louvre", " museum", " faces", " Mont", "martre"]
    logp = torch.log_softmax(torch.tensor(logits), dim=-1)
    segment = Segment(text="".join(tokens), tokens=tokens, token_ids=list(range(n)), logprobs=[0.0] * n,
                      entropies=(-(logp.exp() * logp).sum(-1)).tolist(), attention=attention[0].tolist())
    decision = rigkit_decide(segment, threshold=1.53)
    assert flagged == []
    assert decision.retrieve and [s.text for s in decision.spans] == ["Montmartre"]


def test_departure_the_query_follows_the_strongest_trigger_only():
    """With several flagged words DRAGIN averages what each attends to and leaves all of them
    out; rigkit reads the strongest trigger's row alone (one need, one query), over the words
    before it. On the sentences of seed 5 where two or more words fire the two queries part."""
    rng = random.Random(5)
    differ = 0
    for _ in range(150):
        words, logits, attention = draw(rng, length=(8, 12))
        flagged, rag, curr_tokens, hit = dragin_rind(words, logits, attention)
        if len(flagged) < 2:
            continue
        decision = rigkit_decide(rigkit_segment(words, logits, attention))
        trigger = decision.evidence["trigger_token"]
        row = attention.mean(axis=0)[trigger]
        by_trigger = sorted(sorted(range(trigger), key=lambda i: -row[i])[:3])
        ours = AttentionQuery(include_question=False).build("", "", decision).text
        assert ours == " ".join(words[i] for i in by_trigger)
        differ += ours != dragin_query(rag, curr_tokens, hit, attention, top_k=3)
    assert differ > 0


def test_departure_the_query_reads_the_trigger_row():
    """For a flagged word at position t DRAGIN ranks earlier words by the attention of position
    t - 1 (the step that wrote it); rigkit by the row of t itself, the word once written. They
    agree when every query spreads over earlier words alike (the sentences above) and can differ
    when the two rows rank the earlier words differently, as here."""
    words = ["Gustave", "Eiffel", "lattice", "engineer", "Paris", "granite"]
    n = len(words)
    attention = np.zeros((1, n, n))
    for j in range(n):
        attention[0, j, : j + 1] = 1.0 / (j + 1)
    attention[0, 4, :5] = [0.6, 0.1, 0.1, 0.1, 0.1]  # row t - 1 favours Gustave
    attention[0, 5, :6] = [0.05, 0.05, 0.05, 0.05, 0.4, 0.4]  # row t favours Paris
    logits = np.zeros((n, len(TOKENIZER.vocab)))
    logits[:5, 0] = 30.0  # near-certain steps: entropy ~0
    _, rag, curr_tokens, hit = dragin_rind(words, logits, attention, threshold=1.0)
    decision = rigkit_decide(rigkit_segment(words, logits, attention), top_words=1, threshold=1.0)
    assert decision.evidence["trigger_token"] == 5 and hit == [0, 0, 0, 0, 0, 1]
    assert dragin_query(rag, curr_tokens, hit, attention, top_k=1) == "Gustave"
    assert AttentionQuery(include_question=False).build("", "", decision).text == "Paris"


def test_departure_the_query_reads_the_sentence_not_the_question():
    """DRAGIN's QFS ranks the real words of the question, the answer so far and the sentence;
    rigkit's attention covers the segment's own tokens (one forward pass over them, through the
    prompt's cache), so its query words come from the sentence and the `attention` query adds
    the question's key terms itself (`query.include_question`)."""
    question, words = ["Napoleon", "bridge"], ["Gustave", "Eiffel", "lattice", "engineer", "Paris"]
    m, n = len(question) + len(words), len(words)
    full = np.zeros((1, m, m))
    for j in range(m):
        full[0, j, : j + 1] = 1.0 / (j + 1)
    for j in (m - 2, m - 1):  # the rows that wrote and then read "Paris": Napoleon first, then Eiffel
        full[0, j, : j + 1] = 0.02
        full[0, j, 0], full[0, j, 3] = 0.6, 0.3
    full[0, m - 1, m - 1] = 0.5  # "Paris" holds its own attention: DRAGIN and rigkit both flag it
    segment_attention = full[:, 2:, 2:]  # the segment's rows over its own tokens, as rigkit reads them
    logits = np.zeros((n, len(TOKENIZER.vocab)))
    logits[:4, 0] = 30.0  # near-certain steps; "Paris" is a guess
    flagged, rag, curr_tokens, hit = dragin_rind(words, logits, segment_attention)
    decision = rigkit_decide(rigkit_segment(words, logits, segment_attention), top_words=1)
    assert flagged == [4] and decision.evidence["trigger_token"] == 4
    assert dragin_query(rag, curr_tokens, hit, full, top_k=1, question="Napoleon bridge") == "Napoleon"
    assert AttentionQuery(include_question=False).build("", "", decision).text == "Eiffel"
