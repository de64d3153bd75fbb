"""The verify phase's fresh process: nothing shared with the trainer but the store.

    python -m entrypoint.verify_worker --store URI --job JOB_ID --workdir DIR --trial ID [--endpoint-url URL ...]

Downloads the trial's newest checkpoint, verifies its manifest (every file's size and sha256), checks that
it is the trained end (its step and its weights equal the committed final weights, tensor by tensor),
reloads the model from it as a user would and re-runs the eval split. Writes
`phases/verify/fresh_process.json`; the verify phase compares it with the end of training.
Exit code 0 when the record was written, 1 with the reason on stderr otherwise.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load, load_file

from entrypoint.checkpoint import checkpoint_prefix, find_latest
from entrypoint.context import PhaseContext, dumps
from entrypoint.evaluation import predict, score
from entrypoint.model import load_trained, resolve_model_dir
from entrypoint.preprocess import is_causal, is_image, load_processor
from entrypoint.runner import job_store
from entrypoint.store import ObjectNotFound, open_store
from jobspec.load import parse_spec

WEIGHT_FILES = ("adapter_model.safetensors", "model.safetensors")


class VerifyError(RuntimeError):
    pass


def verify(ctx: PhaseContext, trial_id: str, log) -> dict:
    spec = ctx.spec
    record = ctx.read_json(f"trials/{trial_id}/result.json")
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
    names = [n for n in WEIGHT_FILES if (found.folder / n).is_file()]
    if not names:
        raise VerifyError(f"trial {trial_id}: checkpoint step {found.step} holds no {' or '.join(WEIGHT_FILES)}")
    try:
        final = load(ctx.store.get_bytes(f"trials/{trial_id}/final/{names[0]}"))
    except ObjectNotFound:
        raise VerifyError(f"trial {trial_id}: final/{names[0]} is missing from the store") from None
    checkpoint = load_file(found.folder / names[0])
    same = final.keys() == checkpoint.keys() and all(torch.equal(final[k], checkpoint[k]) for k in final)
    if not same:
        raise VerifyError(f"trial {trial_id}: final/{names[0]} differs from checkpoint step {found.step}'s weights")

    base = resolve_model_dir(spec.model)
    causal = is_causal(spec)
    labels = ctx.labels
    model = load_trained(base, found.folder, labels, record["settings"]["adaptation"]["method"], causal, is_image(spec))
    tokenizer = load_processor(base, spec)
    rows = ctx.read_split("eval")
    outputs = predict(model, tokenizer, rows, spec, labels, ctx.device)
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
    parser = argparse.ArgumentParser(prog="entrypoint.verify_worker")
    for flag in ("--store", "--job", "--workdir", "--trial"):
        parser.add_argument(flag, required=True)
    for flag in ("--endpoint-url", "--region", "--addressing-style"):
        parser.add_argument(flag)
    args = parser.parse_args(argv)
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    root = open_store(
        args.store, endpoint_url=args.endpoint_url, region=args.region, addressing_style=args.addressing_style
    )
    store = job_store(root, args.job)
    loaded = parse_spec(store.get_bytes("spec.yaml").decode(), source=f"{store.uri}/spec.yaml")

    def log(message: str) -> None:
        print(f"verify: {message}", flush=True)

    ctx = PhaseContext(loaded.spec, loaded.sha256, store, Path(args.workdir), log)
    try:
        result = verify(ctx, args.trial, log)
    except VerifyError as exc:
        print(f"verify: {exc}", file=sys.stderr, flush=True)
        return 1
    store.put_bytes("phases/verify/fresh_process.json", dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
