"""A torchrun worker: rebuild the job context from the store and run the train phase on this rank.

    torchrun ... -m entrypoint.train_worker --store URI --job JOB_ID --workdir DIR --trial ID [--endpoint-url URL ...]

Rank 0 writes the trial's result to `trials/<trial>/train_result.json`; the launching process commits it.
Exit code 143 when stopped by SIGTERM (checkpoint committed if the grace allowed).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from entrypoint.context import PhaseContext, dumps
from entrypoint.distributed import rank
from entrypoint.phases import train
from entrypoint.runner import job_store
from entrypoint.store import open_store
from entrypoint.trainer import EXIT_INTERRUPTED, Interrupted
from jobspec.experiments import resolve_trials
from jobspec.load import parse_spec


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="entrypoint.train_worker")
    parser.add_argument("--store", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--workdir", required=True, type=Path)
    parser.add_argument("--trial", required=True)
    parser.add_argument("--endpoint-url")
    parser.add_argument("--region")
    parser.add_argument("--addressing-style")
    args = parser.parse_args(argv)
    import transformers

    transformers.logging.set_verbosity_error()  # as in the CLI: rentune reports what matters itself
    transformers.logging.disable_progress_bar()
    root = open_store(
        args.store, endpoint_url=args.endpoint_url, region=args.region, addressing_style=args.addressing_style
    )
    store = job_store(root, args.job)
    loaded = parse_spec(store.get_bytes("spec.yaml").decode(), source=f"{store.uri}/spec.yaml")
    me = rank()

    def log(message: str) -> None:
        if me == 0:
            print(message, flush=True)

    ctx = PhaseContext(loaded.spec, loaded.sha256, store, args.workdir, log)
    try:
        trial = {t.id: t for t in resolve_trials(loaded.spec)}[args.trial]
        result = train.train_trial(ctx, trial)
    except Interrupted as exc:
        log(f"rentune: {exc}")
        return EXIT_INTERRUPTED
    if me == 0:
        store.put_bytes(train.worker_result_key(args.trial), dumps(result))
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():  # a clean teardown; DeepSpeed on gloo can abort without
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
