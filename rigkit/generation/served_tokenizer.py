"""The tokenizer of a served model, loaded on this side: rigkit keeps the transcript in its tokens."""

from __future__ import annotations

from typing import Any

from rigkit.config import GeneratorConfig
from rigkit.errors import InputError

__all__ = ["load_tokenizer"]


def load_tokenizer(name: str, trust_remote_code: bool = GeneratorConfig.trust_remote_code) -> Any:
    """The served model's tokenizer by hub name or path; the default short name stays offline."""
    from rigkit.generation.default_model import DEFAULT_MODEL, default_tokenizer

    if name.lower() == DEFAULT_MODEL:
        return default_tokenizer()
    from transformers import AutoTokenizer

    from rigkit.models.registry import MODELS

    if name.lower() in MODELS:
        return _offline_tokenizer(MODELS[name.lower()])

    try:
        return AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        raise InputError(
            f"cannot load the tokenizer {name!r} ({type(err).__name__}); name the served model's tokenizer "
            "with generator.tokenizer (a hub id or a local folder)"
        ) from None


def _offline_tokenizer(model: Any) -> Any:
    """An offline model's tokenizer: its converted copy's, else read from its installed GGUF."""
    from transformers import AutoTokenizer

    from rigkit.models.install import converted_dir, require_installed

    converted = converted_dir(model)
    if (converted / "tokenizer_config.json").exists():
        return AutoTokenizer.from_pretrained(str(converted))
    gguf = require_installed(model, f"{model.name}'s tokenizer")
    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
