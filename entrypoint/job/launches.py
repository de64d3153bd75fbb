"""The lead node's training launches, recorded in the job's store for the other nodes (follower.py).

    train/launch.json   {trial, launch id, attempt, at[, ended]}: the lead's newest torchrun launch

The launch id is also torchrun's rendezvous id, so agents of another launch never join this one.
"""

from __future__ import annotations

import time
import uuid

from entrypoint.job import layout
from entrypoint.job.state import dumps, read_json
from entrypoint.store import ObjectNotFound, Store

__all__ = ["announce_launch", "attempt_ended", "end_launch", "newest_launch"]


def announce_launch(store: Store, trial_id: str, attempt: int) -> str:
    """Tell the other nodes the lead is about to start torchrun for `trial_id`; returns the launch id,
    which is also the rendezvous id (agents of another launch never join this one)."""
    launch_id = uuid.uuid4().hex[:16]
    store.put_bytes(
        layout.LAUNCH, dumps({"trial": trial_id, "launch": launch_id, "attempt": attempt, "at": time.time()})
    )
    return launch_id


def end_launch(store: Store, launch_id: str) -> None:
    """torchrun of launch `launch_id` has returned on the lead: mark it, so that no node joins it late."""
    launch = newest_launch(store)
    if launch and launch.get("launch") == launch_id:
        store.put_bytes(layout.LAUNCH, dumps({**launch, "ended": True}))


def newest_launch(store: Store) -> dict | None:
    try:
        return read_json(store, layout.LAUNCH)
    except ObjectNotFound:
        return None


def attempt_ended(store: Store, attempt: int) -> dict | None:
    try:
        return read_json(store, layout.attempt_ended(attempt))
    except ObjectNotFound:
        return None
