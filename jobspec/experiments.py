"""Trials: `main` (the spec's own adaptation and training settings) and each variant listed under
`experiments:`, resolved to complete settings and checked to differ from their reference in exactly the
parameters they declare. Checked when the spec is loaded, so a bad variant is refused before any training.

    main                       adaptation + training as written in the spec
    lr-high  (reference main)  main's settings + {training.learning_rate: 0.003}; changes: [training.learning_rate]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from jobspec.schema import Adaptation, JobSpec, Training

__all__ = ["MAIN", "SHARED", "Trial", "resolve_trials", "trial_errors", "trial_spec"]

MAIN = "main"

# Settings every trial shares, so that trials differ only in what they declare and are compared fairly:
# one seed, one eval procedure, one device. Checkpoint and logging cadence do not change what is learned.
SHARED = (
    "training.seed",
    "training.eval_batch",
    "training.device",
    "training.backend",
    "training.deterministic",
    "training.checkpoint",
    "training.log_every_steps",
    "training.packing",  # what a step trains on (rows, not examples): budgets compare only with one answer
    "training.liger",  # what the image has
)


@dataclass(frozen=True)
class Trial:
    id: str
    reference: str | None  # None for main
    changes: tuple[str, ...]
    rationale: str
    adaptation: Adaptation
    training: Training


def _flatten(node: Any, prefix: str) -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(_flatten(value, f"{prefix}.{key}"))
        return out
    return {prefix: node}


def _merge(base: dict, override: dict) -> dict:
    merged = dict(base)
    for key, value in override.items():
        merged[key] = _merge(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return merged


def _resolve(spec: JobSpec) -> tuple[list[Trial], list[str]]:
    trials = [Trial(MAIN, None, (), "the spec's own settings", spec.adaptation, spec.training)]
    errors: list[str] = []
    for i, experiment in enumerate(spec.experiments):
        where = f"experiments.{i} ({experiment.id})"
        known = {t.id: t for t in trials}
        if experiment.id in known:
            errors.append(f"{where}: id: expected a new trial id; {experiment.id!r} is already used")
            continue
        reference = known.get(experiment.reference)
        if reference is None:
            errors.append(
                f"{where}: reference: expected main or the id of an earlier experiment "
                f"({', '.join(known)}), got {experiment.reference!r}"
            )
            continue
        sections: dict[str, Any] = {}
        for name, model, ref_value in (
            ("training", Training, reference.training),
            ("adaptation", Adaptation, reference.adaptation),
        ):
            try:
                sections[name] = model.model_validate(_merge(ref_value.model_dump(), getattr(experiment, name)))
            except ValidationError as exc:
                for err in exc.errors():
                    loc = ".".join(str(p) for p in err["loc"])
                    errors.append(f"{where}: {name}.{loc}: {err['msg']}")
        if len(sections) < 2:
            continue
        before = {
            **_flatten(reference.training.model_dump(), "training"),
            **_flatten(reference.adaptation.model_dump(), "adaptation"),
        }
        after = {
            **_flatten(sections["training"].model_dump(), "training"),
            **_flatten(sections["adaptation"].model_dump(), "adaptation"),
        }
        changed = {key for key in after if after[key] != before.get(key)}
        declared = set(experiment.changes)
        for key in sorted(changed - declared):
            errors.append(
                f"{where}: changes {key} ({before.get(key)!r} -> {after[key]!r}) against its reference "
                f"{reference.id!r} without declaring it; expected `changes` to list every parameter that differs"
            )
        for key in sorted(declared - changed):
            errors.append(f"{where}: changes: declares {key}, but it equals the reference {reference.id!r}'s value")
        for key in sorted(changed):
            if key.startswith(SHARED):
                errors.append(f"{where}: {key}: expected unchanged; every trial shares {key} for a fair comparison")
        trials.append(
            Trial(
                experiment.id,
                reference.id,
                tuple(experiment.changes),
                experiment.rationale,
                sections["adaptation"],
                sections["training"],
            )
        )
    return trials, errors


def trial_errors(spec: JobSpec) -> list[str]:
    """Every problem with the spec's experiments, one line each (empty when they are all sound)."""
    return _resolve(spec)[1]


def resolve_trials(spec: JobSpec) -> list[Trial]:
    """`main` first, then the variants in spec order. Raises ValueError listing every problem."""
    trials, errors = _resolve(spec)
    if errors:
        raise ValueError("\n".join(errors))
    return trials


def trial_spec(spec: JobSpec, trial: Trial) -> JobSpec:
    """The spec as this trial trains: its adaptation and training settings, everything else shared."""
    return spec.model_copy(update={"adaptation": trial.adaptation, "training": trial.training})
