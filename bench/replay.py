"""Replay (teacher forcing): push one run's exact tokens through another layout or cache setting.

Each layout makes the model read a different context, so free runs write different answers and
their pre-fill and time are not comparable. A replay records what a reference run generated,
call by call, and then forces those tokens in another run: the model still runs every forward
pass through the real KV cache, the stop rule still decides where segments end, the decider and
the retriever still run; only the choice of the next token is taken from the record. Pre-filled
tokens and seconds then compare like with like.

Built on public parts only: `ScriptedModel` wraps a transformers model and is handed to an
ordinary `HFGenerator`; forcing is a `LogitsProcessor` passed to `model.generate`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rigkit.generation import HFGenerator
from rigkit.trace import RIGResult

__all__ = ["ScriptedModel", "scripted_generator", "same_run"]


class _ForceTokens:
    """LogitsProcessor: at step j of this call, only `script[j]` may be chosen (then `eos`)."""

    def __init__(self, script: Sequence[int], prompt_len: int, eos: int):
        self.script, self.prompt_len, self.eos = list(script), prompt_len, eos

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        step = input_ids.shape[1] - self.prompt_len
        token = self.script[step] if step < len(self.script) else self.eos
        forced = scores.new_full(scores.shape, float("-inf"))
        forced[:, token] = 0.0
        return forced


class ScriptedModel:
    """A transformers causal LM whose `generate` records each call's new tokens, and, when
    given a script from an earlier recording, forces them (call i gets `script[i]`).

    Everything else (forward passes, caches, config, device) is the wrapped model's own.
    """

    def __init__(self, model: Any, script: Sequence[Sequence[int]] | None = None):
        self._model = model
        self.script = [list(s) for s in script] if script is not None else None
        self.calls: list[list[int]] = []  # each segment call's tokens, in order
        self.generator: HFGenerator | None = None  # set by `scripted_generator`

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        from transformers import LogitsProcessorList

        prompt_len = int(kwargs["input_ids"].shape[1])
        # A call may start with a token the previous call generated past its segment's end (the
        # generator carries it instead of computing it again): it belongs to this call's tokens,
        # so the record is the same whether or not a way carries (a cache-off way never does).
        carried = list(getattr(self.generator, "carried", None) or [])
        if self.script is not None:
            i = len(self.calls)
            script = self.script[i] if i < len(self.script) else []
            eos = kwargs.get("eos_token_id")
            eos = eos[0] if isinstance(eos, (list, tuple)) else eos
            processors = LogitsProcessorList(kwargs.pop("logits_processor", None) or [])
            processors.append(_ForceTokens(script[len(carried):], prompt_len, int(eos)))
            kwargs["logits_processor"] = processors
        out = self._model.generate(*args, **kwargs)
        sequences = getattr(out, "sequences", out)
        self.calls.append(carried + sequences[0, prompt_len:].tolist())
        return out

    def eval(self) -> ScriptedModel:
        self._model.eval()
        return self  # HFGenerator keeps what eval() returns

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._model(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


def scripted_generator(
    base: HFGenerator, use_cache: bool = True, script: Sequence[Sequence[int]] | None = None
) -> tuple[HFGenerator, ScriptedModel]:
    """A generator over `base`'s model and tokenizer that records (or, with `script`, forces)
    every call's tokens; returns it with its `ScriptedModel` (whose `.calls` hold the record)."""
    model = ScriptedModel(base.model, script)
    generator = HFGenerator(
        model, base.tokenizer, spec=base.spec, source=base.source, use_cache=use_cache,
        temperature=base.temperature, top_p=base.top_p,
    )
    model.generator = generator
    return generator, model


def same_run(a: RIGResult, b: RIGResult) -> bool:
    """Whether two runs wrote the same segments and retrieved the same chunks, round by round.

    The answer texts may still differ in spacing: the append layout joins a segment written after
    a passage block with a space, the prefix layout has no block to join across."""
    if len(a.rounds) != len(b.rounds):
        return False
    for x, y in zip(a.rounds, b.rounds):
        if x.segment.token_ids != y.segment.token_ids or x.action != y.action:
            return False
        if [h.chunk_id for h in x.hits] != [h.chunk_id for h in y.hits]:
            return False
    return True
