"""Inference for classification, shared by training, evaluation and verification, so every phase turns
logits into labels the same way (preprocessing for training lives in data/encoding.py)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = [
    "centroid_labels",
    "image_logits",
    "label_logits",
    "predict_image_labels",
    "predict_labels",
    "zero_shot_labels",
]


def _batches(tokenizer, texts: Sequence[str], max_length: int, batch: int, device):
    """The texts tokenized as classification training tokenizes them, `batch` at a time, padded, on `device`."""
    for start in range(0, len(texts), batch):
        yield tokenizer(
            list(texts[start : start + batch]),
            truncation=True,
            max_length=max_length,
            padding=True,
            return_tensors="pt",
        ).to(device)


@torch.no_grad()
def predict_labels(
    model, tokenizer, texts: Sequence[str], labels: Sequence[str], max_length: int, batch: int, device
) -> list[str]:
    """Argmax label for each text, in order. Puts `model` in eval mode."""
    return [labels[i] for i in label_logits(model, tokenizer, texts, max_length, batch, device).argmax(dim=-1).tolist()]


@torch.no_grad()
def label_logits(model, tokenizer, texts: Sequence[str], max_length: int, batch: int, device) -> torch.Tensor:
    """The classifier's logits for each text (float32, on the CPU), in order. Puts `model` in eval mode."""
    model.eval().to(device)
    return torch.cat(
        [model(**inputs).logits.float().cpu() for inputs in _batches(tokenizer, texts, max_length, batch, device)]
    )


@torch.no_grad()
def _embed(encoder, tokenizer, texts: Sequence[str], max_length: int, batch: int, device) -> torch.Tensor:
    """Mean-pooled, L2-normalised token embeddings (the pooling sentence encoders such as MiniLM use)."""
    encoder.eval().to(device)
    out = []
    for inputs in _batches(tokenizer, texts, max_length, batch, device):
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


def _pixels(processor, paths: Sequence[str], modes: Sequence[str], device) -> torch.Tensor:
    from entrypoint.data.images import load_image

    images = [load_image(path, modes)[0] for path in paths]
    return processor(images=images, return_tensors="pt")["pixel_values"].to(device)


@torch.no_grad()
def predict_image_labels(
    model, processor, paths: Sequence[str], labels: Sequence[str], modes: Sequence[str], batch: int, device
) -> list[str]:
    """Argmax label for each image file, in order, through the base model's image processor."""
    return [labels[i] for i in image_logits(model, processor, paths, modes, batch, device).argmax(dim=-1).tolist()]


@torch.no_grad()
def image_logits(model, processor, paths: Sequence[str], modes: Sequence[str], batch: int, device) -> torch.Tensor:
    """The classifier's logits for each image file (float32, on the CPU), in order."""
    model.eval().to(device)
    return torch.cat(
        [
            model(pixel_values=_pixels(processor, paths[start : start + batch], modes, device)).logits.float().cpu()
            for start in range(0, len(paths), batch)
        ]
    )


@torch.no_grad()
def _embed_images(encoder, processor, paths: Sequence[str], modes: Sequence[str], batch: int, device) -> torch.Tensor:
    """The untouched backbone's image embedding: its pooler output, or the first token's hidden state."""
    encoder.eval().to(device)
    out = []
    for start in range(0, len(paths), batch):
        outputs = encoder(pixel_values=_pixels(processor, paths[start : start + batch], modes, device))
        pooled = getattr(outputs, "pooler_output", None)
        if pooled is None:
            pooled = outputs.last_hidden_state[:, 0]
        out.append(torch.nn.functional.normalize(pooled.flatten(1).float(), dim=-1))
    return torch.cat(out)


def centroid_labels(
    encoder,
    processor,
    train: Sequence[tuple[str, str]],
    paths: Sequence[str],
    labels: Sequence[str],
    modes: Sequence[str],
    batch: int,
    device,
) -> list[str]:
    """The untouched image model's guess: the category whose mean training embedding (cosine) is closest.
    A vision backbone has no text to compare with, so its baseline uses the train split's labels, not its
    weights' training: nothing is learned but one mean vector per category."""
    train_vectors = _embed_images(encoder, processor, [p for p, _ in train], modes, batch, device)
    rows = torch.tensor([labels.index(label) for _, label in train])
    centroids = torch.stack([train_vectors[rows == i].mean(dim=0) for i in range(len(labels))])
    centroids = torch.nn.functional.normalize(centroids, dim=-1)
    vectors = _embed_images(encoder, processor, paths, modes, batch, device)
    return [labels[i] for i in (vectors @ centroids.T).argmax(dim=-1).tolist()]
