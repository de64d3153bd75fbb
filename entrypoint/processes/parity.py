"""The parity process of a merged export: nothing shared with the process that merged but the store.

    python -m entrypoint.processes.parity --store URI --job JOB_ID --workdir DIR --trial ID \
        [--endpoint-url URL ...]

Downloads export/adapter/ and export/merged/ as stored, runs trial/parity.py and writes
`phases/export/parity.json`; the export reads it. Exit code 0 when the record was written (whatever it
says), 1 with the reason on stderr otherwise.
"""

from __future__ import annotations

import shutil
import sys

from entrypoint.context import subprocess_context
from entrypoint.job import layout
from entrypoint.job.state import dumps
from entrypoint.store import get_tree
from entrypoint.training.lifeline import die_with_parent
from entrypoint.trial.parity import parity


def main(argv: list[str] | None = None) -> int:
    die_with_parent()  # never outlive the process that started this one (lifeline.py)

    def log(message: str) -> None:
        print(f"parity: {message}", flush=True)

    ctx, trial_id = subprocess_context("entrypoint.processes.parity", argv, log)
    folders = {name: ctx.workdir / name for name in ("adapter", "merged")}
    for name, folder in folders.items():
        shutil.rmtree(folder, ignore_errors=True)
        get_tree(ctx.store, layout.export_file(name), folder)
        if not any(folder.iterdir()):
            print(f"parity: export/{name}/ is empty in the store", file=sys.stderr, flush=True)
            return 1
    result = parity(ctx, trial_id, folders["adapter"], folders["merged"], log)
    ctx.store.put_bytes(layout.PARITY, dumps(result))
    for folder in folders.values():
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
