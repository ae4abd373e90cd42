"""LoRA adapters named by `--model`: the adapter folder alone (onto the base its config names) is
accepted; an adapter put onto another base model than it was trained on is refused naming both,
before any model loads."""

from __future__ import annotations

import json
import shutil

import pytest

from rigkit.cli import check_model_path
from rigkit.errors import InputError
from rigkit.generation.adapters import ADAPTERS_DIR, adapter_spec, same_base

SHIPPED = ADAPTERS_DIR / "smollm2-135m-instruct-markers"


def _retrained(tmp_path, base: str):
    """A copy of the shipped adapter whose config names `base`."""
    folder = tmp_path / "adapter"
    shutil.copytree(SHIPPED, folder)
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": base}))
    return folder


def test_an_adapter_folder_is_a_model_spec():
    check_model_path(str(SHIPPED))  # no config.json, no tokenizer: an adapter, not a broken model
    assert adapter_spec(str(SHIPPED)) == ("smollm2-135m-instruct", SHIPPED)


def test_a_folder_that_is_neither_model_nor_adapter_is_still_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(InputError, match="is not a model folder"):
        check_model_path(str(tmp_path))


def test_an_adapter_on_another_base_is_refused_naming_both(tmp_path, cli):
    folder = _retrained(tmp_path, "Qwen/Qwen2.5-0.5B-Instruct")
    with pytest.raises(InputError, match=r"trained on 'Qwen/Qwen2.5-0.5B-Instruct', not on 'smollm2-135m-instruct'"):
        adapter_spec(f"smollm2-135m-instruct+{folder}")
    done = cli("ask", "What?", "--model", f"smollm2-135m-instruct+{folder}")
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and "Qwen/Qwen2.5-0.5B-Instruct" in errors[0] and "smollm2-135m-instruct" in errors[0]
    assert "loading" not in done.stderr  # refused before any model loads


def test_one_model_spelled_two_ways_is_the_same_base(tmp_path):
    assert same_base("smollm2-135m-instruct", "HuggingFaceTB/SmolLM2-135M-Instruct")
    assert same_base("HuggingFaceTB/SmolLM2-135M-Instruct", "/models/SmolLM2-135M-Instruct/")
    assert not same_base("smollm2-135m-instruct", "HuggingFaceTB/SmolLM2-360M-Instruct")
    folder = _retrained(tmp_path, "HuggingFaceTB/SmolLM2-135M-Instruct")
    assert adapter_spec(f"smollm2-135m-instruct+{folder}") == ("smollm2-135m-instruct", folder)
    assert adapter_spec("smollm2-135m-instruct+markers") == ("smollm2-135m-instruct", SHIPPED)


@pytest.mark.slow
def test_the_adapter_folder_loads_as_the_base_plus_the_adapter():
    from rigkit.generation.loading import load_generator

    generator = load_generator(str(SHIPPED))
    assert generator.source.endswith("+ LoRA smollm2-135m-instruct-markers")


def _one_error(done) -> str:
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("rigkit: error:")]
    assert len(errors) == 1, done.stderr[-2000:]
    return errors[0]


def test_an_adapter_whose_base_is_itself_or_no_model_is_one_line_before_loading(tmp_path, cli):
    itself = _retrained(tmp_path, str(tmp_path / "adapter"))
    line = _one_error(cli("ask", "What?", "--model", str(itself)))
    assert "(the adapter itself)" in line and "not a model folder" in line
    (tmp_path / "empty").mkdir()
    other = tmp_path / "other"
    shutil.copytree(itself, other)
    config = json.loads((other / "adapter_config.json").read_text())
    (other / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": str(tmp_path / "empty")}))
    done = cli("ask", "What?", "--model", str(other))
    assert "is not a model folder: missing config.json" in _one_error(done) and "loading" not in done.stderr


def test_serve_refuses_a_model_folder_without_weights_before_loading(tmp_path, cli):
    (tmp_path / "config.json").write_text("{}")
    line = _one_error(cli("serve", "--model", str(tmp_path)))
    assert "is not a model folder: missing weights" in line


@pytest.mark.slow
def test_damaged_adapter_files_are_one_line_naming_the_adapter(tmp_path, cli):
    folder = tmp_path / "adapter"
    shutil.copytree(SHIPPED, folder)
    weights = folder / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # cut short
    line = _one_error(cli("ask", "What?", "--model", str(folder), "--decider", "never"))
    assert f"the adapter {folder} cannot be loaded onto smollm2-135m-instruct" in line
