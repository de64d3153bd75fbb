"""Variants compared fairly, an invalid trial kept with its reason, the sealed test split opened once, and a
report a person can read: real `rentune` processes, a tiny BERT from disk, the loopback S3 server."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import yaml
from PIL import Image

from entrypoint.report.results import Results
from entrypoint.store import PrefixedStore
from entrypoint.store.s3 import S3Store
from tests.models import build_tiny_bert
from tests.processes import rentune
from tests.s3server import create_bucket
from tests.specs import s3_section, tiny_job, write_spec

ROOT = Path(__file__).resolve().parents[2]


def _spec(
    tmp_path: Path, model: Path, endpoint: str, bucket: str, job_id: str, name: str = "spec.yaml", variants: bool = True
) -> Path:
    experiments = [
        {
            "id": "lr-high",
            "changes": ["training.learning_rate"],
            "rationale": "a tiny model may want a larger step",
            "training": {"learning_rate": 0.02},
        },
        {
            "id": "wrong-module",
            "reference": "lr-high",
            "changes": ["adaptation.target_modules"],
            "rationale": "planted: a module name the model does not have",
            "adaptation": {"target_modules": ["no_such_projection"]},
        },
        {
            "id": "longer",
            "changes": ["training.max_steps"],
            "rationale": "does a longer run help? (exceeds main's budget)",
            "training": {"max_steps": 18},
        },
    ]
    spec = tiny_job(
        job_id,
        model,
        hypothesis={"metric": "macro_f1", "min_gain": 0.02},  # 96 eval examples cannot show 0.02: warned
        guardrails=[{"metric": "f1/*", "tolerance": 1.0}, {"metric": "accuracy", "tolerance": 0.5}],
        training={"microbatch": 16, "seed": 3},
        store=s3_section(endpoint, bucket),
        experiments=experiments if variants else [],
    )
    return write_spec(tmp_path / name, spec)


@pytest.fixture(scope="module")
def job(s3_server, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("trials")
    model = build_tiny_bert(tmp / "bert")
    bucket = create_bucket(s3_server)
    spec = _spec(tmp, model, s3_server, bucket, "trials")
    result = rentune("run", str(spec), "--workdir", str(tmp / "work"), cwd=tmp)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    store = PrefixedStore(
        S3Store.from_uri(f"s3://{bucket}/runs", endpoint_url=s3_server, addressing_style="path"), "jobs/trials"
    )
    return tmp, model, bucket, store, result


def _json(store, key: str):
    return json.loads(store.get_bytes(key))


def test_valid_trials_share_one_eval_config_and_the_invalid_one_keeps_its_reason(job):
    _, _, _, store, result = job
    configs = {t: store.get_bytes(f"trials/{t}/eval/eval_config.json") for t in ("main", "lr-high", "longer")}
    assert len(set(configs.values())) == 1, configs  # byte-identical stored configs
    config = json.loads(configs["main"])
    assert config["split"] == "eval" and config["seed"] == 3 and config["data_version"]
    assert store.head("trials/wrong-module/eval/eval_config.json") is None

    invalid = _json(store, "trials/wrong-module/result.json")
    assert invalid["status"] == "invalid" and "no_such_projection" in invalid["reason"]
    results = _json(store, "report/results.json")
    by_id = {t["id"]: t for t in results["trials"]}
    assert list(by_id) == ["main", "lr-high", "wrong-module", "longer"]  # nothing dropped, spec order
    assert by_id["wrong-module"]["status"] == "invalid" and by_id["wrong-module"]["metrics"] is None
    assert by_id["lr-high"]["losses"] != by_id["main"]["losses"]  # really trained with its own setting
    assert results["eval_configs_identical"] is True
    assert "wrong-module" in result.stdout and "invalid" in result.stdout


def test_budget_is_recorded_per_trial(job):
    _, _, _, store, _ = job
    by_id = {t["id"]: t for t in _json(store, "report/results.json")["trials"]}
    assert by_id["main"]["budget"] == {**by_id["main"]["budget"], "status": "within", "done_examples": 12 * 16}
    assert by_id["longer"]["budget"]["status"] == "exceeds" and by_id["longer"]["budget"]["done_examples"] == 18 * 16
    assert by_id["longer"]["steps"] == 18 and by_id["lr-high"]["steps"] == 12


def test_selection_on_eval_then_the_test_split_is_opened_once(job, s3_server):
    _, _, bucket, store, _ = job
    results = _json(store, "report/results.json")
    evaluated = _json(store, "phases/evaluate/result.json")
    completed = {t: r for t, r in evaluated["trials"].items() if r["status"] == "completed"}
    best = max(completed, key=lambda t: completed[t]["metrics"]["macro_f1"])
    assert results["selected"]["trial_id"] == evaluated["selected"] == best
    test = _json(store, "phases/test/result.json")
    assert test["selected"] == best and set(_json(store, "phases/test/metrics.json")) == {"baseline", best}
    root = S3Store.from_uri(f"s3://{bucket}/runs", endpoint_url=s3_server, addressing_style="path")
    seals = [info.key for info in root.list("sealed-tests")]
    assert seals == [f"sealed-tests/{test['test_sha256']}/opened.json"]
    opened = json.loads(root.get_bytes(seals[0]))
    assert opened["job_id"] == "trials" and opened["trial_id"] == best
    assert opened["spec_sha256"] == results["job"]["spec_sha256"]


def test_a_second_spec_on_the_same_test_split_is_refused_before_training_unless_overridden(job, s3_server):
    tmp, model, bucket, store, _ = job
    # the same test split (data and split seed); its refusal and override do not depend on the variants
    spec = _spec(tmp, model, s3_server, bucket, "trials-again", name="again.yaml", variants=False)
    refused = rentune("run", str(spec), "--workdir", str(tmp / "work2"), cwd=tmp)
    assert refused.returncode == 3, refused.stdout[-2000:] + refused.stderr[-2000:]
    assert "already opened by job 'trials'" in refused.stderr and "--reopen-test" in refused.stderr
    assert "train: starting" not in refused.stdout  # refused in the data phase, before any compute
    root = S3Store.from_uri(f"s3://{bucket}/runs", endpoint_url=s3_server, addressing_style="path")
    assert root.head("jobs/trials-again/phases/data/result.json") is None
    assert len(list(root.list("sealed-tests"))) == 1  # nothing recorded for the refused job

    reason = "the first job's selection had a bug; re-checked by hand"
    ran = rentune(
        "run", str(spec), "--workdir", str(tmp / "work2"), "--reopen-test", reason, "--until", "report", cwd=tmp
    )
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    results = json.loads(root.get_bytes("jobs/trials-again/report/results.json"))
    assert results["test"]["override"]["reason"] == reason
    assert results["test"]["override"]["earlier_opening"]["job_id"] == "trials"
    assert reason in root.get_bytes("jobs/trials-again/report/report.md").decode()
    assert any(reason in note for note in results["limitations"])


def test_report_is_valid_against_its_schema_with_plots_and_table(job, tmp_path, s3_server):
    tmp, _, bucket, store, result = job
    results = _json(store, "report/results.json")
    Results.model_validate(results)
    assert _json(store, "report/results.schema.json") == Results.model_json_schema()
    for name in ("loss_curves.png", "per_category.png"):
        png = store.get_bytes(f"report/{name}")
        assert png.startswith(b"\x89PNG\r\n\x1a\n")
        Image.open(io.BytesIO(png)).verify()
        assert Image.open(io.BytesIO(png)).size[0] >= 600
    report = store.get_bytes("report/report.md").decode()
    assert (
        "| trial | reference | change | status | macro_f1 | gain | 95% interval | hypothesis | guardrails | budget |"
        in report
    )
    for section in ("## Power: the smallest change each split can show", "## What changed", "### main on eval: "):
        assert section in report
    power = results["power"]["metrics"][0]
    assert power["metric"] == "macro_f1" and power["decidable"] is False and power["eval"]["detectable"] > 0.02
    assert "going on (evaluation.underpowered: warn)" in result.stdout
    runner_up = results["selected"]["runner_up"]
    assert runner_up["trial_id"] != results["selected"]["trial_id"] and runner_up["trial_id"] in (
        "main",
        "lr-high",
        "longer",
    )
    low, high = runner_up["interval"]
    assert runner_up["decided"] == (low > 0 or high < 0) and f"against the runner-up {runner_up['trial_id']}" in report
    # the power note stands under a verdict that stayed inconclusive, never under one that decided
    still_open = "inconclusive" in (results["verdict"]["eval"]["hypothesis"], results["verdict"]["test"]["hypothesis"])
    noted = any("macro_f1 (hypothesis) could only show changes larger than" in n for n in results["limitations"])
    assert noted == still_open, (results["verdict"], results["limitations"])
    for trial in results["trials"]:
        if trial["hypothesis"]:
            h = trial["hypothesis"]
            row = next(line for line in report.splitlines() if line.startswith(f"| {trial['id']}"))
            interval = f"[{h['interval'][0]:+.3f}, {h['interval'][1]:+.3f}]"
            assert f"| {interval} | {h['result']} | {trial['guardrails_result']} |" in row, row
            changed = trial["changed"]
            assert (
                changed["fixed"]
                == len(changed["examples"]["fixed"])
                == sum(g["fixed"] for g in changed["per_group"].values())
            )
    for trial in ("main", "lr-high", "wrong-module", "longer"):
        assert f"| {trial}" in report
    assert report.rstrip().splitlines()[-1].startswith("- ")  # ends with the observed limitations
    assert "## Observed limitations" in report
    assert results["limitations"] and any("wrong-module is invalid" in n for n in results["limitations"])
    assert any("longer exceeds the training budget" in n for n in results["limitations"])

    fetched = rentune(
        "fetch",
        "trials",
        "--store",
        f"s3://{bucket}/runs",
        "--endpoint-url",
        s3_server,
        "--dest",
        str(tmp_path / "f"),
        cwd=tmp,
    )
    assert fetched.returncode == 0, fetched.stderr
    assert (tmp_path / "f/report/report.md").read_text() == report
    assert (tmp_path / "f/report/per_category.png").read_bytes() == store.get_bytes("report/per_category.png")
    assert (tmp_path / "f/export/BINDING.json").is_file() and not (tmp_path / "f/export/adapter").exists()
    assert "*" + results["selected"]["trial_id"] in fetched.stdout


def test_the_report_sets_the_plan_after_the_probe_against_what_each_phase_and_trial_took(job):
    _, _, _, store, _ = job
    results, report = _json(store, "report/results.json"), store.get_bytes("report/report.md").decode()
    lease = results["lease"]
    names = [row["name"] for row in lease["rows"]]
    trials = ["main", "lr-high", "wrong-module", "longer"]
    assert names == ["data", "baseline", "probe", "train", *trials, "evaluate", "test", "verify", "report", "export"]
    rows = {row["name"]: row for row in lease["rows"]}
    for phase in ("data", "baseline", "probe", "train", "evaluate", "test", "verify"):
        assert rows[phase]["actual"] == _json(store, f"phases/{phase}/result.json")["seconds"]
    assert rows["report"]["actual"] is None and rows["export"]["actual"] is None  # they run after the report
    for trial in trials:
        record = _json(store, f"trials/{trial}/result.json")
        assert rows[trial]["actual"] == record["seconds"] and rows[trial]["planned_in"].endswith("(after probe)")
    main = rows["main"]
    assert main["error"] == pytest.approx((main["planned"] - main["actual"]) / main["actual"])
    # The probe times the step twice: the worst case for memory, and the typical one the plan uses
    probe = _json(store, "phases/probe/result.json")
    assert 8 <= len(probe["typical_step"]["steps"]) <= 32 and probe["worst_case_step_seconds"] > 0
    step = probe["typical_step"]["seconds"]
    shown = f"{step * 1000:.3g} ms" if step < 0.1 else f"{step:.3g} s"
    assert main["source"].startswith("setup ") and f"12 steps x {shown}" in main["source"]
    # every revision kept, numbered, each saying what was just measured
    revisions = [_json(store, f"plans/{n:04d}.json") for n in range(1, lease["revisions"] + 1)]
    reasons = [r["reason"] for r in revisions]
    assert reasons[0] == "attempt 1 started" and "after probe" in reasons and "after trial main" in reasons
    assert [r["revision"] for r in revisions] == list(range(1, len(revisions) + 1))
    assert _json(store, "plan.json")["revision"] >= revisions[-1]["revision"]
    assert "## Lease: planned against actual" in report and "\n  main " in report and "lease used: " in report


def test_export_carries_the_selected_trial(job):
    _, _, _, store, _ = job
    binding = _json(store, "export/BINDING.json")
    selected = _json(store, "report/results.json")["selected"]["trial_id"]
    assert binding["trial_id"] == selected
    assert store.get_bytes("export/adapter/adapter_model.safetensors") == store.get_bytes(
        f"trials/{selected}/final/adapter_model.safetensors"
    )


def test_a_guardrail_on_a_metric_the_job_does_not_compute_stops_it_before_training(tmp_path):
    model = build_tiny_bert(tmp_path / "bert")
    spec = yaml.safe_load(_spec(tmp_path, model, "unused", "unused", "typo").read_text())
    spec["guardrails"] = [{"metric": "f1/biling", "tolerance": 0.0}]  # no data.labels: caught at the baseline
    spec["experiments"] = []
    spec["store"] = {"uri": f"file://{tmp_path / 'store'}"}
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(spec))
    result = rentune("run", str(path), "--workdir", str(tmp_path / "work"), cwd=tmp_path)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert "guardrails: 'f1/biling': no such metric is computed for this job" in result.stderr
    assert "f1/billing" in result.stderr and "probe: starting" not in result.stdout


def test_an_underpowered_job_with_underpowered_fail_stops_after_the_baseline_with_no_trial(tmp_path):
    model = build_tiny_bert(tmp_path / "bert")
    spec = yaml.safe_load(_spec(tmp_path, model, "unused", "unused", "small").read_text())
    spec["evaluation"] = {"underpowered": "fail", "resamples": 2000}
    spec["store"] = {"uri": f"file://{tmp_path / 'store'}"}
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(spec))
    job = tmp_path / "store/jobs/small"
    for _ in range(2):  # a second run of the same spec stops at the same place
        result = rentune("run", str(path), "--workdir", str(tmp_path / "work"), cwd=tmp_path)
        assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
        assert "the hypothesis cannot be decided with these splits" in result.stderr
        assert "on eval (96 examples)" in result.stderr and "stopped before training" in result.stderr
        assert "examples would decide it" in result.stderr and "probe: starting" not in result.stdout
        assert "decide the hypothesis in a new job, a copy of this spec with another job.id" in result.stderr
        assert (job / "phases/baseline/result.json").is_file() and not (job / "trials").exists()
    baseline = json.loads((job / "phases/baseline/result.json").read_text())
    needed = baseline["power"]["metrics"][0]["needed"]["eval"]
    assert needed > 96 and f"About {needed} eval" in result.stderr


def test_a_goal_the_baseline_leaves_no_room_for_stops_after_the_baseline_naming_the_ceiling(tmp_path):
    """min_gain 1.0 on macro_f1: any baseline above 0 leaves less than that below 1.0, so no training can
    show it; under `underpowered: fail` the job stops before the probe, naming the baseline and the room."""
    model = build_tiny_bert(tmp_path / "bert")
    spec = yaml.safe_load(_spec(tmp_path, model, "unused", "unused", "ceiling").read_text())
    spec["hypothesis"]["min_gain"] = 1.0
    spec["evaluation"] = {"underpowered": "fail", "resamples": 2000}
    spec["store"] = {"uri": f"file://{tmp_path / 'store'}"}
    path = tmp_path / "ceiling.yaml"
    path.write_text(yaml.safe_dump(spec))
    result = rentune("run", str(path), "--workdir", str(tmp_path / "work"), cwd=tmp_path)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    job = tmp_path / "store/jobs/ceiling"
    hypothesis = json.loads((job / "phases/baseline/result.json").read_text())["power"]["metrics"][0]
    base = 1.0 - hypothesis["room"]
    assert hypothesis["reachable"] is False and 0 < base < 1
    assert f"NO (cannot hold: the baseline leaves {hypothesis['room']:.3f})" in result.stdout  # the power table
    assert (
        f"the hypothesis cannot hold: the untouched model's macro_f1 is {base:.3f} on eval, so a gain of "
        f"hypothesis.min_gain 1.000 would need {base + 1:.3f}, above the most macro_f1 can be (1.000)"
    ) in result.stderr
    assert "stopped before training" in result.stderr.lower() and "probe: starting" not in result.stdout
    assert not (job / "trials").exists()
