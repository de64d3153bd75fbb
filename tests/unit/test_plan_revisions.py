"""Re-planning as the job goes, through a real file store, with a fake clock and a fake step timer: every
revision is kept, the trial after the first is planned from the first's own step time, the training
deadline keeps the final phases and the margin (a trial cut by it leaves the export safe), and the lease
account sets what was planned against what happened."""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from transformers import TrainerControl

from entrypoint.job.lease import lease_account, lease_lines
from entrypoint.job.plan import plan_revisions, store_plan
from entrypoint.job.state import dumps, job_store, read_json
from entrypoint.store import FileStore
from entrypoint.training.trainer import StepClock, StoreCheckpointCallback, graceful_sigterm
from entrypoint.trial.train import _timings
from jobspec import parse_spec
from jobspec.schema import CheckpointPolicy

ROOT = Path(__file__).resolve().parents[1].parent
RAW = yaml.safe_load((ROOT / "jobspec/examples/quickstart.yaml").read_text())
START = 1_800_000_000.0  # the lease start (rental.started_at), in seconds
STEPS = 108  # 288 training examples x 6 epochs / 16


class FakeTimer:
    """A monotonic timer that moves only when told to."""

    def __init__(self, now: float = 0.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def _spec():
    raw = copy.deepcopy(RAW)
    raw["training"].update({"epochs": 6})
    raw["data"].update({"source": str(ROOT / "examples/data/tickets.jsonl"), "split": {"eval": 0.2, "test": 0.2}})
    raw["rental"] = {"window": "3d", "margin": "2h", "started_at": "2027-01-15T08:00:00+00:00"}
    loaded = parse_spec(yaml.safe_dump(raw), source="spec.yaml")
    return loaded


@pytest.fixture
def job(tmp_path):
    """A job whose data, baseline and probe phases have committed what they measure."""
    loaded = _spec()
    store = job_store(FileStore(tmp_path / "store"), loaded.spec.job.id)
    store.put_bytes("spec.yaml", loaded.text.encode())
    start = loaded.spec.rental.started_at.timestamp()
    store.put_bytes("attempts/1/started.json", dumps({"started_at": start, "startup_seconds": 6.0}))
    counts = {"train": {"x": 288}, "eval": {"x": 96}, "test": {"x": 96}}
    store.put_bytes("phases/data/result.json", dumps({"counts": counts, "seconds": 2.0}))
    store.put_bytes(
        "phases/baseline/result.json", dumps({"seconds": 3.0, "timings": {"baseline": 0.96, "baseline_examples": 96}})
    )
    probe = {
        "seconds": 9.0,
        "train_rows": 288,
        "load_seconds": 1.5,
        "trial_setup_seconds": 2.0,
        "typical_step": {"seconds": 0.4, "steps": [0.41, 0.39, 0.4, 0.42, 0.4]},
        "eval_loss_pass": {"seconds": 5.0, "batches": 6, "batches_timed": 4},
        "checkpoint_cost": {"bytes": 4_000_000, "save_seconds": 0.05, "put_seconds": 0.5, "weights_bytes": 1_000_000},
    }
    store.put_bytes("phases/probe/result.json", dumps(probe))
    return loaded.spec, store, start


def test_the_trial_after_the_first_is_planned_from_the_first_ones_own_steps(job):
    spec, store, start = job
    lines = []
    first = store_plan(spec, store, start + 14.0, "after probe", lines.append)
    main, variant = first["trials"]
    assert main["source"] == variant["source"] == "predicted"
    assert f"{STEPS} steps x 0.4 s" in main["formula"] and main["formula"].startswith("setup 2 s")

    # Trial main trains, timed by a fake step timer: 3x slower per step than the probe said.
    timer = FakeTimer(100.0)
    clock = StepClock(timer)
    clock.on_train_begin(None, None, None)
    for step in range(STEPS):
        timer.now += 1.2
        clock.on_step_end(None, None, None)
        if step in (26, 53, 80, 107):
            clock.on_evaluate(None, None, None, metrics={"eval_runtime": 4.0})
    saves = [{"background": True, "local_save_s": 0.02, "bytes": 4_000_000, "commit_s": 0.1}] * 5
    timings = _timings(97.0, clock, saves, predict=1.92, examples=96)
    assert timings["setup"] == 3.0 and timings["step"] == pytest.approx(1.2) and timings["steps_timed"] == STEPS - 1
    assert timings["store_rate"] == pytest.approx(4e7) and timings["checkpoint_save"] == 0.02
    record = {"trial_id": "main", "status": "completed", "timings": timings, "seconds": 150.0}
    store.put_bytes("trials/main/result.json", dumps(record))

    second = store_plan(spec, store, start + 170.0, "after trial main", lines.append)
    main, variant = second["trials"]
    assert main["seconds"] == 0.0 and main["source"] == "done"
    assert f"{STEPS} steps x 1.2 s" in variant["formula"]  # the first trial's step, not the probe's
    assert "setup 3 s" in variant["formula"] and "eval-loss passes x 4 s" in variant["formula"]
    assert second["figures"]["step"]["source"].startswith("trial main")
    # setup, steps, eval-loss passes, 6 checkpoints (every 20 steps, the last at the end), the last one and
    # the weights up at the trial's measured rate, the eval predictions
    expected = 3.0 + STEPS * 1.2 + 4 * 4.0 + 6 * 0.02 + 4e6 / 4e7 + 1e6 / 4e7 + 96 * 0.02
    assert variant["seconds"] == pytest.approx(expected)
    # the store keeps both revisions, numbered; plan.json is the newest
    assert [r["revision"] for r in plan_revisions(store)] == [1, 2]
    assert [r["reason"] for r in plan_revisions(store)] == ["after probe", "after trial main"]
    assert read_json(store, "plan.json") == second
    assert second["expected_end_at"] == pytest.approx(start + 170.0 + variant["seconds"] + _final(second))


def _final(plan: dict) -> float:
    return sum(s["seconds"] for s in plan["slots"] if s["name"] in ("evaluate", "test", "verify", "report", "export"))


def test_a_trial_cut_by_the_deadline_leaves_the_final_phases_and_the_margin(job):
    spec, store, start = job
    plan = store_plan(spec, store, start + 14.0, "after probe", lambda line: None)
    slots = {s["name"]: s for s in plan["slots"]}
    # the deadline keeps every final phase, as predicted from the figures, what a trial cut by it still does
    # (its last checkpoint and weights up, its eval predictions) and the margin before the lease end
    assert all(slots[n]["source"] == "predicted" for n in ("trial end", "evaluate", "test", "verify", "export"))
    tail = slots["trial end"]["seconds"]
    assert tail == pytest.approx(4e6 / 8e6 + 1e6 / 8e6 + 96 * 0.01)  # the probe's 4 MB put in 0.5 s: 8 MB/s
    reserve = tail + _final(plan) + plan["margin_seconds"]
    assert plan["train_deadline_at"] + reserve == pytest.approx(plan["lease_end_at"])
    assert slots["export"]["end"] == pytest.approx(plan["lease_seconds"] - plan["margin_seconds"])

    # Training reads the same deadline: the step past it saves a checkpoint and stops, whatever the count.
    clock = FakeTimer(plan["train_deadline_at"] - 1.0)
    saver = StoreCheckpointCallback(
        None, "p", {}, CheckpointPolicy(), graceful_sigterm(60, print), lambda m: None,
        deadline=plan["train_deadline_at"], clock=clock,
    )  # fmt: skip
    args = SimpleNamespace(output_dir=tempfile.gettempdir())
    assert not saver.on_step_end(args, SimpleNamespace(global_step=10, max_steps=STEPS), TrainerControl()).should_save
    clock.now += 2.0
    control = saver.on_step_end(args, SimpleNamespace(global_step=11, max_steps=STEPS), TrainerControl())
    assert control.should_save and control.should_training_stop and saver.deadline_hit_at == 11
    # what is left after the deadline: the cut trial's end, the final phases as predicted and the whole
    # margin, less the one step that ran past it
    overshoot = clock.now - plan["train_deadline_at"]
    assert plan["lease_end_at"] - clock.now == pytest.approx(reserve - overshoot)


def test_the_lease_account_sets_the_plan_after_the_probe_against_what_each_phase_took(job):
    spec, store, start = job
    store_plan(spec, store, start, "attempt 1 started", lambda line: None)
    after_probe = store_plan(spec, store, start + 14.0, "after probe", lambda line: None)
    planned = after_probe["trials"][0]["seconds"]
    store.put_bytes(
        "trials/main/result.json", dumps({"trial_id": "main", "status": "completed", "seconds": planned / 2})
    )
    store.put_bytes("phases/report/result.json", dumps({"seconds": 0.3}))
    account = lease_account(spec, store, start + 100.0)
    rows = {r["name"]: r for r in account["rows"]}
    assert rows["main"]["planned"] == pytest.approx(planned, abs=1e-3)
    assert rows["main"]["error"] == pytest.approx(1.0, abs=1e-4)  # planned twice what it took: +100%
    assert rows["main"]["planned_in"] == "revision 2 (after probe)"
    assert rows["data"]["source"] == "measured" and rows["data"]["error"] == 0.0  # committed before the first plan
    assert rows["report"]["source"].startswith("default") and rows["report"]["error"] is None  # not a prediction
    assert rows["low-lr"]["actual"] is None and account["total"]["actual"] is None  # not run yet
    assert account["largest_error"] == {"name": "main", "error": rows["main"]["error"]}
    assert account["used_seconds"] == 100.0 and account["revisions"] == 2
    table = "\n".join(lease_lines(account))
    assert "  main" in table and "+100%" in table and "lease used: 100.0 s of 3d" in table


def test_a_variant_with_a_larger_batch_leaves_main_s_step_for_the_trials_after_it(tmp_path):
    raw = copy.deepcopy(RAW)
    raw["training"].update({"epochs": 6})
    raw["data"].update({"source": str(ROOT / "examples/data/tickets.jsonl"), "split": {"eval": 0.2, "test": 0.2}})
    raw["rental"] = {"window": "3d", "started_at": "2027-01-15T08:00:00+00:00"}
    raw["experiments"] = [
        {"id": "wide", "changes": ["training.grad_accum"], "rationale": "r", "training": {"grad_accum": 4}},
        {"id": "slow", "changes": ["training.learning_rate"], "rationale": "r", "training": {"learning_rate": 1e-4}},
    ]
    spec = parse_spec(yaml.safe_dump(raw), source="spec.yaml").spec
    store = job_store(FileStore(tmp_path / "store"), spec.job.id)
    counts = {"train": {"x": 288}, "eval": {"x": 96}, "test": {"x": 96}}
    store.put_bytes("phases/data/result.json", dumps({"counts": counts, "seconds": 2.0}))
    store.put_bytes(
        "phases/probe/result.json", dumps({"seconds": 9.0, "typical_step": {"seconds": 0.4, "steps": [0.4]}})
    )
    # main and wide have finished; wide's steps took 4x main's: 4x the examples per step
    for trial, step in (("main", 0.4), ("wide", 1.6)):
        store.put_bytes(f"trials/{trial}/result.json", dumps({"trial_id": trial, "timings": {"step": step}}))
    plan = store_plan(spec, store, spec.rental.started_at.timestamp() + 100, "after trial wide", lambda line: None)
    assert plan["figures"]["step"]["value"] == pytest.approx(0.4)  # per main's batch, not wide's
    assert "/ 4 (its batch)" in plan["figures"]["step"]["source"]
    slow = plan["trials"][2]
    assert slow["seconds"] == pytest.approx(STEPS * 0.4 * 1.1)  # only the step is known: x the overhead


def test_the_export_leaves_the_merge_out_when_its_estimate_no_longer_fits_before_the_margin(tmp_path):
    from entrypoint.context import PhaseContext
    from entrypoint.trial.export import merge_fits

    spec = parse_spec(yaml.safe_dump(RAW), source="spec.yaml").spec
    store = job_store(FileStore(tmp_path / "store"), spec.job.id)
    now = {"t": START}
    ctx = PhaseContext(spec, "sha", store, tmp_path / "work", print, clock=lambda: now["t"])
    assert merge_fits(ctx) is None  # no plan yet: nothing to hold the merge back
    store.put_bytes("plan.json", dumps({"merge_seconds": 300.0, "lease_end_at": START + 3600, "margin_seconds": 1800}))
    now["t"] = START + 1200  # 600 s before the margin: the merge's 300 s fit
    assert merge_fits(ctx) is None
    now["t"] = START + 1600  # 200 s left
    assert merge_fits(ctx) == "the merge and its parity check need about 300 s, 200 s are left before the margin"
