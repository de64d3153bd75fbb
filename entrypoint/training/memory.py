"""Peak memory on every backend, the one place that recognises out-of-memory errors, and the memory
estimate of a training step broken into weights, gradients, optimizer state and activations.

On CUDA and ROCm (torch reports both as `cuda`) the peak is the caching allocator's
`max_memory_allocated`. On CPU it is the process RSS, sampled by a background thread every few
milliseconds (psutil): it includes the Python runtime and libraries, so it is reported as an absolute
figure next to the baseline it started from.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import psutil
import torch

__all__ = ["OutOfMemory", "PeakMemory", "StepEstimate", "estimate_step", "is_oom"]

_OOM_MESSAGES = ("out of memory", "can't allocate memory", "hip error: out of memory", "cublas_status_alloc_failed")


class OutOfMemory(RuntimeError):
    """A step did not fit on the device; `advice` says which setting would make it fit."""

    def __init__(self, message: str, advice: list[str]):
        self.advice = advice
        super().__init__(message + ("; " + "; ".join(advice) if advice else ""))


def is_oom(exc: BaseException) -> bool:
    """True for CUDA and HIP OOM (torch.OutOfMemoryError) and CPU allocation failures."""
    if isinstance(exc, torch.OutOfMemoryError | MemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc).lower() for m in _OOM_MESSAGES)


class PeakMemory:
    """Context manager measuring the peak memory (bytes) of the block on `device`: `.peak`, `.start`."""

    def __init__(self, device: torch.device, interval_s: float = 0.002):
        self.device = device
        self.interval_s = interval_s
        self.start = self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        process = psutil.Process()
        while not self._stop.is_set():
            self.peak = max(self.peak, process.memory_info().rss)
            time.sleep(self.interval_s)

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.start = self.peak = torch.cuda.memory_allocated(self.device)
        else:
            self.start = self.peak = psutil.Process().memory_info().rss
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak = max(self.peak, torch.cuda.max_memory_allocated(self.device))
        else:
            self._stop.set()
            if self._thread is not None:
                self._thread.join()
            self.peak = max(self.peak, psutil.Process().memory_info().rss)


@dataclass(frozen=True)
class StepEstimate:
    weights: int
    gradients: int
    optimizer: int
    activations: int  # measured: the step's peak above weights, gradients and optimizer state

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.activations

    def as_dict(self) -> dict:
        return {
            "weights": self.weights,
            "gradients": self.gradients,
            "optimizer": self.optimizer,
            "activations": self.activations,
            "total": self.total,
        }


def estimate_step(model: torch.nn.Module, step_increase: int) -> StepEstimate:
    """Bytes of a training step by component. Weights: every parameter and buffer at its dtype. Gradients:
    one per trainable element at its dtype. Optimizer: AdamW keeps two fp32 moments per trainable element.
    Activations: what the measured step needed beyond the gradients and optimizer state it created
    (`step_increase` = peak during the first step minus memory before it)."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    weights += sum(b.numel() * b.element_size() for b in model.buffers())
    trainable = [p for p in model.parameters() if p.requires_grad]
    gradients = sum(p.numel() * p.element_size() for p in trainable)
    optimizer = sum(2 * p.numel() * 4 for p in trainable)
    return StepEstimate(weights, gradients, optimizer, max(0, step_increase - gradients - optimizer))
