"""The device a job trains on, decided once: the one place that checks the spec's backend, device and
precision against what this process's torch can do. The runner calls `preflight` before any phase; every
phase gets the same answer from `resolve_device`."""

from __future__ import annotations

import torch

from entrypoint.errors import InvalidInput
from jobspec.schema import Training

__all__ = ["Unsupported", "backend", "preflight", "resolve_device"]


class Unsupported(InvalidInput):
    """The spec asks for something this image or machine cannot do; said before any compute is spent."""


def backend() -> str:
    """The accelerator stack this torch is built for: rocm, cuda or cpu."""
    return "rocm" if torch.version.hip else "cuda" if torch.version.cuda else "cpu"


def resolve_device(training: Training) -> torch.device:
    """`training.device` made concrete: auto is the GPU when torch sees one (ROCm reports as cuda too)."""
    wanted = training.device
    if wanted == "cuda" and not torch.cuda.is_available():
        raise Unsupported("training.device: 'cuda' requested but torch sees no CUDA or ROCm device")
    if wanted == "auto":
        wanted = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(wanted)


def preflight(training: Training) -> torch.device:
    """Refuse an image built for another stack, a device that is not there, or a precision the device
    cannot train in. Returns the device."""
    have = backend()
    if training.backend != "any" and training.backend != have:
        built = {"rocm": f"ROCm (HIP {torch.version.hip})", "cuda": f"CUDA {torch.version.cuda}", "cpu": "CPU only"}
        raise Unsupported(
            f"training.backend: the spec expects {training.backend!r} but this image's torch {torch.__version__} is "
            f"built for {built[have]}; run it on the {training.backend} image (`rentune env` shows what an image has)"
        )
    device = resolve_device(training)
    if training.precision == "fp16" and device.type != "cuda":
        raise Unsupported("training.precision: fp16 needs a CUDA or ROCm device; use bf16 or fp32 on CPU")
    if training.precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise Unsupported(f"training.precision: bf16 is not supported by {torch.cuda.get_device_name(device)}")
    return device
