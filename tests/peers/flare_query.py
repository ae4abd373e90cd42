# FLARE's look-ahead decision and masked query, vendored for the `prob` decider's parity tests
# (tests/test_peer_flare_dragin.py).
#
# From https://github.com/jzbjyb/FLARE, commit ec4b06b502b5ab54f3f9236b0112a5d28482e7bb,
# src/templates.py, class ApiReturn: the class attributes, __init__, has_tokens, token_probs and
# use_as_query. FLARE calls `use_as_query(low_prob=look_ahead_filter_prob,
# mask_prob=look_ahead_mask_prob, mask_method=look_ahead_mask_method)` on the look-ahead sentence
# (src/openai_api.py, ret_prompt): an empty query means no retrieval; otherwise the tokens at or
# below `mask_prob` are masked out. Its probabilities are `np.exp(token_logprob)` of the
# completion (src/openai_api.py, complete).
#
# MIT License
#
# Copyright (c) 2023 Zhengbao Jiang
#
# Permission is hereby granted, free of charge, to any person obtaining a copy
# of this software and associated documentation files (the "Software"), to deal
# in the Software without restriction, including without limitation the rights
# to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
# copies of the Software, and to permit persons to whom the Software is
# furnished to do so, subject to the following conditions:
#
# The above copyright notice and this permission notice shall be included in all
# copies or substantial portions of the Software.
#
# THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
# IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
# FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
# AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
# LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
# OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
# SOFTWARE.
#
# Changes (the shim): the imports are only those the kept code uses (typing.List); two class attributes that load sentence splitters at import time are left
# out (`spacy_nlp = spacy.load('en_core_web_sm')`, a model download, and
# `psentencizer = PunktSentenceTokenizer()`); only the sentence-truncation methods, not vendored,
# use them. The other methods of ApiReturn are left out too. `use_as_query`'s
# 'wholeterm-*' branch names CtxPrompt, which is not vendored: the tests use FLARE's configured
# 'simple' method. The kept code is unchanged.
# ruff: noqa  (upstream's code as upstream wrote it)

from typing import List


class ApiReturn:
    EOS = '<|endoftext|>'
    use_sentencizer = 'nltk'
    min_sent_len = 5

    def __init__(
        self,
        prompt: str,
        text: str,
        tokens: List[str] = None,
        probs: List[float] = None,
        offsets: List[int] = None,
        finish_reason: str = 'stop',
        model: str = None,
        skip_len: int = 0,
    ):
        self.model = model
        self.prompt = prompt
        self.text = text

        self.tokens = tokens
        self.probs = probs
        self.offsets = offsets
        if self.has_tokens:
            assert len(tokens) == len(probs) == len(offsets)

        self.finish_reason = finish_reason
        if self.finish_reason is None:
            self.finish_reason = 'stop'  # TODO: a bug from openai?

        if skip_len:  # skip `skip_len` chars at the beginning
            self.text = self.text[skip_len:]
            if self.has_tokens:
                i = 0
                for i, off in enumerate(self.offsets):
                    if off == skip_len:
                        break
                    elif off > skip_len:  # the previous token span across the boundary
                        i = i - 1
                        assert i >= 0
                        break
                self.tokens = self.tokens[i:]
                self.probs = self.probs[i:]
                self.offsets = self.offsets[i:]

    @property
    def has_tokens(self):
        return self.tokens is not None

    @property
    def token_probs(self):
        if self.has_tokens:
            return self.probs
        else:
            return []

    def use_as_query(
        self,
        low_prob: float = None,
        mask_prob: float = None,
        mask_method: str = 'simple',
        n_gen_char_in_prompt: int = 0,
        api_key: str = None,
    ):
        if not low_prob and not mask_prob:
            return self.text
        assert self.has_tokens, 'not supported'
        if low_prob:
            ok = False
            for p in self.probs:
                if p <= low_prob:
                    ok = True
                    break
            if not ok:
                return ''
        if mask_prob:
            if mask_method == 'simple':
                keep = [(t if p > mask_prob else ' ') for t, p in zip(self.tokens, self.probs)]
                keep = ''.join(keep).strip()
                return keep
            elif mask_method in {'wholeterm-decontextualize', 'wholeterm-askquestion'}:
                if n_gen_char_in_prompt == 0:
                    context = ''
                else:
                    context = self.prompt[-n_gen_char_in_prompt:]
                decontextualize = 'decontextualize' in mask_method
                askquestion = 'askquestion' in mask_method
                keep = CtxPrompt.get_queries_from_text_for_retrieval(
                    context=context,
                    tokens=self.tokens,
                    probs=self.probs,
                    low=mask_prob,
                    api_key=api_key,
                    detect_low_terms=True,
                    decontextualize=decontextualize,
                    askquestion=askquestion)
                return keep
            else:
                raise NotImplementedError
        else:
            return self.text

