"""Training overhead of rentune: the same tiny training run through rentune's Trainer setup (its callbacks:
progress with tokens/s, parameter check and peak memory over the first steps, checkpoint commits to a
file:// store)
and through a bare HF Trainer with identical TrainingArguments (local checkpoints every 100 steps too) and no
callbacks, alternated in one run. With --tracking, a third run logs every step to all three trackers
in their local modes (TensorBoard files copied to the store, an MLflow file store, W&B offline).

    .venv/bin/python bench/overhead.py [--steps 300] [--repeats 3] [--tracking]

Prints steps/s for each and the ratio rentune / bare (goal: >= 0.97, i.e. within 3%); with --tracking
also tracked / untracked rentune.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # --tracking: MLflow 3 keeps its file store behind this
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import Trainer  # noqa: E402

from entrypoint.kinds import kind_for  # noqa: E402
from entrypoint.store import FileStore  # noqa: E402
from entrypoint.tracking import RunRef, Tracking, open_tracking  # noqa: E402
from entrypoint.tracking.callback import TrackingCallback  # noqa: E402
from entrypoint.training.throughput import CountingCollator, ThroughputMeter, flops_per_token  # noqa: E402
from entrypoint.training.trainer import (  # noqa: E402
    FirstStepsCallback,
    ProgressCallback,
    StoreCheckpointCallback,
    build_trainer,
    graceful_sigterm,
)
from jobspec import parse_spec  # noqa: E402
from tests.models import build_tiny_bert  # noqa: E402

transformers.logging.set_verbosity_error()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tracking", action="store_true", help="also time rentune with all three trackers")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="rentune-overhead-"))
    model_dir = build_tiny_bert(tmp / "bert")
    spec = parse_spec(
        f"""
job: {{id: overhead}}
hypothesis: {{task: classification, statement: overhead}}
model: {{path: {model_dir}, max_length: 64}}
data: {{source: {ROOT / "examples/data/tickets.jsonl"}}}
adaptation: {{method: lora, rank: 8, target_modules: [query, value]}}
training: {{max_steps: {args.steps}, microbatch: 16, device: cpu, checkpoint: {{every_steps: 100}}}}
"""
    ).spec
    rows = [json.loads(line) for line in (ROOT / "examples/data/tickets.jsonl").read_text().splitlines() if line]
    labels = sorted({r["label"] for r in rows})
    kind = kind_for(spec)
    tokenizer = kind.model.processor(model_dir)
    features = [e.features for e in kind.model.encode(tokenizer, rows, labels)]
    cpu = torch.device("cpu")
    log = lambda message: None  # noqa: E731

    def rentune_run(i: int, tracked: bool = False) -> float:
        torch.manual_seed(0)
        model = kind.model.load(model_dir, labels, spec.adaptation)
        store = FileStore(tmp / f"store-{i}-{tracked}")
        counter = CountingCollator(kind.model.collator(tokenizer))
        meter = ThroughputMeter(counter, *flops_per_token(model, 32.0), None, "cpu")
        tracking = Tracking([], {}, log)
        if tracked:
            trackers = parse_spec(
                f"{{job: {{id: t}}, hypothesis: {{task: classification, statement: t}}, model: {{path: m}}, "
                f"data: {{source: d.jsonl}}, tracking: {{tensorboard: true, mlflow: {{tracking_uri: "
                f"'{(tmp / 'mlruns').as_uri()}'}}, wandb: {{project: bench}}}}}}"
            ).spec.tracking
            run = RunRef("overhead", f"run-{i}", store, tmp / f"tracking-{i}", "train")
            tracking = open_tracking(trackers, run, print)
            assert len(tracking.trackers) == 3, "a tracker did not open: see the warning above"
        with graceful_sigterm(60, log) as sigterm:
            callbacks = [
                meter,
                ProgressCallback(log, meter=meter),
                StoreCheckpointCallback(store, "ckpt", {}, spec.training.checkpoint, sigterm, log),
                FirstStepsCallback("lora", cpu),
                *([TrackingCallback(tracking, meter, cpu)] if tracked else []),
            ]
            trainer = build_trainer(
                model,
                counter,
                features,
                spec.training,
                output_dir=tmp / f"r{i}",
                device=cpu,
                loss_per="example",
                callbacks=callbacks,
            )
            started = time.perf_counter()
            trainer.train()
            rate = args.steps / (time.perf_counter() - started)
            started = time.perf_counter()
            tracking.close(finished=True)  # what the trackers still queue, then W&B's finish: once per trial
            if tracked:
                closing.append(time.perf_counter() - started)
            return rate

    def bare_run(i: int) -> float:
        torch.manual_seed(0)
        model = kind.model.load(model_dir, labels, spec.adaptation)
        reference = build_trainer(
            model,
            kind.model.collator(tokenizer),
            features,
            spec.training,
            output_dir=tmp / f"b{i}",
            device=cpu,
            loss_per="example",
        )
        trainer = Trainer(
            model=model,
            args=reference.args,  # identical, checkpoints every 100 steps included (kept locally)
            train_dataset=features,
            data_collator=kind.model.collator(tokenizer),
        )
        trainer.model_accepts_loss_kwargs = False
        started = time.perf_counter()
        trainer.train()
        return args.steps / (time.perf_counter() - started)

    ours, bare, tracked, closing = [], [], [], []
    for i in range(args.repeats):  # alternate so drift on a shared machine hits both alike
        bare.append(bare_run(i))
        ours.append(rentune_run(i))
        if args.tracking:
            tracked.append(rentune_run(i, tracked=True))
    o, b = statistics.median(ours), statistics.median(bare)
    print(f"steps/s over {args.steps} steps, median of {args.repeats}: rentune {o:.1f}, bare Trainer {b:.1f}")
    print(f"ratio rentune / bare: {o / b:.3f} (both save every 100 steps; rentune also hashes, uploads and rotates)")
    if tracked:
        t = statistics.median(tracked)
        print(f"rentune with TensorBoard + MLflow (file store) + W&B (offline): {t:.1f} steps/s")
        print(f"ratio tracked / untracked rentune: {t / o:.3f} (every step logged to each tracker)")
        print(f"closing the trackers' runs at the end: {statistics.median(closing):.2f} s")


if __name__ == "__main__":
    main()
