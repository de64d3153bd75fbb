"""The selection rule (entrypoint/evaluation/selection.py): the highest hypothesis metric on eval among the
trials with no failed guardrail, ties to the earlier trial, the runner-up, and every trial invalid."""

from __future__ import annotations

import pytest

from entrypoint.evaluation.selection import NoValidTrial, select


def _trial(f1: float, guardrails: str = "pass") -> dict:
    return {"status": "completed", "reason": "", "metrics": {"macro_f1": f1}, "guardrails_result": guardrails}


def _invalid(reason: str) -> dict:
    return {"status": "invalid", "reason": reason}


def test_the_highest_metric_among_trials_with_no_failed_guardrail_is_selected():
    results = {"main": _trial(0.80), "lr-high": _trial(0.90, "fail"), "rank-8": _trial(0.85, "inconclusive")}
    choice = select(results, "macro_f1")
    assert (choice.selected, choice.runner_up) == ("rank-8", "main")  # lr-high's guardrail failed
    assert choice.why == "highest macro_f1 on eval among trials with no failed guardrail"


def test_a_tie_goes_to_the_earlier_trial_in_the_spec():
    assert select({"main": _trial(0.8), "b": _trial(0.8), "c": _trial(0.8)}, "macro_f1").selected == "main"
    assert select({"b": _trial(0.8), "main": _trial(0.8)}, "macro_f1").selected == "b"


def test_when_every_trial_fails_a_guardrail_the_best_of_them_is_selected_and_said():
    choice = select({"main": _trial(0.7, "fail"), "b": _trial(0.9, "fail")}, "macro_f1")
    assert (choice.selected, choice.runner_up) == ("b", "main")
    assert choice.why == "every trial fails a guardrail; highest macro_f1 on eval"


def test_a_safe_trial_alone_is_compared_with_the_best_of_the_others():
    results = {"main": _trial(0.7), "b": _trial(0.9, "fail"), "c": _trial(0.6, "fail"), "d": _invalid("oom")}
    choice = select(results, "macro_f1")
    assert (choice.selected, choice.runner_up) == ("main", "b")


def test_one_completed_trial_has_no_runner_up():
    choice = select({"main": _trial(0.7), "b": _invalid("NaN loss at step 3")}, "macro_f1")
    assert (choice.selected, choice.runner_up) == ("main", None)


def test_no_completed_trial_is_refused_with_every_reason():
    with pytest.raises(NoValidTrial, match=r"main: invalid \(oom\); b: stopped \(no room\)"):
        select({"main": _invalid("oom"), "b": {"status": "stopped", "reason": "no room"}}, "macro_f1")
