"""The Trainer's side of tracking: every step's log entry to the trackers, on global rank 0.

    on_train_begin: replay state.log_history     # after a resume, the steps a tracker lacks
    on_log:         add tokens/s (each progress window) and memory to the entry, then log it
    on_save:        sync (TensorBoard's files to the store, in the background)

tokens/s and memory are written into the Trainer's own log entry, so they travel in every checkpoint's
trainer_state.json and a replay after a resume logs them as the killed attempt did.
"""

from __future__ import annotations

import time

import psutil
import torch
from transformers import TrainerCallback

from entrypoint.tracking import STEP_METRICS, Tracking, step_metrics
from entrypoint.training.throughput import ThroughputMeter

__all__ = ["TrackingCallback", "memory_gb"]

SYNC_EVERY_S = 60.0  # TensorBoard files reach the store at least this often while training runs


def memory_gb(device: torch.device) -> float:
    """On a GPU, the peak memory torch allocated on it so far; on CPU, this process's resident memory."""
    if device.type == "cuda":
        return round(torch.cuda.max_memory_allocated(device) / 1e9, 3)
    return round(psutil.Process().memory_info().rss / 1e9, 3)


class TrackingCallback(TrainerCallback):
    """Registered after ThroughputMeter and ProgressCallback, so a step's progress window is complete."""

    def __init__(self, tracking: Tracking, meter: ThroughputMeter, device: torch.device):
        self.tracking, self.meter, self.device = tracking, meter, device
        self.synced = time.monotonic()

    def on_train_begin(self, args, state, control, **kwargs):
        self.tracking.read_held_steps(sorted(set(STEP_METRICS.values())))
        for entry in state.log_history:  # empty on a fresh start
            self.tracking.metrics(step_metrics(entry), entry["step"])

    def on_log(self, args, state, control, logs=None, **kwargs):
        entry = state.log_history[-1] if state.log_history else {}
        if "loss" in entry:
            windows = self.meter.windows
            tokens = windows and windows[-1]["step"] == state.global_step and windows[-1]["padding_share"] is not None
            if tokens:  # a progress window ends at this step (and the job counts tokens: not images)
                entry["tokens_per_s"] = windows[-1]["tokens_per_s"]
            entry["memory_gb"] = memory_gb(self.device)
        if "step" in entry:
            self.tracking.metrics(step_metrics(entry), entry["step"])
        if time.monotonic() - self.synced >= SYNC_EVERY_S:
            self.on_save(args, state, control)

    def on_save(self, args, state, control, **kwargs):
        self.synced = time.monotonic()
        self.tracking.sync()
