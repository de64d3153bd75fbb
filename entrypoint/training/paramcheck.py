"""The parameters that train are exactly the ones declared: checked on the real model, after a real update.

Declared trainable: for LoRA, the adapter matrices (`lora_`) and the copies peft makes of
`modules_to_save` (and of a new classification head); for full fine-tuning, every parameter. After the
first optimizer steps every declared parameter must have changed and every other one must be
bit-identical (a quantized weight with its quantization state: training/quantize.py). LoRA's B matrices
start at zero, so the A matrices get no gradient in the first step: a declared parameter may take up to
`GRACE_STEPS` updates to move.

Under DeepSpeed ZeRO-3 each rank holds a slice of every parameter: each one is gathered whole for its
fingerprint, one at a time (the device holds at most one gathered parameter beyond the shards; the host
a copy of it while it is hashed), and every rank checks the same full values. On a large model that is
a full all-gather of the weights per checked step, for the few steps until the check passes.
"""

from __future__ import annotations

import hashlib

import torch

from entrypoint.training.quantize import int8_scales, quant_state_tensors

__all__ = ["GRACE_STEPS", "ParameterCheck", "ParameterCheckError", "declared_trainable"]

GRACE_STEPS = 2


class ParameterCheckError(RuntimeError):
    """Parameters changed that should be frozen, or declared trainable ones never changed."""


def declared_trainable(name: str, method: str) -> bool:
    if method == "full":
        return True
    return "lora_" in name or ".modules_to_save." in name


def _fingerprint(tensor: torch.Tensor) -> str:
    """sha256 of the tensor's bytes and, for a quantized weight (QLoRA), of its quantization state too."""
    digest = hashlib.sha256()
    for part in (tensor, *quant_state_tensors(tensor)):
        digest.update(part.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _fingerprints(model: torch.nn.Module) -> dict[str, str]:
    """name -> fingerprint of every parameter; a ZeRO-3 partitioned one (it has `ds_id`) gathered first.
    Under ZeRO-3 every rank must call this (the gathers are collectives), in the same order."""
    out = {}
    for name, param in model.named_parameters():
        if hasattr(param, "ds_id"):
            import deepspeed

            with deepspeed.zero.GatheredParameters([param], modifier_rank=None):
                out[name] = _fingerprint(param)
        else:
            out[name] = _fingerprint(param)
    for name, scales in int8_scales(model).items():  # 8-bit weights' scales: frozen like their weights
        out[name] = _fingerprint(scales)
    return out


class ParameterCheck:
    """`ParameterCheck(model, method)` fingerprints every parameter; call `after_update(model, step)` after
    each of the first optimizer steps. Raises ParameterCheckError on a violation; `done` once all passed."""

    def __init__(self, model: torch.nn.Module, method: str):
        self.method = method
        self.before = _fingerprints(model)
        declared = {name for name in self.before if declared_trainable(name, method)}
        if not declared:
            raise ParameterCheckError("no parameter is declared trainable; check adaptation.target_modules")
        self.pending = set(declared)  # declared, not yet seen to change
        self.declared = declared
        self.done = False
        wrong = sorted(n for n, p in model.named_parameters() if p.requires_grad != (n in declared))
        if wrong:
            raise ParameterCheckError(
                f"requires_grad disagrees with the declared adaptation for {len(wrong)} parameter(s): {wrong[:5]}"
            )

    def after_update(self, model: torch.nn.Module, step: int) -> None:
        if self.done:
            return
        now = _fingerprints(model)
        moved_frozen = sorted(n for n in self.before if n not in self.declared and now[n] != self.before[n])
        if moved_frozen:
            raise ParameterCheckError(
                f"step {step}: {len(moved_frozen)} parameter(s) that should be frozen changed: {moved_frozen[:5]}"
            )
        self.pending = {n for n in self.pending if now[n] == self.before[n]}
        if not self.pending:
            self.done = True
        elif step >= GRACE_STEPS:
            raise ParameterCheckError(
                f"after {step} updates with a learning rate above 0: {len(self.pending)} declared trainable "
                "parameter(s) never changed: "
                f"{sorted(self.pending)[:5]}"
            )

    def summary(self) -> dict:
        return {"declared_trainable": len(self.declared), "frozen": len(self.before) - len(self.declared)}
