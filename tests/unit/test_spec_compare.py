"""Specs compared by content (jobspec/compare.py): every differing field named, locations apart."""

from __future__ import annotations

import pytest
import yaml

from jobspec.compare import differences, locate, with_locations
from jobspec.load import parse_spec
from tests.specs import load, tiny_job


def _spec(**sections):
    return load(tiny_job("j", "/models/a", **sections)).spec


def test_every_differing_field_is_named_with_both_values():
    stored = _spec()
    running = _spec(training={"learning_rate": 0.01, "seed": 3}, adaptation={"method": "lora", "rank": 8})
    assert [str(d) for d in differences(stored, running)] == [
        "adaptation.rank: stored 4, yours 8",
        "training.learning_rate: stored 0.005, yours 0.01",
        f"training.seed: stored {stored.training.seed}, yours 3",
    ]


def test_the_same_content_written_differently_has_no_difference():
    stored = load(tiny_job("j", "/models/a"))
    data = yaml.safe_load(stored.text)
    data["training"]["learning_rate"] = "5e-3"  # what YAML reads as a string, pydantic as the same float
    text = "# a comment\n" + yaml.safe_dump(dict(reversed(data.items())), default_flow_style=True)
    assert text != stored.text
    assert differences(stored.spec, parse_spec(text).spec) == []


def test_a_moved_location_is_applied_and_anything_else_is_a_change():
    stored = _spec()
    spec, moved, changed = locate(stored, load(tiny_job("j", "/mnt/other/a")).spec)
    assert (moved, changed) == ({"model.path": "/mnt/other/a"}, [])
    assert spec.model.path == "/mnt/other/a" and spec.model.revision == stored.model.revision
    # from a path to the hub is another model, not another place
    hub = load({**tiny_job("j", "/x"), "model": {"hub_id": "org/model", "revision": "a" * 40, "max_length": 32}}).spec
    _, moved, changed = locate(stored, hub)
    assert moved == {} and {d.field for d in changed} >= {"model.path", "model.hub_id"}


def test_only_locations_can_be_moved():
    with pytest.raises(ValueError, match="training.learning_rate: not a location"):
        with_locations(_spec(), {"training.learning_rate": 1.0})
