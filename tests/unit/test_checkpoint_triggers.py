"""When the Trainer is asked to save: every N minutes, on SIGTERM (and then stop), at the last step.
A fake clock is injected; nothing sleeps."""

from __future__ import annotations

import os
import signal
import tempfile
from types import SimpleNamespace

import pytest
from transformers import TrainerControl

from entrypoint.training import trainer as trainer_module
from entrypoint.training.trainer import StoreCheckpointCallback, graceful_sigterm
from jobspec.plan import AUTO_FIRST_MINUTES, checkpoint_policy_text, planned_steps, young_daly_minutes
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
    args = SimpleNamespace(output_dir=tempfile.gettempdir())  # a disk with room: only the triggers decide
    return callback.on_step_end(args, SimpleNamespace(global_step=step, max_steps=max_steps), TrainerControl())


def test_minutes_interval(clock):
    callback, _ = _callback(CheckpointPolicy(every_minutes=5))
    clock.now += 299
    assert not _step(callback, 1).should_save
    clock.now += 1
    assert _step(callback, 2).should_save


def test_auto_interval_follows_the_measured_commit_cost(clock):
    lines: list[str] = []
    policy = CheckpointPolicy(every_minutes="auto", mtbf_hours=2)
    callback = StoreCheckpointCallback(None, "p", {}, policy, graceful_sigterm(60, print), lines.append)
    clock.now += AUTO_FIRST_MINUTES * 60 - 1  # until a commit is measured: the first interval
    assert not _step(callback, 1).should_save
    clock.now += 1
    assert _step(callback, 2).should_save
    # the commit of step 2 took 9 s in all: sqrt(2 x 9 s x 7200 s) = 360 s = 6 min
    callback.records.append({"step": 2, "bytes": 1000, "blocked_s": 1.0, "commit_s": 8.0})
    callback.last_commit = clock.now
    clock.now += 6 * 60 - 1
    assert not _step(callback, 3).should_save
    clock.now += 1
    assert _step(callback, 4).should_save
    assert callback.interval == {"policy": "auto", "mtbf_hours": 2, "step": 2, "commit_cost_s": 9.0, "minutes": 6.0}
    assert lines == [
        "checkpoint: every_minutes auto: a commit costs 9.0 s, MTBF 2 h -> every 6.0 min (sqrt(2 x C x MTBF))"
    ]


def test_young_daly_interval_is_never_shorter_than_a_commit_and_within_a_day():
    assert young_daly_minutes(9.0, 2.0) == pytest.approx(6.0)
    assert young_daly_minutes(0.01, 0.01) == 1.0  # at least a minute
    assert young_daly_minutes(3000.0, 0.01) == pytest.approx(50.0)  # a commit of 50 min: never two at once
    assert young_daly_minutes(30000.0, 10000.0) == 1440.0


def test_the_plan_says_when_checkpoints_are_committed():
    text = checkpoint_policy_text(CheckpointPolicy(every_steps=25, every_minutes="auto", mtbf_hours=12, keep=2))
    assert text == (
        "checkpoints: every 25 steps, every_minutes auto: sqrt(2 x C x MTBF) with MTBF 12 h and C the cost of "
        "the newest commit (10 min until the first measures it), on SIGTERM and at the end; keep 2"
    )


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


def test_an_eval_loss_pass_before_a_save_is_not_counted_as_the_checkpoint_s_cost(clock, tmp_path):
    from entrypoint.store import FileStore

    callback = StoreCheckpointCallback(
        FileStore(tmp_path / "store"), "p", {}, CheckpointPolicy(), graceful_sigterm(60, print), lambda m: None
    )
    args = SimpleNamespace(output_dir=str(tmp_path / "out"))
    state = SimpleNamespace(global_step=100, max_steps=100, is_local_process_zero=True)
    assert callback.on_step_end(args, state, TrainerControl()).should_save  # the last step
    clock.now += 50.0  # the Trainer's eval-loss pass at the same step, before its save
    callback.on_evaluate(args, state, TrainerControl())
    clock.now += 2.0  # the local save
    (tmp_path / "out/checkpoint-100").mkdir(parents=True)
    (tmp_path / "out/checkpoint-100/model.safetensors").write_bytes(b"x" * 100)
    callback.on_save(args, state, TrainerControl())
    assert callback.records[0]["local_save_s"] == 2.0 and callback.records[0]["blocked_s"] == 2.0
    assert callback.committed == [100]
