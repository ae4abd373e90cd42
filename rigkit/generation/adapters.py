"""LoRA adapters as model specs: `BASE+NAME`, `BASE+/path/to/adapter`, or an adapter folder.

`NAME` is an adapter shipped in `rigkit/resources/adapters/` (`smollm2-135m-instruct+markers`
is the folder `smollm2-135m-instruct-markers`). The adapter is merged into the base weights
after loading, so the generator is a plain transformers model again: the KV cache, per-token
probabilities and attention read-outs work exactly as without it.

An adapter is merged only onto the base model its `adapter_config.json` names: LoRA deltas
trained on one model load without complaint onto another of the same shape and make it worse,
so `OTHER+adapter` is refused naming both. Names match across spellings of one model (the short
name `smollm2-135m-instruct` and its hub id, a hub id and a local folder of the same name).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rigkit.errors import InputError, ModelNotFoundError

__all__ = ["ADAPTERS_DIR", "shipped_adapters", "is_adapter_dir", "adapter_spec", "adapter_base",
           "same_base", "load_with_adapter"]

ADAPTERS_DIR = Path(__file__).resolve().parent.parent / "resources" / "adapters"
_CONFIG = "adapter_config.json"


def shipped_adapters() -> list[str]:
    """Folder names of the adapters that come with rigkit."""
    if not ADAPTERS_DIR.is_dir():
        return []
    return sorted(p.name for p in ADAPTERS_DIR.iterdir() if (p / _CONFIG).exists())


def _is_adapter_dir(path: Path) -> bool:
    return path.is_dir() and (path / _CONFIG).exists()


def is_adapter_dir(path: str | Path) -> bool:
    """Whether `path` is a LoRA adapter folder (it holds an `adapter_config.json`)."""
    return _is_adapter_dir(Path(path).expanduser())


def adapter_base(adapter_dir: Path) -> str:
    """The base model the adapter's config names ("" when it names none)."""
    config = adapter_dir / _CONFIG
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(f"{config}: not a readable adapter config ({type(err).__name__})") from None
    base = data.get("base_model_name_or_path") if isinstance(data, dict) else None
    return base if isinstance(base, str) else ""


def same_base(a: str, b: str) -> bool:
    """Whether two model specs name the same model (short name, hub id, or a folder of that name)."""
    from rigkit.generation.default_model import DEFAULT_HUB_ID, DEFAULT_MODEL

    def key(spec: str) -> str:
        spec = spec.strip().rstrip("/\\")
        spec = DEFAULT_HUB_ID if spec.lower() == DEFAULT_MODEL else spec
        return spec.replace("\\", "/").rsplit("/", 1)[-1].lower()

    return key(a) == key(b)


def adapter_spec(spec: str) -> tuple[str, Path] | None:
    """(base spec, adapter folder) when `spec` names an adapter, else None.

    An adapter folder alone loads onto the base its config names; `BASE+adapter` must name that
    base (else `InputError`, naming both)."""
    path = Path(spec).expanduser()
    if path.exists():
        if not _is_adapter_dir(path):
            return None
        base = adapter_base(path)
        if not base:
            raise ModelNotFoundError(f"{path}/{_CONFIG} names no base model; use BASE+{path}")
        _check_base(base, path)
        return base, path
    if "+" not in spec:
        return None
    base, name = spec.rsplit("+", 1)
    for candidate in (Path(name).expanduser(), ADAPTERS_DIR / f"{base}-{name}", ADAPTERS_DIR / name):
        if _is_adapter_dir(candidate):
            trained_on = adapter_base(candidate)
            if trained_on and not same_base(base, trained_on):
                raise InputError(
                    f"the adapter {candidate} was trained on {trained_on!r}, not on {base!r}: load it as "
                    f"{trained_on}+{name} (or give the folder alone)"
                )
            _check_base(base, candidate)
            return base, candidate
    known = ", ".join(shipped_adapters()) or "none"
    raise ModelNotFoundError(
        f"adapter {name!r} for {base!r} not found (shipped: {known}); give a folder with {_CONFIG}"
    )


def _check_base(base: str, adapter: Path) -> None:
    """The base of `adapter`, when a local folder, must be a model folder (not an adapter: that
    one would name a base again, or itself)."""
    from rigkit.generation.default_model import model_folder_problem

    folder = Path(base).expanduser()
    if not folder.exists():
        return  # a hub id or the default short name: the loader says when it cannot load it
    if _is_adapter_dir(folder):
        itself = " (the adapter itself)" if folder.resolve() == adapter.resolve() else ""
        raise InputError(f"the adapter {adapter} names {base}{itself} as its base model, which is an adapter "
                         "folder, not a model folder: name the base model's folder or hub id")
    problem = model_folder_problem(folder)
    if problem:
        raise InputError(f"the adapter {adapter} names {base} as its base model, which is not a model "
                         f"folder: {problem}")


def load_with_adapter(
    base: str, adapter_dir: Path, load_base: Callable[[str], tuple[Any, Any, str]]
) -> tuple[Any, Any, str]:
    """Load `base` with `load_base`, apply the LoRA adapter, merge it; (model, tokenizer, source)."""
    from peft import PeftModel  # imported only when an adapter is asked for

    model, tokenizer, source = load_base(base)
    try:
        tuned = PeftModel.from_pretrained(model, str(adapter_dir))
    except Exception as err:  # noqa: BLE001 - safetensors, size mismatches, bad config values: one line
        first = (str(err).strip().splitlines() or [""])[0][:200]
        raise InputError(f"the adapter {adapter_dir} cannot be loaded onto {base}: its files are damaged or "
                         f"made for another model ({type(err).__name__}: {first})") from None
    merged = tuned.merge_and_unload()
    return merged.eval(), tokenizer, f"{source} + LoRA {adapter_dir.name}"
