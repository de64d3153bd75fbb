"""What every tracking backend implements (`Tracker`), and which run it opens (`RunRef`): the backends
(tensorboard_files.py, mlflow_runs.py, wandb_runs.py) import this module only, never the package."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from entrypoint.store import Store

__all__ = ["RunRef", "Tracker"]


@dataclass(frozen=True)
class RunRef:
    """Which run a tracker opens: a trial of a job, from which phase."""

    job_id: str
    trial_id: str
    store: Store  # the job's store (TensorBoard's event files go there)
    scratch: Path  # this process's local folder for the trackers' files
    phase: str  # "train" (steps are replayed and logged) or "report" (results only)

    @property
    def name(self) -> str:
        return f"{self.job_id}/{self.trial_id}"


class Tracker(Protocol):
    """One tracking backend's run for one trial. Any method may raise: the caller turns that into a warning."""

    name: str

    def open(self, run: RunRef, ids: dict | None) -> dict:
        """Start the run, or continue the one `ids` (what an earlier open returned) names. Returns its ids."""

    def logged_steps(self, keys: list[str]) -> dict[str, int]:
        """Per metric name, the last step this run already holds (absent: none)."""

    def log_params(self, params: dict[str, str]) -> None: ...

    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...

    def log_summary(self, values: dict[str, str]) -> None:
        """Run-level values (verdict, status): tags in MLflow, the summary in W&B, text in TensorBoard."""

    def log_files(self, files: list[Path]) -> None: ...

    def sync(self) -> None:
        """Make what was logged visible where the tracker keeps it (TensorBoard: upload to the store)."""

    def close(self, finished: bool) -> None: ...
