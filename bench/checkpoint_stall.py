"""Checkpoint stall: how long the training loop is blocked per checkpoint, for a full fine-tune of a ~100M
parameter causal LM on CPU (about 1.2 GB of checkpoint state: fp32 weights and two AdamW moments), saving
every few steps, three ways in one run:

    bare        a bare HF Trainer save to local disk (no store): the floor
    background  rentune: the same local save, then the commit to S3 in the background (the default)
    synchronous rentune with the commit in the training loop, as every commit was before

    .venv/bin/python bench/checkpoint_stall.py [--layers 12] [--every 10] [--saves 3]

The store is moto's S3 server on loopback (rotation keeps one checkpoint, so its memory stays bounded).
Blocked time runs from the step at which the save was asked for to the end of `on_save` (local write
included); the last save of a run is always committed before training returns, so only the periodic ones
are compared. Goals: background <= 1.2x bare, and synchronous >= 3x background. "run" is the whole
training run's wall time: on a machine where training and the upload share the same few CPU cores (and
here the S3 server too), the background commit slows the steps it runs beside.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, TrainerCallback  # noqa: E402

from entrypoint.store.s3 import S3Store  # noqa: E402
from entrypoint.training.trainer import StoreCheckpointCallback, build_trainer, graceful_sigterm  # noqa: E402
from jobspec.schema import Training  # noqa: E402
from tests.s3server import MotoServer, create_bucket  # noqa: E402

ENV = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
VOCAB, SEQ = 16000, 16


class BlockedTimer(TrainerCallback):
    """For the bare Trainer: from the step that asked for a save to the end of on_save, as rentune records.
    Like rentune, which deletes a checkpoint's local folder once it is committed, it deletes each folder
    at the next step (untimed): kept folders would leave gigabytes of dirty pages that slow the next save
    down, and the comparison would measure the page cache instead of the save."""

    def __init__(self):
        self.asked_at: float | None = None
        self.blocked: list[float] = []
        self.saved: list[Path] = []

    def on_step_begin(self, args, state, control, **kwargs):
        while len(self.saved) > 1:  # the newest one stays, for its size
            shutil.rmtree(self.saved.pop(0), ignore_errors=True)

    def on_step_end(self, args, state, control, **kwargs):
        self.asked_at = time.monotonic() if control.should_save else None

    def on_save(self, args, state, control, **kwargs):
        self.blocked.append(time.monotonic() - (self.asked_at or time.monotonic()))
        self.saved.append(Path(args.output_dir) / f"checkpoint-{state.global_step}")


def _model(layers: int) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=768, intermediate_size=2048, num_hidden_layers=layers,
        num_attention_heads=12, num_key_value_heads=12, max_position_embeddings=64, tie_word_embeddings=False,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def _features(count: int) -> list[dict]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (count, SEQ), generator=generator)
    return [{"input_ids": row, "attention_mask": torch.ones(SEQ, dtype=torch.long), "labels": row} for row in ids]


def run(mode: str, layers: int, every: int, saves: int, endpoint: str, tmp: Path) -> tuple[list[float], int, float]:
    """Blocked seconds of each periodic save, the checkpoint's bytes and the run's wall time."""
    steps = every * (saves + 1)  # `saves` periodic saves, then the final one
    training = Training(max_steps=steps, microbatch=1, learning_rate=1e-4, checkpoint={"every_steps": every})
    callbacks: list[TrainerCallback] = []
    timer, saver = BlockedTimer(), None
    if mode == "bare":
        callbacks.append(timer)
    else:
        bucket = create_bucket(endpoint)
        store = S3Store.from_uri(f"s3://{bucket}/bench", endpoint_url=endpoint, addressing_style="path")
        policy = training.checkpoint.model_copy(update={"keep": 1})
        saver = StoreCheckpointCallback(
            store, "ckpt", {"trial_id": "bench"}, policy, graceful_sigterm(600, print), lambda line: None,
            background=mode == "background",
        )  # fmt: skip
        callbacks.append(saver)
    trainer = build_trainer(
        _model(layers), transformers.default_data_collator, _features(steps), training,
        output_dir=tmp / mode, device=torch.device("cpu"), loss_per="token", callbacks=callbacks,
    )  # fmt: skip
    started = time.monotonic()
    trainer.train()
    wall = time.monotonic() - started
    if saver is not None:
        periodic = [r for r in saver.records if r["background"] or mode == "synchronous"][:saves]
        return [r["blocked_s"] for r in periodic], periodic[0]["bytes"], wall
    size = sum(p.stat().st_size for p in timer.saved[-1].rglob("*") if p.is_file())
    return timer.blocked[:saves], size, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=12, help="12 layers of width 768: about 110M parameters")
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--saves", type=int, default=3)
    args = parser.parse_args()
    os.environ.update(ENV)
    transformers.logging.set_verbosity_error()
    results = {}
    with MotoServer() as server, tempfile.TemporaryDirectory() as tmp:
        for mode in ("bare", "background", "synchronous"):
            blocked, size, wall = run(mode, args.layers, args.every, args.saves, server.endpoint_url, Path(tmp))
            results[mode] = statistics.median(blocked)
            each = ", ".join(f"{b:.2f}" for b in blocked)
            print(
                f"{mode:<12} checkpoint {size / 1e9:.2f} GB; blocked per save {each} s "
                f"(median {results[mode]:.2f} s); run {wall:.0f} s"
            )
    print(
        f"background / bare {results['background'] / results['bare']:.2f} (goal <= 1.2); "
        f"synchronous / background {results['synchronous'] / results['background']:.1f} (goal >= 3)"
    )


if __name__ == "__main__":
    main()
