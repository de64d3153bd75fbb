"""`rentune status JOB --store URI`: where a job stands, read from the store alone (works from a laptop).

job, lease (start, end, time left; elapsed, predicted end, what is left after it), the plan's problems
phase table: committed or not, seconds taken vs the plan's budget and deadline
plan against actual: each phase and trial as planned (entrypoint/job/lease.py), what it took, the error
trial table: status, steps (or the newest committed checkpoint while training), reason, tracker runs
attempts: how each process start ended (completed, interrupted, error, or killed: no end record)
"""

from __future__ import annotations

import time

from entrypoint.errors import InvalidInput
from entrypoint.job import layout
from entrypoint.job.attempts import attempt_numbers
from entrypoint.job.lease import lease_account, lease_lines
from entrypoint.job.queue import CANCELLED, FAILED, REJECTED
from entrypoint.job.state import (
    PHASE_NAMES,
    job_store,
    read_json,
    read_result,
    stored_spec,
)
from entrypoint.store import ObjectNotFound, Store
from entrypoint.store.checkpoint import MANIFEST, checkpoint_prefix, list_steps
from jobspec.experiments import resolve_trials

__all__ = ["JobNotFound", "render_status"]


class JobNotFound(InvalidInput):
    """The store holds no job (and no queue entry) by that id."""


def _hm(seconds: float) -> str:
    sign, seconds = ("-" if seconds < 0 else ""), abs(seconds)
    minutes = int(round(seconds / 60))
    return f"{sign}{minutes // 60}h{minutes % 60:02d}"


def _json(store: Store, key: str) -> dict | None:
    try:
        return read_json(store, key)
    except ObjectNotFound:
        return None


def _runs(ids: dict) -> str:
    """`mlflow run 3f2a... (experiment rentune/job), wandb run team/project/ab12..., tensorboard trials/main/...`"""
    shown = []
    if "mlflow" in ids:
        shown.append(f"mlflow run {ids['mlflow'].get('run_id')} (experiment {ids['mlflow'].get('experiment')})")
    if "wandb" in ids:
        where = "/".join(str(ids["wandb"][k]) for k in ("entity", "project") if ids["wandb"].get(k))
        shown.append(f"wandb run {where}/{ids['wandb'].get('id')}")
    if "tensorboard" in ids:
        shown.append(f"tensorboard {ids['tensorboard'].get('prefix')}/")
    return ", ".join(shown)


def render_status(root: Store, job_id: str, now: float | None = None) -> str:
    """The status as text. Raises JobNotFound when the store holds no such job."""
    now = time.time() if now is None else now
    store = job_store(root, job_id)
    try:
        spec = stored_spec(store).spec
    except ObjectNotFound:
        if root.head(layout.queue_entry(job_id)) is not None:
            return f"job {job_id}: queued in {root.uri}/{layout.queue_entry(job_id)}, waiting for a worker"
        for outcome in (REJECTED, FAILED, CANCELLED):
            key = layout.queue_entry(job_id, outcome)
            if root.head(key) is not None:
                if outcome == CANCELLED:
                    return f"job {job_id}: cancelled before a worker started it; its spec: {root.uri}/{key}"
                return f"job {job_id}: {outcome}, see {root.uri}/{key.removesuffix('.yaml')}.*.txt"
        raise JobNotFound(f"{store.uri}: no job {job_id!r} in this store") from None
    plan = _json(store, layout.PLAN)
    lines = [f"job {job_id} ({spec.hypothesis.task}) in {store.uri}"]
    if plan:
        lines.append(
            f"lease {plan['window']}: ends in {_hm(plan['lease_end_at'] - now)}; training deadline in "
            f"{_hm(plan['train_deadline_at'] - now)}; step time {plan['step_seconds']:.3g} s ({plan['step_source']})"
        )
        if "expected_end_at" in plan:  # a plan of an earlier rentune has no prediction of the end
            finished = read_result(store, PHASE_NAMES[-1]) is not None
            end = "ended" if finished else "predicted to end"
            at = _hm(plan["expected_end_at"] - plan["lease_start_at"])
            lines.append(
                f"elapsed {_hm(now - plan['lease_start_at'])}; {end} {at} "
                f"after the lease start (plan revision {plan.get('revision', '-')}, {plan.get('reason', '-')}); "
                f"{_hm(plan['lease_end_at'] - plan['expected_end_at'])} left before the lease ends, the "
                f"{_hm(plan['margin_seconds'])} margin included"
            )
        if plan.get("notice_line"):  # a plan of an earlier rentune has none
            lines.append(plan["notice_line"])
        lines += [f"plan: {problem}" for problem in plan["problems"]]
    budgets = {slot["name"]: slot for slot in plan["slots"]} if plan else {}
    lines += ["", f"{'phase':<10} {'state':<10} {'took':>8} {'budget':>8} {'deadline':>9}"]
    for name in PHASE_NAMES:
        result = read_result(store, name)
        slot = budgets.get(name)
        took = _hm(result["seconds"]) if result else "-"
        budget = _hm(slot["seconds"]) if slot else "-"
        deadline = _hm(plan["lease_start_at"] + slot["end"] - now) if slot and plan else "-"
        lines.append(f"{name:<10} {'committed' if result else 'pending':<10} {took:>8} {budget:>8} {deadline:>9}")
    account = lease_account(spec, store, now) if plan else None
    if account:
        lines += ["", "plan against actual:", *lease_lines(account)]
    baseline = read_result(store, "baseline")
    for m in (baseline or {}).get("power", {}).get("metrics", []):
        if m.get("reachable") is False:
            lines.append(
                f"power: {m['metric']} ({m['role']}) cannot gain the {m['asked']:.3f} asked: the baseline leaves "
                f"{m['room']:.3f} below 1.0; expect 'does not hold'"
            )
        elif m["decidable"] is False:
            lines.append(
                f"power: {m['metric']} ({m['role']}) can show changes of {m['eval']['detectable']:.3f} on eval and "
                f"{m['test']['detectable']:.3f} on test, not the {m['asked']:.3f} asked: expect 'inconclusive'"
            )
    evaluated = read_result(store, "evaluate") or {"trials": {}}
    lines += ["", f"{'trial':<20} {'status':<10} {'steps':>7}  reason"]
    for trial in resolve_trials(spec):
        record = _json(store, layout.trial_result(trial.id))
        if record is None:
            steps = list_steps(store, checkpoint_prefix(trial.id))
            committed = [step for step, names in steps.items() if MANIFEST in names]  # no manifest, no commit
            state, shown = ("training", f"{max(committed)}*") if committed else ("pending", "-")
            lines.append(f"{trial.id:<20} {state:<10} {shown:>7}")
            failing = _json(store, layout.trial_commit_status(trial.id))
            if failing and failing.get("failures_in_a_row"):
                lines.append(
                    f"{'':<20} checkpoint commits failing: {failing['failures_in_a_row']} in a row, the last at "
                    f"step {failing.get('step')}: {str(failing.get('error'))[:160]}"
                )
        else:
            reason = (record.get("reason") or "")[:100]
            lines.append(f"{trial.id:<20} {record['status']:<10} {record.get('steps', 0):>7}  {reason}")
        scored = evaluated["trials"].get(trial.id, {})
        if (scored.get("hypothesis") or {}).get("interval"):  # not a point verdict of an earlier rentune
            lines.append(f"{'':<20} eval: {_verdict(scored)}")
        runs = _json(store, layout.trial_tracking(trial.id)) if spec.tracking.enabled else None
        if runs:
            lines.append(f"{'':<20} tracking: {_runs(runs)}")
    lines.append("(* = newest committed checkpoint)")
    tested = read_result(store, "test")
    if tested and tested["hypothesis"].get("interval"):
        lines.append(f"sealed test, {tested['selected']}: {_verdict(tested)}")
    lines += ["", "attempts:"]
    for n in attempt_numbers(store):
        started = _json(store, layout.attempt_started(n)) or {}
        ended = _json(store, layout.attempt_ended(n))
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started.get("started_at", 0)))
        if ended is None:
            outcome = "running, or killed (no end record yet)"
        else:
            outcome = ended["outcome"] + (f" in {ended['phase']}: {ended['error']}" if ended.get("error") else "")
        lines.append(f"  {n}: started {when}, {outcome[:160]}")
    return "\n".join(lines)


def _verdict(scored: dict) -> str:
    """One trial's verdict on a split: the gain with its interval, the hypothesis, the guardrails."""
    h = scored["hypothesis"]
    low, high = h["interval"]
    return (
        f"{h['metric']} {h['gain']:+.3f} [{low:+.3f}, {high:+.3f}]: hypothesis {h['result']}; "
        f"guardrails {scored['guardrails_result']}"
    )
