"""Verify phase: before anything is exported, a fresh process (a real subprocess, sharing nothing with the
trainer but the store) downloads the selected trial's final checkpoint, verifies its manifest, reloads the
model and re-runs the eval split (the recheck process,
entrypoint/processes/recheck.py). Its metrics must equal those of the outputs
recorded at the end of training within VERIFY_TOLERANCE, or the job fails loudly and nothing is exported.
"""

from __future__ import annotations

import subprocess
import sys

from entrypoint.context import PhaseContext
from entrypoint.job import layout
from entrypoint.job.state import read_jsonl
from entrypoint.store import StoreError
from entrypoint.store.checkpoint import checkpoint_prefix
from entrypoint.training.disk import child_failed, last_error_line
from entrypoint.training.lifeline import dies_with_parent

__all__ = ["VERIFY_TOLERANCE", "VerificationFailed", "run"]

# Largest absolute difference allowed on any metric. Non-zero only because GPU kernels are not
# bit-reproducible between processes; on CPU the observed difference is 0.
VERIFY_TOLERANCE = 0.01


class VerificationFailed(RuntimeError):
    """The checkpoint, reloaded in a fresh process, does not reproduce the end of training."""


def _checkpoint_bytes(ctx: PhaseContext, trial_id: str) -> int | None:
    """The size of the trial's newest checkpoint (what the fresh process downloads), or None: unknown."""
    prefix = checkpoint_prefix(trial_id)
    sizes: dict[int, int] = {}
    try:
        for info in ctx.store.list(prefix):
            step = info.key[len(prefix) + 1 :].partition("/")[0]
            if step.startswith("step-") and step[5:].isdigit():
                sizes[int(step[5:])] = sizes.get(int(step[5:]), 0) + info.size
    except StoreError:
        return None
    return sizes[max(sizes)] if sizes else None


def run(ctx: PhaseContext) -> dict:
    selected = ctx.result("evaluate")["selected"]
    ctx.store.delete(layout.VERIFY_FRESH_PROCESS)
    command = [
        sys.executable,
        "-m",
        "entrypoint.processes.recheck",
        *ctx.store_args,
        "--workdir",
        str(ctx.workdir / "verify"),
        "--trial",
        selected,
    ]
    ctx.log(f"verify: reloading trial {selected}'s final checkpoint in a fresh process")
    done = subprocess.run(command, capture_output=True, text=True, check=False, preexec_fn=dies_with_parent)
    for line in done.stdout.splitlines():
        ctx.log(line)
    if done.returncode != 0:
        needed = _checkpoint_bytes(ctx, selected)
        full = child_failed(done, "verify", ctx.workdir / "verify", ctx.log, needed, "its copy of the checkpoint")
        if full is not None:
            raise full
        raise VerificationFailed(
            f"verify: the fresh process failed (exit {done.returncode}): {last_error_line(done)} (its whole "
            "stderr is in the attempt's log); nothing is exported"
        )
    fresh = ctx.read_json(layout.VERIFY_FRESH_PROCESS)
    rows = ctx.read_split("eval")
    at_end_outputs = [r["output"] for r in read_jsonl(ctx.store.get_bytes(layout.trial_outputs_at_end(selected)))]
    at_end = ctx.kind.task.score(rows, at_end_outputs, ctx.labels)["metrics"]
    differences = {name: abs(fresh["metrics"][name] - value) for name, value in at_end.items()}
    worst = max(differences, key=differences.get)
    if differences[worst] > VERIFY_TOLERANCE:
        raise VerificationFailed(
            f"verify: trial {selected} reloaded in a fresh process gives {worst} {fresh['metrics'][worst]:.4f}, "
            f"{at_end[worst]:.4f} at the end of training (tolerance {VERIFY_TOLERANCE}); nothing is exported"
        )
    ctx.log(
        f"verify: trial {selected}, checkpoint step {fresh['checkpoint_step']}: every metric within "
        f"{VERIFY_TOLERANCE} of the end of training (largest difference {differences[worst]:.2g}, {worst})"
    )
    return {
        "trial_id": selected,
        "checkpoint_step": fresh["checkpoint_step"],
        "fresh_process_pid": fresh["pid"],
        "tolerance": VERIFY_TOLERANCE,
        "largest_difference": {"metric": worst, "value": differences[worst]},
        "outputs_equal": fresh["outputs"] == at_end_outputs,
        "metrics": fresh["metrics"],
    }
