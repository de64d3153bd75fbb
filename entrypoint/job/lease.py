"""Plan against actual: what the plan said each phase and trial would take, what it took, and the lease
used against the window. Read from the stored plan revisions (entrypoint/job/plan.py) and the committed
results; shown in the report's "Lease" section, in results.json and by `rentune status`.

    planned   phases before training: the first plan's budget (a default until measured);
              training, each trial and the final phases: the plan made right after the probe (the first
              with a measured step, the one a user decides on)
    actual    the seconds the committed phase (or trial, in the process that finished it) took
    error     (planned - actual) / actual: positive is pessimistic, negative optimistic; none for a default
              budget (room kept, not a prediction). The largest error leaves out rows under a second.
"""

from __future__ import annotations

from entrypoint.job import layout
from entrypoint.job.attempts import attempt_numbers, lease_start
from entrypoint.job.plan import plan_revisions
from entrypoint.job.state import PHASE_NAMES, read_json, read_result
from entrypoint.store import ObjectNotFound, Store
from jobspec.experiments import resolve_trials
from jobspec.plan import BEFORE_TRAINING
from jobspec.schema import JobSpec

__all__ = ["lease_account", "lease_lines"]


def _error(planned: float | None, actual: float | None) -> float | None:
    return (planned - actual) / actual if planned is not None and actual else None


def _expected(plan: dict, name: str) -> tuple[float, str]:
    """What `plan` expects phase `name` to take, and from what."""
    if name == "train":
        return sum(t["seconds"] for t in plan["trials"]), "the trials' needs"
    slot = next(s for s in plan["slots"] if s["name"] == name)
    return slot["seconds"], slot["source"] + (f": {slot['formula']}" if slot.get("formula") else "")


def lease_account(spec: JobSpec, store: Store, now: float) -> dict | None:
    """Plan against actual for every phase and trial so far (None before any plan was stored)."""
    revisions = plan_revisions(store)
    if not revisions:
        return None
    first = revisions[0]
    probed = next((r for r in revisions if r.get("reason") == "after probe"), None)
    rows = []
    for name in PHASE_NAMES:
        plan = first if name in BEFORE_TRAINING or probed is None else probed
        planned, source = _expected(plan, name)
        result = read_result(store, name)
        actual = result["seconds"] if result else None
        rows.append(_row(name, "phase", planned, source, plan, actual, _expected(first, name)[0]))
        if name != "train":
            continue
        for trial in resolve_trials(spec):
            try:
                record = read_json(store, layout.trial_result(trial.id))
            except ObjectNotFound:
                record = {}
            budget = next(t for t in plan["trials"] if t["id"] == trial.id)
            first_budget = next(t for t in first["trials"] if t["id"] == trial.id)
            rows.append(
                _row(
                    trial.id, "trial", budget["seconds"], budget.get("formula") or budget.get("source", ""), plan,
                    record.get("seconds"), first_budget["seconds"],
                )
            )  # fmt: skip
    phases = [r for r in rows if r["kind"] == "phase"]
    done = [r for r in phases if r["actual"] is not None]
    start = lease_start(spec, store)
    newest = revisions[-1]
    total = None
    if probed is not None:
        # Phases before training took what they took (the plan after the probe knows it); the rest as planned
        planned_total = sum(r["actual"] if r["name"] in BEFORE_TRAINING else r["planned"] for r in phases)
        actual_total = sum(r["actual"] for r in done) if len(done) == len(phases) else None
        total = {"planned": planned_total, "actual": actual_total, "error": _error(planned_total, actual_total)}
    # Rows under a second are left out: their error is the timer's noise, not the plan's.
    judged = [r for r in rows if r["error"] is not None and r["name"] not in BEFORE_TRAINING and r["actual"] >= 1]
    largest = max(judged, key=lambda r: abs(r["error"]), default=None)
    return {
        "window": first["window"],
        "lease_seconds": first["lease_seconds"],
        "margin_seconds": newest["margin_seconds"],
        "lease_start_at": start,
        "used_seconds": _ended(store, now) - start,
        "expected_end_at": newest.get("expected_end_at"),
        "revisions": len(revisions),
        "rows": rows,
        "total": total,
        "largest_error": {"name": largest["name"], "error": largest["error"]} if largest else None,
    }


def _ended(store: Store, now: float) -> float:
    """When a finished job's last attempt ended (it ended with the export's commit), else now."""
    if read_result(store, PHASE_NAMES[-1]) is None:
        return now
    for number in attempt_numbers(store)[::-1]:
        try:
            ended = read_json(store, layout.attempt_ended(number))
        except ObjectNotFound:
            continue
        if ended.get("outcome") == "completed" and ended.get("ended_at"):
            return ended["ended_at"]
    return now


def _row(name, kind, planned, source, plan, actual, first_planned) -> dict:
    predicted = not source.startswith("default")  # a default budget is room kept, not a prediction
    planned = round(planned, 3)
    return {
        "name": name,
        "kind": kind,
        "first_planned": round(first_planned, 3),
        "planned": planned,
        "planned_in": f"revision {plan['revision']} ({plan['reason']})",
        "source": source,
        "actual": actual,
        "error": _error(planned, actual) if predicted else None,
    }


def _sec(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 600:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds:.0f} s"
    minutes = int(round(seconds / 60))
    return f"{minutes // 60}h{minutes % 60:02d}"


def _pct(error: float | None) -> str:
    return "-" if error is None else f"{error:+.0%}"


def lease_lines(account: dict) -> list[str]:
    """The account as a table a person reads (report.md, `rentune status`)."""
    lines = [
        f"{'phase / trial':<18} {'first plan':>10} {'planned':>10} {'actual':>10} {'error':>7}  planned from",
    ]
    for row in account["rows"]:
        name = row["name"] if row["kind"] == "phase" else f"  {row['name']}"
        figures = f"{_sec(row['first_planned']):>10} {_sec(row['planned']):>10} {_sec(row['actual']):>10}"
        lines.append(f"{name:<18} {figures} {_pct(row['error']):>7}  {row['source']}")
    total = account["total"]
    if total:
        lines.append(
            f"{'total':<18} {'':>10} {_sec(total['planned']):>10} {_sec(total['actual']):>10} {_pct(total['error']):>7}"
            "  phases before training as they took, the rest from the plan after the probe"
        )
    used, lease = account["used_seconds"], account["lease_seconds"]
    lines.append(
        f"lease used: {_sec(used)} of {account['window']} ({used / lease:.2%}); {account['revisions']} plan revisions; "
        f"a margin of {_sec(account['margin_seconds'])} is kept before the lease ends"
    )
    return lines
