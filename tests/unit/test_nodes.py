"""A node other than 0 follows the lead through the store: when it stops waiting, and why (the torchrun
launches it joins are tested with real processes in tests/integration/test_multinode.py)."""

from __future__ import annotations

import threading
import time

import pytest

from entrypoint import follower
from entrypoint.errors import Interrupted
from entrypoint.follower import LeadStopped, follow_lead
from entrypoint.job import layout
from entrypoint.job.launches import announce_launch, end_launch
from entrypoint.job.state import dumps, job_store
from entrypoint.store import open_store


def _follow(root, tmp_path, lines, wait_s=30.0):
    follow_lead(root, "j", 1, tmp_path / "work", ("--store", root.uri), lines.append, lead_wait_s=wait_s, poll_s=0.01)


def test_exits_cleanly_once_training_is_committed(tmp_path):
    root = open_store(f"file://{tmp_path / 'store'}")
    store = job_store(root, "j")
    store.put_bytes("attempts/1/started.json", dumps({"started_at": 0}))
    lines: list[str] = []
    threading.Timer(0.3, lambda: store.put_bytes(layout.phase_result("train"), dumps({}))).start()
    _follow(root, tmp_path, lines)
    assert lines[-1] == "node 1: training is done; the lead node runs the remaining phases. Exiting."


def test_stops_when_the_leads_attempt_ends_first_but_not_for_an_attempt_that_ended_before_it_started(tmp_path):
    root = open_store(f"file://{tmp_path / 'store'}")
    store = job_store(root, "j")
    store.put_bytes("attempts/1/started.json", dumps({"started_at": 0}))
    store.put_bytes("attempts/1/ended.json", dumps({"outcome": "interrupted", "error": "SIGTERM"}))

    def lead_restarts_then_fails():  # attempt 1 ended before this node started: it waits for attempt 2
        time.sleep(0.3)
        store.put_bytes("attempts/2/started.json", dumps({"started_at": 1}))
        time.sleep(0.3)
        store.put_bytes("attempts/2/ended.json", dumps({"outcome": "error", "error": "RuntimeError: boom"}))

    threading.Thread(target=lead_restarts_then_fails).start()
    with pytest.raises(LeadStopped, match="attempt 2 ended error before training was done .RuntimeError: boom"):
        _follow(root, tmp_path, [])


def test_gives_up_when_no_lead_attempt_starts(tmp_path):
    root = open_store(f"file://{tmp_path / 'store'}")
    with pytest.raises(LeadStopped, match="no new training launch of the lead node within 0 s"):
        _follow(root, tmp_path, [], wait_s=0.2)


@pytest.mark.parametrize(
    "outcome,error",
    [("interrupted", Interrupted), ("completed", None)],
    ids=["sigterm-ends-this-node-too", "until-before-train-ends-it-cleanly"],
)
def test_a_lead_attempt_that_ends_before_training_ends_this_node_the_same_way(tmp_path, outcome, error):
    root = open_store(f"file://{tmp_path / 'store'}")
    store = job_store(root, "j")
    store.put_bytes("attempts/1/started.json", dumps({"started_at": 0}))
    threading.Timer(
        0.3, lambda: store.put_bytes("attempts/1/ended.json", dumps({"outcome": outcome, "error": "x"}))
    ).start()
    lines: list[str] = []
    if error is None:
        _follow(root, tmp_path, lines)
        assert lines[-1] == "node 1: the lead node's attempt 1 ended before training, as asked. Exiting."
    else:
        with pytest.raises(error, match="attempt 1 was stopped on SIGTERM"):
            _follow(root, tmp_path, lines)


def test_an_ended_launch_is_not_joined(tmp_path, monkeypatch):
    root = open_store(f"file://{tmp_path / 'store'}")
    store = job_store(root, "j")
    store.put_bytes("attempts/1/started.json", dumps({"started_at": 0}))
    end_launch(store, announce_launch(store, "main", 1))
    joined = []
    monkeypatch.setattr(follower, "_join", lambda *args: joined.append(args))
    monkeypatch.setattr(follower, "_check_model", lambda *args: None)
    with pytest.raises(LeadStopped, match="no new training launch"):
        _follow(root, tmp_path, [], wait_s=0.3)
    assert not joined
    announce_launch(store, "main", 1)  # a live launch of the current attempt is joined
    with pytest.raises(LeadStopped, match="no new training launch"):
        _follow(root, tmp_path, [], wait_s=0.3)
    assert len(joined) == 1


def test_a_launch_names_its_trial_attempt_and_a_fresh_id(tmp_path):
    store = job_store(open_store(f"file://{tmp_path / 'store'}"), "j")
    first, second = announce_launch(store, "main", 3), announce_launch(store, "main", 3)
    assert first != second
    assert store.get_bytes(layout.LAUNCH) and b'"attempt": 3' in store.get_bytes(layout.LAUNCH)


def test_training_committed_between_two_looks_is_done_not_a_stopped_lead(tmp_path, monkeypatch):
    root = open_store(f"file://{tmp_path / 'store'}")
    store = job_store(root, "j")
    store.put_bytes("attempts/1/started.json", dumps({"started_at": 0}))
    ended, looks = follower.attempt_ended, []

    def lead_finishes_meanwhile(store_, attempt):
        looks.append(attempt)
        if len(looks) == 2:  # the first look is at start-up; the second, in the loop, after the train check
            # The lead commits training and ends its attempt (--until train) just after this node looked
            # for the train phase's result and just before it looks at the attempt.
            store.put_bytes(layout.phase_result("train"), dumps({}))
            store.put_bytes("attempts/1/ended.json", dumps({"outcome": "completed", "error": None}))
        return ended(store_, attempt)

    lines: list[str] = []
    monkeypatch.setattr(follower, "attempt_ended", lead_finishes_meanwhile)
    _follow(root, tmp_path, lines)
    assert len(looks) >= 2 and lines[-1].startswith("node 1: training is done")
