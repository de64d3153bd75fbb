"""Train phase: every trial in spec order (`main`, then each variant of `experiments:`), each with the HF
Trainer.

    for trial in trials:                          # jobspec/experiments.py resolves and checks them
        if trials/<id>/result.json exists: skip   # committed by an earlier process
        train it (in this process, or in torchrun ranks), resuming from its newest committed checkpoint
        put trials/<id>/result.json               # completed | invalid, with the reason

Checkpoints are committed to the store during training (every N steps and/or minutes, on SIGTERM and at
the end). A process that starts this phase again, on any node, resumes from the newest checkpoint that
verifies, with optimizer, scheduler, RNG states and data position, so the run continues as if never
stopped. A trial whose settings cannot train (out of memory, NaN loss, a module LoRA cannot find) is
recorded as invalid with its reason and the next trial runs: it is never dropped from the results.
At the end of a trial the trained weights and the eval outputs they give are committed, for the evaluate
phase to check against.
"""

from __future__ import annotations

import gc
import shutil
import time

import torch

from entrypoint.context import PhaseContext
from entrypoint.errors import Interrupted, signal_name
from entrypoint.job import layout
from entrypoint.job.launches import announce_launch, end_launch
from entrypoint.job.plan import store_plan
from entrypoint.job.state import dumps
from entrypoint.store import ObjectExists, ObjectNotFound
from entrypoint.store.checkpoint import checkpoint_prefix, list_steps
from entrypoint.training.distributed import (
    needs_launch,
    run_torchrun,
    torchrun_command,
)
from entrypoint.training.memory import is_oom
from entrypoint.trial.train import train_trial, training_deadline
from jobspec.experiments import MAIN, Trial, resolve_trials
from jobspec.plan import planned_steps

__all__ = ["BUDGET_UNIT", "run"]


BUDGET_UNIT = "training examples processed (optimizer steps x microbatch x grad_accum x processes)"
PACKED_BUDGET_UNIT = "packed rows processed (optimizer steps x microbatch x grad_accum x processes)"


def run(ctx: PhaseContext) -> dict:
    trials = resolve_trials(ctx.spec)
    # What a step draws from: the train examples, or with packing the rows the probe counted.
    n_train = ctx.result("probe").get("train_rows") or len(ctx.read_split("train"))
    summary = {}
    for trial in trials:
        key = layout.trial_result(trial.id)
        try:
            record = ctx.read_json(key)
            ctx.log(f"train: trial {trial.id} already {record['status']}, skipping")
        except ObjectNotFound:
            ctx.log(f"train: trial {trial.id}" + (f" ({trial.rationale})" if trial.reference else ""))
            deadline, needs = training_deadline(ctx)
            left = None if deadline is None else deadline - ctx.clock()
            started = bool(list_steps(ctx.store, checkpoint_prefix(trial.id)))  # the deadline cuts it if need be
            if trial.id != MAIN and not started and left is not None and needs.get(trial.id, 0.0) > left:
                record = _not_started(trial, needs[trial.id], left)
                ctx.log(f"train: trial {trial.id} is stopped: {record['reason']}")
            else:
                record = _run_trial(ctx, trial, trials[0], n_train)
            try:
                ctx.store.put_if_absent(key, dumps(record))
            except ObjectExists:  # another process committed this trial meanwhile; theirs stands
                record = ctx.read_json(key)
            # The next trials are planned from this one's own figures (and its deadline moves with them)
            store_plan(ctx.spec, ctx.store, ctx.clock(), f"after trial {trial.id}", ctx.log)
        summary[trial.id] = {k: record.get(k) for k in ("status", "reason", "steps", "budget", "evaluable")}
    return {"trials": summary, "order": [t.id for t in trials]}


def _not_started(trial: Trial, needs: float, left: float) -> dict:
    """A trial the lease has no room for: recorded as stopped, never silently dropped."""
    return {
        "trial_id": trial.id,
        "reference": trial.reference,
        "changes": list(trial.changes),
        "rationale": trial.rationale,
        "settings": {"adaptation": trial.adaptation.model_dump(), "training": trial.training.model_dump()},
        "status": "stopped",
        "reason": f"not started: it needs about {needs / 3600:.1f} h and {max(left, 0) / 3600:.1f} h are left "
        "before the plan's training deadline",
        "steps": 0,
        "evaluable": False,
        "budget": {
            "reference_examples": 0,
            "planned_examples": 0,
            "done_examples": 0,
            "status": "short",
            "unit": BUDGET_UNIT,
        },
    }


def _world(ctx: PhaseContext) -> int:
    return ctx.spec.distribution.nproc_per_node * ctx.spec.distribution.nnodes


def _examples(trial: Trial, n_train: int, world: int) -> int:
    """Training examples a trial's plan processes: optimizer steps x global batch."""
    t = trial.training
    return planned_steps(t, n_train, world) * t.microbatch * t.grad_accum * world


def _run_trial(ctx: PhaseContext, trial: Trial, main: Trial, n_train: int) -> dict:
    record = {
        "trial_id": trial.id,
        "reference": trial.reference,
        "changes": list(trial.changes),
        "rationale": trial.rationale,
        "settings": {"adaptation": trial.adaptation.model_dump(), "training": trial.training.model_dump()},
    }
    started = time.monotonic()
    try:
        outcome = _launch(ctx, trial) if needs_launch(ctx.spec.distribution) else train_trial(ctx, trial)
    except Interrupted:
        raise
    except Exception as exc:
        if not is_oom(exc):
            raise
        outcome = {"status": "invalid", "reason": f"out of memory: {exc}", "evaluable": False}
    if outcome["status"] == "invalid":
        # Out of the except block, so the traceback no longer holds them: the failed trainer, model and
        # optimizer must not crowd out the next trial.
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    record.update(outcome)
    record["seconds"] = round(time.monotonic() - started, 3)  # in this process: what the plan predicted
    if outcome["status"] != "completed":
        ctx.log(f"train: trial {trial.id} is {outcome['status']}: {outcome['reason']}")
    world = _world(ctx)
    t = trial.training
    reference, planned = _examples(main, n_train, world), _examples(trial, n_train, world)
    done = outcome.get("steps", 0) * t.microbatch * t.grad_accum * world
    status = "exceeds" if planned > reference else "short" if min(planned, done) < reference else "within"
    record["budget"] = {
        "reference_examples": reference,
        "planned_examples": planned,
        "done_examples": done,
        "status": status,
        "unit": PACKED_BUDGET_UNIT if ctx.spec.training.packing else BUDGET_UNIT,
    }
    return record


def _launch(ctx: PhaseContext, trial: Trial) -> dict:
    """Run this trial in `nproc_per_node` torchrun ranks and return rank 0's result."""
    distribution = ctx.spec.distribution
    ctx.store.delete(layout.trial_rank_result(trial.id))
    shutil.rmtree(ctx.workdir / "ranks", ignore_errors=True)
    rank_args = [*ctx.store_args, "--workdir", str(ctx.workdir / "ranks"), "--trial", trial.id]
    launch = announce_launch(ctx.store, trial.id, ctx.attempt) if distribution.nnodes > 1 else None
    command = torchrun_command(distribution, rank_args, rdzv_id=launch)
    ctx.log(f"train: launching {distribution.nproc_per_node} x {distribution.nnodes} processes with torchrun")
    if launch:
        ctx.log(f"train: launch {launch}: the other {distribution.nnodes - 1} node(s) join it through the store")
    try:
        code, stopped = run_torchrun(command, ctx.spec.training.checkpoint.grace_seconds, ctx.log)
    finally:
        if launch:
            end_launch(ctx.store, launch)
    if stopped:
        raise Interrupted(
            f"train: torchrun ranks stopped on {signal_name(stopped)} (exit {code}); resume continues from the store",
            stopped,
        )
    try:
        result = ctx.read_json(layout.trial_rank_result(trial.id))
    except ObjectNotFound:
        result = None
    if code != 0 and not (result and result.get("status") == "invalid"):  # a rank's OOM stops torchrun too
        raise RuntimeError(f"train: torchrun exited with code {code}; the ranks' output above says why")
    if result is None:
        raise RuntimeError(f"train: torchrun exited 0 but rank 0 wrote no {layout.trial_rank_result(trial.id)}")
    return {**result, "launcher": "torchrun", "processes": distribution.nproc_per_node * distribution.nnodes}
