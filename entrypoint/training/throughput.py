"""Throughput of a training run: tokens/s (non-padding), the padding share and, on a GPU, MFU (model FLOPs
utilisation) at every logging step.

    CountingCollator    wraps the collator: real tokens (the examples' or packed rows' own) and padded tokens
    ThroughputMeter     a callback: per optimizer step, the tokens of its batches and its seconds, excluding
                        eval passes and checkpoint saves; windows of `every` steps for the log line
    flops_per_token     the model's training FLOPs per token (below)
    peak_flops          the device's dense bf16/fp16 peak (data sheets), or RENTUNE_PEAK_TFLOPS

FLOPs per token follow the usual accounting (Kaplan et al. 2020; PaLM, Chowdhery et al. 2022, app. B):
every weight matrix costs 2 FLOPs per parameter forward and 4 backward (2 for the input's gradient, 2 for
the weight's), and attention 12 x layers x width x context. A frozen weight's gradient is never computed,
so with LoRA a frozen matrix costs 4, not 6: MFU here is not inflated by work LoRA skips. The context is
the mean tokens per example (with packing each token attends within its own example). Embedding lookups
cost nothing. Under torchrun the counts of all ranks are summed; MFU is per device.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence

import torch
from transformers import TrainerCallback

__all__ = ["CountingCollator", "ThroughputMeter", "flops_per_token", "peak_flops"]

# Dense (no sparsity) bf16/fp16 tensor-core peak per device, TFLOP/s, from the vendors' data sheets. The
# first name contained in torch's device name wins, so more specific names come first.
PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.4),  # SXM ("NVIDIA H100 80GB HBM3")
    ("H200", 989.4),
    ("GH200", 989.4),
    ("B200", 2250.0),
    ("A100", 312.0),
    ("L40S", 362.0),
    ("L40", 181.0),
    ("L4", 121.0),
    ("RTX 4090", 165.2),
    ("RTX A6000", 154.8),
    ("MI300X", 1307.4),
    ("MI325X", 1307.4),
    ("MI250X", 383.0),
    ("MI250", 362.1),
    ("MI210", 181.0),
)


def peak_flops(device: torch.device, precision: str) -> tuple[float | None, str]:
    """The device's peak FLOP/s for MFU and where it came from; None (with the reason) on CPU, in fp32
    (no tensor-core peak to compare with) or for a device not in the table without RENTUNE_PEAK_TFLOPS."""
    override = os.environ.get("RENTUNE_PEAK_TFLOPS")
    if override:
        return float(override) * 1e12, "RENTUNE_PEAK_TFLOPS"
    if device.type != "cuda":
        return None, f"no MFU on {device.type}"
    if precision not in ("bf16", "fp16"):
        return None, f"no MFU in {precision} (peaks are for bf16/fp16 tensor cores)"
    name = torch.cuda.get_device_name(device)
    for part, tflops in PEAK_TFLOPS:
        if part in name:
            return tflops * 1e12, f"{name}: {tflops:g} TFLOP/s dense bf16 (data sheet)"
    return None, f"peak of {name!r} unknown: set RENTUNE_PEAK_TFLOPS"


def _numel(p: torch.nn.Parameter) -> int:
    return getattr(p, "ds_numel", None) or p.numel()  # ZeRO-3 leaves a partitioned parameter empty


def flops_per_token(model: torch.nn.Module, context: float) -> tuple[float, dict]:
    """Training FLOPs per token (module docstring) and its parts, for a mean context of `context` tokens."""
    frozen = trainable = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding):
            continue
        weight = module._parameters.get("weight")
        if weight is not None and weight.dim() == 2:
            if weight.requires_grad:
                trainable += _numel(weight)
            else:
                frozen += _numel(weight)
    config = getattr(model, "config", None)
    text = config.get_text_config() if config is not None and hasattr(config, "get_text_config") else config
    layers = getattr(text, "num_hidden_layers", None) or getattr(text, "n_layer", 0) or 0
    width = getattr(text, "hidden_size", None) or getattr(text, "n_embd", 0) or 0
    heads, head_dim = getattr(text, "num_attention_heads", None), getattr(text, "head_dim", None)
    if heads and head_dim:
        width = heads * head_dim  # attention width, when it differs from the hidden size
    attention = 12.0 * layers * width * context
    total = 6.0 * trainable + 4.0 * frozen + attention
    parts = {
        "trainable_matrix_parameters": trainable,
        "frozen_matrix_parameters": frozen,
        "attention_flops_per_token": attention,
        "context_tokens": round(context, 1),
        "formula": "6 x trainable + 4 x frozen matrix parameters + 12 x layers x width x context",
    }
    return total, parts


class CountingCollator:
    """The collator, counting what it batches: `real` tokens (the features' own input ids) and `padded`
    (the batch's input ids, padding included). Features without input ids (images) count nothing."""

    def __init__(self, collate: Callable[[Sequence[dict]], dict]):
        self.collate = collate
        self.real = self.padded = 0

    def __call__(self, features: Sequence[dict]) -> dict:
        batch = self.collate(features)
        if "input_ids" in batch:
            self.real += sum(len(f["input_ids"]) for f in features)
            self.padded += batch["input_ids"].numel()
        return batch

    def take(self) -> tuple[int, int]:
        counts = (self.real, self.padded)
        self.real = self.padded = 0
        return counts


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


class ThroughputMeter(TrainerCallback):
    """Tokens, padding and seconds per optimizer step, from the collator's counts. A step's seconds run
    from the end of the previous step's logging, eval and save to its own log, so an eval pass or a
    checkpoint never counts as slow training; the eval batches' tokens are discarded the same way.
    `window()` sums the steps since the last window (and over ranks under torchrun) for the log line;
    `summary()` is what the trial result records."""

    def __init__(self, counter: CountingCollator, flops: float | None, parts: dict, peak: float | None, peak_source):
        self.counter, self.flops, self.parts, self.peak, self.peak_source = counter, flops, parts, peak, peak_source
        self.steps: list[tuple[int, int, int, float]] = []  # (step, real, padded, seconds) of this process
        self.windows: list[dict] = []  # per logged window: its step and figures
        self._sums: list[tuple[int, int, float]] = []  # per window: real and padded tokens (all ranks), seconds
        self.world = 1
        self._shown = 0  # steps already in a window
        self._since = time.perf_counter()

    def _restart(self) -> None:
        self.counter.take()  # eval batches, or nothing
        self._since = time.perf_counter()

    def on_train_begin(self, args, state, control, **kwargs):
        self.world = args.world_size
        self._restart()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            real, padded = self.counter.take()
            now = time.perf_counter()
            self.steps.append((state.global_step, real, padded, now - self._since))
            self._since = now

    def on_evaluate(self, args, state, control, **kwargs):
        self._restart()

    def on_save(self, args, state, control, **kwargs):
        self._restart()

    def window(self) -> dict:
        """The figures of the steps since the last window; under torchrun a collective: every rank calls it."""
        recent, self._shown = self.steps[self._shown :], len(self.steps)
        real, padded = sum(s[1] for s in recent), sum(s[2] for s in recent)
        seconds = max(sum(s[3] for s in recent), 1e-9)
        if _distributed():
            counts = torch.tensor([real, padded], dtype=torch.float64)
            if torch.distributed.get_backend() == "nccl":
                counts = counts.cuda()
            torch.distributed.all_reduce(counts)
            real, padded = int(counts[0]), int(counts[1])
        figures = self._figures(real, padded, seconds)
        if recent:
            self.windows.append({"step": recent[-1][0], **figures})
            self._sums.append((real, padded, seconds))
        return figures

    def _figures(self, real: int, padded: int, seconds: float) -> dict:
        tokens_per_s = real / seconds
        per_device = tokens_per_s / self.world
        mfu = per_device * self.flops / self.peak if self.flops and self.peak else None
        return {
            "tokens_per_s": round(tokens_per_s, 1),
            "tokens_per_s_per_device": round(per_device, 1),
            "padding_share": round(1 - real / padded, 4) if padded else None,
            "mfu": round(mfu, 4) if mfu is not None else None,
        }

    def summary(self) -> dict:
        """The run's figures in this process: all windows after the first (which carries the warm-up), or
        the only one, summed (tokens over seconds)."""
        steady = self._sums[1:] or self._sums
        real, padded, seconds = (sum(s[i] for s in steady) for i in range(3))
        figures = (
            self._figures(real, padded, seconds)
            if seconds
            else dict.fromkeys(("tokens_per_s", "tokens_per_s_per_device", "padding_share", "mfu"))
        )
        return {
            **figures,
            "measured_over": f"{len(steady)} of {len(self._sums)} logging windows (the first is warm-up)",
            "windows": self.windows,
            "flops_per_token": self.flops,
            "flops": self.parts,
            "peak_flops_per_device": self.peak,
            "peak_source": self.peak_source,
            "world_size": self.world,
        }
