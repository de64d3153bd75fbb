"""The verdict: does the hypothesis hold, and does every guardrail pass, measured against the baseline.

Metrics are compared by name from each report's flat `metrics` dict. A guardrail such as `f1/*` expands to
every category on its own (`f1/billing`, `f1/shipping`, ...): a macro average can improve while one
category gets worse, and that category must fail its guardrail.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from entrypoint.errors import InvalidInput
from entrypoint.evaluation.formats import higher_is_better
from jobspec.schema import Guardrail, Hypothesis

__all__ = ["GuardrailError", "check_guardrails", "expand", "higher_is_better", "hypothesis_verdict"]


class GuardrailError(InvalidInput):
    """A guardrail names a metric this job does not compute."""


def expand(pattern: str, computed: Mapping[str, float]) -> list[str]:
    """The metric names a guardrail covers. Raises GuardrailError if none was computed."""
    if pattern.endswith("/*"):
        names = sorted(name for name in computed if name.startswith(pattern[:-1]))
    else:
        names = [pattern] if pattern in computed else []
    if not names:
        raise GuardrailError(
            f"guardrails: {pattern!r}: no such metric is computed for this job; computed: {', '.join(sorted(computed))}"
        )
    return names


def check_guardrails(
    guardrails: Sequence[Guardrail], baseline: Mapping[str, float], trial: Mapping[str, float]
) -> list[dict]:
    """One record per covered metric: baseline, trial, change, tolerance, passed."""
    checks = []
    for guardrail in guardrails:
        for name in expand(guardrail.metric, baseline):
            before, after = baseline[name], trial[name]
            worse_by = (before - after) if higher_is_better(name) else (after - before)
            checks.append(
                {
                    "guardrail": guardrail.metric,
                    "metric": name,
                    "baseline": before,
                    "trial": after,
                    "change": after - before,
                    "tolerance": guardrail.tolerance,
                    # a hair of float noise never fails a guardrail with tolerance 0
                    "passed": worse_by <= guardrail.tolerance + 1e-12,
                }
            )
    return checks


def hypothesis_verdict(hypothesis: Hypothesis, baseline: Mapping[str, float], trial: Mapping[str, float]) -> dict:
    """Holds when the primary metric improves on the baseline by at least `min_gain` (and by more than 0)."""
    metric = hypothesis.metric
    gain = trial[metric] - baseline[metric]
    return {
        "metric": metric,
        "baseline": baseline[metric],
        "trial": trial[metric],
        "gain": gain,
        "min_gain": hypothesis.min_gain,
        "holds": gain > 0 and gain >= hypothesis.min_gain,
    }
