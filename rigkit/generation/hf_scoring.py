"""Query likelihood for an in-process model: batched continuation scores, without the run's cache."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

__all__ = ["score_continuations"]


def score_continuations(
    model: Any, tokenizer: Any, pad: int, prompts: Sequence[str], continuations: Sequence[str],
    batch_size: int = 8,
) -> list[float]:
    """Mean log-probability per token of each continuation after its prompt, (n,).

    Plain text, no chat template (query likelihood works for base and instruct models).
    Batched forward passes without the run's cache: rows are left-padded so every
    continuation ends its row, positions follow the attention mask (padding does not shift
    them, so a batched score equals the one-by-one score), and only the continuation's
    logits are computed where the model takes `logits_to_keep`. `pad` is the padding token id.
    """
    import torch

    if len(prompts) != len(continuations):
        raise ValueError(f"{len(prompts)} prompts but {len(continuations)} continuations")
    rows = [
        (tokenizer(p).input_ids, tokenizer(c, add_special_tokens=False).input_ids)
        for p, c in zip(prompts, continuations)
    ]
    if any(not cont for _, cont in rows):
        raise ValueError("every continuation needs at least one token")
    keep_kwarg = "logits_to_keep" in inspect.signature(model.forward).parameters
    # batches of similar length waste little on padding; scores go back in the given order
    order = sorted(range(len(rows)), key=lambda i: len(rows[i][0]) + len(rows[i][1]))
    scores = [0.0] * len(rows)
    for start in range(0, len(rows), max(1, batch_size)):
        where = order[start : start + batch_size]
        batch = [rows[i] for i in where]
        width = max(len(p) + len(c) for p, c in batch)
        tail = max(len(c) for _, c in batch) + 1  # logits that predict any continuation token
        ids = torch.tensor([[pad] * (width - len(p) - len(c)) + p + c for p, c in batch],
                           device=model.device)  # (b, width)
        mask = torch.tensor([[0] * (width - len(p) - len(c)) + [1] * (len(p) + len(c))
                             for p, c in batch], device=model.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        extra = {"logits_to_keep": tail} if keep_kwarg else {}
        with torch.inference_mode():
            logits = model(input_ids=ids, attention_mask=mask, position_ids=positions,
                                use_cache=False, **extra).logits[:, -tail:].float()  # (b, tail, vocab)
        logprobs = torch.log_softmax(logits[:, :-1], dim=-1)  # position i predicts token i + 1
        for row, (i, (_, cont)) in enumerate(zip(where, batch)):
            target = torch.tensor(cont, device=logprobs.device)
            picked = logprobs[row, -len(cont):].gather(-1, target[:, None]).squeeze(-1)  # (n,)
            scores[i] = float(picked.mean())
    return scores
