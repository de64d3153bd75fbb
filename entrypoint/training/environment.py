"""Versions actually used in this process: what a bug report or a binding needs to be reproduced."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
import time
import warnings

import torch

__all__ = ["environment", "platform_summary", "quiet_libraries"]

_PACKAGES = (
    "transformers",
    "peft",
    "accelerate",
    "safetensors",
    "tokenizers",
    "boto3",
    "pydantic",
    "deepspeed",
    "flash-attn",
    "liger-kernel",
    "bitsandbytes",
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
    if torch.cuda.is_available():
        info["device_memory_bytes"] = [
            torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count())
        ]
        if torch.backends.cudnn.is_available():
            info["cudnn_or_miopen"] = torch.backends.cudnn.version()
        try:
            info["nccl_or_rccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except (AttributeError, RuntimeError):
            info["nccl_or_rccl"] = None
        info["driver"] = _driver_version()
    info["image_digest"] = os.environ.get("RENTUNE_IMAGE_DIGEST")  # set by the container build, if known
    return info


def platform_summary(env: dict) -> dict:
    """What a resume compares: a different stack repeats launch and quality checks and is flagged."""
    return {
        "torch": env["torch"],
        "backend": env["backend"],
        "cuda": env.get("cuda"),
        "hip": env.get("hip"),
        "devices": env.get("devices", []),
        "transformers": env["packages"].get("transformers"),
        "peft": env["packages"].get("peft"),
    }


def _driver_version() -> str | None:
    """The NVIDIA or AMD kernel driver version, read from the files the drivers expose (no tools needed)."""
    for path in ("/proc/driver/nvidia/version", "/sys/module/amdgpu/version"):
        try:
            return open(path).readline().strip() or None
        except OSError:
            continue
    return None


def quiet_libraries() -> None:
    """Every process that trains or evaluates calls this once: rentune reports what matters itself (missing
    weights are an error in training/model.py), and the libraries' load reports and progress bars would bury
    the per-step progress lines."""
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    # peft still calls transformers' v4 names; the FutureWarning says nothing a user can act on.
    warnings.filterwarnings("ignore", message=r".*deprecated and will be removed in v6", category=FutureWarning)


def process_age() -> float | None:
    """Seconds since this process started: interpreter start and imports, before its first work (the plan's
    `startup` figure). None where the platform does not say."""
    try:
        import psutil

        return max(0.0, time.time() - psutil.Process().create_time())
    except Exception:  # no psutil, or no process table (some sandboxes)
        return None
