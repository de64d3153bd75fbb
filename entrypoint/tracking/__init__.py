"""Tracking people already use (TensorBoard, MLflow, W&B): one run per trial in each, continued after a
resume on any node, never a repeated step.

    train phase, per trial, on global rank 0:
        ids = trials/<id>/tracking.json, or the resumed checkpoint manifest's copy, or none yet
        tracking = open_tracking(...)              # each tracker starts its run, or continues the one in ids
        put trials/<id>/tracking.json              # the run ids; every checkpoint manifest carries them too
        on train begin: replay state.log_history   # the steps each tracker lacks (a resume), never one it holds
        on each log:    that step's metrics        # loss, learning rate, grad norm, tokens/s, memory, eval loss
        at the end:     close the runs
    report phase, per trial: the baseline's and the trial's eval metrics, the test for the selected trial,
        the verdict, and (MLflow, W&B) the report and plots as files; the runs are closed finished.

What a tracker already holds is its own business (`logged_steps`): MLflow and W&B online ask their server,
W&B offline reads the earlier attempts' files under WANDB_DIR, TensorBoard purges every earlier step and
takes the full replay. The steps
come from the Trainer's log (carried in every checkpoint), so a replay logs what the killed attempt did.

A tracker that fails (server unreachable, no API key, an error while logging) is a warning in the log and
is off for the rest of the process: tracking never fails a job. A tracker whose package the image lacks is
refused before the first phase (training/device.py's preflight).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from entrypoint.job import layout
from entrypoint.job.state import dumps
from entrypoint.store import ObjectNotFound, Store
from entrypoint.store.objects import CorruptObject, read_json
from entrypoint.tracking.base import RunRef, Tracker
from jobspec.schema import Tracking as TrackingSpec

__all__ = [
    "STEP_METRICS",
    "RunRef",
    "Tracker",
    "Tracking",
    "open_tracking",
    "spec_params",
    "step_metrics",
    "stored_ids",
]

# The Trainer's log entry keys (plus the two rentune adds: tokens_per_s, memory_gb) -> tracker metric names.
STEP_METRICS = {
    "loss": "train/loss",
    "learning_rate": "train/learning_rate",
    "grad_norm": "train/grad_norm",
    "tokens_per_s": "train/tokens_per_s",
    "memory_gb": "train/memory_gb",
    "epoch": "train/epoch",
    "eval_loss": "eval/loss",
}


def step_metrics(entry: dict) -> dict[str, float]:
    """A Trainer log entry's numbers under their tracker names."""
    return {
        name: float(entry[key])
        for key, name in STEP_METRICS.items()
        if isinstance(entry.get(key), int | float) and not isinstance(entry.get(key), bool)
    }


def _make(name: str, spec: TrackingSpec) -> Tracker:
    if name == "tensorboard":
        from entrypoint.tracking.tensorboard_files import TensorBoardFiles

        return TensorBoardFiles()
    if name == "mlflow":
        from entrypoint.tracking.mlflow_runs import MlflowRuns

        return MlflowRuns(spec.mlflow)
    from entrypoint.tracking.wandb_runs import WandbRuns

    return WandbRuns(spec.wandb)


class Tracking:
    """The spec's trackers for one trial, as one object: each call goes to every tracker still on, and a
    tracker that raises is reported once and dropped. With no tracker configured every call does nothing."""

    def __init__(
        self, trackers: list[Tracker], ids: dict, log: Callable[[str], None], new: frozenset[str] = frozenset()
    ):
        self.trackers, self.ids, self.log = trackers, ids, log
        self.new = new  # the trackers whose run this process started (not continued)
        self.logged: dict[str, dict[str, int]] = {t.name: {} for t in trackers}

    def __bool__(self) -> bool:
        return bool(self.trackers)

    def _each(self, what: str, call: Callable[[Tracker], object]) -> None:
        for tracker in list(self.trackers):
            try:
                call(tracker)
            except Exception as exc:  # a tracker never fails the job
                self.log(
                    f"tracking: warning: {tracker.name}: {what} failed ({type(exc).__name__}: {exc}); "
                    f"{tracker.name} is off for the rest of this process"
                )
                self.trackers.remove(tracker)

    def read_held_steps(self, keys: list[str]) -> None:
        """Ask each tracker which steps its run already holds (none for a new run), so none is logged twice."""

        def ask(tracker: Tracker) -> None:
            self.logged[tracker.name] = dict(tracker.logged_steps(keys))

        self._each("reading the logged steps", ask)

    def metrics(self, metrics: dict[str, float], step: int) -> None:
        """Log `metrics` at `step` to each tracker, leaving out those it holds at this step or later."""

        def send(tracker: Tracker) -> None:
            held = self.logged[tracker.name]
            new = {k: v for k, v in metrics.items() if step > held.get(k, -1)}
            if new:
                tracker.log_metrics(new, step)
                held.update(dict.fromkeys(new, step))

        self._each(f"logging step {step}", send)

    def describe_new_runs(self, params: dict[str, str], files: list[Path]) -> None:
        """Parameters and files (the spec) for the runs this process started; a continued run has them."""

        def describe(tracker: Tracker) -> None:
            if tracker.name in self.new:
                tracker.log_params(params)
                tracker.log_files(files)

        self._each("logging parameters", describe)

    def summary(self, values: dict[str, str]) -> None:
        self._each("logging the summary", lambda t: t.log_summary(values))

    def files(self, files: list[Path]) -> None:
        self._each("logging files", lambda t: t.log_files(files))

    def sync(self) -> None:
        self._each("syncing", lambda t: t.sync())

    def close(self, finished: bool) -> list[str]:
        """End each run; returns the trackers that closed theirs without an error."""
        self._each("closing the run", lambda t: t.close(finished))
        closed, self.trackers = [t.name for t in self.trackers], []
        return closed


def stored_ids(store: Store, trial_id: str, log: Callable[[str], None]) -> dict | None:
    """The trial's run ids (trials/<id>/tracking.json), or None: not written yet, or unreadable (a warning:
    the trial's tracking starts new runs rather than fail the job)."""
    try:
        return json.loads(json.dumps(read_json(store, layout.trial_tracking(trial_id))))  # plain dicts
    except ObjectNotFound:
        return None
    except CorruptObject as exc:
        log(f"tracking: warning: {exc}; the trial's runs cannot be continued, new ones are started")
        return None


def open_tracking(
    spec: TrackingSpec,
    run: RunRef,
    log: Callable[[str], None],
    fallback_ids: dict | None = None,
    only: set[str] | None = None,
) -> Tracking:
    """Open (or continue) the trial's run in each tracker the spec enables (of them, those in `only`) and
    store their ids in trials/<id>/tracking.json. `fallback_ids`: the ids a resumed checkpoint's manifest
    carries, used when the trial's tracking.json is missing."""
    key = layout.trial_tracking(run.trial_id)
    stored = stored_ids(run.store, run.trial_id, log) or dict(fallback_ids or {})
    ids = dict(stored)
    trackers: list[Tracker] = []
    new = set()
    for name in spec.enabled:
        if only is not None and name not in only:
            continue
        try:
            tracker = _make(name, spec)
            ids[name] = tracker.open(run, stored.get(name))
        except Exception as exc:  # a tracker never fails the job
            log(
                f"tracking: warning: {name}: could not open the run for trial {run.trial_id} "
                f"({type(exc).__name__}: {exc}); the trial goes on without it"
            )
            continue
        trackers.append(tracker)
        continued = bool(stored.get(name)) and stored[name] == ids[name]
        if not continued:
            new.add(name)
        log(f"tracking: {name}: {'continuing' if continued else 'started'} run {_describe(ids[name])}")
    if ids != stored:
        run.store.put_bytes(key, dumps(ids))
    return Tracking(trackers, ids, log, frozenset(new))


def spec_params(spec: dict, prefix: str = "") -> dict[str, str]:
    """A spec as flat parameters: `training.learning_rate` -> `0.0002` (lists and mappings as JSON)."""
    params = {}
    for key, value in spec.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            params.update(spec_params(value, f"{name}."))
        else:
            params[name] = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return params


def _describe(ids: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in ids.items() if v)
