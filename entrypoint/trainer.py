"""The HF `Trainer`, configured from the spec, with rentune's callbacks. No hand-written training loop."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

from transformers import DataCollatorWithPadding, PrinterCallback, Trainer, TrainerCallback, TrainingArguments

from jobspec.schema import Training

__all__ = ["ProgressCallback", "build_trainer", "planned_steps"]


def planned_steps(training: Training, n_train: int, world_size: int = 1) -> int:
    """Optimizer steps for the run: `max_steps` if set, else epochs over the data at the global batch."""
    if training.max_steps is not None:
        return training.max_steps
    per_epoch = math.ceil(n_train / (training.microbatch * training.grad_accum * world_size))
    return max(1, math.ceil(training.epochs * per_epoch))


class ProgressCallback(TrainerCallback):
    """One line per logging step (`train: step 20/60  loss 0.812  12.4 s`) and the loss history."""

    def __init__(self, log: Callable[[str], None]):
        self.log = log
        self.losses: list[dict] = []
        self.started = time.monotonic()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.losses.append({"step": state.global_step, "loss": float(logs["loss"])})
            elapsed = time.monotonic() - self.started
            self.log(f"train: step {state.global_step}/{state.max_steps}  loss {logs['loss']:.4f}  {elapsed:.1f} s")


def build_trainer(
    model,
    tokenizer,
    train_features: list[dict],
    training: Training,
    output_dir: Path,
    use_cpu: bool,
    callbacks: list[TrainerCallback],
) -> Trainer:
    """A Trainer that saves nothing by itself (rentune commits checkpoints) and reports to nobody."""
    steps = planned_steps(training, len(train_features))
    args = TrainingArguments(
        output_dir=str(output_dir),
        per_device_train_batch_size=training.microbatch,
        gradient_accumulation_steps=training.grad_accum,
        max_steps=steps,
        learning_rate=training.learning_rate,
        weight_decay=training.weight_decay,
        warmup_steps=int(training.warmup_ratio * steps),
        lr_scheduler_type="linear",
        seed=training.seed,
        data_seed=training.seed,
        bf16=training.precision == "bf16",
        fp16=training.precision == "fp16",
        use_cpu=use_cpu,
        logging_strategy="steps",
        logging_steps=max(1, steps // 20),
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        disable_tqdm=True,
        label_names=["labels"],
        dataloader_num_workers=0,
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=train_features,
        data_collator=DataCollatorWithPadding(tokenizer),
        callbacks=callbacks,
    )
    trainer.remove_callback(PrinterCallback)  # ProgressCallback prints one readable line per log instead
    return trainer
