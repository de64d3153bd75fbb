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
from entrypoint.job.state import read_jsonl

__all__ = ["VERIFY_TOLERANCE", "VerificationFailed", "run"]

# Largest absolute difference allowed on any metric. Non-zero only because GPU kernels are not
# bit-reproducible between processes; on CPU the observed difference is 0.
VERIFY_TOLERANCE = 0.01


class VerificationFailed(RuntimeError):
    """The checkpoint, reloaded in a fresh process, does not reproduce the end of training."""


def run(ctx: PhaseContext) -> dict:
    selected = ctx.result("evaluate")["selected"]
    ctx.store.delete("phases/verify/fresh_process.json")
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
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    for line in done.stdout.splitlines():
        ctx.log(line)
    if done.returncode != 0:
        raise VerificationFailed(
            f"verify: the fresh process failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}; "
            "nothing is exported"
        )
    fresh = ctx.read_json("phases/verify/fresh_process.json")
    rows = ctx.read_split("eval")
    at_end_outputs = [
        r["output"] for r in read_jsonl(ctx.store.get_bytes(f"trials/{selected}/eval_outputs_at_end.jsonl"))
    ]
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
