"""A LoRA adapter merged into its base model, so that the result serves without peft (export/merged/).

Two ways, the same arithmetic: every wrapped weight becomes W + scale * (B @ A), computed in float32 and
then cast to the export's dtype (merging straight into a bf16 or quantized base rounds the small delta
away: peft#1388, transformers#31293).

- Streamed (`merge_streamed`): over the base's safetensors files one at a time and one tensor at a time,
  written as shards of the same names with the same index. Peak memory: one output shard and one tensor
  in float32, so a 70B base merges in a node's RAM. For adapters whose every LoRA module names a weight
  of the base checkpoint (plain LoRA on the linear layers of a decoder), which `stream_refusal` checks.
- In memory (`merge_loaded`): the model as the job loads it (base + adapter, or a full fine-tune), upcast
  to float32, peft's `merge_and_unload`, cast and `save_pretrained`: for what the stream cannot place (a
  new head saved with the adapter, DoRA, per-module ranks, embedding LoRA, renamed checkpoint keys).

Serving files (tokenizer, chat template, generation config) are the caller's (entrypoint/trial/export.py).
A quantized base is refused either way (`MergeError`): merging into it rounds the delta away, and rentune
trains on unquantized safetensors weights.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from entrypoint.job.heartbeat import Heartbeat
from entrypoint.training.model import SHARD_INDEX, sharded_weights

__all__ = ["DTYPES", "MergeError", "base_dtype", "merge_loaded", "merge_streamed", "stream_refusal"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
ADAPTER_WEIGHTS, ADAPTER_CONFIG = "adapter_model.safetensors", "adapter_config.json"
PREFIX = "base_model.model."  # peft's prefix of every saved adapter key
TIED = ("lm_head", "embed")  # with tie_word_embeddings, a LoRA on either changes both: merged in memory


class MergeError(RuntimeError):
    """The adapter cannot be merged into this base (a quantized base)."""


def refuse_quantized(base: Path) -> None:
    """MergeError for a base whose config.json names a quantization_config."""
    config = json.loads((base / "config.json").read_text())
    if config.get("quantization_config"):
        method = config["quantization_config"].get("quant_method", "?")
        raise MergeError(
            f"{base}: the base model is quantized ({method}); merging into it would round the adapter's delta "
            "away. Merge into the unquantized base it was made from"
        )


def base_dtype(folder: Path) -> str:
    """The base model's own dtype (config.json `dtype`, `torch_dtype` before transformers 5), float32 if
    it names none or one rentune does not export to."""
    config = json.loads((folder / "config.json").read_text())
    name = config.get("dtype") or config.get("torch_dtype") or "float32"
    return name if name in DTYPES else "float32"


def _base_files(folder: Path) -> list[str]:
    return sharded_weights(folder) or ["model.safetensors"]


def _lora_pairs(adapter: Path) -> dict[str, tuple[torch.Tensor, torch.Tensor]] | str:
    """module name -> (A, B) from the saved adapter, or why it holds more than plain LoRA pairs."""
    tensors, pairs = load_file(adapter / ADAPTER_WEIGHTS), {}
    for key in tensors:
        module, _, part = key.removeprefix(PREFIX).rpartition(".lora_")
        if not key.startswith(PREFIX) or part not in ("A.weight", "B.weight"):
            return f"the adapter holds {key}, not a LoRA A or B weight"
        pairs.setdefault(module, {})[part[0]] = tensors[key]
    return {module: (ab["A"], ab["B"]) for module, ab in pairs.items()}


def stream_refusal(base: Path, adapter: Path) -> str | None:
    """None when `merge_streamed` can merge this adapter into this base; else why not (then merge in
    memory). Reads the adapter and the base's tensor names, not its weights."""
    refuse_quantized(base)
    config = json.loads((adapter / ADAPTER_CONFIG).read_text())
    if config.get("peft_type") != "LORA":
        return f"peft_type {config.get('peft_type')}"
    for field in ("use_dora", "fan_in_fan_out", "lora_bias", "layer_replication", "target_parameters"):
        if config.get(field):
            return f"{field} is set"
    for field in ("modules_to_save", "rank_pattern", "alpha_pattern", "trainable_token_indices"):
        if config.get(field):
            return f"{field} is not empty"
    if config.get("bias", "none") != "none":
        return f"bias {config['bias']}"
    pairs = _lora_pairs(adapter)
    if isinstance(pairs, str):
        return pairs
    names = set()
    for name in _base_files(base):
        with safe_open(base / name, "pt") as f:
            names |= set(f.keys())
    missing = [module for module in pairs if f"{module}.weight" not in names]
    if missing:
        return f"no base weight {missing[0]}.weight in {base}"
    tied = json.loads((base / "config.json").read_text()).get("tie_word_embeddings", False)
    wrapped = [module for module in pairs if any(part in module.rsplit(".", 1)[-1] for part in TIED)]
    return f"tied embeddings and a LoRA on {wrapped[0]}" if tied and wrapped else None


def merge_streamed(base: Path, adapter: Path, out: Path, dtype: str, log: Callable[[str], None] = print) -> dict:
    """Merge `adapter` into the base in `base`, file by file, into `out` (weights, index and config.json;
    see the module docstring). Call only when stream_refusal said None. Returns what was done."""
    config = json.loads((adapter / ADAPTER_CONFIG).read_text())
    rank, alpha = config["r"], config["lora_alpha"]
    scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    pairs = _lora_pairs(adapter)
    target, merged = DTYPES[dtype], 0
    out.mkdir(parents=True, exist_ok=True)
    files, sizes = _base_files(base), {}
    with Heartbeat(log, "merge", len(files), "files") as beat:
        for number, name in enumerate(files, 1):
            beat.advance(0, doing=name)
            tensors = {}
            with safe_open(base / name, "pt") as f:
                for key in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                    tensor = f.get_tensor(key)
                    pair = pairs.get(key.removesuffix(".weight")) if key.endswith(".weight") else None
                    if pair is not None:
                        a, b = pair
                        delta = b.float() @ a.float()
                        if delta.shape != tensor.shape:
                            raise MergeError(
                                f"{key}: the adapter's delta is {tuple(delta.shape)}, the weight {tuple(tensor.shape)}"
                            )
                        tensor = tensor.float() + scale * delta
                        merged += 1
                    tensors[key] = tensor.to(target) if tensor.is_floating_point() else tensor
            save_file(tensors, out / name, metadata={"format": "pt"})
            sizes[name] = sum(t.numel() * t.element_size() for t in tensors.values())
            log(f"merge: {name} ({number}/{len(files)}) written")
            del tensors
            beat.advance()
    if merged != len(pairs):
        raise RuntimeError(f"merge: {merged} weights merged, the adapter wraps {len(pairs)} modules")
    if len(files) > 1 or (base / SHARD_INDEX).is_file():
        index = json.loads((base / SHARD_INDEX).read_text())
        index["metadata"] = {**index.get("metadata", {}), "total_size": sum(sizes.values())}
        (out / SHARD_INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    model_config = json.loads((base / "config.json").read_text())
    model_config.pop("quantization_config", None)
    model_config["dtype"] = model_config["torch_dtype"] = dtype  # transformers 5 reads dtype, earlier ones torch_dtype
    (out / "config.json").write_text(json.dumps(model_config, indent=2, sort_keys=True) + "\n")
    return {"method": "streamed", "modules": merged, "scale": scale, "files": len(files)}


def merge_loaded(model: torch.nn.Module, out: Path, dtype: str, max_shard_size: str = "5GB") -> dict:
    """Merge a loaded model (a peft model: base + adapter; or a full fine-tune, only cast) in float32 and
    save it in `dtype` to `out` with save_pretrained (config.json without quantization_config)."""
    from peft import PeftModel

    if getattr(model.config, "quantization_config", None):
        raise MergeError("the base model is quantized: merging into it would round the adapter's delta away")
    modules = 0
    if isinstance(model, PeftModel):
        modules = sum(1 for name, _ in model.named_modules() if name.endswith(".lora_A"))
        model = model.float().merge_and_unload()
    model = model.to(DTYPES[dtype])
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.dtype = DTYPES[dtype]
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True, max_shard_size=max_shard_size)
    return {"method": "in memory", "modules": modules}
