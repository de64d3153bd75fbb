"""MLflow: one run per trial in the experiment `rentune/<job id>` (or the spec's), on the tracking server the
spec names or MLFLOW_TRACKING_URI gives. Credentials come from MLflow's own environment variables.

Parameters are the trial's flattened spec, each value cut to PARAM_LIMIT characters (older servers refuse
longer ones, and a refused parameter has crashed training elsewhere); the whole spec is a file of the run.
Names MLflow refuses (`@`, `&`, parentheses in a metric or label) have those characters replaced by `_`.

Step metrics go to the server from one sender thread, in step order, so training never waits for it and
the server always holds a prefix of the steps: a process killed with metrics still queued leaves the next
one a clean last step to continue from. A send that fails stops the sender; the next `log_metrics` raises
its error (a warning, and MLflow is off for the rest of the process). `close` waits at most CLOSE_WAIT_S.
"""

from __future__ import annotations

import queue
import re
import threading
import time
from pathlib import Path

from entrypoint.tracking.base import RunRef
from jobspec.schema import MlflowTracking
from jobspec.urls import redact

__all__ = ["CLOSE_WAIT_S", "PARAM_LIMIT", "MlflowRuns", "mlflow_name"]

PARAM_LIMIT = 500  # characters in a parameter value: the limit of MLflow servers before 2.x (6000 since)
CLOSE_WAIT_S = 30.0  # for the queued metrics at the end of a trial (and within SIGTERM's grace)
_KEY_LIMIT = 250
_TAG_LIMIT = 5000
_BATCH = 100  # parameters per log_batch request: the server's limit
_QUEUE = 100_000  # queued steps; beyond this the server is too far behind and MLflow is dropped
_END = None  # tells the sender to stop


def mlflow_name(name: str) -> str:
    """A metric, parameter or tag name MLflow accepts: letters, digits, `_ - . / :` and spaces."""
    return re.sub(r"[^\w./\- :]", "_", name)[:_KEY_LIMIT]


def _cut(value: str) -> str:
    return value if len(value) <= PARAM_LIMIT else value[: PARAM_LIMIT - 1] + "…"


class MlflowRuns:
    name = "mlflow"

    def __init__(self, config: MlflowTracking):
        self.config = config
        self.client = None
        self.run_id: str | None = None
        self.queue: queue.Queue = queue.Queue(maxsize=_QUEUE)
        self.sender: threading.Thread | None = None
        self.error: BaseException | None = None  # the failed send's, raised by the next log_metrics

    def open(self, run: RunRef, ids: dict | None) -> dict:
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
        self.sender = threading.Thread(target=self._send, name="mlflow-sender", daemon=True)
        self.sender.start()
        return {
            "run_id": self.run_id,
            "experiment": experiment,
            "tracking_uri": redact(str(self.client.tracking_uri)),  # MLFLOW_TRACKING_URI may hold one,
        }

    def logged_steps(self, keys: list[str]) -> dict[str, int]:
        held = {}
        for key in keys:
            history = self.client.get_metric_history(self.run_id, mlflow_name(key))
            if history:
                held[key] = max(m.step for m in history)
        return held

    def log_params(self, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(mlflow_name(k), _cut(v)) for k, v in params.items()]
        for start in range(0, len(items), _BATCH):
            self.client.log_batch(self.run_id, params=items[start : start + _BATCH])

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        if self.error is not None:
            raise self.error
        self.queue.put_nowait((metrics, step, int(time.time() * 1000)))  # queue.Full: the server fell behind

    def _send(self) -> None:
        from mlflow.entities import Metric

        while (item := self.queue.get()) is not _END:
            try:
                if self.error is not None:
                    continue  # drain without sending: what follows a failed step must not reach the server
                metrics, step, when = item
                batch = [Metric(mlflow_name(name), value, when, step) for name, value in metrics.items()]
                self.client.log_batch(self.run_id, metrics=batch)
            except Exception as exc:
                self.error = exc
            finally:
                self.queue.task_done()

    def log_summary(self, values: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        tags = [RunTag(mlflow_name(f"rentune.{k}"), v[:_TAG_LIMIT]) for k, v in values.items()]
        self.client.log_batch(self.run_id, tags=tags)

    def log_files(self, files: list[Path]) -> None:
        # the metrics queued before the files first (at most CLOSE_WAIT_S): a file store reading the run
        # while the sender writes a metric file finds it empty and refuses the run as malformed
        deadline = time.monotonic() + CLOSE_WAIT_S
        while self.queue.unfinished_tasks and self.sender.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        for path in files:
            self.client.log_artifact(self.run_id, str(path), artifact_path="rentune")

    def sync(self) -> None:
        pass  # the sender sends as it goes

    def close(self, finished: bool) -> None:
        """Send what is queued (at most CLOSE_WAIT_S), then end the run: FINISHED, or KILLED when training
        did not finish. Raises the sender's error after ending the run."""
        try:
            self.queue.put(_END, timeout=CLOSE_WAIT_S)
            self.sender.join(timeout=CLOSE_WAIT_S)
        finally:
            self.client.set_terminated(self.run_id, status="FINISHED" if finished else "KILLED")
        if self.sender.is_alive():
            raise TimeoutError(f"the server took over {CLOSE_WAIT_S:.0f} s for the queued metrics; the rest is lost")
        if self.error is not None:
            raise self.error
