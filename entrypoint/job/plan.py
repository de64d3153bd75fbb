"""The lease plan as the store sees it now: jobspec.plan's arithmetic fed with what the job has measured.

    figures (jobspec.plan.FIGURES), later sources replacing earlier ones:
        attempts/<n>/started.json   startup (a fresh process before its first work)
        phases/baseline/result.json baseline_predict (and predict, until a trial's is known)
        phases/probe/result.json    step (typical), eval_loss_pass, load, trial_setup, checkpoint_blocked,
                                    store_rate, weights_bytes, model_bytes
        trials/<id>/result.json     each finished trial's own: step, eval_loss_pass, trial_setup, predict,
                                    checkpoint_blocked, store_rate
        phases/evaluate, test       load, predict, judge
    phases/<name>/result.json: the seconds each committed phase took

The runner stores a revision at every process start and after every phase; the train phase after every
trial. `plan.json` is the newest; `plans/NNNN.json` keeps every one, so the report can set what was
planned against what happened (entrypoint/job/lease.py). Read by the train phase (its deadline) and by
`rentune status`.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

from entrypoint.job import layout
from entrypoint.job.attempts import attempt_numbers, lease_start
from entrypoint.job.state import PHASE_NAMES, dumps, read_json, read_result
from entrypoint.store import ObjectExists, ObjectNotFound, Store
from entrypoint.store.checkpoint import MANIFEST, checkpoint_prefix, list_steps
from jobspec.experiments import resolve_trials
from jobspec.plan import Figure, batch_scale, count_split_examples, make_plan
from jobspec.schema import JobSpec

__all__ = ["current_plan", "figures_from", "plan_revisions", "store_plan"]


def _counts(spec: JobSpec, store: Store) -> dict[str, int] | None:
    """Examples per split: the data phase's, else counted from local files; None while unknown."""
    data = read_result(store, "data")
    if data is not None:
        return {split: sum(data["counts"][split].values()) for split in ("train", "eval", "test")}
    try:
        return count_split_examples(spec)
    except OSError:
        return None


def _per_example(seconds: float | None, examples: int | None) -> float | None:
    return seconds / examples if seconds is not None and examples else None


def figures_from(spec: JobSpec, store: Store) -> dict[str, Figure]:
    """What the job has measured so far, by name (jobspec.plan.FIGURES), each with where it came from."""
    figures: dict[str, Figure] = {}

    def put(name: str, value: float | None, source: str) -> None:
        if value is not None and value > 0:
            figures[name] = Figure(float(value), source)

    for number in attempt_numbers(store)[-1:]:
        started = _json(store, layout.attempt_started(number)) or {}
        put("startup", started.get("startup_seconds"), f"attempt {number}: process start to its first work")
    timings = (read_result(store, "baseline") or {}).get("timings", {})
    n = timings.get("baseline_examples")
    per = _per_example(timings.get("baseline"), n)
    put("baseline_predict", per, f"baseline: {n} eval predictions, loading included")
    put("predict", per, f"baseline: {n} eval predictions, loading included (until a trial's are timed)")
    probe = read_result(store, "probe") or {}
    typical, eval_pass, cost = probe.get("typical_step"), probe.get("eval_loss_pass"), probe.get("checkpoint_cost")
    if typical:
        put("step", typical["seconds"], f"probe: median of {len(typical['steps'])} Trainer steps of real lengths")
    elif probe.get("setups") or probe.get("variants"):  # an earlier rentune's probe: its worst-case step alone
        worst = (probe.get("setups") or probe["variants"])["plain"]["seconds"] * spec.training.grad_accum
        put("step", worst, "probe: the worst-case step (an earlier rentune timed no typical one)")
    if eval_pass:
        timed = f"probe: {eval_pass['batches_timed']} of {eval_pass['batches']} batches timed"
        put("eval_loss_pass", eval_pass["seconds"], timed)
    put("load", probe.get("load_seconds"), "probe: model load")
    put("trial_setup", probe.get("trial_setup_seconds"), "probe: model load to the Trainer's loop")
    put("model_bytes", probe.get("model_bytes"), "probe: the base model's weight files")
    if cost:
        put("checkpoint_blocked", cost["save_seconds"], f"probe: a {cost['bytes'] / 1e6:.3g} MB checkpoint saved")
        put("checkpoint_write", cost["save_seconds"], f"probe: a {cost['bytes'] / 1e6:.3g} MB checkpoint written")
        put("checkpoint_bytes", cost["bytes"], "probe: trainable weights and optimizer state")
        put("store_rate", cost["bytes"] / max(cost["put_seconds"], 1e-6), f"probe: {cost['bytes'] / 1e6:.3g} MB put")
        put("weights_bytes", cost["weights_bytes"], "probe: the trainable parameters' bytes")
    for trial in resolve_trials(spec):  # a finished trial's own figures, the latest trial's winning
        timings = (_json(store, layout.trial_result(trial.id)) or {}).get("timings") or {}
        source = f"trial {trial.id}"
        scale = batch_scale(spec.training, trial.training)  # step figures are kept per main's batch
        per_main = timings["step"] / scale if timings.get("step") else None
        per = f" / {scale:g} (its batch)" if scale != 1 else ""
        put("step", per_main, f"{source}: median of {timings.get('steps_timed')} steps{per}")
        passes = timings.get("eval_loss_passes") or []
        put("eval_loss_pass", statistics.mean(passes) if passes else None, f"{source}: {len(passes)} eval-loss passes")
        put("trial_setup", timings.get("setup"), f"{source}: setup")
        n = timings.get("predict_examples")
        put("predict", _per_example(timings.get("predict"), n), f"{source}: {n} eval predictions")
        put("checkpoint_blocked", timings.get("checkpoint_save"), f"{source}: checkpoints saved")
        put("checkpoint_write", timings.get("checkpoint_write"), f"{source}: checkpoints written to disk")
        put("store_rate", timings.get("store_rate"), f"{source}: checkpoints committed")
        put("checkpoint_bytes", timings.get("checkpoint_bytes"), f"{source}: its last checkpoint")
    for phase in ("evaluate", "test"):
        timings = (read_result(store, phase) or {}).get("timings", {})
        if timings.get("predict_examples"):
            put("load", timings["load"] / timings["loads"], f"{phase}: {timings['loads']} model loads")
            n = timings["predict_examples"]
            put("predict", _per_example(timings["predict"], n), f"{phase}: {n} predictions")
            if timings.get("judged"):
                put("judge", timings["judge"] / timings["judged"], f"{phase}: {timings['judged']} judged")
    return figures


def _json(store: Store, key: str) -> dict | None:
    try:
        return read_json(store, key)
    except ObjectNotFound:
        return None


def current_plan(spec: JobSpec, store: Store, now: float, start: float | None = None) -> dict | None:
    """The plan from what the store holds now. None before the number of training examples is known (data
    in s3://, data phase not run)."""
    counts = _counts(spec, store)
    if counts is None:
        return None
    measured = {}
    for name in PHASE_NAMES:
        result = read_result(store, name)
        if result is not None and name != "train":
            measured[name] = result["seconds"]
    probe_result = read_result(store, "probe")
    n_train = counts["train"]
    if probe_result is not None:
        n_train = probe_result.get("train_rows", n_train)  # with packing, steps draw rows of examples
    steps_done = {}
    for trial in resolve_trials(spec):
        if store.head(layout.trial_result(trial.id)) is not None:
            steps_done[trial.id] = 10**12  # finished, whatever its status: nothing left to train
        else:
            committed = [s for s, names in list_steps(store, checkpoint_prefix(trial.id)).items() if MANIFEST in names]
            steps_done[trial.id] = max(committed, default=0)
    start = lease_start(spec, store) if start is None else start
    environment = next((_json(store, layout.attempt_env(n)) for n in attempt_numbers(store)[-1:]), None) or {}
    plan = make_plan(
        spec,
        n_train,
        elapsed=max(0.0, now - start),
        measured=measured,
        steps_done=steps_done,
        figures=figures_from(spec, store),
        counts=counts,
        provider=environment.get("notice_provider"),
    )
    return {
        **plan.to_dict(),
        "lease_start_at": start,
        "lease_end_at": start + plan.lease_seconds,
        "train_deadline_at": start + plan.train_deadline,
        "expected_end_at": start + plan.expected_end,
        "planned_at": now,
    }


def plan_revisions(store: Store) -> list[dict]:
    """Every stored revision, oldest first."""
    keys = [info.key for info in store.list(layout.PLANS) if info.key.endswith(".json")]
    return [read_json(store, key) for key in sorted(keys, key=lambda k: int(k.rsplit("/", 1)[-1].split(".")[0]))]


def store_plan(spec: JobSpec, store: Store, now: float, reason: str, log: Callable[[str], None]) -> dict | None:
    """Re-plan from what the store holds now and keep the revision (`reason`: what was just measured)."""
    plan = current_plan(spec, store, now)
    if plan is None:
        return None
    number = sum(1 for info in store.list(layout.PLANS) if info.key.endswith(".json")) + 1
    while True:  # numbered once: a revision is never overwritten
        plan = {**plan, "revision": number, "reason": reason}
        try:
            store.put_if_absent(layout.plan_revision(number), dumps(plan))
            break
        except ObjectExists:
            number += 1
    store.put_bytes(layout.PLAN, dumps(plan))
    for problem in plan["problems"]:
        log(f"plan: {problem}")
    return plan
