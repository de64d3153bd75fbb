"""The job specs the tests share, written once: the tiny ticket-routing job most integration tests run, and
helpers to store, load and choose the kind of any spec dict."""

from __future__ import annotations

from pathlib import Path

import yaml

from jobspec import LoadedSpec, parse_spec

ROOT = Path(__file__).resolve().parents[1]
TICKETS = ROOT / "examples/data/tickets.jsonl"


def tiny_job(job_id: str, model: Path, **sections) -> dict:
    """Ticket routing (6 categories) with LoRA rank 4 on query/value of `model`, 12 steps on CPU. Each
    keyword replaces a section, or for dict sections updates it one level deep (`training={"seed": 7}`
    keeps the other training settings)."""
    spec = {
        "job": {"id": job_id},
        "hypothesis": {"task": "classification", "statement": "A tiny model learns ticket routing."},
        "model": {"path": str(model), "revision": "tiny-test", "max_length": 32},
        "data": {"source": str(TICKETS)},
        "adaptation": {"method": "lora", "rank": 4, "alpha": 8, "target_modules": ["query", "value"]},
        "training": {"max_steps": 12, "microbatch": 8, "learning_rate": 0.005, "device": "cpu"},
    }
    for name, value in sections.items():
        merge = isinstance(value, dict) and isinstance(spec.get(name), dict)
        spec[name] = {**spec[name], **value} if merge else value
    return spec


def s3_section(endpoint: str, bucket: str) -> dict:
    """The `store:` section of a job on the tests' moto server."""
    return {"uri": f"s3://{bucket}/runs", "endpoint_url": endpoint, "addressing_style": "path"}


def write_spec(path: Path, spec: dict) -> Path:
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def load(spec: dict) -> LoadedSpec:
    return parse_spec(yaml.safe_dump(spec, sort_keys=False), source="spec.yaml")


def kind_of(spec: dict):
    """The kind (data, model and task sides) a spec dict runs as (entrypoint.kinds.kind_for on the validated
    spec)."""
    from entrypoint.kinds import kind_for

    return kind_for(load(spec).spec)
