"""BINDING.json checked against an export folder and a base model: `rentune check-export`.

The export phase writes BINDING.json (entrypoint/phases/export.py): the size and sha256 of every exported
file and the hashes of the base model the adapter was trained on. `check_export` reads it back on the
machine that will load the adapter.
"""

from __future__ import annotations

import json
from pathlib import Path

from entrypoint.errors import InvalidInput
from entrypoint.store import check_key
from entrypoint.store.hashing import file_sha256
from entrypoint.store.objects import CorruptObject, StoredObject, loads_object
from entrypoint.training.model import hash_base_model

__all__ = ["KWARGS_FILE", "TEMPLATE_FILE", "check_export"]

TEMPLATE_FILE = "adapter/chat_template.jinja"  # chat jobs: the template the tokenizer renders with
KWARGS_FILE = "adapter/chat_template_kwargs.json"  # chat jobs: data.chat_template_kwargs, when any


def check_export(
    directory: Path, base: Path, allow_parity_failure: bool = False, requantize: str | None = None
) -> tuple[StoredObject, list[str]]:
    """Check an export folder against its BINDING.json: every file it lists is there with its size and
    sha256 (those of merged/ only when that folder is there), no file under adapter/ or merged/ is
    unlisted, the merged folder (if any) passed its parity check (unless `allow_parity_failure`), and
    `base` hashes to the bound base model. Returns the binding and the problems found (none: the export is
    intact and belongs to `base`). A QLoRA export (BINDING.json's `quantization`) with `requantize` (a
    device: cpu, cuda) also has `base` quantized there as recorded and its sha256 compared. Raises
    CorruptObject when BINDING.json is unreadable or lacks what this check needs."""
    where = directory / "BINDING.json"
    try:
        binding = loads_object(where.read_bytes(), str(where))
    except OSError as exc:
        raise CorruptObject(f"{where}: cannot read the binding ({exc.strerror or exc})") from None
    files, expected = binding["files"], binding["base_model"]
    if not isinstance(files, dict) or not all(
        isinstance(v, dict) and isinstance(v.get("size"), int) and isinstance(v.get("sha256"), str)
        for v in files.values()
    ):
        raise CorruptObject(f"{where}: files: expected a mapping of file name -> {{size, sha256}}")
    merged = _merged_field(binding, where)
    quantization = binding.get("quantization")
    if quantization is not None and not (isinstance(quantization, dict) and isinstance(quantization.get("bits"), int)):
        raise CorruptObject(f"{where}: quantization: expected null or a mapping with the recorded bits and sha256")
    if requantize == "cuda" and quantization:
        _require_cuda()
    problems = []
    fetched = (directory / "merged").is_dir()  # `rentune fetch` leaves the merged model out unless asked
    for name, info in sorted(files.items()):
        if name.startswith("merged/") and not fetched:
            continue
        path = directory / check_key(name)
        if not path.is_file():
            problems.append(f"{path}: missing")
        elif path.stat().st_size != info["size"] or file_sha256(path) != info["sha256"]:
            problems.append(f"{path}: differs from its sha256 in BINDING.json (changed or corrupted)")
    for path in sorted([*(directory / "adapter").rglob("*"), *(directory / "merged").rglob("*")]):
        if path.is_file() and path.relative_to(directory).as_posix() not in files:
            problems.append(f"{path}: not covered by BINDING.json (added after the export?)")
    if fetched and merged and merged["parity"] == "failed" and not allow_parity_failure:
        reasons = "; ".join(merged.get("reasons") or []) or "no reason recorded"
        problems.append(
            f"{directory / 'merged'}: failed its parity check against the adapter ({reasons}); "
            "serve the adapter, or pass --allow-parity-failure to accept the merged folder as it is"
        )
    problems += _chat_problems(directory, binding)
    actual = hash_base_model(base, memo=False)  # every byte: this check is what a user relies on
    if actual.sha256 != expected["sha256"]:
        names = sorted(set(expected["files"]) | set(actual.files))
        differ = [n for n in names if expected["files"].get(n) != actual.files.get(n)]
        problems.append(
            f"{base}: base model sha256 {actual.sha256[:16]} differs from BINDING.json's {expected['sha256'][:16]}; "
            f"files that differ: {', '.join(differ)}"
        )
    if requantize and quantization and not problems:
        problems += _quantized_problems(base, quantization, requantize, binding["job_id"])
    return binding, problems


def _merged_field(binding: StoredObject, where: Path) -> dict | None:
    """BINDING.json's `merged`: null, or a mapping whose `parity` is ok, failed or skipped and whose
    `reasons` (if any) is a list of strings; CorruptObject naming the field otherwise."""
    merged = binding.get("merged")
    if merged is None:
        return None
    parities = ("ok", "failed", "not run")
    if not isinstance(merged, dict) or merged.get("parity") not in parities:
        raise CorruptObject(
            f"{where}: merged: expected null or a mapping with parity one of {', '.join(parities)}, got "
            f"{json.dumps(merged)[:80]}"
        )
    reasons = merged.get("reasons")
    if reasons is not None and not (isinstance(reasons, list) and all(isinstance(r, str) for r in reasons)):
        raise CorruptObject(f"{where}: merged.reasons: expected a list of strings, got {json.dumps(reasons)[:80]}")
    return merged


def _require_cuda() -> None:
    import torch

    if not torch.cuda.is_available():
        built = f"torch {torch.__version__}" + ("" if torch.version.cuda else ", built without CUDA")
        raise InvalidInput(
            f"--requantize cuda: this machine has no CUDA device ({built}); run check-export where the job "
            "trained (the same image and device kind), or leave --requantize out to check every file and the "
            "base model's sha256 without requantizing"
        )


def _quantized_problems(base: Path, recorded: dict, device: str, job_id: str) -> list[str]:
    """`base` quantized on `device` with the recorded settings: a different sha256 is a problem naming the
    settings and builds that differ (training/quantize.py: check_quantized)."""
    import torch
    from transformers import AutoModelForCausalLM

    from entrypoint.store.models import ModelMismatch
    from entrypoint.training.model import SAFE_LOADING
    from entrypoint.training.quantize import check_quantized, load_quantized
    from jobspec.schema import Quantization

    fields = (
        ("bits", "compute_dtype") if recorded["bits"] == 8 else ("bits", "quant_type", "double_quant", "compute_dtype")
    )
    settings = Quantization.model_construct(**{k: recorded[k] for k in fields})
    model = load_quantized(AutoModelForCausalLM, base, settings, "fp32", torch.device(device), **SAFE_LOADING)
    try:
        check_quantized(recorded, model.rentune_quantized, job_id)
    except ModelMismatch as exc:
        return [f"{base}: {exc}"]
    return []


def _chat_problems(directory: Path, binding: StoredObject) -> list[str]:
    """A chat job's export renders as it trained: its template is the one BINDING.json names, and its
    template arguments are those BINDING.json lists."""
    problems = []
    template, kwargs = binding.get("chat_template_sha256"), binding.get("chat_template_kwargs")
    path = directory / TEMPLATE_FILE
    if template and (not path.is_file() or file_sha256(path) != template):
        problems.append(f"{path}: not the chat template trained with (BINDING.json's chat_template_sha256)")
    path = directory / KWARGS_FILE
    if kwargs:
        try:
            found = json.loads(path.read_text())
        except (OSError, ValueError):
            found = None
        if found != kwargs:
            expected = json.dumps(kwargs, sort_keys=True)
            problems.append(f"{path}: not the chat template arguments trained with ({expected})")
    return problems
