"""What the loop needs of a model: the `Generator` protocol and optional capabilities.

Every backend implements `Generator`, including what it says about itself (`spec`, `source`,
`context_limit`) and token streaming (`next_segment(..., on_token=None)`). In-process models also
offer model internals (attention, hidden states) and a resettable cache; deciders and the trigger
code ask for those with `isinstance(generator, SupportsAttention)` and friends instead of probing
attribute names.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Protocol, runtime_checkable

from rigkit.errors import InputError
from rigkit.trace import Segment
from rigkit.transcript import Piece, StopRule

__all__ = [
    "Generator",
    "SupportsAttention",
    "SupportsHiddenStates",
    "SupportsReset",
    "ReportsTokenScores",
    "LOGPROBS",
    "ATTENTION",
    "EXTRA_PASSES",
    "check_needs",
]


@runtime_checkable
class Generator(Protocol):
    """The model behind a run. In-process (`HFGenerator`) or an HTTP backend."""

    @property
    def spec(self) -> str:
        """The model's name as given (hub id, local path, served name); results record it."""
        ...

    @property
    def source(self) -> str:
        """Where the weights or the numbers come from (GGUF file, hub, server and its limits)."""
        ...

    @property
    def context_limit(self) -> int:
        """The most tokens the model attends to, prompt and answer together."""
        ...

    def next_segment(
        self, prompt: Sequence[Piece], stop: StopRule, max_new_tokens: int,
        on_token: Callable[[str], None] | None = None,
    ) -> Segment:
        """Continue `prompt` until `stop` fires, end of turn, or `max_new_tokens`.

        `on_token`, when given, receives each new token's text as it is written (tentative:
        the returned `Segment` is what counts; `rigkit.streaming` reconciles the two). Every
        generator takes it; one that cannot stream may ignore it, and its text then reaches
        listeners when each round ends.
        """
        ...

    def generate(self, prompt: str, max_new_tokens: int = 48) -> str:
        """A one-off helper call (e.g. a query rewrite): `prompt` as a user message, reply text."""
        ...

    def count_tokens(self, text: str) -> int: ...

    def render_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        """The chat template applied to `messages`, as text."""
        ...


@runtime_checkable
class SupportsAttention(Protocol):
    """A generator that can show the attention among a segment's tokens (DRAGIN)."""

    def segment_attention(self, segment: Segment) -> list[list[float]]: ...


@runtime_checkable
class SupportsHiddenStates(Protocol):
    """A generator that can pool the hidden state of a segment (trigger features)."""

    def segment_hidden_state(self, segment: Segment) -> list[float]: ...


@runtime_checkable
class SupportsReset(Protocol):
    """A generator with per-question state (a KV cache) to forget, and sampling to reseed."""

    def reset(self, seed: int | None = None) -> None: ...


@runtime_checkable
class ReportsTokenScores(Protocol):
    """A generator that may lack per-token log-probabilities (a chat server that does not send them)."""

    def missing_token_scores(self) -> str | None:
        """None when segments carry real log-probabilities, else what is missing, in one line."""
        ...


# What a decider may need of the model besides the text (declared as `needs` on its class)
LOGPROBS = "log-probabilities"  # real per-token log-probabilities (a chat server may not send them)
ATTENTION = "attentions"  # the attention among a segment's tokens (an in-process model)
EXTRA_PASSES = "extra passes"  # forward passes of its own through the model (recorded per decision)


def check_needs(decider: str, needs: Collection[str], generator: Generator, text_only: Sequence[str] = ()) -> None:
    """Refuse, in one line naming `decider`, needs `generator` cannot meet: a served model
    (`OpenAIGenerator`) offers no attentions, so DRAGIN's attention-weighted entropy cannot run on
    it; a chat server may send no log-probabilities. `text_only`: deciders that read the text alone."""
    if LOGPROBS in needs and isinstance(generator, ReportsTokenScores):
        if missing := generator.missing_token_scores():
            raise InputError(f"decider {decider!r} reads token probabilities, but {missing}; "
                             f"deciders that work with it: {', '.join(text_only)}")
    if ATTENTION in needs and not isinstance(generator, SupportsAttention):
        raise InputError(
            f"decider {decider!r} needs the model's attention weights, which "
            f"{type(generator).__name__} ({generator.spec}) cannot give; use an "
            "in-process model, or entropy alone with decider.params.use_attention: false"
        )
