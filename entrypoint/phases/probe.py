"""Probe phase: complete training steps (forward, loss, backward, optimizer) at the spec's max length and
microbatch on the real device, before the lease is spent on training.

    plain            microbatch at max_length, one optimizer step     -> peak memory, step time, gradients g
    checkpointing    the same with activation checkpointing          -> must give g (same seed)
    accumulation     `k` microbatches accumulated into one step      -> must equal one batch of k x microbatch
    combined         both                                            -> must give the accumulation gradients

then a parameter check on the plain model after two updates: every declared trainable parameter moved,
every other one is bit-identical. A step that does not fit (OOM) stops the job with the setting that
would make it fit.
"""

from __future__ import annotations

import gc
import time

import torch

from entrypoint.context import PhaseContext
from entrypoint.memory import OutOfMemory, PeakMemory, estimate_step, is_oom
from entrypoint.model import build_model, resolve_model_dir
from entrypoint.paramcheck import ParameterCheck
from entrypoint.preprocess import IGNORE_INDEX, collator, encode_rows, is_causal, is_image, load_processor

__all__ = ["GRAD_RTOL", "run"]

GRAD_RTOL = 1e-4  # float sums in another order: equal to about 1e-6 in fp32; bf16 needs more
SEED = 1234


def _batch(ctx: PhaseContext, tokenizer, labels: list[str], size: int, causal: bool) -> dict:
    """`size` train examples, longest first, padded to exactly max_length: the worst case the trainer sees."""
    rows = ctx.read_split("train")
    encoded = sorted(encode_rows(tokenizer, rows, ctx.spec, labels), key=lambda e: -e.full_length)
    features = [encoded[i % len(encoded)].features for i in range(size)]
    batch = collator(tokenizer, causal, is_image(ctx.spec))(features)
    length = ctx.spec.model.max_length
    pad = length - batch["input_ids"].shape[1] if "input_ids" in batch else 0
    if pad > 0:
        fill = {"input_ids": tokenizer.pad_token_id or 0, "attention_mask": 0, "token_type_ids": 0}
        if causal:
            fill["labels"] = IGNORE_INDEX
        for key, value in fill.items():
            if key in batch:
                batch[key] = torch.nn.functional.pad(batch[key], (0, pad), value=value)
    return {k: v.to(ctx.device) for k, v in batch.items()}


def _split(batch: dict, parts: int) -> list[dict]:
    size = batch["labels"].shape[0] // parts
    return [{k: v[i * size : (i + 1) * size] for k, v in batch.items()} for i in range(parts)]


def _loss_weights(micro: list[dict], causal: bool) -> list[float]:
    """How the trainer normalises an accumulated batch: per token across all microbatches (causal LM), or
    per example (classification). Each microbatch's mean loss is weighted by its share of the total."""
    if causal:
        counts = [int((m["labels"][:, 1:] != IGNORE_INDEX).sum()) for m in micro]
    else:
        counts = [m["labels"].shape[0] for m in micro]
    return [c / sum(counts) for c in counts]


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad and p.grad is not None}


def _step(model, micro: list[dict], causal: bool, checkpointing: bool, optimizer, device) -> tuple[dict, dict]:
    """One optimizer step over `micro` microbatches; returns measurements and the gradients before the step."""
    if checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.activation_checkpointing_disable()
    model.train()
    torch.manual_seed(SEED)
    weights = _loss_weights(micro, causal)
    with PeakMemory(device) as peak:
        started = time.perf_counter()
        for part, weight in zip(micro, weights, strict=True):
            (model(**part).loss * weight).backward()
        grads = _grads(model)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - started
    return {"peak_bytes": peak.peak, "start_bytes": peak.start, "seconds": seconds}, grads


def _max_rel_diff(a: dict, b: dict) -> float:
    """Largest difference of any parameter's gradient, relative to that gradient's size. Gradients that are
    zero in exact arithmetic (an attention key bias: softmax ignores it) come out as float noise, about
    1e-11; they are measured against a thousandth of the largest gradient instead of against themselves."""
    floor = 1e-3 * max((g.abs().max().item() for g in a.values()), default=0.0)
    worst = 0.0
    for name in a:
        scale = max(a[name].abs().max().item(), floor) or 1.0
        worst = max(worst, (a[name] - b[name]).abs().max().item() / scale)
    return worst


def _fresh(folder, causal, labels, spec, device):
    torch.manual_seed(spec.training.seed)
    model = build_model(folder, causal, labels, spec.adaptation, is_image(spec)).to(device)
    trainable = [p for p in model.parameters() if p.requires_grad]
    return model, torch.optim.AdamW(trainable, lr=spec.training.learning_rate)


def run(ctx: PhaseContext) -> dict:
    spec = ctx.spec
    causal = is_causal(spec)
    folder = resolve_model_dir(spec.model)
    labels = ctx.labels
    tokenizer = load_processor(folder, spec)
    m = spec.training.microbatch
    k = max(2, spec.training.grad_accum)
    device = ctx.device
    variants, outcomes = {}, {}
    for name, checkpointing, parts in (
        ("plain", False, 1),
        ("checkpointing", True, 1),
        ("accumulation", False, k),
        ("combined", True, k),
    ):
        model, optimizer = _fresh(folder, causal, labels, spec, device)
        batch = _batch(ctx, tokenizer, labels, m * parts, causal)
        try:
            measured, grads = _step(model, _split(batch, parts), causal, checkpointing, optimizer, device)
        except Exception as exc:
            if not is_oom(exc):
                raise
            del model, optimizer, batch  # free the failed attempt before the next variant builds its model
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
            outcomes[name] = "oom"
            variants[name] = {"oom": True, "microbatch": m, "accumulated": parts, "checkpointing": checkpointing}
            continue
        variants[name] = {"microbatch": m, "accumulated": parts, "checkpointing": checkpointing, **measured}
        if name == "plain":
            estimate = estimate_step(model, measured["peak_bytes"] - measured["start_bytes"])
            checker = ParameterCheck(model, spec.adaptation.method)
            checker.after_update(model, 1)
            _step(model, [batch], causal, False, optimizer, device)
            checker.after_update(model, 2)
            variants[name]["parameter_check"] = {"passed": checker.done, **checker.summary()}
        outcomes[name] = grads
        del model, optimizer

    if outcomes.get("plain") == "oom":
        fits = [n for n in ("checkpointing", "accumulation", "combined") if outcomes.get(n) != "oom"]
        advice = {
            "checkpointing": "set training.activation_checkpointing: true",
            "combined": "set training.activation_checkpointing: true",
        }
        hints = [advice[n] for n in fits if n in advice][:1] or [
            f"halve training.microbatch to {max(1, m // 2)} and double training.grad_accum",
            "use adaptation.method: lora, precision bf16, or distribution deepspeed with offload",
        ]
        raise OutOfMemory(f"probe: one step at microbatch {m} x {spec.model.max_length} tokens does not fit", hints)

    checks = {}
    if isinstance(outcomes.get("checkpointing"), dict):
        checks["checkpointing_vs_plain"] = _max_rel_diff(outcomes["plain"], outcomes["checkpointing"])
    if isinstance(outcomes.get("accumulation"), dict):
        # Reference: one batch of k x microbatch, measured without timing (it may need more memory).
        # Eval mode (no dropout): the two batch shapes would draw different dropout masks otherwise.
        batch = _batch(ctx, tokenizer, labels, m * k, causal)
        whole = _eval_grads(_fresh(folder, causal, labels, spec, device)[0], [batch], causal)
        accumulated = _eval_grads(_fresh(folder, causal, labels, spec, device)[0], _split(batch, k), causal)
        checks["accumulation_vs_one_batch"] = _max_rel_diff(whole, accumulated)
        if isinstance(outcomes.get("combined"), dict):
            checks["combined_vs_accumulation"] = _max_rel_diff(outcomes["accumulation"], outcomes["combined"])
    failed = {name: diff for name, diff in checks.items() if diff > GRAD_RTOL}
    if failed:
        raise RuntimeError(f"probe: gradients disagree beyond {GRAD_RTOL:g} (max relative difference): {failed}")

    plain = variants["plain"]
    ctx.log(
        f"probe: step at {m} x {spec.model.max_length} tokens: {plain['seconds']:.3f} s, peak "
        f"{plain['peak_bytes'] / 2**20:.0f} MiB ({device.type}); checkpointing and accumulation verified"
    )
    return {
        "device": device.type,
        "memory_measure": "allocator peak" if device.type == "cuda" else "process RSS (absolute)",
        "precision": spec.training.precision,
        "variants": variants,
        "gradient_checks": {"max_relative_difference": checks, "tolerance": GRAD_RTOL},
        "estimate_bytes": estimate.as_dict(),
        # The plain step's measured peak is the prediction for training: the same model, batch shape and
        # optimizer, with the optimizer state already allocated by that step.
        "predicted_peak_bytes": plain["peak_bytes"],
        "loss_normalization": "per token across the accumulated batch" if causal else "per example",
        "grad_accum_verified_with": k,
    }


def _eval_grads(model, micro: list[dict], causal: bool) -> dict[str, torch.Tensor]:
    """Gradients of the accumulated, normalised loss over `micro`, in eval mode (dropout off)."""
    model.eval()
    for part, weight in zip(micro, _loss_weights(micro, causal), strict=True):
        (model(**part).loss * weight).backward()
    return _grads(model)
