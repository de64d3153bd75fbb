"""Weights & Biases: one run per trial (grouped by job) in the spec's project, continued by id with
`resume="allow"` after a resume on any node. The API key, the mode (WANDB_MODE=offline) and the folder
(WANDB_DIR; default: this process's scratch) come from W&B's own environment variables, never the spec.

Online, W&B's server says which step a continued run reached. Offline there is no server: the steps a
continued run holds are read from the offline files of earlier attempts under the same WANDB_DIR (a volume
that outlives the node). Only what W&B's service wrote to disk counts: a SIGKILLed process loses the records
the service still buffered, and the next attempt logs them again from the Trainer's log. `wandb sync` then
uploads the attempts' offline folders into the one run.
"""

from __future__ import annotations

import os
import struct
import uuid
from pathlib import Path

from entrypoint.tracking.base import RunRef
from jobspec.schema import WandbTracking

__all__ = ["WandbRuns"]

INIT_TIMEOUT_S = 60  # an unreachable server is a warning after this long, not a stalled job


class WandbRuns:
    name = "wandb"

    def __init__(self, config: WandbTracking):
        self.config = config
        self.run = None
        self.folder: Path | None = None

    def open(self, run: RunRef, ids: dict | None) -> dict:
        import wandb

        run_id = (ids or {}).get("id") or uuid.uuid4().hex[:12]
        # WANDB_DIR is W&B's own setting (read here because an explicit `dir` would override it).
        folder = self.folder = Path(os.environ.get("WANDB_DIR") or run.scratch)
        folder.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=self.config.project,
            entity=self.config.entity,
            id=run_id,
            resume="allow",
            name=run.name,
            group=run.job_id,
            job_type=run.phase,
            dir=str(folder),
            reinit="create_new",
            settings=wandb.Settings(console="off", silent=True, init_timeout=INIT_TIMEOUT_S),
        )
        return {"id": run_id, "project": self.config.project, "entity": self.config.entity}

    def logged_steps(self, keys: list[str]) -> dict[str, int]:
        if self.run.settings._offline:
            held = offline_steps(self.folder / "wandb", self.run.id)
            return {k: v for k, v in held.items() if k in keys}
        last = self.run.step - 1  # online: the server's step for a continued run, 0 for a new one
        return dict.fromkeys(keys, last) if last >= 0 else {}

    def log_params(self, params: dict[str, str]) -> None:
        self.run.config.update(params, allow_val_change=True)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        if step < self.run.step:
            # A continued online run stands at the server's last step + 1, and W&B drops a step below it:
            # results logged at a trial's last step (the report phase) go to the run's summary instead.
            self.run.summary.update(metrics)
            return
        self.run.log(metrics, step=step)

    def log_summary(self, values: dict[str, str]) -> None:
        self.run.summary.update({f"rentune/{k}": v for k, v in values.items()})

    def log_files(self, files: list[Path]) -> None:
        for path in files:
            self.run.save(str(path), base_path=str(path.parent), policy="now")

    def sync(self) -> None:
        pass  # W&B's service sends as it goes

    def close(self, finished: bool) -> None:
        self.run.finish(exit_code=0 if finished else 1)


def offline_steps(folder: Path, run_id: str) -> dict[str, int]:
    """Per metric, the last step the offline runs of `run_id` in `folder` hold on disk."""
    from wandb.proto.wandb_internal_pb2 import Record

    held: dict[str, int] = {}
    for path in folder.glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"):
        for chunk in _log_records(path.read_bytes()):
            record = Record()
            record.ParseFromString(chunk)
            if record.WhichOneof("record_type") == "history":
                step = record.history.step.num
                for item in record.history.item:
                    key = item.key or "/".join(item.nested_key)
                    if not key.startswith("_"):
                        held[key] = max(held.get(key, step), step)
    return held


def _log_records(data: bytes):
    """The records of W&B's transaction log (LevelDB's log format after a 7-byte `:W&B` header: 32 KiB
    blocks of chunks, each `crc32 u32, length u16, type u8` then its bytes; type 1 a whole record, 2/3/4 its
    first/middle/last piece). A tail cut off by a kill ends the scan."""
    block, pos, pending = 32 * 1024, 7, b""
    if data[:4] != b":W&B":
        return
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's last bytes, too few for a header, are padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:  # zeros up to the block's end
            pos += block - pos % block
            continue
        if pos + 7 + length > len(data):  # the end of what reached the disk
            break
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            yield pending
            pending = b""
