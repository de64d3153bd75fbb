"""When the Trainer is asked to save: every N minutes, on SIGTERM (and then stop), at the last step.
A fake clock is injected; nothing sleeps."""

from __future__ import annotations

import os
import signal
from types import SimpleNamespace

import pytest
from transformers import TrainerControl

from entrypoint.training import trainer as trainer_module
from entrypoint.training.trainer import StoreCheckpointCallback, graceful_sigterm
from jobspec.plan import planned_steps
from jobspec.schema import CheckpointPolicy, Training


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = Clock()
    monkeypatch.setattr(trainer_module.time, "monotonic", fake)
    return fake


def _callback(policy: CheckpointPolicy, sigterm=None):
    sigterm = sigterm or graceful_sigterm(60, lambda m: None)
    return StoreCheckpointCallback(None, "p", {}, policy, sigterm, lambda m: None), sigterm


def _step(callback, step: int, max_steps: int = 100) -> TrainerControl:
    return callback.on_step_end(None, SimpleNamespace(global_step=step, max_steps=max_steps), TrainerControl())


def test_minutes_interval(clock):
    callback, _ = _callback(CheckpointPolicy(every_minutes=5))
    clock.now += 299
    assert not _step(callback, 1).should_save
    clock.now += 1
    assert _step(callback, 2).should_save


def test_last_step_always_saves(clock):
    callback, _ = _callback(CheckpointPolicy())
    assert not _step(callback, 99).should_save
    assert _step(callback, 100).should_save


def test_sigterm_saves_and_stops_after_the_current_step(clock):
    with graceful_sigterm(60, lambda m: None) as sigterm:
        callback, _ = _callback(CheckpointPolicy(every_steps=50), sigterm)
        assert not _step(callback, 3).should_training_stop
        os.kill(os.getpid(), signal.SIGTERM)  # handled: the test process survives
        control = _step(callback, 4)
        assert control.should_save and control.should_training_stop
        assert sigterm.watchdog is not None and sigterm.watchdog.is_alive()
        # In a run the watchdog ends the process once the grace is over; here it would end pytest 60 s later.
        sigterm.watchdog.cancel()
    assert signal.getsignal(signal.SIGTERM) is not sigterm._handle  # previous handler restored


def test_planned_steps():
    assert planned_steps(Training(epochs=2, microbatch=16, grad_accum=2), n_train=100) == 8  # ceil(100/32)*2
    assert planned_steps(Training(max_steps=7), n_train=100) == 7
    assert planned_steps(Training(epochs=0.5, microbatch=16), n_train=100) == 4


def test_missing_device_or_unsupported_precision_is_refused_before_any_phase():
    import torch

    from entrypoint.training.device import Unsupported, preflight

    with pytest.raises(Unsupported, match="fp16 needs a CUDA or ROCm device"):
        preflight(Training(device="cpu", precision="fp16"))
    assert preflight(Training(device="cpu", precision="bf16")).type == "cpu"  # CPU autocast supports bf16
    if not torch.cuda.is_available():
        with pytest.raises(Unsupported, match="'cuda' requested but torch sees no CUDA or ROCm device"):
            preflight(Training(device="cuda", precision="fp32"))
