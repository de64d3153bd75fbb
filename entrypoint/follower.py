"""A job on several nodes: the lead node runs every phase; the other nodes take part in training only.

    lead  (node rank 0):  rentune run SPEC
        phases as on one node; for each trial it trains:
            put train/launch.json {trial, launch id, attempt}  ->  torchrun --nnodes N (c10d, rdzv id = launch id)
    other (node rank k):  rentune run SPEC --node-rank k        (or RENTUNE_NODE_RANK=k)
        wait for the lead's attempt; for each launch of that attempt whose trial has no result yet:
            torchrun --nnodes N, the same rendezvous -> the same trial's ranks on this node
        exit 0 once the train phase is committed (the lead evaluates, tests, verifies and exports alone);
        exit as the lead's attempt did (143 on its SIGTERM, 1 on its error) if that attempt ends first

Nodes share nothing but the store and the rendezvous endpoint: every rank reopens the job from the store,
each node downloads the checkpoint it resumes from once, and each node commits the files its own ranks
wrote (store/checkpoint.py). Node numbers in checkpoints and logs are torchrun's (GROUP_RANK); of
--node-rank only 0 (the lead) against the rest matters. Which node holds global rank 0 in a launch does
not matter: rank 0 writes the trial's result to the store, where the lead reads it.
"""

from __future__ import annotations

import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path

from entrypoint.errors import Interrupted, signal_name
from entrypoint.job import layout
from entrypoint.job.attempts import attempt_numbers
from entrypoint.job.launches import attempt_ended, newest_launch
from entrypoint.job.state import continue_spec, job_store, stored_spec
from entrypoint.notices import watching_notices
from entrypoint.runner import locations_args
from entrypoint.store import Store
from entrypoint.training.distributed import run_torchrun, torchrun_command
from entrypoint.training.model import match_base_model, resolve_model_dir
from jobspec.load import LoadedSpec

__all__ = ["LeadStopped", "follow_lead"]

POLL_S = 2.0


class LeadStopped(RuntimeError):
    """The lead node's attempt ended before training was done: nothing left for this node to join."""


def follow_lead(
    root: Store,
    job_id: str,
    node: int,
    workdir: Path,
    store_args: tuple[str, ...],
    log: Callable[[str], None],
    lead_wait_s: float = 7200.0,  # the lead's phases before training can take long on a large model
    poll_s: float = POLL_S,
    loaded: LoadedSpec | None = None,
) -> None:
    """Node `node` (> 0) of job `job_id`: join each torchrun launch of the lead's current attempt until the
    train phase is committed. Before the first launch it gets the base model (a download happens here, not
    inside a launch) and refuses a copy that differs from the one the job started with (ModelMismatch).
    Gives up after `lead_wait_s` without an attempt of the lead or a new launch of it (LeadStopped). When
    the lead's attempt ends first: its SIGTERM is this node's too (Interrupted), an error is LeadStopped,
    and an attempt that stopped early on purpose (`--until`) ends this node cleanly."""
    store = job_store(root, job_id)
    log(
        f"node {node}: the lead node (node rank 0) runs every phase but training; this node joins its training "
        "launches and exits when training is done"
    )
    stop: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))
    try:
        with watching_notices(log):  # a provider's interruption notice takes the SIGTERM path
            _follow(store, node, workdir, store_args, log, lead_wait_s, poll_s, stop, loaded)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _follow(store, node, workdir, store_args, log, lead_wait_s, poll_s, stop, loaded) -> None:
    ended_before = {n for n in attempt_numbers(store) if attempt_ended(store, n) is not None}
    idle_since, joined, model_checked = time.monotonic(), set(), False
    while not stop:
        if store.head(layout.phase_result("train")) is not None:
            log(f"node {node}: training is done; the lead node runs the remaining phases. Exiting.")
            return
        current = max(attempt_numbers(store), default=0)
        launch = newest_launch(store)
        if current and current not in ended_before and (ended := attempt_ended(store, current)) is not None:
            if store.head(layout.phase_result("train")) is not None:  # committed just before the attempt ended
                continue
            _lead_ended(node, current, ended, log)
            return
        if launch and launch["attempt"] == current and not launch.get("ended") and launch["launch"] not in joined:
            joined.add(launch["launch"])
            if store.head(layout.trial_result(launch["trial"])) is None:
                if not model_checked:
                    moved = _check_model(store, node, workdir, log, loaded)
                    store_args = (*store_args, *locations_args(moved))
                    model_checked = True
                if stop:
                    break
                _join(store, launch, node, workdir, store_args, log)
            idle_since = time.monotonic()
            continue
        if time.monotonic() - idle_since > lead_wait_s:
            raise LeadStopped(
                f"node {node}: no new training launch of the lead node within {lead_wait_s:.0f} s "
                f"(newest attempt: {current or 'none'}); start this node again together with the lead"
            )
        time.sleep(poll_s)
    raise Interrupted(f"node {node}: stopped on SIGTERM while waiting for the lead's next launch")


def _lead_ended(node: int, attempt: int, ended: dict, log) -> None:
    """The lead's attempt ended before training was done: end this node the same way."""
    outcome, error = ended.get("outcome"), ended.get("error")
    if outcome == "interrupted":
        raise Interrupted(f"node {node}: the lead node's attempt {attempt} was stopped on SIGTERM ({error})")
    if outcome == "completed":  # the lead stopped before training on purpose (`rentune run --until ...`)
        log(f"node {node}: the lead node's attempt {attempt} ended before training, as asked. Exiting.")
        return
    raise LeadStopped(
        f"node {node}: the lead node's attempt {attempt} ended {outcome} before training was done ({error}); "
        "start this node again with the lead"
    )


def _check_model(store: Store, node: int, workdir: Path, log, loaded: LoadedSpec | None) -> dict:
    """This node's spec (`loaded`, when given) must continue the stored one (JobConflict otherwise), and this
    node's base model (downloaded now if it comes from a bucket or the hub) must be the one the job started
    with. Returns the locations this node moved (continue_spec)."""
    if loaded is None:
        spec, moved = stored_spec(store).spec, {}
    else:
        continued = continue_spec(store, loaded)
        for line in continued.lines():
            log(f"node {node}: {line}")
        spec, moved = continued.loaded.spec, continued.moved
    match_base_model(store, spec, resolve_model_dir(spec.model, spec.store, log), record=False)
    return moved


def _join(store: Store, launch: dict, node: int, workdir: Path, store_args, log) -> None:
    spec = stored_spec(store).spec
    trial = launch["trial"]
    args = [*store_args, "--workdir", str(workdir / "ranks"), "--trial", trial]
    shutil.rmtree(workdir / "ranks", ignore_errors=True)  # the ranks' scratch is fresh for each launch
    log(f"node {node}: joining the lead's launch {launch['launch']} (trial {trial})")
    code, stopped = run_torchrun(
        torchrun_command(spec.distribution, args, rdzv_id=launch["launch"]),
        spec.training.checkpoint.grace_seconds,
        log,
    )
    if stopped:
        raise Interrupted(f"node {node}: torchrun ranks stopped on {signal_name(stopped)} (exit {code})", stopped)
    if code != 0:  # the lead decides what the trial's failure means; its next launch says what comes next
        log(f"node {node}: torchrun exited with code {code} in trial {trial}; waiting for the lead's next launch")
