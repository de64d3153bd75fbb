"""The lease plan as the store sees it now: jobspec.plan's arithmetic fed with what the job has measured
(committed phases' seconds, the probe's step time, trials finished). Stored as `plan.json` by the runner;
read by the train phase (its deadline) and by `rentune status`."""

from __future__ import annotations

from entrypoint.job.attempts import lease_start
from entrypoint.job.state import PHASE_NAMES, read_json, read_result
from entrypoint.store import Store
from jobspec.plan import count_train_examples, make_plan
from jobspec.schema import JobSpec

__all__ = ["current_plan"]


def current_plan(spec: JobSpec, store: Store, now: float, start: float | None = None) -> dict | None:
    """The plan from what the store holds now. None before the number of training examples is known (data
    in s3://, data phase not run)."""
    data = read_result(store, "data")
    if data is not None:
        n_train = sum(data["counts"]["train"].values())
    else:
        try:
            n_train = count_train_examples(spec)
        except OSError:
            n_train = None
    if n_train is None:
        return None
    measured = {}
    for name in PHASE_NAMES:
        result = read_result(store, name)
        if result is not None and name != "train":
            measured[name] = result["seconds"]
    probe_result = read_result(store, "probe")
    step = None
    if probe_result is not None:
        step = probe_result["variants"]["plain"]["seconds"] * spec.training.grad_accum
        n_train = probe_result.get("train_rows", n_train)  # with packing, steps draw rows of examples
    steps_done = {}
    for info in store.list("trials"):
        if info.key.endswith("/result.json") and info.key.count("/") == 2:
            record = read_json(store, info.key)
            steps_done[record["trial_id"]] = 10**12  # finished, whatever its status: nothing left to train
    start = lease_start(spec, store) if start is None else start
    plan = make_plan(
        spec, n_train, elapsed=max(0.0, now - start), measured=measured, step_seconds=step, steps_done=steps_done
    )
    return {
        **plan.to_dict(),
        "lease_start_at": start,
        "lease_end_at": start + plan.lease_seconds,
        "train_deadline_at": start + plan.train_deadline,
        "planned_at": now,
    }
