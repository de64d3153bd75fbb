"""Train phase: fit the adapter (or the full model) on the train split with the HF Trainer.

Checkpoints are committed to the store during training (every N steps and/or minutes, on SIGTERM and at
the end). A process that starts this phase again, on any node, resumes from the newest checkpoint that
verifies, with optimizer, scheduler, RNG states and data position, so the run continues as if never
stopped. At the end the trained weights and the eval predictions they give are committed, for the
evaluate phase to check against.
"""

from __future__ import annotations

import shutil

from transformers import AutoTokenizer, set_seed

from entrypoint.checkpoint import CheckpointError, checkpoint_prefix, find_latest
from entrypoint.classify import predict_labels
from entrypoint.context import PhaseContext, to_jsonl
from entrypoint.distributed import deepspeed_config, is_worker, needs_launch, rank, run_torchrun, torchrun_command
from entrypoint.envinfo import environment, platform_summary
from entrypoint.model import adaptation_summary, build_model, hash_base_model, load_trained, resolve_model_dir
from entrypoint.preprocess import collator, encode_rows, is_causal, prepare_tokenizer
from entrypoint.store import put_tree
from entrypoint.trainer import (
    EXIT_INTERRUPTED,
    FirstStepsCallback,
    Interrupted,
    ProgressCallback,
    StoreCheckpointCallback,
    build_trainer,
    graceful_sigterm,
)

__all__ = ["TRIAL_ID", "WORKER_RESULT", "run"]

TRIAL_ID = "main"  # one trial until the spec grows `experiments:`
WORKER_RESULT = f"trials/{TRIAL_ID}/train_result.json"  # written by torchrun's rank 0 for the launcher


def _checkpoint_meta(ctx: PhaseContext, base_sha256: str) -> dict:
    env = environment()
    return {
        "trial_id": TRIAL_ID,
        "spec_sha256": ctx.spec_sha256,
        "data_version": ctx.read_json("phases/data/result.json")["data_version"],
        "base_model_sha256": base_sha256,
        "env": platform_summary(env),
    }


def _launch(ctx: PhaseContext) -> dict:
    """Run this phase in `nproc_per_node` torchrun workers and return rank 0's result."""
    distribution = ctx.spec.distribution
    ctx.store.delete(WORKER_RESULT)
    shutil.rmtree(ctx.workdir / "workers", ignore_errors=True)
    command = torchrun_command(distribution, [*ctx.store_args, "--workdir", str(ctx.workdir / "workers")])
    ctx.log(f"train: launching {distribution.nproc_per_node} x {distribution.nnodes} processes with torchrun")
    code, terminated = run_torchrun(command, ctx.spec.training.checkpoint.grace_seconds, ctx.log)
    if terminated or code == EXIT_INTERRUPTED:
        raise Interrupted(f"train: torchrun workers stopped on SIGTERM (exit {code}); resume continues from the store")
    if code != 0:
        raise RuntimeError(f"train: torchrun exited with code {code}; the workers' output above says why")
    result = ctx.read_json(WORKER_RESULT)
    return {**result, "launcher": "torchrun", "processes": distribution.nproc_per_node * distribution.nnodes}


def run(ctx: PhaseContext) -> dict:
    spec = ctx.spec
    if needs_launch(spec.distribution):
        return _launch(ctx)
    set_seed(spec.training.seed)
    folder = resolve_model_dir(spec.model)
    labels = ctx.labels
    causal = is_causal(spec)
    tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(folder), causal)
    model = build_model(folder, causal, labels, spec.adaptation)
    features = [e.features for e in encode_rows(tokenizer, ctx.read_split("train"), spec, labels)]
    adaptation = adaptation_summary(model)
    trainable, total = adaptation["trainable_parameters"], adaptation["total_parameters"]
    ctx.log(
        f"train: {len(features)} examples, {trainable:,} of {total:,} parameters trainable ({spec.adaptation.method}, "
        f"{len(adaptation['lora_modules'])} LoRA modules, saved in full: {adaptation['modules_to_save'] or 'none'})"
    )

    meta = _checkpoint_meta(ctx, hash_base_model(folder).sha256)
    prefix = checkpoint_prefix(TRIAL_ID)
    out = ctx.workdir / "trials" / TRIAL_ID  # shared by the ranks of one node under torchrun
    if not is_worker():
        shutil.rmtree(out, ignore_errors=True)  # local scratch is never trusted across processes
    resume_dir = out / f"resume-rank{rank()}"
    shutil.rmtree(resume_dir, ignore_errors=True)
    resume = find_latest(ctx.store, prefix, resume_dir, ctx.log)
    platform_change = None
    if resume is not None:
        for field in ("spec_sha256", "data_version", "base_model_sha256"):
            if resume.manifest.get(field) != meta[field]:
                raise CheckpointError(
                    f"checkpoint step {resume.step}: {field} differs from this job's; refusing to resume from it"
                )
        ctx.log(f"train: resuming from committed checkpoint step {resume.step}")
        if resume.manifest.get("env") != meta["env"]:
            platform_change = {"checkpoint": resume.manifest.get("env"), "now": meta["env"]}
            ctx.log(f"train: platform change since step {resume.step}: {platform_change}; results are flagged")

    with graceful_sigterm(spec.training.checkpoint.grace_seconds, ctx.log) as sigterm:
        saver = StoreCheckpointCallback(ctx.store, prefix, meta, spec.training.checkpoint, sigterm, ctx.log)
        zero3 = spec.distribution.strategy == "deepspeed" and spec.distribution.zero_stage == 3
        first_steps = FirstStepsCallback(spec.adaptation.method, ctx.device, check_parameters=not zero3)
        trainer = build_trainer(
            model,
            collator(tokenizer, causal),
            features,
            spec.training,
            out / "trainer",
            ctx.device.type == "cpu",
            [ProgressCallback(ctx.log), saver, first_steps],
            token_normalized_loss=causal,
            deepspeed=deepspeed_config(spec.distribution, spec.training.precision)
            if spec.distribution.strategy == "deepspeed"
            else None,
        )
        outcome = trainer.train(resume_from_checkpoint=str(resume.folder) if resume else None)
        if sigterm.requested.is_set() and trainer.state.global_step < trainer.state.max_steps:
            raise Interrupted(
                f"train: stopped on SIGTERM at step {trainer.state.global_step}/{trainer.state.max_steps}; "
                f"committed checkpoints: {saver.committed or 'none in this process'}"
            )

    final = out / "final"
    trainer.save_model(str(final))  # every rank takes part (ZeRO-3 gathers); the main process writes
    if not trainer.is_world_process_zero():
        return {}
    tokenizer.save_pretrained(final)
    keys = put_tree(ctx.store, f"trials/{TRIAL_ID}/final", final)

    # Workers of a sharded run hold only part of the weights: predict from the saved ones there.
    model = trainer.model if not is_worker() else load_trained(folder, final, labels, spec.adaptation.method)
    eval_rows = ctx.read_split("eval")
    predicted = predict_labels(
        model,
        tokenizer,
        [r["text"] for r in eval_rows],
        labels,
        spec.model.max_length,
        spec.training.eval_batch,
        ctx.device,
    )
    ctx.store.put_bytes(
        f"trials/{TRIAL_ID}/eval_predictions_at_end.jsonl", to_jsonl({"predicted": p} for p in predicted)
    )
    probe_peak = ctx.read_json("phases/probe/result.json")["predicted_peak_bytes"]
    return {
        "trial_id": TRIAL_ID,
        "world_size": trainer.args.world_size,
        "parameter_check": {"passed": first_steps.check.done, **first_steps.check.summary()}
        if first_steps.check
        else {"passed": None, "skipped": "ZeRO-3 partitions parameters; the probe's check covers the model"},
        "memory": {
            "first_steps_peak_bytes": first_steps.peak_bytes,
            "probe_predicted_peak_bytes": probe_peak,
            "actual_over_predicted": first_steps.peak_bytes / probe_peak if first_steps.peak_bytes else None,
        },
        "steps": trainer.state.global_step,
        "resumed_from_step": resume.step if resume else None,
        "platform_change": platform_change,
        "train_loss": outcome.training_loss,
        "losses": [{"step": e["step"], "loss": e["loss"]} for e in trainer.state.log_history if "loss" in e],
        "checkpoints_committed": saver.committed,
        "adaptation": adaptation,
        "weights": keys,
    }
