"""LoRA adapters as model specs: `BASE+NAME`, `BASE+/path/to/adapter`, or an adapter folder.

`NAME` is an adapter shipped in `rigkit/resources/adapters/` (`smollm2-135m-instruct+markers`
is the folder `smollm2-135m-instruct-markers`). The adapter is merged into the base weights
after loading, so the generator is a plain transformers model again: the KV cache, per-token
probabilities and attention read-outs work exactly as without it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rigkit.errors import ModelNotFoundError

__all__ = ["ADAPTERS_DIR", "shipped_adapters", "adapter_spec", "load_with_adapter"]

ADAPTERS_DIR = Path(__file__).resolve().parent.parent / "resources" / "adapters"
_CONFIG = "adapter_config.json"


def shipped_adapters() -> list[str]:
    """Folder names of the adapters that come with rigkit."""
    if not ADAPTERS_DIR.is_dir():
        return []
    return sorted(p.name for p in ADAPTERS_DIR.iterdir() if (p / _CONFIG).exists())


def _is_adapter_dir(path: Path) -> bool:
    return path.is_dir() and (path / _CONFIG).exists()


def adapter_spec(spec: str) -> tuple[str, Path] | None:
    """(base spec, adapter folder) when `spec` names an adapter, else None."""
    path = Path(spec).expanduser()
    if path.exists():
        if not _is_adapter_dir(path):
            return None
        base = json.loads((path / _CONFIG).read_text()).get("base_model_name_or_path") or ""
        if not base:
            raise ModelNotFoundError(f"{path}/{_CONFIG} names no base model; use BASE+{path}")
        return base, path
    if "+" not in spec:
        return None
    base, name = spec.rsplit("+", 1)
    for candidate in (Path(name).expanduser(), ADAPTERS_DIR / f"{base}-{name}", ADAPTERS_DIR / name):
        if _is_adapter_dir(candidate):
            return base, candidate
    known = ", ".join(shipped_adapters()) or "none"
    raise ModelNotFoundError(
        f"adapter {name!r} for {base!r} not found (shipped: {known}); give a folder with {_CONFIG}"
    )


def load_with_adapter(
    base: str, adapter_dir: Path, load_base: Callable[[str], tuple[Any, Any, str]]
) -> tuple[Any, Any, str]:
    """Load `base` with `load_base`, apply the LoRA adapter, merge it; (model, tokenizer, source)."""
    from peft import PeftModel  # imported only when an adapter is asked for

    model, tokenizer, source = load_base(base)
    tuned = PeftModel.from_pretrained(model, str(adapter_dir))
    merged = tuned.merge_and_unload()
    return merged.eval(), tokenizer, f"{source} + LoRA {adapter_dir.name}"
