"""`rentune fetch`: a job's report, export metadata and TensorBoard event files, copied from the store to
a local folder.

    DEST/report/...                     results.json, report.md, plots
    DEST/export/...                     BINDING.json, spec, results (export/adapter/ only when asked)
    DEST/tensorboard/<trial>/<file>     one run per trial: `tensorboard --logdir DEST/tensorboard`

Event files come while the job still trains; a fetch again replaces each file whole.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from entrypoint.errors import InvalidInput
from entrypoint.job import layout
from entrypoint.job.state import stored_spec
from entrypoint.store import InvalidKey, Store
from jobspec.experiments import resolve_trials

__all__ = ["Fetched", "fetch_job"]


@dataclass(frozen=True)
class Fetched:
    files: int  # written under the destination
    report: bool  # report/ or export/ files among them (else TensorBoard event files only)
    tensorboard: bool  # event files among them


def fetch_job(store: Store, dest: Path, with_adapter: bool = False, with_merged: bool = False) -> Fetched:
    """Copy the job's files from `store` (the job's own prefix, `job_store(root, job_id)`) under `dest`.
    Raises InvalidInput when there is nothing to fetch yet, InvalidKey (naming it) for a stored name that is
    not a safe key; then nothing is written."""
    try:  # every name is checked before anything is written
        keys = [info.key for prefix in (layout.REPORT, layout.EXPORT) for info in store.list(prefix)]
        trials = [trial.id for trial in resolve_trials(stored_spec(store).spec)] if store.head(layout.SPEC) else []
        events = [info.key for trial in trials for info in store.list(layout.trial_tensorboard(trial))]
    except InvalidKey as exc:
        raise InvalidKey(
            f"{exc}; nothing was fetched: one name that could point outside {dest} refuses the whole download "
            "(the other files are intact in the store)"
        ) from None
    keys = [k for k in keys if with_adapter or not k.startswith(layout.EXPORT_ADAPTER + "/")]
    # the merged folder is the whole model: only on demand
    keys = [k for k in keys if with_merged or not k.startswith(layout.EXPORT_MERGED + "/")]
    if not keys and not events:
        raise InvalidInput(f"{store.uri}: no report yet (the job has not reached its report phase)")
    targets = {key: dest / key for key in keys}
    targets.update({key: dest / "tensorboard" / key.split("/")[1] / key.split("/")[-1] for key in events})
    for key, target in targets.items():
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".partial")
        partial.write_bytes(store.get_bytes(key))
        os.replace(partial, target)  # a fetch again while the job trains replaces each file whole
    return Fetched(files=len(targets), report=bool(keys), tensorboard=bool(events))
