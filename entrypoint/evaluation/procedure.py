"""One evaluation procedure for the baseline, every trial, the end of training and the sealed test: the same
inputs, the same decoding, the same metrics. `eval_config` describes the procedure; the report checks that
every trial's stored config is equal, so no trial is measured differently from another.

    outputs = kind.model.predict(model, ...)      labels (classification) or generated text
    report  = kind.task.score(rows, outputs, ...) {"metrics": {name: value, ...}, per category/field details}

(trial/evaluate.py runs it with a job's context.)
"""

from __future__ import annotations

from entrypoint.data.encoding import PREPROCESS_VERSION
from entrypoint.evaluation.bootstrap import Bootstrap
from jobspec.schema import JobSpec

__all__ = ["EVAL_VERSION", "eval_config"]

EVAL_VERSION = "eval-1"


def eval_config(spec: JobSpec, settings: dict, split: str, data_version: str, base_sha256: str) -> dict:
    """Everything that decides a measurement, for one split. Equal configs = comparable numbers.
    `settings`: the model side's and the task side's own (decoding, template, metric versions, fields)."""
    e = spec.evaluation
    return {
        "eval_version": EVAL_VERSION,
        "task": spec.hypothesis.task,
        "split": split,
        "data_version": data_version,
        "base_model_sha256": base_sha256,
        "preprocess_version": PREPROCESS_VERSION,
        "max_length": spec.model.max_length,
        "eval_batch": spec.training.eval_batch,
        "seed": spec.training.seed,
        "intervals": Bootstrap(e.resamples, e.confidence, e.seed).describe(spec.data.cluster_field),
        **settings,
        **({"format": spec.hypothesis.format.model_dump()} if spec.hypothesis.format else {}),
    }
