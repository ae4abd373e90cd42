"""Fine-tuning: teach a generator to write its own retrieval markers (LoRA, on CPU)."""

from rigkit.finetune.data import (
    MarkerExample,
    build_marker_data,
    data_hash,
    encode_example,
    read_examples,
    write_examples,
)

__all__ = [
    "MarkerExample",
    "build_marker_data",
    "data_hash",
    "encode_example",
    "read_examples",
    "write_examples",
]
