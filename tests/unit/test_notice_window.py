"""The notice window: how long the commit after SIGTERM takes (the step in progress, the local save, the
upload), whether it fits grace_seconds and the detected provider's notice, and when it does not, the
periodic interval that keeps one interruption's loss within training.checkpoint.max_lost_minutes. Pure
arithmetic on measured figures, and the trainer's interval with a fake clock; nothing sleeps."""

from __future__ import annotations

import json
import math
import tempfile
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from transformers import TrainerControl

from entrypoint.cli import main
from entrypoint.training import trainer as trainer_module
from entrypoint.training.trainer import StoreCheckpointCallback, graceful_sigterm
from jobspec.plan import Figure, make_plan, notice_window
from jobspec.schema import CheckpointPolicy
from tests.unit.test_plan import ROOT, _spec

GB = 1e9


def _only_at_the_end(**policy):
    """The quickstart with no periodic checkpoint: only on SIGTERM and at the end."""
    return _spec(**{"training.checkpoint": {"keep": 2, **policy}})


def _figures(step: float, save: float, size: float, rate: float) -> dict[str, Figure]:
    return {
        "step": Figure(step, "probe"),
        "checkpoint_blocked": Figure(save, "probe"),
        "checkpoint_bytes": Figure(size, "probe"),
        "store_rate": Figure(rate, "probe"),
    }


def test_a_commit_that_fits_says_so_against_the_grace_and_both_notices():
    window = notice_window(_only_at_the_end(), _figures(step=0.5, save=1.5, size=0.04 * GB, rate=100e6))
    assert window.fits and window.commit_seconds == pytest.approx(0.5 + 1.5 + 0.4)
    assert window.lost_minutes is None and window.interval_source == "spec"
    assert window.line() == (
        "notice window: a commit on SIGTERM takes 2.4 s (step 0.5 s + save 1.5 s + upload 0.4 s of 0.04 GB at "
        "100 MB/s): fits grace_seconds 90 s (AWS's 120 s fits, GCP's 30 s fits)"
    )


def test_a_checkpoint_that_cannot_commit_in_its_grace_gets_a_shorter_interval_and_the_loss_bound():
    # 60 GB at 200 MB/s: 300 s of upload, far past 90 s of grace. The spec commits every 1000 steps of 2 s
    # (33 min, plus the commit): one interruption would lose up to 38.7 min, more than the 30 it allows.
    spec = _spec(**{"training.checkpoint": {"every_steps": 1000, "max_lost_minutes": 30}})
    figures = _figures(step=2.0, save=20.0, size=60 * GB, rate=200e6)
    window = notice_window(spec, figures)
    assert not window.fits and window.worst_seconds == pytest.approx(2 + 20 + 300 + 300)  # one in flight, waited for
    assert window.interval_source == "plan"
    assert window.interval_minutes == pytest.approx((1800 - 320) / 60)
    assert window.lost_minutes == pytest.approx(30.0) and window.lost_steps == 900
    plan = make_plan(spec, 288, figures=figures)
    assert plan.notice["interval_minutes"] == pytest.approx(window.interval_minutes)
    assert plan.notice_line in plan.table().splitlines()
    assert plan.notice_line.endswith(
        "does NOT fit grace_seconds 90 s (AWS's 120 s does NOT fit, GCP's 30 s does NOT fit); an interruption "
        "loses up to 30 min (900 steps) since the last committed checkpoint; periodic commits every 24.7 min (set "
        "by the plan for training.checkpoint.max_lost_minutes 30)"
    )

    # Already often enough: the spec's interval stands, and the plan says what an interruption loses.
    spec = _spec(**{"training.checkpoint": {"every_steps": 100, "max_lost_minutes": 30}})
    window = notice_window(spec, figures)
    assert not window.fits and window.interval_source == "spec"
    assert window.lost_minutes == pytest.approx((200 + 320) / 60) and window.lost_steps == 260


def test_without_periodic_checkpoints_the_whole_trial_is_at_stake():
    spec = _only_at_the_end(max_lost_minutes=20)
    figures = _figures(step=2.0, save=20.0, size=60 * GB, rate=200e6)
    assert notice_window(spec, figures, trial_seconds=3600).interval_minutes == pytest.approx((1200 - 320) / 60)
    spec = _only_at_the_end(max_lost_minutes=100)
    window = notice_window(spec, figures, trial_seconds=3600)  # 60 min of trial + its final commit
    assert window.interval_minutes is None and window.lost_minutes == pytest.approx((3600 + 320) / 60)


def test_the_detected_provider_s_notice_bounds_the_window_when_shorter_than_the_grace():
    figures = _figures(step=5.0, save=15.0, size=8 * GB, rate=200e6)  # 60 s in all
    spec = _only_at_the_end()
    assert notice_window(spec, figures).fits  # grace 90 s
    assert notice_window(spec, figures, provider="aws").fits  # 120 s: the grace is the shorter
    gcp = notice_window(spec, figures, provider="gcp")
    assert not gcp.fits and gcp.limit == "GCP's notice 30 s" and gcp.limit_seconds == 30.0
    assert make_plan(spec, 288, figures=figures, provider="gcp").notice["limit"] == "GCP's notice 30 s"


def test_a_loss_that_cannot_be_bounded_says_what_to_change():
    spec = _spec(**{"training.checkpoint": {"every_steps": 1000, "max_lost_minutes": 5}})  # 300 s; a commit 320 s
    window = notice_window(spec, _figures(step=2.0, save=20.0, size=60 * GB, rate=200e6))
    assert not window.fits and window.problem and window.interval_source == "spec"
    assert "cannot be kept within training.checkpoint.max_lost_minutes 5" in window.line()


def test_plan_before_any_measurement_says_the_window_is_not_measured_yet(tmp_path):
    result = CliRunner().invoke(main, ["plan", str(ROOT / "jobspec/examples/quickstart.yaml")])
    assert result.exit_code == 0, result.output
    assert (
        "notice window: not measured yet (the probe times a checkpoint's save, its bytes and the store's rate); a "
        "commit on SIGTERM must fit grace_seconds 90 s and the provider's notice (AWS 120 s, GCP 30 s)"
    ) in result.output


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _step(callback, step: int) -> TrainerControl:
    args = SimpleNamespace(output_dir=tempfile.gettempdir())
    return callback.on_step_end(args, SimpleNamespace(global_step=step, max_steps=10**6), TrainerControl())


@pytest.mark.parametrize("every_minutes", [None, 60.0, "auto"])
def test_the_trainer_commits_at_least_as_often_as_the_plan_says(monkeypatch, every_minutes):
    clock = Clock()
    monkeypatch.setattr(trainer_module.time, "monotonic", clock)
    lines: list[str] = []
    policy = CheckpointPolicy(every_steps=10**6, every_minutes=every_minutes)
    sigterm = graceful_sigterm(60, print)
    callback = StoreCheckpointCallback(None, "p", {}, policy, sigterm, lines.append, cap_minutes=2.5)
    assert "committing at least every 2.5 min: the plan's notice window" in lines[0]
    clock.now += 2.5 * 60 - 1
    assert not _step(callback, 1).should_save
    clock.now += 1
    assert _step(callback, 2).should_save
    if every_minutes == "auto":  # Young/Daly's interval from the measured commit (6 min here) stays capped
        callback.records.append({"step": 2, "bytes": 1000, "blocked_s": 1.0, "commit_s": 8.0})
        callback.last_commit = clock.now
        clock.now += 2.5 * 60
        assert _step(callback, 3).should_save and math.isclose(callback.interval_minutes, 2.5)


def test_the_step_reached_is_recorded_every_few_seconds_and_at_a_stop(monkeypatch, tmp_path):
    from entrypoint.store import FileStore
    from entrypoint.training.trainer import PROGRESS_EVERY_S

    clock = Clock()
    monkeypatch.setattr(trainer_module.time, "monotonic", clock)
    store = FileStore(tmp_path / "store")
    sigterm = graceful_sigterm(60, print)
    progress = {"key": "trials/main/progress.json", "interruptions": [{"lost_steps": 3}]}
    callback = StoreCheckpointCallback(store, "p", {}, CheckpointPolicy(), sigterm, print, progress=progress)

    def step(n: int) -> int:
        args = SimpleNamespace(output_dir=tempfile.gettempdir())
        state = SimpleNamespace(global_step=n, max_steps=100, is_world_process_zero=True)
        callback.on_step_end(args, state, TrainerControl())
        return json.loads(store.get_bytes("trials/main/progress.json"))["step"]

    assert step(1) == 1  # the first step of a process
    clock.now += PROGRESS_EVERY_S - 1
    assert step(2) == 1
    clock.now += 1
    assert step(3) == 3
    sigterm.requested.set()
    assert step(4) == 4  # a stop is recorded at once
    assert json.loads(store.get_bytes("trials/main/progress.json"))["interruptions"] == [{"lost_steps": 3}]
