"""The verify phase's recheck, run in a fresh process (processes/recheck.py) that shares nothing with the
trainer but the store: download the trial's newest checkpoint, verify its manifest (every file's size and
sha256), check that it is the trained end (its step and its weights equal the committed final weights,
tensor by tensor), reload the model from it as a user would and re-run the eval split.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load, load_file

from entrypoint.context import PhaseContext
from entrypoint.job import layout
from entrypoint.store import ObjectNotFound
from entrypoint.store.checkpoint import checkpoint_prefix, find_latest
from entrypoint.training.model import SHARD_INDEX, ModelError, sharded_weights
from entrypoint.trial.evaluate import trial_adaptation

__all__ = ["SHARD_INDEX", "WEIGHT_FILES", "RecheckError", "load_weights", "recheck", "weight_files"]

WEIGHT_FILES = ("adapter_model.safetensors", "model.safetensors")


class RecheckError(RuntimeError):
    """The selected trial's checkpoint is not the trained end, or its files are missing."""


def weight_files(folder: Path) -> list[str]:
    """The safetensors files holding a saved model's weights: the adapter, the single model file, or every
    shard its index names (RecheckError if one is missing). Empty if the folder has none of them."""
    for name in WEIGHT_FILES:
        if (folder / name).is_file():
            return [name]
    try:
        return sharded_weights(folder)
    except ModelError as exc:
        raise RecheckError(str(exc)) from None


def load_weights(folder: Path, names: list[str]) -> dict[str, torch.Tensor]:
    """Every tensor of `names` (weight_files) under `folder`, in one dict."""
    return {key: tensor for name in names for key, tensor in load_file(folder / name).items()}


def recheck(ctx: PhaseContext, trial_id: str, log) -> dict:
    """The fresh process's record of `trial_id` (see the module docstring): its checkpoint, reloaded as a
    user would, re-runs the eval split."""
    record = ctx.read_json(layout.trial_result(trial_id))
    into = ctx.workdir / "checkpoint"
    shutil.rmtree(into, ignore_errors=True)
    found = find_latest(ctx.store, checkpoint_prefix(trial_id), into, log)
    if found is None:
        raise RecheckError(f"trial {trial_id}: no checkpoint verifies against its manifest")
    if found.step != record["steps"]:
        raise RecheckError(
            f"trial {trial_id}: the newest verified checkpoint is step {found.step}, training ended at "
            f"step {record['steps']}"
        )
    names = weight_files(found.folder)
    if not names:
        raise RecheckError(
            f"trial {trial_id}: checkpoint step {found.step} holds no {' or '.join(WEIGHT_FILES)} and no {SHARD_INDEX}"
        )
    try:
        stored = [load(ctx.store.get_bytes(f"{layout.trial_final(trial_id)}/{name}")) for name in names]
    except ObjectNotFound as exc:
        raise RecheckError(f"trial {trial_id}: a weight file of final/ is missing from the store ({exc})") from None
    final = {key: tensor for part in stored for key, tensor in part.items()}
    checkpoint = load_weights(found.folder, names)
    same = final.keys() == checkpoint.keys() and all(torch.equal(final[k], checkpoint[k]) for k in final)
    if not same:
        raise RecheckError(f"trial {trial_id}: final/{names[0]}... differs from checkpoint step {found.step}'s weights")

    side, labels = ctx.kind.model, ctx.labels
    model = side.load(ctx.model_dir, labels, trial_adaptation(record), trained=found.folder)
    rows = ctx.read_split("eval")
    outputs = side.predict(model, side.processor(ctx.model_dir), rows, labels, ctx.device)
    return {
        "trial_id": trial_id,
        "checkpoint_step": found.step,
        "checkpoint_files": sorted(found.manifest["files"]),
        "weights_equal_final": True,
        "metrics": ctx.kind.task.score(rows, outputs, labels)["metrics"],
        "outputs": outputs,
        "pid": os.getpid(),
    }
