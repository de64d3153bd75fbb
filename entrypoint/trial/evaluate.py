"""The evaluation procedure (evaluation/procedure.py) with a job's context: the untouched model's outputs,
a trial's committed weights reloaded as a fresh consumer would, and the eval config they are measured
under."""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Sequence

from entrypoint.context import PhaseContext
from entrypoint.evaluation.procedure import eval_config
from entrypoint.job import layout
from entrypoint.kinds import Baseline
from entrypoint.store import get_tree
from entrypoint.training.model import hash_base_model
from jobspec.schema import Adaptation, Quantization

__all__ = ["baseline_outputs", "evaluate_trial", "split_config", "trial_adaptation"]


def split_config(ctx: PhaseContext, split: str) -> dict:
    """The eval config of `split` for this job (the model's and the task's settings included)."""
    settings = {**ctx.kind.model.settings(), **ctx.kind.task.settings()}
    return eval_config(ctx.spec, settings, split, ctx.data_version, hash_base_model(ctx.model_dir).sha256)


def baseline_outputs(ctx: PhaseContext, rows: Sequence[dict]) -> Baseline:
    """The untouched model's outputs on `rows`, and how they were obtained (timed, loading included)."""
    model = ctx.kind.model
    with ctx.timed("baseline"):
        processor = model.processor(ctx.model_dir)
        found = model.baseline(ctx.model_dir, processor, rows, ctx.labels, ctx.device, lambda: ctx.read_split("train"))
    ctx.count("baseline_examples", len(rows))
    return found


def trial_adaptation(record: dict) -> Adaptation:
    """The adaptation a trial trained with, from its committed result, as it was stored (not validated
    again: a record written by an earlier rentune stays readable; reloading reads only its method and its
    quantization)."""
    settings = dict(record["settings"]["adaptation"])
    if settings.get("quantization"):
        settings["quantization"] = Quantization.model_construct(**settings["quantization"])
    return Adaptation.model_construct(**settings)


def evaluate_trial(ctx: PhaseContext, trial_id: str, split: str) -> tuple[list[dict], list[str], dict]:
    """Reload a trial's committed weights from the store as a fresh consumer would and predict `split`.
    Returns rows, outputs, report; the report's `observed` says what the evaluation really used (device,
    weights dtype, split bytes)."""
    side = ctx.kind.model
    record = ctx.read_json(layout.trial_result(trial_id))
    weights = ctx.workdir / "evaluate" / trial_id
    shutil.rmtree(weights, ignore_errors=True)
    get_tree(ctx.store, layout.trial_final(trial_id), weights)
    with ctx.timed("load"):  # what the plan predicts the later phases from (entrypoint/job/plan.py)
        model = side.load(ctx.model_dir, ctx.labels, trial_adaptation(record), trained=weights)
    ctx.count("loads")
    processor = side.processor(weights)
    rows = ctx.read_split(split)
    with ctx.timed("predict"):
        outputs = side.predict(model, processor, rows, ctx.labels, ctx.device)
    ctx.count("predict_examples", len(rows))
    observed = {
        "device": ctx.device.type,
        "weights_dtype": str(next(model.parameters()).dtype),
        "examples": len(rows),
        "split_sha256": hashlib.sha256(ctx.store.get_bytes(layout.data_split(split))).hexdigest(),
        "processor": type(processor).__name__,
    }
    return rows, outputs, {**ctx.kind.task.score(rows, outputs, ctx.labels), "observed": observed}
