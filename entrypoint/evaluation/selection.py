"""Which trial the job goes on with: the rule the evaluate phase applies to the trials it judged.

    among the trials that completed (have eval metrics):
        the pool: those with no failed guardrail, or every completed trial when each fails one
        selected: the highest hypothesis metric on eval in the pool; a tie goes to the earlier trial in the
                  spec's order
        runner-up: the next in the pool, or (a pool of one) the best of the other completed trials; none
                   when only one trial completed

The eval split alone decides: the sealed test split is opened afterwards, for the selected trial only.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["NoValidTrial", "Selection", "select"]


class NoValidTrial(RuntimeError):
    """Every trial was invalid: there is nothing to select, test or export."""


@dataclass(frozen=True)
class Selection:
    selected: str
    runner_up: str | None
    why: str  # the rule as applied, for the log and the report


def select(results: dict[str, dict], metric: str) -> Selection:
    """`results`: each trial's evaluate record in spec order (`metrics` when it completed,
    `guardrails_result` pass | fail | inconclusive, else `status` and `reason`). Raises NoValidTrial when
    none completed."""
    completed = [t for t, r in results.items() if "metrics" in r]
    if not completed:
        reasons = "; ".join(f"{t}: {r['status']} ({r['reason']})" for t, r in results.items())
        raise NoValidTrial(f"evaluate: no trial completed, nothing to select: {reasons}")
    safe = [t for t in completed if results[t]["guardrails_result"] != "fail"]

    def rank(trials: list[str]) -> list[str]:  # highest first; ties in spec order
        return sorted(trials, key=lambda t: (-results[t]["metrics"][metric], completed.index(t)))

    ranked = rank(safe or completed)
    selected = ranked[0]
    others = ranked[1:] or rank([t for t in completed if t != selected])
    why = (
        f"highest {metric} on eval among trials with no failed guardrail"
        if safe
        else f"every trial fails a guardrail; highest {metric} on eval"
    )
    return Selection(selected, others[0] if others else None, why)
