"""LoRA fine-tuning of a causal LM on marker transcripts, on CPU.

One example per forward pass (no padding to pay for on a CPU), gradients accumulated over
`grad_accum` examples per optimizer step. The loss covers only the assistant's tokens (labels are
-100 on system prompt, question and passages), so the model learns to ask and to answer, never to
write passages. Every `save_every` steps a checkpoint (adapter, optimizer, position in the data,
loss curve) replaces the previous one atomically; a run that is stopped, by its time budget or
by hand, resumes from it. With dev data, the dev loss is measured every `eval_every` steps and the
best adapter is the one kept (early stopping after `patience` evaluations without improvement).
"""

from __future__ import annotations

import copy
import json
import math
import os
import random
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rigkit.errors import InputError
from rigkit.files import atomic_write_text
from rigkit.finetune.data import (
    MarkerExample,
    data_hash,
    encode_example,
    end_of_turn,
    read_examples,
)

__all__ = ["LoraTrainConfig", "TrainReport", "train_markers", "encode_all", "ADAPTER_FILE"]

ADAPTER_FILE = "adapter_model.safetensors"
TRAINING_FILE = "training.json"
CHECKPOINT_DIR = "checkpoint"
# LoRA on the attention and MLP projections of Llama-style blocks (SmolLM2, the tiny test model).
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class LoraTrainConfig:
    rank: int = 8
    alpha: int = 16
    dropout: float = 0.05
    learning_rate: float = 1e-3
    warmup_steps: int = 5
    epochs: float = 3.0
    grad_accum: int = 4
    max_steps: int | None = None  # optimizer steps
    max_len: int = 512
    time_budget_min: float | None = None
    eval_every: int = 10
    save_every: int = 5
    patience: int = 3  # dev evaluations without improvement before stopping; 0: never stop early
    keep: str = "best"  # the adapter written to out_dir: "best" (lowest dev loss) or "last"
    eval_examples: int = 40  # dev examples per evaluation (a forward pass each: time on a CPU)
    seed: int = 0
    target_modules: tuple[str, ...] = TARGET_MODULES
    # Adapt only the top N blocks (None: all). The backward pass then stops at the lowest adapted
    # block: on a CPU that halves a step's cost, and a marker habit is learned near the output.
    top_layers: int | None = None
    save_dtype: str = "float16"  # halves the shipped adapter; loads into float32 LoRA weights


@dataclass
class TrainReport:
    """What a run did; written as `training.json` beside the adapter."""

    out_dir: str
    data: str
    data_hash: str
    eval_data: str | None
    base_model: str
    steps: int
    planned_steps: int
    examples_seen: int
    train_examples: int
    train_loss: list[tuple[int, float]] = field(default_factory=list)  # (step, mean loss)
    dev_loss: list[tuple[int, float]] = field(default_factory=list)
    best_step: int | None = None
    stopped_because: str = ""
    minutes: float = 0.0
    examples_per_second: float = 0.0
    tokens_per_second: float = 0.0
    peak_memory_mb: float = 0.0
    trainable_parameters: int = 0
    adapter_mb: float = 0.0
    resumed_from_step: int = 0
    config: dict[str, Any] = field(default_factory=dict)
    command: str = ""


def encode_all(examples: Sequence[MarkerExample], generator: Any, max_len: int) -> list[tuple[list[int], list[int]]]:
    """Token ids and labels of each example; longer than `max_len` keeps the first `max_len`."""
    end = end_of_turn(generator)
    encoded = []
    for example in examples:
        ids, labels = encode_example(generator.tokenizer, example, end)
        if any(label != -100 for label in labels[:max_len]):
            encoded.append((ids[:max_len], labels[:max_len]))
    return encoded


def _peak_memory_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def _lora_model(base: Any, config: LoraTrainConfig) -> Any:
    from peft import LoraConfig, get_peft_model

    present = {name.rsplit(".", 1)[-1] for name, _ in base.named_modules()}
    targets = [t for t in config.target_modules if t in present]
    if not targets:
        raise InputError(f"none of the LoRA target modules {config.target_modules} are in the model")
    layers = None
    if config.top_layers:
        count = getattr(base.config, "num_hidden_layers", 0)
        if not 0 < config.top_layers <= count:
            raise InputError(f"top_layers must be between 1 and the model's {count} layers")
        layers = list(range(count - config.top_layers, count))
    lora = LoraConfig(
        r=config.rank, lora_alpha=config.alpha, lora_dropout=config.dropout,
        target_modules=targets, task_type="CAUSAL_LM", bias="none", layers_to_transform=layers,
    )
    return get_peft_model(base, lora)


def _mean_loss(model: Any, batch: Sequence[tuple[list[int], list[int]]]) -> float:
    import torch

    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for ids, labels in batch:
            n = sum(label != -100 for label in labels[1:])
            out = model(input_ids=torch.tensor([ids]), labels=torch.tensor([labels]))
            total, count = total + out.loss.item() * n, count + n
    model.train()
    return total / max(count, 1)


def _save_adapter(model: Any, target: Path, base_model: str, save_dtype: str) -> float:
    """Save the adapter files into `target` (each staged, then renamed into place); return MB."""
    import torch
    from safetensors.torch import load_file, save_file

    target.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target, prefix=".adapter."))
    try:
        model.save_pretrained(staging)
        weights = staging / ADAPTER_FILE
        tensors = {k: v.to(getattr(torch, save_dtype)).contiguous() for k, v in load_file(weights).items()}
        save_file(tensors, weights, metadata={"format": "pt"})
        config_path = staging / "adapter_config.json"
        config = json.loads(config_path.read_text())
        config["base_model_name_or_path"] = base_model  # a rigkit model spec, not a cache path
        config_path.write_text(json.dumps(config, indent=2) + "\n")
        for name in (ADAPTER_FILE, "adapter_config.json"):  # not peft's generic model card
            os.replace(staging / name, target / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return (target / ADAPTER_FILE).stat().st_size / 1e6


def _lr_factor(step: int, config: LoraTrainConfig, planned: int) -> float:
    if step < config.warmup_steps:
        return (step + 1) / (config.warmup_steps + 1)
    progress = (step - config.warmup_steps) / max(1, planned - config.warmup_steps)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))  # cosine down to 10%


def train_markers(
    data_path: str | Path,
    out_dir: str | Path,
    generator: Any,
    config: LoraTrainConfig | None = None,
    *,
    eval_path: str | Path | None = None,
    base_model: str = "",
    progress: bool = True,
    resume: bool = True,
    command: str = "",
) -> TrainReport:
    """Train a LoRA adapter on the examples in `data_path`; the adapter lands in `out_dir`.

    `generator` is an `HFGenerator` (its model is copied, never changed). A checkpoint in
    `out_dir/checkpoint` is resumed unless `resume=False`.
    """
    import torch
    from peft import set_peft_model_state_dict
    from tqdm.auto import tqdm

    config = config or LoraTrainConfig()
    if config.keep not in ("best", "last"):
        raise InputError(f"keep must be 'best' or 'last', not {config.keep!r}")
    out_dir, data_path = Path(out_dir), Path(data_path)
    train = encode_all(read_examples(data_path), generator, config.max_len)
    dev = encode_all(read_examples(eval_path), generator, config.max_len)[: config.eval_examples] if eval_path else []
    if not train:
        raise InputError(f"{data_path}: no example has assistant tokens to learn")
    base_model = base_model or generator.spec or "unknown"

    torch.manual_seed(config.seed)
    model = _lora_model(copy.deepcopy(generator.model), config)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=0.0)
    per_epoch = math.ceil(len(train) / config.grad_accum)
    planned = max(1, math.ceil(per_epoch * config.epochs))
    if config.max_steps is not None:
        planned = min(planned, config.max_steps)

    report = TrainReport(
        out_dir=str(out_dir), data=str(data_path), data_hash=data_hash(data_path),
        eval_data=str(eval_path) if eval_path else None, base_model=base_model, steps=0,
        planned_steps=planned, examples_seen=0, train_examples=len(train),
        trainable_parameters=sum(p.numel() for p in params), config=asdict(config), command=command,
    )
    checkpoint = out_dir / CHECKPOINT_DIR
    state_file = checkpoint / "state.json"
    order: list[int] = []
    cursor = 0
    elapsed_before, tokens_seen = 0.0, 0
    bad_evals, best = 0, math.inf
    if resume and state_file.exists():
        state = json.loads(state_file.read_text())
        if state["data_hash"] != report.data_hash:
            raise InputError(
                f"{checkpoint}: the checkpoint was trained on other data; use another --out or --fresh"
            )
        from safetensors.torch import load_file

        weights = {k: v.float() for k, v in load_file(checkpoint / "adapter" / ADAPTER_FILE).items()}
        set_peft_model_state_dict(model, weights)
        optimizer.load_state_dict(torch.load(checkpoint / "optimizer.pt", weights_only=True))
        order, cursor = state["order"], state["cursor"]
        report.steps = report.resumed_from_step = state["step"]
        report.examples_seen, tokens_seen = state["examples_seen"], state["tokens_seen"]
        report.train_loss = [tuple(x) for x in state["train_loss"]]
        report.dev_loss = [tuple(x) for x in state["dev_loss"]]
        report.best_step, best, bad_evals = state["best_step"], state["best"], state["bad_evals"]
        elapsed_before = state["elapsed_s"]
    rng = random.Random(config.seed + report.steps)

    def next_example() -> tuple[list[int], list[int]]:
        nonlocal order, cursor
        if cursor >= len(order):
            order, cursor = list(range(len(train))), 0
            rng.shuffle(order)
        cursor += 1
        return train[order[cursor - 1]]

    def save_checkpoint(elapsed: float) -> None:
        staging = Path(tempfile.mkdtemp(dir=out_dir, prefix=".checkpoint."))
        _save_adapter(model, staging / "adapter", base_model, "float32")
        torch.save(optimizer.state_dict(), staging / "optimizer.pt")
        state = {
            "step": report.steps, "cursor": cursor, "order": order, "data_hash": report.data_hash,
            "examples_seen": report.examples_seen, "tokens_seen": tokens_seen,
            "train_loss": report.train_loss, "dev_loss": report.dev_loss, "best_step": report.best_step,
            "best": best, "bad_evals": bad_evals, "elapsed_s": elapsed,
        }
        (staging / "state.json").write_text(json.dumps(state))
        old = out_dir / ".checkpoint.old"
        shutil.rmtree(old, ignore_errors=True)
        if checkpoint.exists():
            os.replace(checkpoint, old)
        os.replace(staging, checkpoint)
        shutil.rmtree(old, ignore_errors=True)

    out_dir.mkdir(parents=True, exist_ok=True)
    examples_before, tokens_before = report.examples_seen, tokens_seen
    started = time.monotonic()
    budget_s = config.time_budget_min * 60 if config.time_budget_min else math.inf
    report.stopped_because = "planned steps done"
    bar = tqdm(total=planned, initial=report.steps, desc="lora", unit="step", disable=not progress)
    while report.steps < planned:
        if elapsed_before + time.monotonic() - started >= budget_s:
            report.stopped_because = f"time budget ({config.time_budget_min:g} min)"
            break
        for group in optimizer.param_groups:
            group["lr"] = config.learning_rate * _lr_factor(report.steps, config, planned)
        losses = []
        for _ in range(config.grad_accum):
            ids, labels = next_example()
            out = model(input_ids=torch.tensor([ids]), labels=torch.tensor([labels]))
            (out.loss / config.grad_accum).backward()
            losses.append(out.loss.item())
            report.examples_seen += 1
            tokens_seen += len(ids)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        report.steps += 1
        report.train_loss.append((report.steps, round(sum(losses) / len(losses), 4)))
        bar.update(1)
        bar.set_postfix(loss=f"{report.train_loss[-1][1]:.3f}")
        evaluate = dev and (report.steps % config.eval_every == 0 or report.steps == planned)
        if evaluate:
            loss = _mean_loss(model, dev)
            report.dev_loss.append((report.steps, round(loss, 4)))
            if loss < best:
                best, bad_evals, report.best_step = loss, 0, report.steps
                _save_adapter(model, out_dir / "best", base_model, config.save_dtype)
            else:
                bad_evals += 1
        if report.steps % config.save_every == 0 or report.steps == planned:
            save_checkpoint(elapsed_before + time.monotonic() - started)
        if dev and config.patience and bad_evals >= config.patience:
            report.stopped_because = f"dev loss did not improve {config.patience} times"
            break
    bar.close()
    if dev and report.steps and (not report.dev_loss or report.dev_loss[-1][0] != report.steps):
        loss = _mean_loss(model, dev)  # the last steps count too when choosing the adapter
        report.dev_loss.append((report.steps, round(loss, 4)))
        if loss < best:
            best, report.best_step = loss, report.steps
            _save_adapter(model, out_dir / "best", base_model, config.save_dtype)
    elapsed = elapsed_before + time.monotonic() - started
    save_checkpoint(elapsed)

    # The adapter kept: the best on dev when there is dev data (unless `keep="last"`), else the last.
    final_weights = None
    if dev and config.keep == "best" and (out_dir / "best" / ADAPTER_FILE).exists():
        from safetensors.torch import load_file

        final_weights = {k: v.float() for k, v in load_file(out_dir / "best" / ADAPTER_FILE).items()}
        set_peft_model_state_dict(model, final_weights)
    else:
        report.best_step = report.steps
    report.adapter_mb = round(_save_adapter(model, out_dir, base_model, config.save_dtype), 2)
    shutil.rmtree(out_dir / "best", ignore_errors=True)
    report.minutes = round(elapsed / 60, 2)
    run_s = max(time.monotonic() - started, 1e-9)
    report.examples_per_second = round((report.examples_seen - examples_before) / run_s, 3)
    report.tokens_per_second = round((tokens_seen - tokens_before) / run_s, 1)
    report.peak_memory_mb = round(_peak_memory_mb(), 1)
    atomic_write_text(out_dir / TRAINING_FILE, json.dumps(asdict(report), indent=1) + "\n")
    return report
