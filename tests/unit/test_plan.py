"""The lease plan: per-window budgets that always keep the export and the margin, and refusals that say
what to cut. Pure Python, no torch."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from entrypoint.cli import main
from jobspec import parse_spec
from jobspec.plan import AFTER_TRAINING, DEFAULT_BUDGETS, Figure, make_plan

ROOT = Path(__file__).resolve().parents[2]
GOOD = yaml.safe_load((ROOT / "jobspec/examples/quickstart.yaml").read_text())
# Pinned here, not taken from the demo's tuning: 288 training tickets x 6 epochs / 16 = 108 steps per trial.
GOOD["training"].update({"epochs": 6, "learning_rate": 0.001})
GOOD["data"].update({"source": str(ROOT / "examples/data/tickets.jsonl"), "split": {"eval": 0.2, "test": 0.2}})


def _spec(**changes):
    spec = copy.deepcopy(GOOD)
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        node = spec
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return parse_spec(yaml.safe_dump(spec), source="spec.yaml").spec


def _slots(plan) -> dict:
    return {slot.name: slot for slot in plan.slots}


@pytest.mark.parametrize("window,hours", [("3d", 72), ("7d", 168), ("30d", 720)])
def test_every_window_keeps_export_and_margin_at_the_end(window, hours):
    spec = _spec(**{"rental.margin": None})
    plan = make_plan(spec, 288, window=window)
    slots = _slots(plan)
    assert plan.lease_seconds == hours * 3600 and not plan.problems
    assert slots["margin"].end == hours * 3600 and slots["export"].end == slots["margin"].start
    assert slots["export"].seconds == DEFAULT_BUDGETS["export"]
    assert plan.train_deadline == slots["train"].end == slots["evaluate"].start
    reserve = sum(slots[name].seconds for name in AFTER_TRAINING) + slots["margin"].seconds
    assert plan.train_deadline == hours * 3600 - reserve
    for earlier, later in zip(plan.slots, plan.slots[1:], strict=False):
        assert earlier.end <= later.start + 1e-9  # slots never overlap


def test_longer_windows_give_more_room_for_variants_and_a_larger_margin():
    spec = _spec(**{"rental.margin": None, "rental.step_seconds": 1200.0})  # 108 steps ~ 40 h
    plans = {w: make_plan(spec, 288, window=w) for w in ("3d", "7d", "30d")}
    margins = [plans[w].margin_seconds for w in ("3d", "7d", "30d")]
    assert margins == sorted(margins) and margins[0] < margins[-1]
    room = [_slots(plans[w])["train"].seconds for w in ("3d", "7d", "30d")]
    assert room[0] < room[1] < room[2]
    # each trial: 108 steps x 1200 s x 1.1 = 39.6 h; 3d leaves about 67 h: main fits, the variant does not
    assert [t.fits for t in plans["3d"].trials] == [True, False]
    variant = GOOD["experiments"][0]["id"]
    assert f"experiments {variant} do not fit" in plans["3d"].problems[0] and "cut" in plans["3d"].problems[0]
    assert all(t.fits for t in plans["7d"].trials) and not plans["30d"].problems


def test_a_main_trial_that_cannot_fit_is_refused_with_what_to_cut(tmp_path):
    spec = copy.deepcopy(GOOD)
    spec["rental"] = {"window": "3d", "step_seconds": 5000.0}
    spec["data"]["source"] = str(ROOT / "examples/data/tickets.jsonl")
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    result = CliRunner().invoke(main, ["plan", str(path)])
    assert result.exit_code == 2
    assert "trial main needs" in result.output and "cut: training.max_steps <= " in result.output
    most = int(result.output.split("training.max_steps <= ")[1].split(",")[0])
    spec["training"]["max_steps"] = most
    spec["experiments"] = []
    path.write_text(yaml.safe_dump(spec))
    fits = CliRunner().invoke(main, ["plan", str(path)])
    assert fits.exit_code == 0, fits.output  # the advice is exact: that many steps do fit
    assert "train" in fits.output and "margin" in fits.output


def test_a_margin_longer_than_the_lease_is_refused():
    plan = make_plan(_spec(**{"rental.margin": "80h"}), 288)
    assert plan.problems and "leave no time for training" in plan.problems[0]


def test_replanning_uses_time_used_measured_phases_and_the_probe_step():
    spec = _spec()
    fresh = make_plan(spec, 288)
    step = {"step": Figure(0.3, "probe")}
    later = make_plan(spec, 288, elapsed=30 * 3600, measured={"data": 5.0, "probe": 7.0}, figures=step)
    assert _slots(later)["data"].seconds == 5.0 and _slots(later)["data"].source == "measured"
    # only the step is measured: the rest of a trial is the overhead factor, and says so
    assert later.step_source == "measured" and later.trials[0].seconds == pytest.approx(108 * 0.3 * 1.1)
    assert later.trials[0].source == "measured step" and "x 1.1" in later.trials[0].formula
    assert _slots(later)["train"].start == 30 * 3600  # training can only start now
    assert later.train_deadline == fresh.train_deadline  # the reserve at the end does not move
    done = make_plan(spec, 288, steps_done={"main": 108})
    assert done.trials[0].seconds == 0.0


FIGURES = {
    "step": Figure(0.4, "probe"),
    "trial_setup": Figure(2.0, "probe"),
    "eval_loss_pass": Figure(5.0, "probe"),
    "checkpoint_blocked": Figure(0.05, "probe"),
    "checkpoint_bytes": Figure(8e6, "probe"),
    "weights_bytes": Figure(4e6, "probe"),
    "store_rate": Figure(2e6, "probe"),
    "predict": Figure(0.01, "baseline"),
    "baseline_predict": Figure(0.008, "baseline"),
    "load": Figure(1.5, "probe"),
    "startup": Figure(6.0, "attempt 1"),
}
COUNTS = {"train": 288, "eval": 96, "test": 96}


def test_every_part_of_a_trial_and_of_the_final_phases_comes_from_a_measured_figure():
    spec = _spec(**{"training.checkpoint": {"every_steps": 20, "keep": 2}})
    plan = make_plan(spec, 288, figures=FIGURES, counts=COUNTS)
    main = plan.trials[0]
    # 108 steps; the Trainer evaluates every 27 steps: 4 passes; checkpoints at 20, 40, ..., 100 and the end: 6
    # then the last checkpoint (8 MB) and the weights (4 MB) up at 2 MB/s, and 96 eval predictions
    expected = 2.0 + 108 * 0.4 + 4 * 5.0 + 6 * 0.05 + 8e6 / 2e6 + 4e6 / 2e6 + 96 * 0.01
    assert main.source == "predicted" and main.seconds == pytest.approx(expected)
    assert "108 steps x 0.4 s" in main.formula and "4 eval-loss passes x 5 s" in main.formula
    slots = _slots(plan)
    fetch_load_predict = 2.0 + 1.5 + 96 * 0.01
    assert slots["evaluate"].source == "predicted" and slots["evaluate"].seconds == pytest.approx(
        2 * fetch_load_predict
    )
    assert slots["test"].seconds == pytest.approx(96 * 0.008 + fetch_load_predict)
    assert slots["verify"].seconds == pytest.approx(6.0 + fetch_load_predict)
    assert slots["export"].seconds == pytest.approx(2 * 2.0)
    # what a trial cut by the deadline still does after its last step is reserved before the final phases
    assert slots["trial end"].seconds == pytest.approx(8e6 / 2e6 + 4e6 / 2e6 + 96 * 0.01)
    assert slots["train"].end == plan.train_deadline == slots["trial end"].start
    assert slots["trial end"].end == slots["evaluate"].start
    assert slots["report"].source == "default"  # nothing measures it before it runs
    # a variant with twice the batch per step takes twice as long per step
    wider = {**GOOD["experiments"][0], "changes": ["training.grad_accum"], "training": {"grad_accum": 2}}
    wide = make_plan(_spec(**{"experiments": [wider]}), 288, figures=FIGURES, counts=COUNTS)
    assert "x 2 (batch)" in wide.trials[1].formula
    # a figure missing: the phase keeps its default, and says so
    partial = make_plan(spec, 288, figures={k: v for k, v in FIGURES.items() if k != "startup"}, counts=COUNTS)
    assert (
        _slots(partial)["verify"].source == "default" and _slots(partial)["verify"].seconds == DEFAULT_BUDGETS["verify"]
    )


def test_a_merged_export_counts_the_merge_and_its_parity_check_in_the_export_slot():
    figures = {**FIGURES, "model_bytes": Figure(90e6, "probe")}
    merged = make_plan(_spec(**{"export.merged": True}), 288, figures=figures, counts=COUNTS)
    # read the base as a load does, put about its bytes, a fresh process, adapter and merged model on eval
    merge = 1.5 + 90e6 / 2e6 + 6.0 + 2 * (1.5 + 96 * 0.01)
    export = _slots(merged)["export"]
    assert merged.merge_seconds == pytest.approx(merge) and export.seconds == pytest.approx(2 * 2.0 + merge)
    assert "merge: read 1.5 s" in export.formula and "put 90 MB" in export.formula and "parity" in export.formula
    plain = make_plan(_spec(), 288, figures=figures, counts=COUNTS)  # a classifier: no merged folder by default
    assert plain.merge_seconds == 0.0 and _slots(plain)["export"].seconds == pytest.approx(2 * 2.0)
    # the merge moves the training deadline by exactly its estimate
    assert plain.train_deadline - merged.train_deadline == pytest.approx(merge)
    unknown = make_plan(_spec(**{"export.merged": True}), 288, figures=FIGURES, counts=COUNTS)  # no model_bytes
    assert _slots(unknown)["export"].source == "default" and unknown.merge_seconds == 0.0


def test_the_advice_on_steps_fits_and_is_within_an_eval_pass_of_the_most_that_fit():
    figures = {**FIGURES, "step": Figure(100.0, "probe"), "eval_loss_pass": Figure(600.0, "probe")}
    done = {"data": 1, "baseline": 1, "probe": 1}

    def plan(**changes):
        spec = _spec(**{"rental.margin": "70h", "experiments": [], **changes})
        return make_plan(spec, 288, figures=figures, counts=COUNTS, measured=done)

    refused = plan()
    assert refused.problems and "cut: training.max_steps <= " in refused.problems[0]
    most = int(refused.problems[0].split("training.max_steps <= ")[1].split(",")[0])
    assert not plan(**{"training.max_steps": most}).problems  # the advice fits
    # The need is not monotone in steps (the Trainer evaluates 4 or 5 times), so a few more may fit; never
    # more than one eval-loss pass's worth of steps more.
    fitting = [n for n in range(1, 109) if not plan(**{"training.max_steps": n}).problems]
    assert most <= max(fitting) <= most + 600 / 100 + 1


def test_run_refuses_a_job_that_cannot_fit_before_storing_anything(tmp_path):
    from entrypoint.runner import PlanDoesNotFit, run_job
    from entrypoint.store import FileStore

    spec = copy.deepcopy(GOOD)
    spec["rental"] = {"window": "3d", "step_seconds": 5000.0}
    spec["data"]["source"] = str(ROOT / "examples/data/tickets.jsonl")
    loaded = parse_spec(yaml.safe_dump(spec), source="spec.yaml")
    with pytest.raises(PlanDoesNotFit, match="cut: training.max_steps <= "):
        run_job(loaded, FileStore(tmp_path / "store"), tmp_path / "work", lambda line: None)
    assert not any((tmp_path / "store").rglob("*"))  # not even the spec: fix it and run the same job id again


def test_plan_states_the_smallest_change_the_split_sizes_can_show():
    from jobspec.plan import count_split_examples, detectable_from_size, split_power_lines

    raw = copy.deepcopy(GOOD)
    raw["hypothesis"]["min_gain"] = 0.05
    raw["data"]["source"] = str(ROOT / "examples/data/tickets.jsonl")
    raw["data"]["split"] = {"eval": 0.2, "test": 0.2}
    spec = parse_spec(yaml.safe_dump(raw), source="q.yaml").spec
    assert detectable_from_size(96, 0.95) == pytest.approx(1.959964 * (0.5 / 96) ** 0.5)
    lines = split_power_lines(spec, {"train": 288, "eval": 96, "test": 96})
    assert "changes smaller than 0.141 on eval (96 examples) and 0.141 on test (96)" in lines[0]
    assert "about 769 eval and 769 test examples" in lines[1]  # 0.5 x (1.96 / 0.05)^2
    uneven = split_power_lines(spec, {"train": 10, "eval": 1000, "test": 100})  # the test split decides: 0.139
    assert "about 769 eval and 769 test examples" in uneven[1]
    assert "would be empty" in split_power_lines(spec, {"train": 10, "eval": 0, "test": 5})[0]
    assert len(split_power_lines(spec, {"train": 10, "eval": 5000, "test": 5000})) == 1  # 0.028 < 0.05: decidable
    counts = count_split_examples(spec)
    assert counts == {"train": 288, "eval": 96, "test": 96}  # 480 lines of tickets.jsonl


def test_plan_of_data_in_a_bucket_states_power_from_train_examples_and_the_split_shares(tmp_path):
    raw = copy.deepcopy(GOOD)
    raw["data"] = {"source": "s3://bucket/data/tickets.jsonl", "split": {"eval": 0.2, "test": 0.2}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(raw))
    refused = CliRunner().invoke(main, ["plan", str(path)])
    assert refused.exit_code == 2 and "pass --train-examples N to plan" in refused.output
    result = CliRunner().invoke(main, ["plan", str(path), "--train-examples", "288"])
    assert "power: eval and test sizes from --train-examples 288 and data.split's shares" in result.output
    assert "on eval (96 examples) and 0.141 on test (96)" in result.output, result.output  # as from the file
    raw["data"] = {"files": {split: f"s3://bucket/data/{split}.jsonl" for split in ("train", "eval", "test")}}
    path.write_text(yaml.safe_dump(raw))
    files = CliRunner().invoke(main, ["plan", str(path), "--train-examples", "288"])
    assert "power: not computed: data.files are in object storage" in files.output, files.output
