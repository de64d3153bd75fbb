"""What every phase receives: the frozen spec, the job's store and a local scratch folder."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from entrypoint.store import Store
from jobspec.schema import JobSpec

__all__ = ["PhaseContext", "dumps", "read_jsonl", "to_jsonl"]


def dumps(obj: Any) -> bytes:
    """Stable JSON bytes for the store: sorted keys, indented, trailing newline."""
    return (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def to_jsonl(rows: Iterable[dict]) -> bytes:
    return "".join(json.dumps(row, sort_keys=True, ensure_ascii=False) + "\n" for row in rows).encode()


def read_jsonl(data: bytes) -> list[dict]:
    return [json.loads(line) for line in data.decode().splitlines() if line.strip()]


@dataclass(frozen=True)
class PhaseContext:
    spec: JobSpec
    spec_sha256: str
    store: Store  # confined to jobs/<job_id>/
    workdir: Path  # local scratch for this process; may be empty on a fresh node
    log: Callable[[str], None]
    store_args: tuple[str, ...] = ()  # how a torchrun worker reopens this job's store (see train_worker)
    root: Store | None = None  # the whole store: the sealed-test record spans jobs
    reopen_test: str | None = None  # the user's reason to open an already opened test split again
    clock: Callable[[], float] = time.time  # wall clock for deadlines; tests inject a fake one

    def read_json(self, key: str) -> Any:
        return json.loads(self.store.get_bytes(key))

    def write_json(self, key: str, obj: Any) -> None:
        self.store.put_bytes(key, dumps(obj))

    def read_split(self, name: str) -> list[dict]:
        """A split as the data phase committed it: rows of {"text", "label"}, {"prompt", "response", "label"},
        or for images {"image", "sha256", "label"} plus "path", the image downloaded into the work dir (its
        sha256 checked), so that any node can train from the store alone."""
        rows = read_jsonl(self.store.get_bytes(f"phases/data/{name}.jsonl"))
        if self.spec.data.modality == "image":
            folder = self.workdir / "images"
            folder.mkdir(parents=True, exist_ok=True)
            for row in rows:
                local = folder / row["image"]
                if not local.is_file():
                    data = self.store.get_bytes(f"phases/data/images/{row['image']}")
                    if hashlib.sha256(data).hexdigest() != row["sha256"]:
                        raise ValueError(f"phases/data/images/{row['image']}: content does not match its sha256")
                    # a unique temp name: the ranks of a torchrun job share this folder
                    handle, partial = tempfile.mkstemp(dir=folder, suffix=".partial")
                    with os.fdopen(handle, "wb") as out:
                        out.write(data)
                    os.replace(partial, local)
                row["path"] = str(local)
        return rows

    @property
    def labels(self) -> list[str]:
        return self.read_json("phases/data/result.json")["labels"]

    @property
    def device(self) -> torch.device:
        wanted = self.spec.training.device
        if wanted == "auto":
            wanted = "cuda" if torch.cuda.is_available() else "cpu"  # ROCm builds report as cuda too
        if wanted == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("training.device: 'cuda' requested but torch sees no CUDA or ROCm device")
        return torch.device(wanted)
