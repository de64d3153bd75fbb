"""docs/spec-reference.md is generated from the job spec's JSON Schema (jobspec/reference.py) and kept current."""

from __future__ import annotations

import copy

import pytest

from jobspec import reference
from jobspec.schema import JobSpec


def test_committed_reference_is_current():
    committed = reference.DOC.read_text(encoding="utf-8") if reference.DOC.is_file() else ""
    assert committed == reference.render(), (
        f"{reference.DOC.name} is stale: run `{reference.COMMAND}` and commit docs/spec-reference.md"
    )


def test_every_section_and_nested_field_is_listed():
    text = reference.render()
    for section in JobSpec.model_json_schema()["properties"]:
        assert f"\n## {section}\n" in text, section
    for field in (
        "evaluation.resamples",
        "data.cluster_field",
        "data.split.eval",
        "data.leaks.near_threshold",
        "data.clean[].max_chars",
        "training.checkpoint.every_minutes",
        "hypothesis.format.json_schema",
        "tracking.wandb.project",
        "guardrails[].tolerance",
        "experiments[].changes",
    ):
        assert f"| `{field}` |" in text, field


def test_types_defaults_and_required_are_resolved():
    rows = {line.split(" | ")[0]: line for line in reference.render().splitlines() if line.startswith("| `")}
    assert rows["| `evaluation.resamples`"] == (
        "| `evaluation.resamples` | 1000 ≤ int ≤ 1,000,000 | `10000` | no | "
        "Bootstrap resamples per interval (1,000 or more, Koehn 2004). |"
    )
    assert '`"warn"` \\| `"fail"`' in rows["| `evaluation.underpowered`"]
    assert '| `["RGB", "L"]` |' in rows["| `data.image_modes`"]  # a default_factory default
    assert "| - | yes |" in rows["| `job.id`"]
    assert "0 < float < 0.5" in rows["| `data.split.eval`"]


def test_a_changed_schema_renders_differently(monkeypatch):
    schema = copy.deepcopy(JobSpec.model_json_schema())
    schema["$defs"]["Evaluation"]["properties"]["resamples"]["description"] = "A description nobody wrote."
    monkeypatch.setattr(reference, "spec_schema", lambda: schema)
    changed = reference.render()
    assert changed != reference.render(JobSpec.model_json_schema())
    assert "A description nobody wrote." in changed


def test_render_is_deterministic():
    assert reference.render() == reference.render()


@pytest.mark.parametrize("content", [None, "# an old reference\n"])
def test_check_fails_on_a_missing_or_stale_file(tmp_path, capsys, content):
    path = tmp_path / "spec-reference.md"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    assert reference.main(["--check", "--file", str(path)]) == 1
    message = capsys.readouterr().err
    assert "spec-reference.md" in message and reference.COMMAND in message

    assert reference.main(["--file", str(path)]) == 0
    assert reference.main(["--check", "--file", str(path)]) == 0
    assert path.read_text(encoding="utf-8") == reference.render()
