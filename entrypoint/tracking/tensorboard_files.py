"""TensorBoard: event files written on this node and copied into the store under trials/<id>/tensorboard/,
so `rentune fetch` brings them and `tensorboard --logdir` reads one run per trial.

Each process writes its own event file. A training process starts its file with a purge at step 1, which
hides every step the earlier files of the trial hold, and replays the whole Trainer log before logging on:
whatever a killed attempt wrote (and however much of it reached the store), the run reads as one, each
step once. Copies to the store run in a background thread, at most one at a time, so training never waits
for them; a failed copy is retried by the next; `close` makes the last.
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

from entrypoint.job import layout
from entrypoint.tracking.base import RunRef

__all__ = ["CLOSE_WAIT_S", "FAILED_COPIES", "TensorBoardFiles"]

FAILED_COPIES = 3  # copies to the store failing in a row before TensorBoard is dropped with a warning
CLOSE_WAIT_S = 60.0  # for a copy still running at the end


class TensorBoardFiles:
    name = "tensorboard"

    def __init__(self):
        self.writer = None
        self.folder: Path | None = None
        self.store = None
        self.prefix = ""
        self._upload: threading.Thread | None = None
        self.error: BaseException | None = None  # the last copy's, if it failed
        self.failures = 0  # copies failed in a row

    def open(self, run: RunRef, ids: dict | None) -> dict:
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

        self.store, self.prefix = run.store, layout.trial_tensorboard(run.trial_id)
        self.folder = run.scratch / "tensorboard" / run.trial_id / uuid.uuid4().hex[:8]  # this process's files
        self.folder.mkdir(parents=True)
        purge = 1 if run.phase == "train" else None
        self.writer = SummaryWriter(str(self.folder), purge_step=purge, flush_secs=30)
        return {"prefix": self.prefix}

    def logged_steps(self, keys: list[str]) -> dict[str, int]:
        return {}  # this file purged all earlier steps: the replay writes them all again

    def log_params(self, params: dict[str, str]) -> None:
        rows = "\n".join(f"| {k} | {v.replace('|', '/')} |" for k, v in params.items())
        self.writer.add_text("rentune/params", "| parameter | value |\n|---|---|\n" + rows, global_step=0)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, global_step=step)

    def log_summary(self, values: dict[str, str]) -> None:
        rows = "\n".join(f"| {k} | {v} |" for k, v in values.items())
        self.writer.add_text("rentune/summary", "| | |\n|---|---|\n" + rows)

    def log_files(self, files: list[Path]) -> None:
        pass  # the report sits beside the event files in the store already

    def sync(self) -> None:
        """Flush and copy this process's event files to the store in the background (skipped while the
        previous copy still runs). A failed copy is retried by the next sync; raises after
        FAILED_COPIES in a row."""
        if self.failures >= FAILED_COPIES:
            raise RuntimeError(f"{FAILED_COPIES} copies of the event files to the store failed: {self.error}")
        if self._upload is not None and self._upload.is_alive():
            return
        self.writer.flush()
        self._upload = threading.Thread(target=self._copy, name="tensorboard-upload", daemon=True)
        self._upload.start()

    def _copy(self) -> None:
        try:
            for path in sorted(self.folder.iterdir()):
                self.store.put_file(f"{self.prefix}/{path.name}", path)
        except Exception as exc:  # retried by the next sync
            self.error, self.failures = exc, self.failures + 1
        else:
            self.error, self.failures = None, 0

    def close(self, finished: bool) -> None:
        if self._upload is not None:
            self._upload.join(timeout=CLOSE_WAIT_S)
        self.writer.close()
        if self._upload is not None and self._upload.is_alive():
            raise TimeoutError(f"a copy of the event files to the store still runs after {CLOSE_WAIT_S:.0f} s")
        self._copy()  # the final copy, whatever the earlier ones did
        if self.error is not None:
            raise self.error
