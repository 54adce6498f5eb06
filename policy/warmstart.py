"""Supervised warm start: a few cross-entropy steps on (prompt, completion) pairs.

Used to give the from-scratch built-in model a "base model" before RL (the output format
and reading its prompt), as pretraining gives real base models. The loss covers the
completion tokens and the EOS after them, never the prompt.

Invariants: pure torch on the given model (no global RNG: batches are whatever the caller
passes); the optimizer is private to the warm start and discarded afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from policy.sampler import encode_completion, encode_prompt

Pairs = Sequence[tuple[str, str]]


def supervised_loss(model: Any, tokenizer: Any, pairs: Pairs) -> torch.Tensor:
    """Mean token cross-entropy of `completion + EOS` given `prompt`, over `pairs`."""
    eos = tokenizer.eos_token_id
    rows, starts = [], []
    for prompt, completion in pairs:
        p = encode_prompt(tokenizer, prompt)
        c = encode_completion(tokenizer, completion) + ([eos] if eos is not None else [])
        rows.append(p + c)
        starts.append(len(p))
    width = max(len(r) for r in rows)
    device = next(model.parameters()).device
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    attn = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, (row, start) in enumerate(zip(rows, starts, strict=True)):
        ids[i, : len(row)] = torch.tensor(row)
        attn[i, : len(row)] = 1
        labels[i, start : len(row)] = torch.tensor(row[start:])
    ids, attn, labels = ids.to(device), attn.to(device), labels.to(device)
    logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1].float()
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100
    )


def supervised_warmup(
    model: Any, tokenizer: Any, batches: Callable[[int], Pairs], steps: int, lr: float = 1e-3
) -> list[float]:
    """`steps` AdamW steps on `batches(step)`; returns the loss per step."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    was_training = model.training
    model.eval()  # dropout off, as in the trainer
    losses = []
    try:
        for step in range(steps):
            opt.zero_grad(set_to_none=True)
            loss = supervised_loss(model, tokenizer, batches(step))
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
    finally:
        model.train(was_training)
    return losses
