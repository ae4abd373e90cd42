"""bench/cuda_check.py on the CPU with the tiny model, so the GPU check never rots where CI has
no GPU; and the random models it builds (rigkit.generation.random_model)."""

from __future__ import annotations

import pytest

from rigkit.errors import ModelNotFoundError
from rigkit.generation.random_model import random_parts, save_model, tiny_parts


@pytest.fixture
def cuda_check(monkeypatch):
    from tests.test_bench import BENCH

    monkeypatch.syspath_prepend(str(BENCH))
    import cuda_check

    return cuda_check


def test_the_check_runs_the_loop_on_the_cpu(cuda_check, capsys):
    code = cuda_check.main(["--device", "cpu", "--dtype", "float32", "--models", "tiny", "--questions", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    row = next(line for line in out.splitlines() if line.startswith("| tiny |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:4] == ["cpu", "float32", "2"]  # device, dtype, one answer per decider
    assert cells[-2:] == ["100%", "ok"]  # the same greedy tokens as the reference run, no problem


def test_a_failed_check_is_reported(cuda_check):
    base = cuda_check.Run("cpu", "float32", answers=1, rounds=2, first={("prob", "q"): [1, 2]})
    run = cuda_check.Run("cuda", "float32", answers=1, rounds=2, retrievals={"prob": 1},
                         first={("prob", "q"): [1, 3]})
    wrong, same = cuda_check.problems(run, base)
    assert same == 0
    assert wrong == ["entropy never retrieved", "no round after the first reused the KV cache",
                     "float32 first segments differ from cpu float32 (0% equal)"]
    run.dtype = "bfloat16"  # half precision: the share is reported, not required
    assert "float32 first segments" not in " ".join(cuda_check.problems(run, base)[0])


def test_random_parts_take_a_folders_architecture_and_tokenizer(tmp_path):
    save_model(*tiny_parts(seed=1), tmp_path / "tiny")
    (tmp_path / "tiny" / "model.safetensors").unlink()  # only config and tokenizer are read
    model, tokenizer = random_parts(tmp_path / "tiny", seed=1)
    assert model.config.num_hidden_layers == 2 and tokenizer.chat_template
    with pytest.raises(ModelNotFoundError, match="lacks config.json"):
        random_parts(tmp_path / "nowhere")
