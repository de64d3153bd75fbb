"""Train one trial with the job's context: in the train phase's own process, or in each torchrun rank
(processes/rank.py). The phase (phases/train.py) decides where; this module trains.

The trial trains with the HF Trainer from its newest committed checkpoint that verifies (optimizer,
scheduler, RNG states and data position restored, so the run continues as if never stopped) to its
planned end, the plan's deadline or SIGTERM; checkpoints are committed to the store as it goes. At the end
the trained weights and the eval outputs they give are committed, for the evaluate phase to check against.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import set_seed

from entrypoint.context import PhaseContext
from entrypoint.data.packing import step_rows
from entrypoint.data.tokens import features_of, token_counts
from entrypoint.errors import Conflict, Interrupted
from entrypoint.job import layout
from entrypoint.job.state import to_jsonl
from entrypoint.store import ObjectNotFound, put_tree
from entrypoint.store.checkpoint import Checkpoint, CheckpointError, checkpoint_prefix, find_latest
from entrypoint.tracking import RunRef, Tracking, open_tracking, spec_params
from entrypoint.tracking.callback import TrackingCallback
from entrypoint.training.device import resolve_precision
from entrypoint.training.disk import disk_full
from entrypoint.training.distributed import deepspeed_config, is_rank, node_rank, rank
from entrypoint.training.environment import environment, platform_summary
from entrypoint.training.lifeline import process_identity, still_running
from entrypoint.training.model import adaptation_summary, hash_base_model
from entrypoint.training.throughput import CountingCollator, ThroughputMeter, flops_per_token, peak_flops
from entrypoint.training.trainer import (
    PROGRESS_EVERY_S,
    DivergenceCallback,
    FirstStepsCallback,
    NonFiniteLoss,
    ProgressCallback,
    StepClock,
    StoreCheckpointCallback,
    build_trainer,
    graceful_sigterm,
    log_every,
    loss_history,
    mean_train_loss,
    reproducible_files,
)
from jobspec.experiments import MAIN, Trial, trial_spec
from jobspec.schema import JobSpec

__all__ = ["InvalidTrial", "plan_checkpoint_minutes", "train_trial", "training_deadline"]


class InvalidTrial(RuntimeError):
    """This trial's settings cannot train; recorded with the reason, and the job goes on with the next."""


def training_deadline(ctx: PhaseContext) -> tuple[float | None, dict]:
    """The plan's training deadline (wall clock) and each trial's estimated seconds, if a plan exists."""
    try:
        plan = ctx.read_json(layout.PLAN)
    except ObjectNotFound:
        return None, {}
    return plan["train_deadline_at"], {t["id"]: t["seconds"] for t in plan["trials"]}


def plan_checkpoint_minutes(ctx: PhaseContext) -> float | None:
    """The periodic checkpoint interval the plan set to bound what an interruption loses (its notice window:
    a commit on SIGTERM that cannot finish in time), or None where the spec's own interval stands."""
    try:
        notice = ctx.read_json(layout.PLAN).get("notice")
    except ObjectNotFound:
        return None
    if isinstance(notice, dict) and notice.get("interval_source") == "plan":
        return notice.get("interval_minutes")
    return None


def train_trial(ctx: PhaseContext, trial: Trial) -> dict:
    """Train one trial to its planned end and commit its weights. Returns its record: status `completed`
    (or `stopped` at the plan's deadline), or `invalid` with the reason (NaN loss, settings the model
    cannot take). Raises Interrupted on SIGTERM (after committing a checkpoint when the grace allowed)."""
    try:
        return _train(ctx, trial)
    except (NonFiniteLoss, InvalidTrial) as exc:
        return {"status": "invalid", "reason": str(exc), "evaluable": False}


@dataclass
class _Setup:
    """What one trial trains with, prepared in this process."""

    spec: JobSpec  # the trial's own settings on top of the job's
    processor: object
    model: torch.nn.Module
    features: Sequence[dict]  # memory-mapped from the stored tokens (data/tokens.py), or packed rows
    eval_rows: list[dict]
    eval_features: Sequence[dict]
    adaptation: dict
    data: dict  # examples, rows (packed or not), mean tokens per example
    meta: dict  # what every checkpoint manifest of this trial records
    out: Path  # local scratch for the Trainer (shared by the ranks of one node)


def _train(ctx: PhaseContext, trial: Trial) -> dict:
    started = time.perf_counter()  # the StepClock's timer
    setup = _prepare(ctx, trial)
    resume, platform_change = _resume_point(ctx, trial, setup)
    interruptions = _interruptions(ctx, trial, resume)
    clock = StepClock()
    with graceful_sigterm(setup.spec.training.checkpoint.grace_seconds, ctx.log) as sigterm:
        trainer, saver, first_steps, meter = _fit(ctx, trial, setup, resume, sigterm, clock, interruptions)
    final = setup.out / "final"
    trainer.save_model(str(final))  # every rank takes part (ZeRO-3 gathers); the main process writes
    if not trainer.is_world_process_zero():
        return {}
    setup.processor.save_pretrained(final)
    reproducible_files(final)
    keys = put_tree(ctx.store, layout.trial_final(trial.id), final)

    # The ranks of a sharded run hold only part of the weights: predict from the saved ones there.
    model = trainer.model if not is_rank() else _reload(ctx, setup, final)
    predicting = time.perf_counter()
    outputs = ctx.kind.model.predict(model, setup.processor, setup.eval_rows, ctx.labels, ctx.device)
    predicted = time.perf_counter() - predicting
    ctx.store.put_bytes(layout.trial_outputs_at_end(trial.id), to_jsonl({"output": o} for o in outputs))
    state = trainer.state
    cut = state.global_step < state.max_steps  # not SIGTERM (raised in _fit): the plan's deadline
    return {
        "status": "stopped" if cut else "completed",
        "reason": f"cut short at the plan's training deadline after {state.global_step} of {state.max_steps} "
        "steps; the weights at that step are evaluated"
        if cut
        else None,
        "evaluable": True,
        "world_size": trainer.args.world_size,
        "parameter_check": {"passed": first_steps.check.done, **first_steps.check.summary()},
        "memory": _memory(ctx, trial, first_steps.peak_bytes),
        "steps": state.global_step,
        "planned_steps": state.max_steps,
        "resumed_from_step": resume.step if resume else None,
        # each earlier process of this trial: the step it reached (recorded every 30 s), where the next resumed
        "interruptions": interruptions,
        "platform_change": platform_change,
        # From every step of the run, all attempts included (the checkpoints carry the Trainer's log).
        "train_loss": mean_train_loss(state.log_history),
        "losses": loss_history(state.log_history, log_every(setup.spec.training.log_every_steps, state.max_steps)),
        "eval_losses": [{"step": e["step"], "loss": e["eval_loss"]} for e in state.log_history if "eval_loss" in e],
        "checkpoints_committed": saver.committed,
        # per checkpoint of this process: bytes, the training loop's blocked time, the commit's own time
        "checkpoints": saver.records,
        "checkpoint_interval": saver.interval,  # every_minutes: auto only
        # how fast: tokens/s (non-padding), padding share, MFU on a GPU, and what they were computed from
        "throughput": meter.summary(),
        "precision": resolve_precision(setup.spec.training, ctx.device),
        "attn_implementation": getattr(getattr(model, "config", None), "_attn_implementation", None),
        "liger": setup.spec.training.liger,
        "data": setup.data,
        "adaptation": setup.adaptation,
        "weights": keys,
        "timings": _timings(started, clock, saver.records, predicted, len(setup.eval_rows)),
    }


def _timings(started: float, clock: StepClock, checkpoints: list[dict], predict: float, examples: int) -> dict:
    """This process's figures for the plan (entrypoint/job/plan.py): its setup before training began, the
    median step, each eval-loss pass, what a checkpoint cost the loop and the store's rate on the commits,
    and the predictions on eval at the end."""
    periodic = [r for r in checkpoints if r.get("background") and r.get("local_save_s") is not None]
    saves = [r["local_save_s"] for r in periodic]
    # what a checkpoint's files take to reach the disk: the loop's save, and the staged writes after it
    writes = [r["local_save_s"] + (r.get("written_s") or 0.0) for r in periodic]
    committed = [r for r in checkpoints if (r.get("commit_s") or 0) > 0.01 and r.get("bytes")]
    uploads = [r["commit_s"] - (r.get("written_s") or 0.0) for r in committed]
    return {
        "setup": round(clock.began - started, 4) if clock.began is not None else None,  # the same timer
        "step": clock.median_step(),
        "steps_timed": max(0, len(clock.ends) - 1),
        "eval_loss_passes": [round(s, 4) for s in clock.eval_seconds],
        # saves that evaluated first (the last) are left out: the eval-loss passes count them
        "checkpoint_save": statistics.median(saves) if saves else None,
        "checkpoint_write": statistics.median(writes) if writes else None,
        "store_rate": sum(r["bytes"] for r in committed) / sum(uploads) if committed and sum(uploads) > 0 else None,
        "checkpoint_bytes": checkpoints[-1].get("bytes") if checkpoints else None,
        "predict": round(predict, 4),
        "predict_examples": examples,
        "seconds": round(clock.timer() - started, 3),
    }


def _prepare(ctx: PhaseContext, trial: Trial) -> _Setup:
    """The trial's model (LoRA-wrapped or full), its encoded train and eval splits, and its scratch folder."""
    spec, side, labels = trial_spec(ctx.spec, trial), ctx.kind.model, ctx.labels
    set_seed(spec.training.seed)
    processor = side.processor(ctx.model_dir)
    try:
        model = side.load(ctx.model_dir, labels, spec.adaptation)
    except ValueError as exc:  # e.g. peft: target modules not found in the base model
        raise InvalidTrial(f"adaptation: the base model cannot take these settings: {exc}") from None
    eval_rows = ctx.read_split("eval")  # predictions on eval are generated from the rows
    train_split, eval_split = ctx.encoded("train", processor, labels), ctx.encoded("eval", processor, labels)
    features, eval_features = features_of(train_split), features_of(eval_split)
    tokens = token_counts(train_split)
    data = {"examples": len(features), "mean_tokens_per_example": sum(tokens) / len(tokens) if tokens else None}
    if spec.training.packing:  # eval loss too: per token it is the same packed or not, and faster
        eval_tokens = token_counts(eval_split)
        features, eval_features = step_rows(spec, features, tokens), step_rows(spec, eval_features, eval_tokens)
        data.update(packed_rows=len(features), tokens=sum(tokens), max_length=spec.model.max_length)
        data["row_fill"] = round(sum(tokens) / (len(features) * spec.model.max_length), 4)
        ctx.log(
            f"train: packing: {data['examples']} examples into {len(features)} rows of up to {spec.model.max_length} "
            f"tokens ({data['row_fill']:.0%} filled)"
        )
    adaptation = adaptation_summary(model)
    trainable, total = adaptation["trainable_parameters"], adaptation["total_parameters"]
    ctx.log(
        f"train: {len(features)} examples, {trainable:,} of {total:,} parameters trainable ({spec.adaptation.method}, "
        f"{len(adaptation['lora_modules'])} LoRA modules, saved in full: {adaptation['modules_to_save'] or 'none'})"
    )
    meta = {
        "trial_id": trial.id,
        "spec_sha256": ctx.spec_sha256,
        "data_version": ctx.data_version,
        "base_model_sha256": hash_base_model(ctx.model_dir).sha256,
        "env": platform_summary(environment()),
    }
    out = ctx.workdir / "trials" / trial.id
    if not is_rank():
        shutil.rmtree(out, ignore_errors=True)  # local scratch is never trusted across processes
    return _Setup(spec, processor, model, features, eval_rows, eval_features, adaptation, data, meta, out)


def _download_once_per_node(ctx: PhaseContext, trial: Trial, out: Path) -> Checkpoint | None:
    """The newest committed checkpoint that verifies (or None), downloaded once per node: the first of
    this node's ranks to take the lock downloads and records what it found in `out/resume/FOUND.json`;
    the others read that record and share the folder. `out` is fresh for each launch (the launching
    process empties the ranks' scratch), so a record never outlives its launch."""
    out.mkdir(parents=True, exist_ok=True)
    folder, found = out / "resume", out / "resume" / "FOUND.json"
    with open(out / "resume.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if found.is_file():
            record = json.loads(found.read_text())
            if record["step"] is None:
                return None
            return Checkpoint(step=record["step"], folder=Path(record["folder"]), manifest=record["manifest"])
        shutil.rmtree(folder, ignore_errors=True)
        resume = find_latest(ctx.store, checkpoint_prefix(trial.id), folder, ctx.log)
        folder.mkdir(exist_ok=True)
        record = {"step": None} if resume is None else {"step": resume.step, "folder": str(resume.folder)}
        found.write_text(json.dumps({**record, "manifest": resume.manifest if resume else None}))
        return resume


def _interruptions(ctx: PhaseContext, trial: Trial, resume: Checkpoint | None) -> list[dict]:
    """Every earlier process of this trial that stopped before its end, with the step it had reached (its
    last progress record: at most PROGRESS_EVERY_S old, so the steps lost are a lower bound when it was
    killed) and the step training resumed from."""
    try:
        progress = ctx.read_json(layout.trial_progress(trial.id))
    except ObjectNotFound:
        return []
    progress = _unless_still_written(ctx, trial, progress)
    seen = [i for i in progress.get("interruptions") or [] if isinstance(i, dict)]
    reached, resumed = progress.get("step"), resume.step if resume else 0
    if isinstance(reached, int):
        lost = max(0, reached - resumed)
        at = progress.get("at")
        seen.append({"reached_step": reached, "resumed_from_step": resumed, "lost_steps": lost, "at": at})
        ctx.log(
            f"train: the last process of this trial had reached step {reached} (recorded every "
            f"{PROGRESS_EVERY_S:.0f} s); resuming from step {resumed}: {lost} steps lost"
        )
    return seen


def _unless_still_written(ctx: PhaseContext, trial: Trial, progress: dict) -> dict:
    """The trial's progress record, once no other process writes the trial: raises Conflict when the one
    that wrote it still trains (on this node: its pid, at its start time; on another node: its record moves
    on within 2.5 x PROGRESS_EVERY_S of a recent write). Two processes training one trial would commit
    checkpoints over each other's."""
    writer = progress.get("writer") or {}
    if not isinstance(writer, dict) or writer.get("pid") == os.getpid():
        return progress
    conflict = (
        f"train: trial {trial.id} is still being trained by process {writer.get('pid')} on {writer.get('host')} "
        f"(its progress record: step {progress.get('step')}); two processes would write one trial. Stop that "
        "one (its container or node), or wait for it to end, then run again"
    )
    if writer.get("host") == socket.gethostname():
        if still_running(writer):
            raise Conflict(conflict)
        return progress
    at = progress.get("at")
    if not isinstance(at, int | float) or time.time() - at > 2.5 * PROGRESS_EVERY_S:
        return progress
    ctx.log(f"train: trial {trial.id}'s progress was recorded {time.time() - at:.0f} s ago on another node; waiting "
            "to see whether that process still writes it")  # fmt: skip
    time.sleep(max(0.0, at + 2.5 * PROGRESS_EVERY_S - time.time()))
    later = ctx.read_json(layout.trial_progress(trial.id))
    if (later.get("at"), later.get("step")) != (at, progress.get("step")):
        raise Conflict(conflict)
    return later


def _resume_point(ctx: PhaseContext, trial: Trial, setup: _Setup) -> tuple[Checkpoint | None, dict | None]:
    """The newest committed checkpoint that verifies and belongs to this job (or None), and the platform
    change since it was written (or None)."""
    started = time.monotonic()
    resume = _download_once_per_node(ctx, trial, setup.out)
    if resume is None:
        return None, None
    fetched = time.monotonic() - started
    for field in ("spec_sha256", "data_version", "base_model_sha256"):
        if resume.manifest.get(field) != setup.meta[field]:
            raise CheckpointError(
                f"checkpoint step {resume.step}: {field} differs from this job's; refusing to resume from it"
            )
    size = sum(info["size"] for info in resume.manifest["files"].values()) / 1e6
    ctx.log(
        f"train: resuming from committed checkpoint step {resume.step} ({size:,.1f} MB verified in {fetched:.1f} s)"
    )
    if resume.manifest.get("env") == setup.meta["env"]:
        return resume, None
    change = {"checkpoint": resume.manifest.get("env"), "now": setup.meta["env"]}
    ctx.log(f"train: platform change since step {resume.step}: {change}; results are flagged")
    return resume, change


def _tracking(ctx: PhaseContext, trial: Trial, setup: _Setup, resume: Checkpoint | None) -> Tracking:
    """The trial's runs in the spec's trackers, on global rank 0 (none elsewhere): continued when the trial
    has them (its tracking.json, or the resumed checkpoint's manifest), else started and described. Their
    ids go into every checkpoint manifest of this process."""
    if rank() != 0 or not setup.spec.tracking.enabled:
        return Tracking([], {}, ctx.log)
    run = RunRef(ctx.spec.job.id, trial.id, ctx.store, ctx.workdir / "tracking", "train")
    tracking = open_tracking(setup.spec.tracking, run, ctx.log, resume.manifest.get("tracking") if resume else None)
    spec_file = run.scratch / trial.id / "spec.json"
    spec_file.parent.mkdir(parents=True, exist_ok=True)
    spec_file.write_text(setup.spec.model_dump_json(indent=2))
    provenance = {f"rentune.{k}": str(setup.meta[k]) for k in ("spec_sha256", "data_version", "base_model_sha256")}
    tracking.describe_new_runs({**spec_params(setup.spec.model_dump(mode="json")), **provenance}, [spec_file])
    setup.meta["tracking"] = tracking.ids
    return tracking


def _fit(
    ctx: PhaseContext,
    trial: Trial,
    setup: _Setup,
    resume: Checkpoint | None,
    sigterm: graceful_sigterm,
    clock: StepClock,
    interruptions: list[dict],
):
    """Run the HF Trainer from `resume` to the planned end, the plan's deadline or SIGTERM (raised as
    Interrupted once the checkpoint committed). Returns the trainer and its callbacks."""
    spec = setup.spec
    deadline, _ = training_deadline(ctx)
    tracking, saver, ended = Tracking([], {}, ctx.log), None, False
    try:
        tracking = _tracking(ctx, trial, setup, resume)  # before the saver: its manifests carry the run ids
        saver = StoreCheckpointCallback(
            ctx.store,
            checkpoint_prefix(trial.id),
            setup.meta,
            spec.training.checkpoint,
            sigterm,
            ctx.log,
            deadline=deadline,
            clock=ctx.clock,
            status_key=layout.trial_commit_status(trial.id) if node_rank() == 0 else None,  # one writer: node 0
            cap_minutes=plan_checkpoint_minutes(ctx),
            progress={
                "key": layout.trial_progress(trial.id),
                "interruptions": interruptions,
                "writer": process_identity(),
            },
        )
        first_steps = FirstStepsCallback(spec.adaptation.method, ctx.device)
        divergence = DivergenceCallback()
        precision = resolve_precision(spec.training, ctx.device)
        counter = CountingCollator(ctx.kind.model.collator(setup.processor))
        context = setup.data["mean_tokens_per_example"]
        flops, parts = flops_per_token(setup.model, context) if context else (None, {})
        meter = ThroughputMeter(counter, flops, parts, *peak_flops(ctx.device, precision))
        progress = ProgressCallback(ctx.log, spec.training.log_every_steps, meter=meter)
        tracking_callbacks = [TrackingCallback(tracking, meter, ctx.device)] if tracking else []
        trainer = build_trainer(
            setup.model,
            counter,
            setup.features,
            spec.training,
            output_dir=setup.out / "trainer",
            device=ctx.device,
            loss_per=ctx.kind.task.loss,
            callbacks=[meter, progress, saver, first_steps, divergence, clock, *tracking_callbacks],
            deepspeed=deepspeed_config(spec.distribution, precision)
            if spec.distribution.strategy == "deepspeed"
            else None,
            eval_features=setup.eval_features,
            precision=precision,
        )
        try:
            trainer.train(resume_from_checkpoint=str(resume.folder) if resume else None)
        except Exception as exc:  # a full disk, wherever torch or the Trainer noticed it, is named as such
            full = disk_full(exc, setup.out, saver.checkpoint_bytes(), "a checkpoint")
            if full is None or full is exc:
                raise
            raise full from exc
        ended = not sigterm.requested.is_set()
    finally:
        if saver is not None:
            saver.finish()  # a commit in flight completes even when training fails: its checkpoint stands
        tracking.close(finished=ended)  # the report phase adds the results
    divergence.raise_if_diverged()
    if sigterm.requested.is_set() and trainer.state.global_step < trainer.state.max_steps:
        kept = (
            f"step {max(saver.committed)} is committed and the next run resumes from it"
            if saver.committed
            else "no checkpoint committed in this process; the next run resumes from the newest earlier one"
        )
        raise Interrupted(
            f"train: stopped on {sigterm.name} at step {trainer.state.global_step}/{trainer.state.max_steps}; {kept}",
            sigterm.signum,
        )
    return trainer, saver, first_steps, meter


def _reload(ctx: PhaseContext, setup: _Setup, final: Path) -> torch.nn.Module:
    """The saved weights, loaded whole by this rank alone. Under ZeRO-3 the Trainer leaves transformers'
    DeepSpeed config set, and from_pretrained would then partition the model as it builds it: collectives
    the other ranks, done with training, never join. It is unset meanwhile."""
    from transformers.integrations import deepspeed as hf_deepspeed

    held = hf_deepspeed._hf_deepspeed_config_weak_ref
    hf_deepspeed.unset_hf_deepspeed_config()
    try:
        return ctx.kind.model.load(ctx.model_dir, ctx.labels, setup.spec.adaptation, trained=final)
    finally:
        hf_deepspeed._hf_deepspeed_config_weak_ref = held


def _memory(ctx: PhaseContext, trial: Trial, peak: int | None) -> dict:
    """The first steps' peak next to the probe's prediction. The probe measured main's settings; its
    prediction applies to a variant only if they match there."""
    predicted = ctx.result("probe")["predicted_peak_bytes"]
    probed = trial.id == MAIN or all(
        getattr(trial.training, f) == getattr(ctx.spec.training, f)
        for f in ("microbatch", "activation_checkpointing", "precision")
    )
    return {
        "first_steps_peak_bytes": peak,
        "probe_predicted_peak_bytes": predicted if probed else None,
        "actual_over_predicted": peak / predicted if peak and probed else None,
    }
