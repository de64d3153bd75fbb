"""A torchrun worker: rebuild the job context from the store and run the train phase on this rank.

    torchrun ... -m entrypoint.training.worker --store URI --job JOB_ID --workdir DIR --trial ID \
        [--endpoint-url URL ...]

Rank 0 writes the trial's result to `trials/<trial>/train_result.json`; the launching process commits it.
Exit code 143 when stopped by SIGTERM (checkpoint committed if the grace allowed).
"""

from __future__ import annotations

import sys

from entrypoint.context import subprocess_context
from entrypoint.errors import EXIT_INTERRUPTED, Interrupted
from entrypoint.job.state import dumps, worker_result_key
from entrypoint.phases import train
from entrypoint.training.distributed import rank
from jobspec.experiments import resolve_trials


def main(argv: list[str] | None = None) -> int:
    me = rank()

    def log(message: str) -> None:
        if me == 0:
            print(message, flush=True)

    ctx, trial_id = subprocess_context("entrypoint.training.worker", argv, log)
    try:
        trial = {t.id: t for t in resolve_trials(ctx.spec)}[trial_id]
        result = train.train_trial(ctx, trial)
    except Interrupted as exc:
        log(f"rentune: {exc}")
        return EXIT_INTERRUPTED
    if me == 0:
        ctx.store.put_bytes(worker_result_key(trial_id), dumps(result))
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():  # a clean teardown; DeepSpeed on gloo can abort without
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
