"""Model loading dispatch and placement, without loading or downloading any model."""

from __future__ import annotations

import pytest

from rigkit.errors import InputError
from rigkit.generation import loading


@pytest.fixture
def calls(monkeypatch):
    """Record which loader each spec reaches; return a tiny stand-in instead of a model."""
    seen: list[tuple[str, str]] = []

    class _Model:
        def eval(self):
            return self

    def fake_default(place):
        seen.append(("offline-gguf-copy", ""))
        return _Model(), object(), "gguf"

    def fake_pretrained(name, place):
        seen.append(("from_pretrained", name))
        return _Model(), object()

    monkeypatch.setattr(loading, "_load_default", fake_default)
    monkeypatch.setattr(loading, "_from_pretrained", fake_pretrained)
    return seen


def test_only_the_short_name_means_the_offline_copy(calls):
    place = loading.Placement(device="cpu", dtype="float32")
    loading._load_model("smollm2-135m-instruct", place)
    loading._load_model("SmolLM2-135M-Instruct", place)  # the short name, any case
    assert calls == [("offline-gguf-copy", ""), ("offline-gguf-copy", "")]


def test_the_hub_id_of_the_default_model_loads_the_hub_model(calls):
    source = loading._load_model("HuggingFaceTB/SmolLM2-135M-Instruct", loading.Placement("cpu", "float32"))[2]
    assert calls == [("from_pretrained", "HuggingFaceTB/SmolLM2-135M-Instruct")]
    assert source == "hub"


def test_auto_placement_on_a_cpu_machine(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(loading, "_mps_available", lambda: False)
    assert loading.Placement().resolve() == loading.Placement("cpu", "float32")


def test_auto_dtype_on_cuda_is_bfloat16_where_supported(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert loading.Placement(device="cuda:1").resolve() == loading.Placement("cuda:1", "bfloat16")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"device": "gpu"}, "unknown device 'gpu'"),
        ({"dtype": "fp8"}, "unknown dtype 'fp8'"),
        ({"attn_implementation": "fast"}, "unknown attn_implementation 'fast'"),
    ],
)
def test_bad_placement_names_are_one_line_errors(kwargs, message):
    with pytest.raises(InputError, match=message):
        loading.Placement(**kwargs).resolve()


def test_cuda_asked_for_without_a_gpu_says_so(monkeypatch):
    import torch

    from rigkit.errors import ModelNotFoundError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ModelNotFoundError, match="sees no CUDA GPU"):
        loading.Placement(device="cuda").resolve()


def test_the_placement_reaches_from_pretrained(monkeypatch):
    """device_map hands placement to accelerate; otherwise the model moves to the device."""
    import transformers

    seen = {}

    class _Model:
        def to(self, device):
            seen["to"] = device
            return self

        def eval(self):
            return self

    def fake_model(name, **kwargs):
        seen.update(kwargs)
        return _Model()

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda name, **kw: object())
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fake_model)
    loading._from_pretrained("some/model", loading.Placement("cpu", "bfloat16", None, "sdpa", True))
    assert seen["to"] == "cpu" and seen["attn_implementation"] == "sdpa" and seen["trust_remote_code"] is True
    assert str(seen["dtype"]) == "torch.bfloat16" and "device_map" not in seen
    seen.clear()
    loading._from_pretrained("some/model", loading.Placement("cuda", "float16", "auto"))
    assert seen["device_map"] == "auto" and "to" not in seen and seen["trust_remote_code"] is False


def test_a_saved_model_loads_in_the_dtype_asked_for(tmp_path):
    """`from_pretrained(dtype=...)` is honoured (transformers >= 4.56; 4.55 ignored it silently)."""
    import torch

    from tests.tiny_model import tiny_generator

    tiny = tiny_generator(0)
    tiny.model.save_pretrained(tmp_path)
    tiny.tokenizer.save_pretrained(tmp_path)
    generator = loading.load_generator(str(tmp_path), device="cpu", dtype="bfloat16")
    assert generator.model.dtype == torch.bfloat16 and generator.source == "local"
    assert generator.model.config._attn_implementation == "sdpa"


def test_a_cached_copy_loses_the_gguf_quantization_config_an_older_conversion_saved(tmp_path, monkeypatch):
    """Its weights are dequantised; vLLM, reading `quant_method: gguf`, would look for a GGUF."""
    import json

    monkeypatch.setenv("RIGKIT_CACHE_DIR", str(tmp_path))
    config_path = loading.converted_model_dir() / "config.json"
    config_path.parent.mkdir(parents=True)
    gguf = {"quant_method": "gguf", "gguf_file": loading.GGUF_FILE, "dequantize": False}
    config_path.write_text(json.dumps({"model_type": "llama", "quantization_config": gguf}))
    read = []

    def from_pretrained(name, place):
        read.append(json.loads(config_path.read_text()))
        return object(), object()

    monkeypatch.setattr(loading, "_from_pretrained", from_pretrained)
    loading._load_default(loading.Placement("cpu", "float32"))
    assert read == [{"model_type": "llama"}]  # cleaned before the model loads
    assert [p.name for p in config_path.parent.iterdir()] == ["config.json"]  # no staging file left


def test_other_quantization_configs_are_left_alone(tmp_path):
    import json

    config = {"model_type": "llama", "quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True}}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    loading._drop_gguf_quantization(path)
    assert json.loads(path.read_text()) == config
