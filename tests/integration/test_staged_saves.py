"""Staged checkpoint saves (entrypoint/training/staging.py) through the real Trainer, scaled down: a full
fine-tune of a 4.6M-parameter Llama (18 MB of weights, 37 MB of AdamW state: both above STAGE_FROM_BYTES).
When the training loop hands a checkpoint over, its weights and optimizer state are copies in memory, not
yet files; the commit writes them, byte for byte what the Trainer writes in line, and a run that resumes
from them ends with the same weights as one that never stopped."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
from transformers import TrainerCallback, default_data_collator

from entrypoint.store import FileStore
from entrypoint.store.checkpoint import find_latest
from entrypoint.training import staging
from entrypoint.training.staging import Stager
from entrypoint.training.trainer import StoreCheckpointCallback, build_trainer, graceful_sigterm
from jobspec.schema import CheckpointPolicy, Training
from tests.models import tiny_llama

VOCAB = 16000


class OnDisk(TrainerCallback):
    """Which of a checkpoint's big files exist when the training loop hands it over (on_save)."""

    def __init__(self):
        self.seen: dict[int, set[str]] = {}

    def on_save(self, args, state, control, **kwargs):
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        names = {"model.safetensors", "optimizer.pt"}
        self.seen[state.global_step] = {n for n in names if (folder / n).is_file()}


class StopAt(TrainerCallback):
    """Stop after step `step` of a run planned for more (its learning-rate schedule unchanged)."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.step:
            control.should_training_stop = True
        return control


def _train(tmp_path: Path, name: str, max_steps: int, resume: Path | None = None):
    torch.manual_seed(0)
    model = tiny_llama(VOCAB, 64, seed=0, hidden_size=256, intermediate_size=512)
    ids = torch.Generator().manual_seed(1)
    rows = [torch.randint(0, VOCAB, (32,), generator=ids).tolist() for _ in range(64)]
    features = [{"input_ids": row, "labels": row} for row in rows]
    store = FileStore(tmp_path / name / "store")
    policy = CheckpointPolicy(every_steps=2, keep=10)
    saver = StoreCheckpointCallback(store, "ckpt", {}, policy, graceful_sigterm(60, print), print)
    on_disk = OnDisk()
    training = Training(
        max_steps=8, microbatch=4, learning_rate=1e-3, device="cpu", deterministic=True, checkpoint=policy
    )
    trainer = build_trainer(
        model, default_data_collator, features, training,
        output_dir=tmp_path / name / "out", device=torch.device("cpu"), loss_per="token",
        callbacks=[on_disk, saver, StopAt(max_steps)],
    )  # fmt: skip
    trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    saver.finish()
    return store, on_disk, saver


def _hashes(store: FileStore, step: int, into: Path) -> dict[str, str]:
    found = find_latest(store, "ckpt", into, print)
    assert found is not None and found.step == step
    return {n: hashlib.sha256((found.folder / n).read_bytes()).hexdigest() for n in found.manifest["files"]}


def test_a_full_fine_tune_s_checkpoint_is_copied_in_memory_and_written_by_its_commit(tmp_path, monkeypatch):
    staged_store, staged_disk, saver = _train(tmp_path, "staged", 4)
    assert staged_disk.seen == {2: set(), 4: set()}  # handed over as copies: the commit wrote the files
    assert all(r["staged"] and r["written_s"] is not None and r["bytes"] > 50e6 for r in saver.records)
    # The buffers were made after the first step, in the background: no checkpoint made any in line.
    assert [r["staging_made_bytes"] for r in saver.records] == [0, 0]

    monkeypatch.setattr(staging, "STAGE_FROM_BYTES", 1 << 40)  # the Trainer's own save, in line
    plain_store, plain_disk, plain = _train(tmp_path, "plain", 4)
    assert plain_disk.seen == {2: {"model.safetensors", "optimizer.pt"}, 4: {"model.safetensors", "optimizer.pt"}}
    assert not any(r["staged"] for r in plain.records)
    staged, written = _hashes(staged_store, 4, tmp_path / "a"), _hashes(plain_store, 4, tmp_path / "b")
    assert staged == written and {"model.safetensors", "optimizer.pt", "scheduler.pt"} <= staged.keys()


def test_a_run_resumed_from_a_staged_checkpoint_ends_as_one_that_never_stopped(tmp_path):
    whole, _, _ = _train(tmp_path, "whole", 8)
    cut, _, _ = _train(tmp_path, "cut", 4)
    restored = find_latest(cut, "ckpt", tmp_path / "restored", print)
    assert restored.step == 4
    resumed, _, _ = _train(tmp_path, "resumed", 8, resume=restored.folder)
    final = _hashes(whole, 8, tmp_path / "c")
    assert _hashes(resumed, 8, tmp_path / "d")["model.safetensors"] == final["model.safetensors"]
    assert _hashes(resumed, 8, tmp_path / "e")["optimizer.pt"] == final["optimizer.pt"]


def test_the_stager_keeps_tied_tensors_tied_reuses_its_buffers_and_declines_what_memory_cannot_hold(monkeypatch):
    shared = torch.arange(6.0)
    state = {"a": shared, "b": shared, "c": [torch.ones(2), {"n": 3}]}
    lines: list[str] = []
    stager = Stager(lines.append, available=lambda: 10**12)
    first = stager.stage("model", state)
    assert first["a"] is first["b"] and torch.equal(first["a"], shared) and first["a"] is not shared
    assert first["c"][1] == {"n": 3}
    writes, _ = stager.take()
    stager.run(writes)
    shared.add_(1.0)
    second = stager.stage("model", state)
    assert second["a"] is first["a"] and torch.equal(second["a"], shared)  # the same buffer, new values
    stager.run(stager.take()[0])

    monkeypatch.setattr(staging, "STAGE_FROM_BYTES", 0)  # reserve makes buffers only for what stage() copies
    reserved = Stager(lines.append, available=lambda: 10**12)
    reserved.reserve({"model": state})
    third = reserved.stage("model", state)
    assert reserved.made_in_line == 0 and third["a"] is third["b"] and torch.equal(third["a"], shared)
    assert third["c"][0] is reserved._buffers["model.c.0"]  # the buffer reserve made, now holding the copy
    fresh = Stager(lines.append, available=lambda: 10**12)
    fresh.stage("model", state)
    assert fresh.made_in_line == (6 + 2) * 4  # no reserve: the first stage makes its buffers itself

    monkeypatch.undo()
    big = {"w": torch.zeros(8 << 20)}  # 32 MB
    assert Stager(lines.append, available=lambda: 10**12).decline("model", big) is None
    assert "would not fit in the host memory available" in Stager(lines.append, available=lambda: 1 << 20).decline(
        "model", big
    )
    assert "written in line" in Stager(lines.append).decline("model", {"w": torch.zeros(4)})


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
