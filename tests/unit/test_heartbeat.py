"""The progress line of long work (entrypoint/job/heartbeat.py): written by a thread every interval while
the work runs, none once it ended; what it says; the interval from RENTUNE_HEARTBEAT_SECONDS; and the
generation loop's, on a real tiny causal LM."""

from __future__ import annotations

import re
import time

import pytest

from entrypoint.errors import InvalidInput
from entrypoint.job.heartbeat import HEARTBEAT_SECONDS, Heartbeat, heartbeat_seconds
from tests.models import build_tiny_causal_lm


def _wait_for(lines: list[str], count: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while len(lines) < count and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_line_every_interval_says_done_of_total_the_rate_and_what_runs_now():
    lines: list[str] = []
    now = [100.0]
    with Heartbeat(lines.append, "probe", total=5, unit="measurements", every=0.01, clock=lambda: now[0]) as beat:
        _wait_for(lines, 1)
        assert lines[0] == "probe: 0/5 measurements in 0 s (none done yet)"
        now[0] += 40.0
        beat.advance(2, doing="the gradient checks")
        _wait_for(lines, len(lines) + 2)
    assert lines[-1] == "probe: 2/5 measurements in 40 s (0.05 measurements/s); now: the gradient checks"
    ended = len(lines)
    time.sleep(0.1)
    assert len(lines) == ended  # the thread stopped with the block


def test_work_shorter_than_the_interval_writes_nothing():
    lines: list[str] = []
    with Heartbeat(lines.append, "merge", total=1, unit="files", every=5.0) as beat:
        beat.advance()
    assert lines == []


def test_the_interval_comes_from_the_environment_and_a_bad_one_is_named(monkeypatch):
    monkeypatch.delenv("RENTUNE_HEARTBEAT_SECONDS", raising=False)
    assert heartbeat_seconds() == HEARTBEAT_SECONDS == 30.0
    monkeypatch.setenv("RENTUNE_HEARTBEAT_SECONDS", "0.5")
    assert heartbeat_seconds() == 0.5 and Heartbeat(print, "x", 1, "y").every == 0.5
    for bad in ("0", "-1", "soon"):
        monkeypatch.setenv("RENTUNE_HEARTBEAT_SECONDS", bad)
        with pytest.raises(InvalidInput, match=rf"RENTUNE_HEARTBEAT_SECONDS='{bad}': expected a number of seconds"):
            heartbeat_seconds()


def test_generation_reports_its_progress_while_it_runs(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from entrypoint.evaluation.generate import generate_responses

    folder = build_tiny_causal_lm(tmp_path / "llama")
    model, tokenizer = AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    monkeypatch.setenv("RENTUNE_HEARTBEAT_SECONDS", "0.001")
    lines: list[str] = []
    answers = generate_responses(model, tokenizer, ["a b", "c d", "e f"], 32, 16, 1, "cpu", log=lines.append)
    assert len(answers) == 3
    beats = [line for line in lines if re.fullmatch(r"generation: [0-3]/3 answers in \d+ s \(.*\)", line)]
    assert beats, lines
    assert lines[-1].startswith("generation: 3 answers, ")  # the throughput line comes last


def test_an_eval_loss_pass_reports_its_batches_until_the_trainer_says_it_ended(monkeypatch):
    """The Trainer's callbacks drive it: a line while prediction steps come, none after on_evaluate."""
    from entrypoint.training.trainer import ProgressCallback

    monkeypatch.setenv("RENTUNE_HEARTBEAT_SECONDS", "0.01")
    lines: list[str] = []
    progress = ProgressCallback(lines.append)
    for _ in range(3):
        progress.on_prediction_step(None, None, None, eval_dataloader=[0] * 8)
    _wait_for(lines, 1)
    assert lines[-1].startswith("eval-loss: 3/8 batches in ")
    progress.on_evaluate(None, None, None)
    ended = len(lines)
    time.sleep(0.1)
    assert len(lines) == ended
    progress.on_prediction_step(None, None, None, eval_dataloader=[0] * 8)  # the next pass counts from 1
    _wait_for(lines, ended + 1)
    assert lines[-1].startswith("eval-loss: 1/8 batches in ")
    progress.on_train_end(None, None, None)
