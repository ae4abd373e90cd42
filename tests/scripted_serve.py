"""`rigkit serve` with a scripted model and a fixed index: `python -m tests.scripted_serve --port N`.

The real command (`rigkit.cli.main(["serve", ...])`: uvicorn, its signal handling, the app, MCP)
over `rigkit.testing` parts instead of the default model and index, so the process starts in
seconds. Each answer is written one word at a time, `RIGKIT_TEST_TOKEN_SECONDS` apart (default 0),
so a test can keep a request in flight.
"""

from __future__ import annotations

import os
import sys
import time

from rigkit.testing import DictRetriever, ScriptedGenerator, make_segment
from rigkit.trace import Hit

ANSWER = "The Eiffel Tower is 330 metres tall and stands in Paris."
SUMMARY = "We talked about the Eiffel Tower."  # every helper call's reply (a history summary)
HITS = [Hit("c1", "d1", "Eiffel Tower", "The Eiffel Tower is 330 metres tall and stands in Paris.", 1.0)]


class SlowScript(ScriptedGenerator):
    """The same one-segment answer for every question, each word after a pause."""

    def __init__(self, pause: float):
        super().__init__([])
        self.pause = pause

    def reset(self, seed: int | None = None) -> None:
        pass

    def next_segment(self, prompt, stop, max_new_tokens, on_token=None):
        segment = make_segment(ANSWER, finish_reason="end_of_turn")
        for token in segment.tokens:
            time.sleep(self.pause)
            if on_token is not None:
                on_token(token)
        return segment

    def generate(self, prompt: str, max_new_tokens: int = 48) -> str:
        self.helper_prompts.append(prompt)
        return SUMMARY


# RIGKIT_TEST_SCRIPT=tools: every question calls the client's `weather` tool, then searches, then
# answers (the marker decider reads the model's own <retrieve> markers)
TOOL_SCRIPT = ['It is sunny. <retrieve>weather {"city": "Paris"}</retrieve>',
               " The tower is tall. <retrieve>its height</retrieve>", " The Eiffel Tower is 330 metres tall."]


class ToolScript(ScriptedGenerator):
    """The tool script from its start for each question (a reset), like a greedy model."""

    def __init__(self) -> None:
        super().__init__(TOOL_SCRIPT)

    def reset(self, seed: int | None = None) -> None:
        self.segments = [make_segment(text) for text in TOOL_SCRIPT]
        self.segments[-1].finish_reason = "end_of_turn"

    def generate(self, prompt: str, max_new_tokens: int = 48) -> str:
        return SUMMARY


def main(argv: list[str]) -> int:
    import rigkit.build
    from rigkit.cli import main as rigkit_main

    pause = float(os.environ.get("RIGKIT_TEST_TOKEN_SECONDS", "0"))
    rigkit.build.build_retriever = lambda config: DictRetriever({}, default=HITS)
    if os.environ.get("RIGKIT_TEST_SCRIPT") == "tools":
        rigkit.build.build_generator = lambda config: ToolScript()
        return rigkit_main(["serve", "--set", "decider.name=marker", "--set", "query.mode=marker", *argv])
    rigkit.build.build_generator = lambda config: SlowScript(pause)
    return rigkit_main(["serve", "--set", "decider.name=never", *argv])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
