"""QLoRA's base model: loaded quantized by bitsandbytes (4-bit NF4/FP4 or 8-bit LLM.int8()), made ready for
LoRA, hashed, and dequantized for a merge. Only jobs with `adaptation.quantization` import bitsandbytes.

The quantized weights are a function of the base's bytes, the settings and the bitsandbytes and torch
builds. Their sha256 (`quantized_sha256`: every tensor of the loaded model, the quantization state included)
is recorded in base_model.json at the job's first use of the base and compared at every later load, on
every node: a checkpoint holds the adapter and optimizer only, so a resume re-quantizes, and must get the
same bytes the adapter was trained against, or be refused.

One CPU trap is closed here: on CPUs with AVX512-BF16, bitsandbytes' `Linear4bit` takes another path in eval
mode under no_grad that repacks its weights in place and computes in bf16 even when fp32 was asked (its
outputs then differ from training's, and from another node's without those instructions). Every loaded
`Linear4bit` is pinned to the path every CPU takes (`support_avx512bf16_for_cpu = False`).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import logging
import os
import sys
import warnings
from pathlib import Path

import torch

from entrypoint.store.models import ModelMismatch
from jobspec.schema import Quantization

__all__ = [
    "bitsandbytes_version",
    "check_quantized",
    "compute_dtype",
    "dequantized",
    "first_record",
    "int8_scales",
    "load_quantized",
    "prepare_for_training",
    "quant_state_tensors",
    "quantization_record",
    "quantized_base",
    "quantized_sha256",
]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@functools.cache
def bitsandbytes_version() -> str:
    """Import bitsandbytes once, quietly: rentune's processes hide it (entrypoint/__init__.py), and its CPU
    backend would otherwise try to fetch a kernel from a hub (code rentune never runs: `kernels` is hidden
    during the import) and log the failure on every start."""
    hidden_until_now = "bitsandbytes" in sys.modules and sys.modules["bitsandbytes"] is None
    if hidden_until_now:
        del sys.modules["bitsandbytes"]
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    # On CPU every 8-bit matmul says its fp32 inputs are cast to fp16: true, and said once in docs/qlora.md.
    warnings.filterwarnings("ignore", message=r"MatMul8bitLt: inputs will be cast")
    hidden = sys.modules.get("kernels", ...)
    sys.modules["kernels"] = None  # `from kernels import ...` raises ImportError: bitsandbytes falls back
    try:
        import bitsandbytes
    finally:
        if hidden is ...:
            del sys.modules["kernels"]
        else:
            sys.modules["kernels"] = hidden
    if hidden_until_now:
        _forget_absence()
    return bitsandbytes.__version__


def _forget_absence() -> None:
    """peft and transformers cache whether bitsandbytes is installed; one that looked while it was hidden
    (a LoRA job earlier in this process: `rentune worker`) looks again, and peft's bnb layers load."""
    for module, names in (
        ("peft.import_utils", ("is_bnb_available", "is_bnb_4bit_available")),
        ("transformers.utils.import_utils", ("is_bitsandbytes_available",)),
    ):
        for name in names:
            cached = getattr(sys.modules.get(module), name, None)
            if hasattr(cached, "cache_clear"):
                cached.cache_clear()
    for name in ("peft.tuners.lora.bnb", "transformers.integrations.bitsandbytes"):
        if sys.modules.get(name) is not None:
            importlib.reload(sys.modules[name])


def compute_dtype(quantization: Quantization, precision: str) -> torch.dtype:
    """The dtype 4-bit matmuls run in: the spec's, or (auto) bf16 when training runs in bf16, else fp32."""
    if quantization.compute_dtype != "auto":
        return DTYPES[quantization.compute_dtype]
    return torch.bfloat16 if precision == "bf16" else torch.float32


def _config(quantization: Quantization, precision: str):
    from transformers import BitsAndBytesConfig

    if quantization.bits == 8:
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=quantization.quant_type,
        bnb_4bit_use_double_quant=quantization.double_quant,
        bnb_4bit_compute_dtype=compute_dtype(quantization, precision),
    )


def _placement(device: torch.device) -> dict:
    """Where from_pretrained puts the quantized weights: the device itself (a quantized model is not moved
    afterwards); a torchrun rank's own GPU."""
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", torch.cuda.current_device())))
    return {"": device}


def load_quantized(model_class, folder: Path, quantization: Quantization, precision: str, device, **loading):
    """`model_class.from_pretrained(folder)` with its weights quantized on `device` as `quantization` says,
    every Linear4bit pinned to the path every CPU takes (module docstring)."""
    bitsandbytes_version()
    model, info = model_class.from_pretrained(
        folder,
        quantization_config=_config(quantization, precision),
        device_map=_placement(torch.device(device)),
        dtype=compute_dtype(quantization, precision),  # the weights left unquantized (norms, embeddings)
        output_loading_info=True,
        **loading,
    )
    pinned = _pin_cpu_path(model)
    model.rentune_quantized = quantization_record(quantization, precision, quantized_sha256(model), pinned)
    model.rentune_loading_info = info  # missing weights are filled at random, not refused: the caller checks
    return model


def _pin_cpu_path(model: torch.nn.Module) -> int:
    pinned = 0
    for module in model.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False
            pinned += 1
    return pinned


def quantization_record(quantization: Quantization, precision: str, sha256: str, modules: int) -> dict:
    """What base_model.json and BINDING.json say of a quantized base: its settings as resolved, the builds
    that quantized it and the sha256 of the result."""
    settings = quantization.model_dump()
    # 4-bit: the matmuls' dtype; both: the dtype of the weights left unquantized (norms, embeddings)
    settings["compute_dtype"] = str(compute_dtype(quantization, precision)).removeprefix("torch.")
    if quantization.bits == 8:
        settings = {"bits": 8, "compute_dtype": settings["compute_dtype"]}
    return {
        **settings,
        "sha256": sha256,
        "quantized_modules": modules,
        "bitsandbytes": bitsandbytes_version(),
        "torch": torch.__version__,
    }


def quantized_sha256(model: torch.nn.Module) -> str:
    """sha256 over every tensor of the loaded model's state dict in key order (name, dtype, shape, bytes):
    the packed weights, their quantization state (absmax, code maps, int8 scales) and the unquantized
    weights, exactly as the model computes with them."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        if not isinstance(tensor, torch.Tensor):
            continue
        data = tensor.detach().to("cpu").contiguous()
        digest.update(f"{name}\t{data.dtype}\t{tuple(data.shape)}\n".encode())
        digest.update(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"")
    return digest.hexdigest()


def quant_state_tensors(param: torch.Tensor) -> list[torch.Tensor]:
    """The tensors a 4-bit weight computes with besides its own bytes: its quantization state (absmax, code
    map, the nested state of double quantization)."""
    state = getattr(param, "quant_state", None)
    if state is None:
        return []
    return [t for t in state.as_dict(packed=True).values() if isinstance(t, torch.Tensor)]


def int8_scales(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Each 8-bit layer's row scales (`<module>.SCB`). They start on the weight and move to the layer's
    state at its first forward pass: read from wherever they are."""
    bnb = sys.modules.get("bitsandbytes")
    if bnb is None:  # not imported: no 8-bit layer can exist
        return {}
    scales = {}
    for name, module in model.named_modules():
        if not isinstance(module, bnb.nn.Linear8bitLt):  # not peft's wrapper of one, whose weight is the same
            continue
        found = getattr(getattr(module, "weight", None), "SCB", None)
        if found is None:
            found = getattr(getattr(module, "state", None), "SCB", None)
        if isinstance(found, torch.Tensor):
            scales[f"{name}.SCB"] = found
    return scales


def prepare_for_training(model: torch.nn.Module) -> torch.nn.Module:
    """peft's preparation for training on a quantized base: the unquantized weights (norms, embeddings) in
    fp32. Activation checkpointing is left to the trainer and the probe, which switch it as for LoRA."""
    from peft import prepare_model_for_kbit_training

    return prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)


def quantized_base(spec, folder: Path, quantization: Quantization, recorded: dict | None, **loading):
    """The causal LM in `folder` quantized on the job's device (spec.training) as `quantization` says,
    checked against the job's `recorded` quantized base (check_quantized; None: nothing to compare)."""
    from transformers import AutoModelForCausalLM

    from entrypoint.training.device import resolve_device, resolve_precision

    device = resolve_device(spec.training)
    precision = resolve_precision(spec.training, device)
    model = load_quantized(AutoModelForCausalLM, folder, quantization, precision, device, **loading)
    check_quantized(recorded, model.rentune_quantized, spec.job.id)
    return model


def first_record(spec, folder: Path, loading: dict) -> dict:
    """The quantized base's record at the job's first use of it (base_model.json): the base quantized once
    on the job's device, hashed, and freed."""
    model = quantized_base(spec, folder, spec.adaptation.quantization, None, **loading)
    record = model.rentune_quantized
    del model
    return record


def check_quantized(recorded: dict | None, mine: dict, job_id: str) -> None:
    """ModelMismatch unless this process quantized the base to the bytes the job recorded at its first use;
    the message names every setting and build that differs. Nothing recorded (a job recorded before
    quantization was known): nothing to compare."""
    if not recorded or recorded.get("sha256") == mine["sha256"]:
        return
    keys = [k for k in ("bits", "quant_type", "double_quant", "compute_dtype", "bitsandbytes", "torch")]
    differ = [f"{k} {recorded.get(k)} there, {mine.get(k)} here" for k in keys if recorded.get(k) != mine.get(k)]
    why = "; ".join(differ) if differ else "same settings and builds (another device or CPU path)"
    raise ModelMismatch(
        f"model: this node quantized the base to sha256 {mine['sha256'][:16]}..., not to the "
        f"{str(recorded.get('sha256'))[:16]}... job {job_id} was trained against ({why}). Refusing to go on: "
        "the adapter was trained on the other bytes. Run it where bitsandbytes and torch are the versions "
        "recorded in base_model.json"
    )


def dequantized(model: torch.nn.Module) -> torch.nn.Module:
    """The quantized base with every quantized layer replaced by a plain Linear holding its dequantized
    weights (transformers' `dequantize`): dequantized in the compute dtype, as every forward pass does, then
    held in fp32. These are the weights the adapter was trained against, which a merge into them
    reproduces. The whole model is held in fp32 on its device while it is merged."""
    model = model.dequantize(dtype=torch.float32)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model.to(torch.float32)
