"""A small synthetic image dataset and a tiny ViT, for the image tests and jobspec/examples/images.yaml.

    python -m tests.shapes examples/data/shapes examples/models/tiny-vit

Four categories drawn with Pillow: circle, square, triangle and cross, each at a random position, size and
colour on a noisy gradient background, saved as PNG in an ImageFolder layout (one folder per category); about a
fifth are greyscale ("L" mode) so the inspection has conversions to report. The ViT is built from a
config (32x32 pixels, 8x8 patches, 2 layers, 32 wide) and saved with `save_pretrained`, with its image
processor.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from PIL import Image, ImageDraw

CATEGORIES = ("circle", "square", "triangle", "cross")


def draw(shape: str, rng: random.Random, size: int = 48) -> Image.Image:
    # A random low-resolution pattern under fine noise: the low frequencies, which perceptual hashes look
    # at, differ between any two images, as in photos, so only true copies have close hashes.
    coarse = Image.frombytes("L", (4, 4), bytes(rng.randrange(20, 140) for _ in range(16)))
    background = coarse.resize((size, size), Image.Resampling.BICUBIC)
    noise = Image.frombytes("L", (size, size), bytes(rng.randrange(0, 24) for _ in range(size * size)))
    grey = Image.blend(background, noise, 0.25)
    image = Image.merge("RGB", (grey, grey.point(lambda v: min(255, v + 10)), grey.point(lambda v: min(255, v + 20))))
    pen = ImageDraw.Draw(image)
    r = rng.randint(size // 4, size // 3)
    cx, cy = rng.randint(r + 2, size - r - 2), rng.randint(r + 2, size - r - 2)
    colour = tuple(rng.randrange(150, 256) for _ in range(3))
    if shape == "circle":
        pen.ellipse((cx - r, cy - r, cx + r, cy + r), fill=colour)
    elif shape == "square":
        pen.rectangle((cx - r, cy - r, cx + r, cy + r), fill=colour)
    elif shape == "triangle":
        pen.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=colour)
    else:
        w = max(2, r // 3)
        pen.rectangle((cx - r, cy - w, cx + r, cy + w), fill=colour)
        pen.rectangle((cx - w, cy - r, cx + w, cy + r), fill=colour)
    return image.convert("L") if rng.random() < 0.2 else image


def write_shapes(folder: Path, per_category: int = 40, seed: int = 0) -> Path:
    """`per_category` PNGs per category under folder/<category>/; returns folder."""
    rng = random.Random(seed)
    for shape in CATEGORIES:
        (folder / shape).mkdir(parents=True, exist_ok=True)
        for i in range(per_category):
            draw(shape, rng).save(folder / shape / f"{shape}-{i:03d}.png")
    return folder


def build_tiny_vit(folder: Path, seed: int = 0) -> Path:
    """A 2-layer, 32-wide ViT on 32x32 pixels, saved as safetensors with its image processor."""
    import torch
    from transformers import ViTConfig, ViTImageProcessor, ViTModel

    torch.manual_seed(seed)
    config = ViTConfig(
        image_size=32,
        patch_size=8,
        num_channels=3,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
    )
    ViTModel(config).save_pretrained(folder, safe_serialization=True)
    ViTImageProcessor(size={"height": 32, "width": 32}, image_mean=[0.5] * 3, image_std=[0.5] * 3).save_pretrained(
        folder
    )
    return folder


if __name__ == "__main__":
    data, model = (Path(a) for a in sys.argv[1:3])
    write_shapes(data)
    build_tiny_vit(model)
    print(f"wrote {data} ({len(CATEGORIES)} categories) and {model}")
