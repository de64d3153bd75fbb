"""The recheck process of the verify phase: nothing shared with the trainer but the store.

    python -m entrypoint.processes.recheck --store URI --job JOB_ID --workdir DIR --trial ID \
        [--endpoint-url URL ...]

Runs trial/recheck.py and writes `phases/verify/fresh_process.json`; the verify phase compares it with
the end of training. Exit code 0 when the record was written, 1 with the reason on stderr otherwise.
"""

from __future__ import annotations

import sys

from entrypoint.context import subprocess_context
from entrypoint.job import layout
from entrypoint.job.state import dumps
from entrypoint.training.lifeline import die_with_parent
from entrypoint.trial.recheck import RecheckError, recheck


def main(argv: list[str] | None = None) -> int:
    die_with_parent()  # never outlive the process that started this one (lifeline.py)

    def log(message: str) -> None:
        print(f"verify: {message}", flush=True)

    ctx, trial_id = subprocess_context("entrypoint.processes.recheck", argv, log)
    try:
        result = recheck(ctx, trial_id, log)
    except RecheckError as exc:
        print(f"verify: {exc}", file=sys.stderr, flush=True)
        return 1
    ctx.store.put_bytes(layout.VERIFY_FRESH_PROCESS, dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
