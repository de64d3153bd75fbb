"""Variants, guardrails and hypothesis metrics are checked when the spec loads, before any training."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from entrypoint.cli import main
from jobspec import SpecError, parse_spec
from jobspec.experiments import resolve_trials, trial_spec

ROOT = Path(__file__).resolve().parents[2]
GOOD = yaml.safe_load((ROOT / "jobspec/examples/quickstart.yaml").read_text())
# Pinned here, not taken from the demo's tuning: 288 training tickets x 6 epochs / 16 = 108 steps per trial.
GOOD["training"].update({"epochs": 6, "learning_rate": 0.001})
GOOD["data"].update({"source": str(ROOT / "examples/data/tickets.jsonl"), "split": {"eval": 0.2, "test": 0.2}})


def _spec(**sections) -> dict:
    spec = copy.deepcopy(GOOD)
    spec.update(sections)
    return spec


def _errors(spec: dict) -> list[str]:
    with pytest.raises(SpecError) as caught:
        parse_spec(yaml.safe_dump(spec), source="spec.yaml")
    return caught.value.errors


def _variant(**fields) -> dict:
    return {"id": "v1", "changes": ["training.learning_rate"], "rationale": "why", **fields}


def test_variant_settings_are_the_reference_plus_its_declared_change():
    spec = _spec(
        experiments=[
            _variant(training={"learning_rate": 0.003}),
            _variant(id="v2", reference="v1", changes=["adaptation.rank"], adaptation={"rank": 4}),
        ]
    )
    loaded = parse_spec(yaml.safe_dump(spec), source="spec.yaml").spec
    main_trial, v1, v2 = resolve_trials(loaded)
    assert [t.id for t in (main_trial, v1, v2)] == ["main", "v1", "v2"]
    assert v1.training.learning_rate == 0.003 and v1.training.model_dump(exclude={"learning_rate"}) == (
        main_trial.training.model_dump(exclude={"learning_rate"})
    )
    assert v1.adaptation == main_trial.adaptation
    assert v2.training == v1.training and v2.adaptation.rank == 4 and v2.adaptation.alpha == v1.adaptation.alpha
    assert trial_spec(loaded, v2).adaptation.rank == 4 and trial_spec(loaded, v2).data == loaded.data


def test_a_variant_changing_an_undeclared_parameter_is_rejected_by_validate(tmp_path):
    spec = _spec(experiments=[_variant(training={"learning_rate": 0.003, "epochs": 9})])
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2
    assert "experiments.0 (v1): changes training.epochs (6.0 -> 9.0)" in result.output
    assert "without declaring it" in result.output and str(path) in result.output


@pytest.mark.parametrize(
    "experiment,expected",
    [
        (_variant(training={"learning_rate": 0.001}), "declares training.learning_rate, but it equals"),
        (_variant(changes=["training.seed"], training={"seed": 5}), "training.seed: expected unchanged"),
        (_variant(changes=["training.eval_batch"], training={"eval_batch": 8}), "every trial shares"),
        (_variant(changes=["training.packing"], training={"packing": True}), "training.packing: expected unchanged"),
        (_variant(reference="later", training={"learning_rate": 0.003}), "reference: expected main or the id"),
        (_variant(id="main", training={"learning_rate": 0.003}), "'main' is already used"),
        (_variant(training={"learning_rat": 0.003}), "training.learning_rat: Extra inputs are not permitted"),
        (_variant(training={"learning_rate": -1}), "training.learning_rate: Input should be greater than 0"),
        (_variant(rationale="two\nlines", training={"learning_rate": 0.003}), "experiments.0.rationale"),
        (_variant(changes=[], training={"learning_rate": 0.003}), "experiments.0.changes"),
    ],
    ids=[
        "unchanged",
        "seed",
        "eval-batch",
        "packing",
        "unknown-reference",
        "reuses-main",
        "typo",
        "bad-value",
        "two-line",
        "none",
    ],
)
def test_bad_variants_are_named(experiment, expected):
    errors = _errors(_spec(experiments=[experiment]))
    assert any(expected in line for line in errors), errors
    assert all(line.startswith("spec.yaml: ") for line in errors)


def test_checkpoint_cadence_nested_change_is_refused_but_named_precisely():
    errors = _errors(
        _spec(experiments=[_variant(changes=["training.checkpoint.keep"], training={"checkpoint": {"keep": 5}})])
    )
    assert any("training.checkpoint.keep: expected unchanged" in line for line in errors), errors


@pytest.mark.parametrize(
    "guardrail,expected",
    [
        ({"metric": "format_valid_rate"}, "guardrails.0.metric: expected one of"),
        ({"metric": "f1/no_such_category"}, None),  # labels not declared in the quickstart: checked after data
        ({"metric": "f1/*", "tolerance": -0.1}, "guardrails.0.tolerance"),
    ],
)
def test_guardrail_metrics_are_checked_against_the_task(guardrail, expected):
    spec = _spec(guardrails=[guardrail])
    if expected is None:
        parse_spec(yaml.safe_dump(spec), source="spec.yaml")
        return
    assert any(expected in line for line in _errors(spec))


def test_a_guardrail_naming_an_undeclared_category_is_refused_when_labels_are_declared():
    spec = _spec(guardrails=[{"metric": "f1/biling"}])
    spec["data"] = {**spec["data"], "labels": ["billing", "shipping"]}
    assert any("expected a category of data.labels, got 'biling'" in line for line in _errors(spec))


@pytest.mark.parametrize(
    "hypothesis,expected",
    [
        ({"metric": "format_valid_rate"}, "for task classification"),
        ({"task": "format"}, "a `format:` section"),
        ({"task": "extraction"}, "required_fields (at least one)"),
        ({"task": "format", "format": {"regex": "("}}, "valid regular expression"),
        ({"task": "format", "format": {"json_schema": {"type": "no-such-type"}}}, "valid JSON Schema"),
        ({"task": "format", "format": {"expect_json": False}}, "at least one check"),
    ],
)
def test_hypothesis_fits_its_task(hypothesis, expected):
    base = {k: v for k, v in GOOD["hypothesis"].items() if k != "metric"}
    spec = _spec(hypothesis={**base, **hypothesis}, guardrails=[])
    errors = _errors(spec)
    assert any(expected in line for line in errors), errors
    assert not any("expected expected" in line for line in errors)


def test_default_primary_metric_per_task():
    for task, extra, metric in (
        ("classification", {}, "macro_f1"),
        ("format", {"format": {"expect_json": True}}, "format_valid_rate"),
        ("extraction", {"required_fields": ["name"]}, "field_accuracy"),
    ):
        hypothesis = {"task": task, "statement": "s", **extra}
        spec = _spec(hypothesis=hypothesis, guardrails=[])
        assert parse_spec(yaml.safe_dump(spec), source="spec.yaml").spec.hypothesis.metric == metric
