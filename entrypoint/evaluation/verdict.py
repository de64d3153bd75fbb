"""The verdict: does the hypothesis hold, and does every guardrail pass, decided by paired intervals.

Each rule has three answers, so sampling noise is never read as a result (`comparison` is what
bootstrap.compare returns: per metric the change of the trial against the baseline and its interval):

    hypothesis  holds          the interval's lower bound of the gain >= min_gain
                does not hold  its upper bound < min_gain
                inconclusive   otherwise (the interval straddles min_gain)
                (with min_gain 0: holds when the lower bound is above 0, does not hold when the upper is <= 0)
    guardrail   pass           lower bound of the change, signed so that worse is negative, >= -tolerance
                fail           its upper bound < -tolerance
                inconclusive   otherwise
    a trial's guardrails: fail if any fails, else inconclusive if any is, else pass

A guardrail such as `f1/*` expands to every category on its own (`f1/billing`, `f1/shipping`, ...): a
macro average can improve while one category gets worse, and that category must be judged on its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from entrypoint.errors import InvalidInput
from entrypoint.evaluation.formats import higher_is_better
from jobspec.schema import Guardrail, Hypothesis

__all__ = [
    "RULES",
    "GuardrailError",
    "check_guardrails",
    "expand",
    "guardrail_names",
    "higher_is_better",
    "hypothesis_verdict",
    "overall",
]

_EPS = 1e-12  # a hair of float noise never decides a verdict

RULES = (
    "hypothesis: holds when the lower bound of the gain's interval is >= min_gain, does not hold when its "
    "upper bound is < min_gain, inconclusive otherwise; guardrail: pass when the lower bound of the change "
    "(worse is negative) is >= -tolerance, fail when its upper bound is < -tolerance, inconclusive otherwise"
)


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


def guardrail_names(guardrails: Sequence[Guardrail], computed: Mapping[str, float]) -> list[str]:
    """Every metric the guardrails cover, once, in order."""
    return list(dict.fromkeys(name for g in guardrails for name in expand(g.metric, computed)))


def check_guardrails(guardrails: Sequence[Guardrail], comparison: Mapping[str, dict]) -> list[dict]:
    """One record per covered metric: baseline, trial, change and its interval, tolerance, result."""
    checks = []
    for guardrail in guardrails:
        for name in expand(guardrail.metric, comparison):
            c = comparison[name]
            low, high = c["interval"]
            # signed so that worse is negative: a lower-is-better metric that rises got worse
            worse_low, worse_high = (low, high) if higher_is_better(name) else (-high, -low)
            tol = guardrail.tolerance
            result = "pass" if worse_low >= -tol - _EPS else "fail" if worse_high < -tol - _EPS else "inconclusive"
            checks.append(
                {
                    "guardrail": guardrail.metric,
                    "metric": name,
                    "baseline": c["before"],
                    "trial": c["after"],
                    "change": c["change"],
                    "interval": c["interval"],
                    "tolerance": tol,
                    "result": result,
                    **({"mcnemar": c["mcnemar"]} if "mcnemar" in c else {}),
                }
            )
    return checks


def overall(checks: Sequence[dict]) -> str:
    """fail if any check fails, else inconclusive if any is, else pass (also with no checks)."""
    results = {c["result"] for c in checks}
    return "fail" if "fail" in results else "inconclusive" if "inconclusive" in results else "pass"


def hypothesis_verdict(hypothesis: Hypothesis, comparison: Mapping[str, dict]) -> dict:
    """The primary metric's gain over the baseline, its interval, and holds / does not hold / inconclusive."""
    metric, min_gain = hypothesis.metric, hypothesis.min_gain
    c = comparison[metric]
    low, high = c["interval"]
    if min_gain > 0:
        holds, fails = low >= min_gain - _EPS, high < min_gain - _EPS
    else:
        holds, fails = low > _EPS, high <= _EPS
    return {
        "metric": metric,
        "baseline": c["before"],
        "trial": c["after"],
        "gain": c["change"],
        "interval": c["interval"],
        "min_gain": min_gain,
        "result": "holds" if holds else "does not hold" if fails else "inconclusive",
        **({"mcnemar": c["mcnemar"]} if "mcnemar" in c else {}),
    }
