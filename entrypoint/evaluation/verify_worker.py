"""The verify phase's fresh process: nothing shared with the trainer but the store.

    python -m entrypoint.evaluation.verify_worker --store URI --job JOB_ID --workdir DIR --trial ID \
        [--endpoint-url URL ...]

Downloads the trial's newest checkpoint, verifies its manifest (every file's size and sha256), checks that
it is the trained end (its step and its weights equal the committed final weights, tensor by tensor),
reloads the model from it as a user would and re-runs the eval split. Writes
`phases/verify/fresh_process.json`; the verify phase compares it with the end of training.
Exit code 0 when the record was written, 1 with the reason on stderr otherwise.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load, load_file

from entrypoint.context import PhaseContext, subprocess_context
from entrypoint.evaluation.procedure import score
from entrypoint.job.state import dumps, trial_result_key
from entrypoint.store import ObjectNotFound
from entrypoint.store.checkpoint import checkpoint_prefix, find_latest
from entrypoint.training.model import SHARD_INDEX, ModelError, sharded_weights

WEIGHT_FILES = ("adapter_model.safetensors", "model.safetensors")


class VerifyError(RuntimeError):
    pass


def weight_files(folder: Path) -> list[str]:
    """The safetensors files holding a saved model's weights: the adapter, the single model file, or every
    shard its index names (VerifyError if one is missing). Empty if the folder has none of them."""
    for name in WEIGHT_FILES:
        if (folder / name).is_file():
            return [name]
    try:
        return sharded_weights(folder)
    except ModelError as exc:
        raise VerifyError(str(exc)) from None


def load_weights(folder: Path, names: list[str]) -> dict[str, torch.Tensor]:
    """Every tensor of `names` (weight_files) under `folder`, in one dict."""
    return {key: tensor for name in names for key, tensor in load_file(folder / name).items()}


def verify(ctx: PhaseContext, trial_id: str, log) -> dict:
    spec = ctx.spec
    record = ctx.read_json(trial_result_key(trial_id))
    into = ctx.workdir / "checkpoint"
    shutil.rmtree(into, ignore_errors=True)
    found = find_latest(ctx.store, checkpoint_prefix(trial_id), into, log)
    if found is None:
        raise VerifyError(f"trial {trial_id}: no checkpoint verifies against its manifest")
    if found.step != record["steps"]:
        raise VerifyError(
            f"trial {trial_id}: the newest verified checkpoint is step {found.step}, training ended at "
            f"step {record['steps']}"
        )
    names = weight_files(found.folder)
    if not names:
        raise VerifyError(
            f"trial {trial_id}: checkpoint step {found.step} holds no {' or '.join(WEIGHT_FILES)} and no {SHARD_INDEX}"
        )
    try:
        stored = [load(ctx.store.get_bytes(f"trials/{trial_id}/final/{name}")) for name in names]
    except ObjectNotFound as exc:
        raise VerifyError(f"trial {trial_id}: a weight file of final/ is missing from the store ({exc})") from None
    final = {key: tensor for part in stored for key, tensor in part.items()}
    checkpoint = load_weights(found.folder, names)
    same = final.keys() == checkpoint.keys() and all(torch.equal(final[k], checkpoint[k]) for k in final)
    if not same:
        raise VerifyError(f"trial {trial_id}: final/{names[0]}... differs from checkpoint step {found.step}'s weights")

    kind, labels = ctx.kind, ctx.labels
    model = kind.reload(ctx.model_dir, found.folder, labels, record["settings"]["adaptation"]["method"])
    rows = ctx.read_split("eval")
    outputs = kind.predict(model, kind.processor(ctx.model_dir), rows, labels, ctx.device)
    return {
        "trial_id": trial_id,
        "checkpoint_step": found.step,
        "checkpoint_files": sorted(found.manifest["files"]),
        "weights_equal_final": True,
        "metrics": score(spec, rows, outputs, labels)["metrics"],
        "outputs": outputs,
        "pid": os.getpid(),
    }


def main(argv: list[str] | None = None) -> int:
    def log(message: str) -> None:
        print(f"verify: {message}", flush=True)

    ctx, trial_id = subprocess_context("entrypoint.evaluation.verify_worker", argv, log)
    try:
        result = verify(ctx, trial_id, log)
    except VerifyError as exc:
        print(f"verify: {exc}", file=sys.stderr, flush=True)
        return 1
    ctx.store.put_bytes("phases/verify/fresh_process.json", dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
