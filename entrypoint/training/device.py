"""The device a job trains on, decided once: the one place that checks the spec's backend, device,
precision, attention implementation and kernels against what this process's torch and image can do. The
runner calls `preflight` before any phase; every phase gets the same answers from `resolve_device` and
`resolve_precision`."""

from __future__ import annotations

import importlib.metadata
import importlib.util

import torch

from entrypoint.errors import InvalidInput
from jobspec.schema import Model, Tracking, Training

__all__ = ["Unsupported", "backend", "preflight", "resolve_device", "resolve_precision"]


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


def resolve_precision(training: Training, device: torch.device) -> str:
    """`training.precision` made concrete: auto is bf16 mixed precision on a GPU that supports it (Ampere
    and later, MI200 and later), fp32 elsewhere (the CPU, older GPUs)."""
    if training.precision != "auto":
        return training.precision
    return "bf16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "fp32"


# The module each tracker of the spec's `tracking:` imports.
TRACKING_MODULES = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _distribution(name: str) -> bool:
    """Whether the distribution is installed (its metadata: rentune's processes hide bitsandbytes from
    find_spec until a QLoRA job imports it, entrypoint/__init__.py)."""
    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def preflight(
    training: Training, model: Model | None = None, tracking: Tracking | None = None, quantized: bool = False
) -> torch.device:
    """Refuse an image built for another stack, a device that is not there, a precision the device cannot
    train in, an attention implementation or kernels the image lacks, a tracker whose package it lacks, or
    a quantized base (`quantized`) without bitsandbytes:
    said before any compute is spent, never replaced by a slower fallback. Returns the device."""
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
    if training.liger and not _installed("liger_kernel"):
        raise Unsupported(
            "training.liger: the liger-kernel package is not installed in this image (it needs a GPU and Triton); "
            "set training.liger: false or use an image with `pip install liger-kernel`"
        )
    if quantized and not _distribution("bitsandbytes"):
        raise Unsupported(
            "adaptation.quantization: bitsandbytes is not installed in this image; install rentune[qlora] (the "
            "images have it) or remove adaptation.quantization"
        )
    missing = [name for name in tracking.enabled if not _installed(TRACKING_MODULES[name])] if tracking else []
    if missing:
        raise Unsupported(
            f"tracking: {', '.join(missing)} enabled but this image lacks "
            f"{', '.join(TRACKING_MODULES[name] for name in missing)}; install rentune[tracking] (the images have it) "
            "or remove the section"
        )
    if model is not None and model.attn_implementation == "flash_attention_2":
        if device.type != "cuda":
            raise Unsupported("model.attn_implementation: flash_attention_2 needs a CUDA or ROCm device; use sdpa")
        if not _installed("flash_attn"):
            raise Unsupported(
                "model.attn_implementation: flash_attention_2 needs the flash-attn package, which this image lacks; "
                "use sdpa (`rentune env` shows what an image has) or install flash-attn in the image"
            )
    return device
