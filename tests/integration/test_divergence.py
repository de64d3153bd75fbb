"""A trial whose loss becomes NaN is stopped at the first logged step and recorded as invalid, through the
real Trainer on a tiny BERT from disk (the Trainer's own NaN filter would otherwise average it away)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from entrypoint.training.trainer import DivergenceCallback, NonFiniteLoss, build_trainer
from jobspec.schema import Adaptation, Training
from tests.models import build_tiny_bert
from tests.specs import kind_of, tiny_job


@pytest.mark.parametrize("poison", [False, True], ids=["healthy", "nan-head"])
def test_nan_loss_stops_training_and_raises(tmp_path, poison):
    folder = build_tiny_bert(tmp_path / "bert")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    kind = kind_of(tiny_job("nan", folder))
    model = kind.model.load(folder, ["a", "b"], Adaptation(target_modules=["query", "value"]))
    if poison:
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if "classifier" in name and name.endswith("weight") and parameter.requires_grad:
                    parameter.fill_(float("nan"))
    features = [dict(tokenizer(f"text number {i}"), labels=i % 2) for i in range(32)]
    training = Training(max_steps=8, microbatch=4, log_every_steps=1, device="cpu")
    divergence = DivergenceCallback()
    trainer = build_trainer(
        model,
        kind.model.collator(tokenizer),
        features,
        training,
        output_dir=tmp_path / "out",
        device=torch.device("cpu"),
        loss_per=kind.task.loss,
        callbacks=[divergence],
    )
    trainer.train()
    if not poison:
        divergence.raise_if_diverged()  # a healthy run passes
        assert trainer.state.global_step == 8
        return
    assert trainer.state.global_step == 1  # stopped at the first logged step, not after all 8
    with pytest.raises(NonFiniteLoss, match="training loss became nan at step 1"):
        divergence.raise_if_diverged()
