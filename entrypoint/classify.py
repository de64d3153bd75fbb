"""Inference for classification, shared by training, evaluation and verification, so every phase turns
logits into labels the same way (preprocessing for training lives in preprocess.py)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["predict_labels", "zero_shot_labels"]


@torch.no_grad()
def predict_labels(
    model, tokenizer, texts: Sequence[str], labels: Sequence[str], max_length: int, batch: int, device
) -> list[str]:
    """Argmax label for each text, in order. Puts `model` in eval mode."""
    model.eval().to(device)
    predicted: list[str] = []
    for start in range(0, len(texts), batch):
        inputs = tokenizer(
            list(texts[start : start + batch]),
            truncation=True,
            max_length=max_length,
            padding=True,
            return_tensors="pt",
        ).to(device)
        logits = model(**inputs).logits
        predicted += [labels[i] for i in logits.argmax(dim=-1).tolist()]
    return predicted


@torch.no_grad()
def _embed(encoder, tokenizer, texts: Sequence[str], max_length: int, batch: int, device) -> torch.Tensor:
    """Mean-pooled, L2-normalised token embeddings (the pooling sentence encoders such as MiniLM use)."""
    encoder.eval().to(device)
    out = []
    for start in range(0, len(texts), batch):
        inputs = tokenizer(
            list(texts[start : start + batch]),
            truncation=True,
            max_length=max_length,
            padding=True,
            return_tensors="pt",
        ).to(device)
        hidden = encoder(**inputs).last_hidden_state
        mask = inputs["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
        out.append(torch.nn.functional.normalize(pooled.float(), dim=-1))
    return torch.cat(out)


def zero_shot_labels(
    encoder,
    tokenizer,
    texts: Sequence[str],
    label_texts: Sequence[str],
    labels: Sequence[str],
    max_length: int,
    batch: int,
    device,
) -> list[str]:
    """The untouched model's guess: the label whose description embeds closest (cosine) to the text."""
    text_vectors = _embed(encoder, tokenizer, texts, max_length, batch, device)
    label_vectors = _embed(encoder, tokenizer, label_texts, max_length, batch, device)
    return [labels[i] for i in (text_vectors @ label_vectors.T).argmax(dim=-1).tolist()]
