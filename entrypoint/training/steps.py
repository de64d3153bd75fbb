"""Complete training steps measured by hand, the way the Trainer runs them: what the probe phase times and
whose gradients it compares (activation checkpointing and gradient accumulation must not change them).

`loss_per` is how an accumulated batch's loss is weighted (kinds' TaskSide.loss): "example" (one label
per sequence) or "token" (every response token counts once across the accumulated batch).
"""

from __future__ import annotations

import contextlib
import time

import torch

from entrypoint.data.encoding import IGNORE_INDEX
from entrypoint.training.memory import PeakMemory

__all__ = [
    "GRAD_RTOL",
    "SEED",
    "autocast",
    "eval_gradients",
    "gradients",
    "loss_weights",
    "max_rel_diff",
    "measured_step",
    "split_batch",
]

# Float sums in another order: equal to about 1e-6 in fp32. In bf16/fp16 autocast the whole batch and its
# microbatches round differently (about 1e-2 measured on the test models); a wrong normalisation of an
# accumulated loss is off by a factor (0.5 or more), so either tolerance catches it.
GRAD_RTOL = {"fp32": 1e-4, "bf16": 5e-2, "fp16": 5e-2}
SEED = 1234


def split_batch(batch: dict, parts: int) -> list[dict]:
    size = batch["labels"].shape[0] // parts
    return [
        {k: v[i * size : (i + 1) * size] if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        for i in range(parts)
    ]


def loss_weights(micro: list[dict], loss_per: str) -> list[float]:
    """How the trainer normalises an accumulated batch (`loss_per`, kinds' TaskSide.loss): per token across
    all microbatches ("token"), or per example ("example"). Each microbatch's mean loss is weighted by its
    share of the total."""
    if loss_per == "token":
        counts = [int((m["labels"][:, 1:] != IGNORE_INDEX).sum()) for m in micro]
    else:
        counts = [m["labels"].shape[0] for m in micro]
    return [c / sum(counts) for c in counts]


def gradients(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad and p.grad is not None}


def autocast(device: torch.device, precision: str):
    """Mixed precision as the Trainer runs it (autocast around forward and loss; weights stay fp32)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)


def measured_step(
    model, micro: list[dict], loss_per: str, checkpointing: bool, optimizer, device, precision: str
) -> tuple[dict, dict]:
    """One optimizer step over `micro` microbatches; returns measurements and the gradients before the step."""
    if checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.activation_checkpointing_disable()
    model.train()
    torch.manual_seed(SEED)
    weights = loss_weights(micro, loss_per)
    with PeakMemory(device) as peak:
        started = time.perf_counter()
        for part, weight in zip(micro, weights, strict=True):
            with autocast(device, precision):
                loss = model(**part).loss * weight
            loss.backward()
        grads = gradients(model)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - started
    return {"peak_bytes": peak.peak, "start_bytes": peak.start, "seconds": seconds}, grads


def max_rel_diff(a: dict, b: dict) -> float:
    """Largest difference of any parameter's gradient, relative to that gradient's size. Gradients that are
    zero in exact arithmetic (an attention key bias: softmax ignores it) come out as float noise, about
    1e-11; they are measured against a thousandth of the largest gradient instead of against themselves."""
    floor = 1e-3 * max((g.abs().max().item() for g in a.values()), default=0.0)
    worst = 0.0
    for name in a:
        scale = max(a[name].abs().max().item(), floor) or 1.0
        worst = max(worst, (a[name] - b[name]).abs().max().item() / scale)
    return worst


def eval_gradients(model, micro: list[dict], loss_per: str, device, precision: str) -> dict[str, torch.Tensor]:
    """Gradients of the accumulated, normalised loss over `micro`, in eval mode (dropout off)."""
    model.eval()
    for part, weight in zip(micro, loss_weights(micro, loss_per), strict=True):
        with autocast(device, precision):
            loss = model(**part).loss * weight
        loss.backward()
    return gradients(model)
