"""A job on several nodes: the lead node runs every phase; the other nodes take part in training only.

    lead  (node rank 0):  rentune run SPEC
        phases as on one node; for each trial it trains:
            put train/launch.json {trial, launch id, attempt}  ->  torchrun --nnodes N (c10d, rdzv id = launch id)
    other (node rank k):  rentune run SPEC --node-rank k        (or RENTUNE_NODE_RANK=k)
        wait for the lead's attempt; for each launch of that attempt whose trial has no result yet:
            torchrun --nnodes N, the same rendezvous -> the same trial's workers on this node
        exit 0 once the train phase is committed (the lead evaluates, tests, verifies and exports alone);
        exit with the lead's outcome if its attempt ends first

Nodes share nothing but the store and the rendezvous endpoint: every rank reopens the job from the store,
downloads the checkpoint it resumes from, and each node commits the files its own ranks wrote
(store/checkpoint.py). Which node holds global rank 0 in a launch does not matter: rank 0 writes the
trial's result to the store, where the lead reads it.
"""

from __future__ import annotations

import shutil
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from entrypoint.errors import EXIT_INTERRUPTED, Interrupted
from entrypoint.job.attempts import attempt_numbers
from entrypoint.job.state import dumps, job_store, phase_result_key, read_json, stored_spec, trial_result_key
from entrypoint.store import ObjectNotFound, Store
from entrypoint.training.distributed import run_torchrun, torchrun_command

__all__ = ["LAUNCH_KEY", "LeadStopped", "announce_launch", "follow_lead"]

LAUNCH_KEY = "train/launch.json"  # the lead's newest torchrun launch, in the job's store
POLL_S = 2.0


class LeadStopped(RuntimeError):
    """The lead node's attempt ended before training was done: nothing left for this node to join."""


def announce_launch(store: Store, trial_id: str, attempt: int) -> str:
    """Tell the other nodes the lead is about to start torchrun for `trial_id`; returns the launch id,
    which is also the rendezvous id (agents of another launch never join this one)."""
    launch_id = uuid.uuid4().hex[:16]
    store.put_bytes(LAUNCH_KEY, dumps({"trial": trial_id, "launch": launch_id, "attempt": attempt, "at": time.time()}))
    return launch_id


def _ended(store: Store, attempt: int) -> dict | None:
    try:
        return read_json(store, f"attempts/{attempt}/ended.json")
    except ObjectNotFound:
        return None


def follow_lead(
    root: Store,
    job_id: str,
    node: int,
    workdir: Path,
    store_args: tuple[str, ...],
    log: Callable[[str], None],
    lead_wait_s: float = 1800.0,
    poll_s: float = POLL_S,
) -> None:
    """Node `node` (> 0) of job `job_id`: join each torchrun launch of the lead's current attempt until the
    train phase is committed. Waits `lead_wait_s` at most for the lead to start an attempt. Raises
    LeadStopped if the lead's attempt ends first, Interrupted on SIGTERM."""
    store = job_store(root, job_id)
    log(
        f"node {node}: the lead node (node rank 0) runs every phase but training; this node joins its training "
        "launches and exits when training is done"
    )
    stop: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))
    try:
        _follow(store, node, workdir, store_args, log, lead_wait_s, poll_s, stop)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _follow(store, node, workdir, store_args, log, lead_wait_s, poll_s, stop) -> None:
    ended_before = {n for n in attempt_numbers(store) if _ended(store, n) is not None}
    waiting_since, joined = time.monotonic(), set()
    while not stop:
        if store.head(phase_result_key("train")) is not None:
            log(f"node {node}: training is done; the lead node runs the remaining phases. Exiting.")
            return
        attempts = attempt_numbers(store)
        current = max(attempts, default=0)
        if current == 0 or current in ended_before:  # the lead has not started (again) yet
            if time.monotonic() - waiting_since > lead_wait_s:
                raise LeadStopped(f"node {node}: no attempt of the lead node started within {lead_wait_s:.0f} s")
        elif (ended := _ended(store, current)) is not None:
            if store.head(phase_result_key("train")) is not None:  # committed just before the attempt ended
                continue
            raise LeadStopped(
                f"node {node}: the lead node's attempt {current} ended {ended.get('outcome')} before training "
                f"was done ({ended.get('error')}); start this node again with the lead"
            )
        else:
            launch = _launch(store)
            if launch and launch["attempt"] == current and launch["launch"] not in joined:
                joined.add(launch["launch"])
                if store.head(trial_result_key(launch["trial"])) is None:
                    _join(store, launch, node, workdir, store_args, log)
                continue
        time.sleep(poll_s)
    raise Interrupted(f"node {node}: stopped on SIGTERM while waiting for the lead's next launch")


def _launch(store: Store) -> dict | None:
    try:
        return read_json(store, LAUNCH_KEY)
    except ObjectNotFound:
        return None


def _join(store: Store, launch: dict, node: int, workdir: Path, store_args, log) -> None:
    spec = stored_spec(store).spec
    trial = launch["trial"]
    args = [*store_args, "--workdir", str(workdir / "workers"), "--trial", trial]
    shutil.rmtree(workdir / "workers", ignore_errors=True)  # the workers' scratch is fresh for each launch
    log(f"node {node}: joining the lead's launch {launch['launch']} (trial {trial})")
    code, terminated = run_torchrun(
        torchrun_command(spec.distribution, args, rdzv_id=launch["launch"]),
        spec.training.checkpoint.grace_seconds,
        log,
    )
    if terminated or code == EXIT_INTERRUPTED:
        raise Interrupted(f"node {node}: torchrun workers stopped on SIGTERM (exit {code})")
    if code != 0:  # the lead decides what the trial's failure means; its next launch says what comes next
        log(f"node {node}: torchrun exited with code {code} in trial {trial}; waiting for the lead's next launch")
