"""MLflow: one run per trial in the experiment `rentune/<job id>` (or the spec's), on the tracking server the
spec names or MLFLOW_TRACKING_URI gives. Credentials come from MLflow's own environment variables.

Parameters are the trial's flattened spec, each value cut to PARAM_LIMIT characters (older servers refuse
longer ones, and a refused parameter has crashed training elsewhere); the whole spec is a file of the run.
Step metrics go out asynchronously (MLflow's own queue), so training does not wait for the server; what a
killed process had queued is replayed by the next, which asks the server for the last step it holds.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from entrypoint.tracking import RunRef
from jobspec.schema import MlflowTracking

__all__ = ["PARAM_LIMIT", "MlflowRuns"]

PARAM_LIMIT = 500  # characters in a parameter value: the limit of MLflow servers before 2.x (6000 since)
_KEY_LIMIT = 250
_TAG_LIMIT = 5000
_BATCH = 100  # parameters per log_batch request: the server's limit
_PENDING = 1000  # queued metric batches after which training waits for the server to catch up


def _cut(value: str) -> str:
    return value if len(value) <= PARAM_LIMIT else value[: PARAM_LIMIT - 1] + "…"


def _without_userinfo(uri: str) -> str:
    return re.sub(r"^([a-z+]+://)[^/@]*@", r"\1", uri)


class MlflowRuns:
    name = "mlflow"

    def __init__(self, config: MlflowTracking):
        self.config = config
        self.client = None
        self.run_id: str | None = None
        self.pending: list = []  # what log_batch queued; waited for at close (and every _PENDING)

    def open(self, run: RunRef, ids: dict | None) -> dict:
        # An unreachable server must cost seconds, not MLflow's default of 7 retries with backoff (minutes).
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
        from mlflow import MlflowClient

        self.client = MlflowClient(tracking_uri=self.config.tracking_uri)
        experiment = self.config.experiment or f"rentune/{run.job_id}"
        if ids and ids.get("run_id"):
            self.run_id = ids["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")  # raises if this server has no such run
        else:
            found = self.client.get_experiment_by_name(experiment)
            experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
            tags = {"rentune.job_id": run.job_id, "rentune.trial_id": run.trial_id}
            self.run_id = self.client.create_run(experiment_id, run_name=run.name, tags=tags).info.run_id
        return {
            "run_id": self.run_id,
            "experiment": experiment,
            "tracking_uri": _without_userinfo(str(self.client.tracking_uri)),
        }

    def logged_steps(self, keys: list[str]) -> dict[str, int]:
        held = {}
        for key in keys:
            history = self.client.get_metric_history(self.run_id, key)
            if history:
                held[key] = max(m.step for m in history)
        return held

    def log_params(self, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k[:_KEY_LIMIT], _cut(v)) for k, v in params.items()]
        for start in range(0, len(items), _BATCH):
            self.client.log_batch(self.run_id, params=items[start : start + _BATCH])

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(name, value, now, step) for name, value in metrics.items()]
        self.pending.append(self.client.log_batch(self.run_id, metrics=batch, synchronous=False))
        if len(self.pending) >= _PENDING:
            self._drain()

    def _drain(self) -> None:
        """Wait for the queued batches; raises the first one's error."""
        pending, self.pending = self.pending, []
        for operations in pending:
            operations.wait()

    def log_summary(self, values: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        tags = [RunTag(f"rentune.{k}"[:_KEY_LIMIT], v[:_TAG_LIMIT]) for k, v in values.items()]
        self.client.log_batch(self.run_id, tags=tags)

    def log_files(self, files: list[Path]) -> None:
        for path in files:
            self.client.log_artifact(self.run_id, str(path), artifact_path="rentune")

    def sync(self) -> None:
        pass  # MLflow's queue sends as it goes

    def close(self, finished: bool) -> None:
        self._drain()
        self.client.set_terminated(self.run_id, status="FINISHED" if finished else "KILLED")
