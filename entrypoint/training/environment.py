"""Versions actually used in this process: what a bug report or a binding needs to be reproduced."""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import re
import sys
import time
import warnings
from pathlib import Path

import torch

__all__ = ["environment", "lock_record", "platform_summary", "quiet_libraries"]

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
    info["lock"] = lock_record(os.environ.get("RENTUNE_LOCK_FILE"))
    return info


_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_record(path: str | None) -> dict | None:
    """The dependency lock this installation was built from (RENTUNE_LOCK_FILE, set by the images to their
    copy of deploy/requirements.lock): its sha256, how many packages it pins and each one installed at
    another version here (none in an image as built; `pip install` inside a container shows up here).
    None outside an image."""
    if not path:
        return None
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        return {"file": path, "error": str(exc)}
    pins = {_canonical(m[1]): m[2] for m in map(_PIN.match, data.decode().splitlines()) if m}
    installed = {
        _canonical(d.metadata["Name"]): d.version for d in importlib.metadata.distributions() if d.metadata["Name"]
    }
    differs = [
        f"{n}: locked {v}, installed {installed.get(n, 'nothing')}" for n, v in pins.items() if installed.get(n) != v
    ]
    return {
        "file": path,
        "sha256": hashlib.sha256(data).hexdigest(),
        "packages": len(pins),
        "differs": sorted(differs),
    }


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
