"""A torchrun rank: rebuild the job context from the store and train the trial on this rank.

    torchrun ... -m entrypoint.processes.rank --store URI --job JOB_ID --workdir DIR --trial ID \
        [--endpoint-url URL ...]

Rank 0 writes the trial's result to `trials/<trial>/train_result.json`; the launching process commits it.
Exit code 143 when stopped by SIGTERM (checkpoint committed if the grace allowed). A rank that runs out
of memory writes the trial's result as invalid instead and exits 1, which makes torchrun stop the rest.
"""

from __future__ import annotations

import contextlib
import sys

from entrypoint.context import subprocess_context
from entrypoint.errors import EXIT_FAILED, EXIT_INTERRUPTED, Interrupted
from entrypoint.job import layout
from entrypoint.job.state import dumps
from entrypoint.store import ObjectExists
from entrypoint.training.disk import disk_full
from entrypoint.training.distributed import node_rank, rank
from entrypoint.training.lifeline import die_with_parent
from entrypoint.training.memory import is_oom
from entrypoint.trial.train import train_trial
from jobspec.experiments import resolve_trials


def main(argv: list[str] | None = None) -> int:
    die_with_parent()  # never outlive the process that started this one (lifeline.py)
    me = rank()

    def log(message: str) -> None:
        if me == 0:
            print(message, flush=True)

    ctx, trial_id = subprocess_context("entrypoint.processes.rank", argv, log)
    try:
        trial = {t.id: t for t in resolve_trials(ctx.spec)}[trial_id]
        result = train_trial(ctx, trial)
    except Interrupted as exc:
        log(f"rentune: {exc}")
        return EXIT_INTERRUPTED
    except Exception as exc:
        full = disk_full(exc, ctx.workdir)
        if full is not None and full is not exc:
            raise full from exc
        if not is_oom(exc):
            raise
        return _out_of_memory(ctx, trial_id, me, exc)
    if me == 0:
        ctx.store.put_bytes(layout.trial_rank_result(trial_id), dumps(result))
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():  # a clean teardown; DeepSpeed on gloo can abort without
        dist.barrier()
        dist.destroy_process_group()
    return 0


def _out_of_memory(ctx, trial_id: str, me: int, exc: BaseException) -> int:
    """This rank ran out of memory: record the trial as invalid (the first rank to say so wins) and exit
    non-zero. torchrun then stops this node's other ranks; ranks on other nodes fail at their next
    collective without this one (at once with gloo, as tested; NCCL may wait for its timeout), and their
    torchrun ends too. The launching process reads the record and goes on with the next trial."""
    reason = f"out of memory on rank {me} (node {node_rank()}): {exc}"
    print(f"rentune: {reason}", flush=True)
    record = {"status": "invalid", "reason": reason, "evaluable": False}
    with contextlib.suppress(ObjectExists):
        ctx.store.put_if_absent(layout.trial_rank_result(trial_id), dumps(record))
    return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
