"""LoRA adapters as model specs: loading them is a generation concern (`rigkit.generation.adapters`).

Training writes the adapter folders that `rigkit.generation.adapters` reads; the names are
re-exported here so the training code and its users find them beside it.
"""

from rigkit.generation.adapters import (
    ADAPTERS_DIR,
    adapter_spec,
    load_with_adapter,
    shipped_adapters,
)

__all__ = ["ADAPTERS_DIR", "shipped_adapters", "adapter_spec", "load_with_adapter"]
