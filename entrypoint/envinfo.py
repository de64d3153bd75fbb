"""Versions actually used in this process: what a bug report or a binding needs to be reproduced."""

from __future__ import annotations

import importlib.metadata
import platform
import sys

import torch

__all__ = ["environment"]

_PACKAGES = (
    "transformers",
    "peft",
    "accelerate",
    "safetensors",
    "tokenizers",
    "boto3",
    "pydantic",
    "deepspeed",
)


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment() -> dict:
    """Python, torch, backend (cuda, rocm or cpu) with its versions and devices, and library versions."""
    backend = "rocm" if torch.version.hip else "cuda" if torch.version.cuda else "cpu"
    info = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "backend": backend,
        "cuda": torch.version.cuda,
        "hip": torch.version.hip,
        "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if torch.cuda.is_available()
        else [],
        "packages": {name: _version(name) for name in _PACKAGES},
        "rentune": _version("rentune"),
    }
    if torch.cuda.is_available() and torch.backends.cudnn.is_available():
        info["cudnn_or_miopen"] = torch.backends.cudnn.version()
    return info
