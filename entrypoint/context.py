"""What every phase receives: the frozen spec, its kind of job, the job's store and a local scratch folder."""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from entrypoint.data.tokens import open_tokens
from entrypoint.job import layout
from entrypoint.job.state import dumps, job_store, read_json, read_jsonl, stored_spec
from entrypoint.kinds import Kind, kind_for
from entrypoint.store import ObjectNotFound, Store, open_store
from entrypoint.training.device import resolve_device, resolve_precision
from entrypoint.training.model import resolve_model_dir
from jobspec.compare import with_locations
from jobspec.schema import JobSpec

__all__ = ["PhaseContext", "subprocess_context"]


@dataclass(frozen=True)
class PhaseContext:
    spec: JobSpec
    spec_sha256: str
    store: Store  # confined to jobs/<job_id>/
    workdir: Path  # local scratch for this process; may be empty on a fresh node
    log: Callable[[str], None]
    store_args: tuple[str, ...] = ()  # how a process of processes/ reopens this job's store
    root: Store | None = None  # the whole store: the sealed-test record spans jobs
    reopen_test: str | None = None  # the user's reason to open an already opened test split again
    clock: Callable[[], float] = time.time  # wall clock for deadlines; tests inject a fake one
    attempt: int = 0  # this process's attempt number (0: a subprocess of one)
    # What the running phase measured for the plan (`timed`): name -> seconds, summed; the runner stores
    # them in the phase's result as `timings` and empties them before the next phase.
    timings: dict[str, float] = field(default_factory=dict)

    @contextlib.contextmanager
    def timed(self, name: str):
        """Add the seconds the block takes to `timings[name]` (entrypoint/job/plan.py reads them)."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.timings[name] = round(self.timings.get(name, 0.0) + time.perf_counter() - started, 4)

    def count(self, name: str, n: int = 1) -> None:
        """Add `n` to `timings[name]`: how many examples, loads or judgements the seconds cover."""
        self.timings[name] = self.timings.get(name, 0) + n

    @functools.cached_property
    def kind(self) -> Kind:
        """The job's data, model and task sides (kinds/)."""
        return kind_for(self.spec, self.log, self.recorded_quantization)

    def recorded_quantization(self) -> dict | None:
        """QLoRA: the quantized base's record in base_model.json (training/quantize.py), None if none."""
        try:
            return self.read_json(layout.BASE_MODEL).get("quantized")
        except ObjectNotFound:
            return None

    @functools.cached_property
    def model_dir(self) -> Path:
        """The base model's local folder (model.path, model.package or the hub cache)."""
        return resolve_model_dir(self.spec.model, self.spec.store, self.log)

    def read_json(self, key: str) -> Any:
        return read_json(self.store, key)

    def result(self, phase: str) -> dict:
        """A phase's committed result (phases/<phase>/result.json)."""
        return self.read_json(layout.phase_result(phase))

    def write_json(self, key: str, obj: Any) -> None:
        self.store.put_bytes(key, dumps(obj))

    def read_split(self, name: str) -> list[dict]:
        """A split as the data phase committed it, made ready for the model on this node by the data side."""
        key = layout.data_split(name)
        return self.kind.data.fetch(self.store, read_jsonl(self.store.get_bytes(key), key), self.workdir)

    def encoded(self, name: str, processor, labels: list[str]) -> Sequence:
        """A split exactly as the trainer sees it (data.encoding.Encoded per row): the tokens the data
        phase stored, memory-mapped on this node (data/tokens.py), never tokenized again; kinds that store
        none (images) encode the split here."""
        record = self.data_result.get("tokens")
        if not record:
            return self.kind.model.encode(processor, self.read_split(name), labels)
        return open_tokens(self.store, record, name, self.workdir, self.log)

    @functools.cached_property
    def data_result(self) -> dict:
        """The data phase's committed result, read once: it never changes after its commit."""
        return self.result("data")

    @property
    def labels(self) -> list[str]:
        return self.data_result["labels"]

    @property
    def data_version(self) -> str:
        return self.data_result["data_version"]

    @property
    def device(self) -> torch.device:
        return resolve_device(self.spec.training)

    @property
    def precision(self) -> str:
        """training.precision for this device (auto: bf16 on a GPU that has it, else fp32)."""
        return resolve_precision(self.spec.training, self.device)


def subprocess_context(prog: str, argv: list[str] | None, log: Callable[[str], None]) -> tuple[PhaseContext, str]:
    """The context of a process the runner starts (a torchrun rank, the recheck process), rebuilt from the
    store alone: `--store URI --job ID --workdir DIR --trial ID [--endpoint-url --region --addressing-style]`
    (runner.store_args writes them). Returns the context and the trial id."""
    from entrypoint.training.environment import quiet_libraries

    parser = argparse.ArgumentParser(prog=prog)
    for flag in ("--store", "--job", "--workdir", "--trial"):
        parser.add_argument(flag, required=True)
    for flag in ("--endpoint-url", "--region", "--addressing-style"):
        parser.add_argument(flag)
    parser.add_argument("--locations", type=json.loads, default={}, help="moved locations, JSON: {field: value}")
    args = parser.parse_args(argv)
    quiet_libraries()
    root = open_store(
        args.store, endpoint_url=args.endpoint_url, region=args.region, addressing_style=args.addressing_style
    )
    store = job_store(root, args.job)
    loaded = stored_spec(store)
    spec = with_locations(loaded.spec, args.locations)  # where the process that started this one found them
    return PhaseContext(spec, loaded.sha256, store, Path(args.workdir), log), args.trial
