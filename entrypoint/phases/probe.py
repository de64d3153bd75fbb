"""Probe phase: complete training steps (forward, loss, backward, optimizer) at the spec's max length and
microbatch on the real device, before the lease is spent on training.

    plain            microbatch at max_length, one optimizer step     -> peak memory, step time, gradients g
                     (with packing: microbatch rows of exactly max_length tokens)
    checkpointing    the same with activation checkpointing          -> must give g (same seed)
    accumulation     `k` microbatches accumulated into one step      -> must equal one batch of k x microbatch
    combined         both                                            -> must give the accumulation gradients

then a parameter check on the plain model after two updates: every declared trainable parameter moved,
every other one is bit-identical. A step that does not fit (OOM) stops the job with the setting that
would make it fit.

The worst case is right for memory and wrong for time. What the plan needs is measured apart, on a fresh
model with the trial's own settings (entrypoint/job/plan.py reads it):

    typical_step     the median of 8 to 32 optimizer steps (at least 10 s of them) after a warm-up one,
                     run by the Trainer as a trial builds it (build_trainer: optimizer, clipping,
                     scheduler, logging every step, the resolved precision, grad_accum microbatches) with
                     its data loader drawing, seeded, from the train split as training sees it (packed rows
                     with packing)
    eval_loss_pass   4 to 16 eval-loss batches (at least 3 s of them, or all) drawn, seeded, from the eval
                     split (Trainer.evaluate), their mean x its batches
    load_seconds     loading the model with its adaptation
    trial_setup      from the load to the Trainer's loop starting
    checkpoint_cost  the trainable weights and optimizer state saved locally, then put to the store
    model_bytes      the base model's weight files (what a merged export reads)
    quantization     QLoRA: the step's memory with the quantized base against the same base unquantized
"""

from __future__ import annotations

import concurrent.futures
import gc
import math
import multiprocessing
import random
import shutil
import statistics
import time
from dataclasses import dataclass

import psutil
import torch
from transformers import TrainerCallback

from entrypoint.context import PhaseContext
from entrypoint.data.encoding import IGNORE_INDEX
from entrypoint.data.packing import pack, step_rows, to_device
from entrypoint.data.tokens import features_of, full_lengths, token_counts
from entrypoint.job import layout
from entrypoint.job.heartbeat import Heartbeat
from entrypoint.training.memory import OutOfMemory, PeakMemory, estimate_step, is_oom
from entrypoint.training.paramcheck import ParameterCheck
from entrypoint.training.steps import GRAD_RTOL, eval_gradients, max_rel_diff, measured_step, split_batch
from entrypoint.training.trainer import StepClock, build_trainer

__all__ = ["GRAD_RTOL", "run"]

# (name, activation checkpointing, microbatches accumulated: 1, or `k`)
SETUPS = (
    ("plain", False, False),
    ("checkpointing", True, False),
    ("accumulation", False, True),
    ("combined", True, True),
)


WARMUP_STEPS = 1
# Steps timed after the warm-up, their median the plan's step time: at least 8 and at least 10 s of them
# (cheap steps are timed in numbers, so that a few slowed by a busy machine, or long batches, do not decide),
# at most 32.
TYPICAL_STEPS = (8, 32)
TYPICAL_SECONDS = 10.0
EVAL_BATCHES = (4, 16)  # eval-loss batches timed: at least 4 and EVAL_SECONDS of them (or all), at most 16
EVAL_SECONDS = 3.0


@dataclass
class StepSetup:
    record: dict  # what the result reports
    grads: dict[str, torch.Tensor] | None  # None when the step did not fit (OOM)


def _full_rows(features: list[dict], size: int, max_length: int) -> list[dict]:
    """`size` packed rows of exactly max_length tokens (the worst case with packing): examples longest first,
    each row filled to the end, the example that overflows cut."""
    rows, at = [], 0
    for _ in range(size):
        members, room = [], max_length
        while room > 0:
            example = features[at % len(features)]
            at += 1
            n = min(room, len(example["input_ids"]))
            members.append({k: example[k][:n] for k in ("input_ids", "labels")})
            room -= n
        rows.append(pack(members, max_length)[0])
    return rows


def _batch(ctx: PhaseContext, processor, labels: list[str], size: int) -> dict:
    """`size` train examples, longest first, padded to exactly max_length: the worst case the trainer sees
    (with packing: `size` rows of exactly max_length tokens)."""
    kind = ctx.kind
    split = ctx.encoded("train", processor, labels)
    if ctx.spec.training.packing:
        max_length = ctx.spec.model.max_length  # a row takes at most max_length examples
        features = _full_rows(_longest(split, min(len(split), size * max_length)), size, max_length)
    else:
        features = _longest(split, size)
    batch = kind.model.collator(processor)(features)
    pad = ctx.spec.model.max_length - batch["input_ids"].shape[1] if "input_ids" in batch else 0
    if pad > 0:
        fill = {"input_ids": processor.pad_token_id or 0, "attention_mask": 0, "token_type_ids": 0}
        if kind.task.loss == "token":
            fill["labels"] = IGNORE_INDEX
        for key, value in fill.items():
            if key in batch:
                batch[key] = torch.nn.functional.pad(batch[key], (0, pad), value=value)
    return to_device(batch, ctx.device)


def _train_rows(ctx: PhaseContext, processor, labels: list[str]) -> int:
    """Rows a training epoch draws from: the train examples, or with packing the rows they pack into."""
    split = ctx.encoded("train", processor, labels)
    if not ctx.spec.training.packing:
        return len(split)
    return len(step_rows(ctx.spec, features_of(split), token_counts(split)))


def _longest(split, size: int) -> list[dict]:
    """The features of the `size` longest examples (before truncation), cycling if there are fewer."""
    lengths = full_lengths(split)
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [split[order[i % len(order)]].features for i in range(size)]


def _fresh(ctx: PhaseContext, labels: list[str]):
    """The model as training builds it, and a plain AdamW over its trainable parameters."""
    torch.manual_seed(ctx.spec.training.seed)
    model = ctx.kind.model.load(ctx.model_dir, labels, ctx.spec.adaptation).to(ctx.device)
    trainable = [p for p in model.parameters() if p.requires_grad]
    return model, torch.optim.AdamW(trainable, lr=ctx.spec.training.learning_rate)


def run(ctx: PhaseContext) -> dict:
    spec, kind, device = ctx.spec, ctx.kind, ctx.device
    labels = ctx.labels
    processor = kind.model.processor(ctx.model_dir)
    m, k = spec.training.microbatch, max(2, spec.training.grad_accum)
    setups = {}
    # each step setup, the gradient checks, the typical steps (with the eval-loss pass and the checkpoint's
    # cost), and the unquantized step beside a quantized one
    total = len(SETUPS) + 2 + (spec.adaptation.quantization is not None)
    with Heartbeat(ctx.log, "probe", total, "measurements") as beat:
        for name, checkpointing, accumulated in SETUPS:
            beat.advance(0, doing=f"the {name} step")
            parts = k if accumulated else 1
            batch = _batch(ctx, processor, labels, m * parts)
            setups[name] = _measure(ctx, labels, batch, parts, checkpointing, with_checks=name == "plain")
            beat.advance()
        if setups["plain"].grads is None:
            raise _does_not_fit(spec, setups)
        beat.advance(0, doing="the gradient checks")
        checks = _gradient_checks(ctx, processor, labels, setups, k)
        beat.advance()
        tolerance = GRAD_RTOL[ctx.precision]
        failed = {name: diff for name, diff in checks.items() if diff > tolerance}
        if failed:
            raise RuntimeError(f"probe: gradients disagree beyond {tolerance:g} (max relative difference): {failed}")

        for setup in setups.values():  # checked: their gradients would only crowd the timing run
            setup.grads = None
        _free(ctx)
        beat.advance(0, doing="the typical steps, the eval-loss pass and a checkpoint")
        timing = _timing(ctx, processor, labels)
        beat.advance()
        quantized = None
        if spec.adaptation.quantization is not None:
            beat.advance(0, doing="the step without quantization")
            quantized = _against_unquantized(ctx, labels, _batch(ctx, processor, labels, m))
            beat.advance()
    plain = setups["plain"].record
    estimate = plain.pop("estimate_bytes")
    rows = "packed rows" if spec.training.packing else "examples"
    ctx.log(
        f"probe: step at {m} {rows} x {spec.model.max_length} tokens ({ctx.precision}): {plain['seconds']:.3f} s, "
        f"peak {plain['peak_bytes'] / 2**20:.0f} MiB ({device.type}); checkpointing and accumulation verified"
    )
    typical = timing.get("typical_step")
    if typical:
        ctx.log(
            f"probe: typical step ({typical['microbatches']} x {m} {rows} of real lengths, the Trainer's): "
            f"{typical['seconds']:.3f} s (median of {len(typical['steps'])}); eval-loss pass "
            f"{timing['eval_loss_pass']['seconds']:.2f} s; model load {timing['load_seconds']:.2f} s"
        )
    return {
        "device": device.type,
        "memory_measure": "allocator peak" if device.type == "cuda" else "process RSS (absolute)",
        "precision": ctx.precision,  # training.precision resolved for this device (auto: bf16 on a GPU)
        "precision_setting": spec.training.precision,
        "attn_implementation": setups["plain"].record.pop("attn_implementation", None),
        # What a training step draws from; the plan counts steps from it.
        "train_rows": _train_rows(ctx, processor, labels),
        "packing": spec.training.packing,
        "setups": {name: v.record for name, v in setups.items()},
        "gradient_checks": {"max_relative_difference": checks, "tolerance": tolerance},
        "estimate_bytes": estimate,
        # The plain step's measured peak is the prediction for training: the same model, batch shape and
        # optimizer, with the optimizer state already allocated by that step.
        "predicted_peak_bytes": plain["peak_bytes"],
        "loss_normalization": "per token across the accumulated batch" if kind.task.loss == "token" else "per example",
        "grad_accum_verified_with": k,
        # For the plan: the step as training will run it (worst-case above is for memory only), and the rest
        "worst_case_step_seconds": plain["seconds"] * spec.training.grad_accum,  # what an earlier rentune planned with
        "model_bytes": sum(path.stat().st_size for path in ctx.model_dir.rglob("*.safetensors")),  # a merge's reads
        **({"quantization": quantized} if quantized else {}),
        **timing,
    }


class _Enough(TrainerCallback):
    """Stops the timing run once TYPICAL_STEPS[0] steps and TYPICAL_SECONDS of them are timed."""

    def __init__(self, clock: StepClock):
        self.clock = clock

    def on_step_end(self, args, state, control, **kwargs):
        ends = self.clock.ends  # StepClock comes first in the callbacks: this step's end is in
        timed = len(ends) - WARMUP_STEPS
        if timed >= TYPICAL_STEPS[0] and ends[-1] - ends[WARMUP_STEPS - 1] >= TYPICAL_SECONDS:
            control.should_training_stop = True
        return control


def _free(ctx: PhaseContext) -> None:
    gc.collect()
    if ctx.device.type == "cuda":
        torch.cuda.empty_cache()


def _timing(ctx: PhaseContext, processor, labels: list[str]) -> dict:
    """What the plan needs (the module docstring), or nothing when the timing run itself does not fit in
    memory beside what the probe holds (the plan then falls back on the worst-case step, and says so)."""
    try:
        return _timed(ctx, processor, labels)
    except Exception as exc:
        if not is_oom(exc):
            raise
        ctx.log("probe: the typical step could not be timed (out of memory); the plan uses the worst-case step")
        return {}
    finally:
        shutil.rmtree(ctx.workdir / "probe", ignore_errors=True)  # the Trainer saves at its last step
        _free(ctx)


def _timed(ctx: PhaseContext, processor, labels: list[str]) -> dict:
    """A fresh model trained for a few steps by the Trainer exactly as a trial builds it, its data loader
    drawing (seeded) from the train split as training sees it, then evaluated on a few eval batches."""
    spec, kind, device, precision = ctx.spec, ctx.kind, ctx.device, ctx.precision
    t = spec.training
    train, held = ctx.encoded("train", processor, labels), ctx.encoded("eval", processor, labels)
    features, eval_features = features_of(train), features_of(held)
    if t.packing:  # as the trial sees them (trial/train.py: _prepare)
        features = step_rows(spec, features, token_counts(train))
        eval_features = step_rows(spec, eval_features, token_counts(held))
    started = time.perf_counter()
    model, _ = _fresh(ctx, labels)
    load = time.perf_counter() - started
    steps = WARMUP_STEPS + TYPICAL_STEPS[1]
    short = t.model_copy(
        update={"max_steps": steps, "checkpoint": t.checkpoint.model_copy(update={"every_steps": None})}
    )
    clock = StepClock()
    enough = _Enough(clock)
    trainer = build_trainer(
        model, kind.model.collator(processor), features, short, output_dir=ctx.workdir / "probe" / "trainer",
        device=device, loss_per=kind.task.loss, callbacks=[clock, enough], precision=precision,
    )  # fmt: skip
    trainer.train()
    gaps = [b - a for a, b in zip(clock.ends, clock.ends[1:], strict=False)]  # the first step is the warm-up
    size = t.eval_batch
    batches = math.ceil(len(eval_features) / size)
    rng = random.Random(t.seed)
    picks = rng.sample(range(batches), min(EVAL_BATCHES[1], batches))  # the model is warm from the steps
    eval_times = []
    for i in picks:  # one batch at a time, as the Trainer's evaluation runs them
        chunk = list(eval_features[i * size : (i + 1) * size])
        eval_times.append(trainer.evaluate(eval_dataset=chunk)["eval_runtime"])
        if len(eval_times) >= EVAL_BATCHES[0] and sum(eval_times) >= EVAL_SECONDS:
            break
    return {
        "load_seconds": round(load, 4),
        "trial_setup_seconds": round(clock.began - started, 4),  # load, the Trainer built, its loop started
        "typical_step": {
            "seconds": statistics.median(gaps),
            "steps": [round(g, 4) for g in gaps],
            "warmup_steps": WARMUP_STEPS,
            "microbatches": t.grad_accum,
            "microbatch": t.microbatch,
            "drawn": f"the Trainer's seeded ({t.seed}) order over the train split's {len(features)} "
            + ("packed rows" if t.packing else "examples"),
            "precision": precision,
            "activation_checkpointing": t.activation_checkpointing,
        },
        "eval_loss_pass": {
            "seconds": statistics.mean(eval_times) * batches if eval_times else 0.0,
            "batches": batches,
            "batches_timed": len(eval_times),
            "batch": size,
        },
        "checkpoint_cost": _checkpoint_cost(ctx, trainer.model, trainer.optimizer),
    }  # the trainer, its model and optimizer go with this frame; _timing frees them


def _checkpoint_cost(ctx: PhaseContext, model, optimizer) -> dict:
    """What a checkpoint costs: the trainable weights and optimizer state saved locally (what blocks the
    training loop) and put to the store (the commit, and the store's throughput), then deleted."""
    folder = ctx.workdir / "probe"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "checkpoint.pt"
    trainable = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    started = time.perf_counter()
    torch.save({"weights": trainable, "optimizer": optimizer.state_dict()}, path)
    saved = time.perf_counter()
    ctx.store.put_file(layout.PROBE_STORE_CHECK, path)
    put = time.perf_counter() - saved
    size = path.stat().st_size
    ctx.store.delete(layout.PROBE_STORE_CHECK)
    path.unlink()
    return {
        "bytes": size,
        "save_seconds": round(saved - started, 4),
        "put_seconds": round(put, 4),
        "weights_bytes": sum(p.numel() * p.element_size() for p in trainable.values()),
    }


def _against_unquantized(ctx: PhaseContext, labels, batch: dict) -> dict:
    """QLoRA: the plain step's memory with the quantized base and with the same base unquantized (the same
    LoRA, batch and optimizer): the peak during a step above what was held before its model loaded, that is
    the model as it stays in memory plus the step's gradients, optimizer state and activations. On a GPU
    the allocator's figures, in this process. On CPU each is measured in a fresh process: the RSS of this
    one keeps what earlier steps freed, which would make whichever is measured first look smaller. The
    unquantized one is left out where its weight files would take more than half the memory free for them
    (on a GPU that is often why QLoRA was chosen)."""
    spec, device = ctx.spec, ctx.device
    files = sum(path.stat().st_size for path in ctx.model_dir.rglob("*.safetensors"))
    free = psutil.virtual_memory().available  # from_pretrained reads the weights into host memory first
    if device.type == "cuda":
        free = min(free, torch.cuda.mem_get_info(device)[0])
    where = "the allocator's, in the probe's process" if device.type == "cuda" else "process RSS, a fresh process each"
    out = {"measure": f"a step's peak above the memory held before its model loaded ({where})"}
    out["weight_files_bytes"] = files
    plain = spec.adaptation.model_copy(update={"quantization": None})
    for name, adaptation in (("quantized", spec.adaptation), ("unquantized", plain)):
        if name == "unquantized" and 2 * files > free:
            out[name] = {"skipped": f"the weight files take {files / 2**30:.1f} GiB, half of the free memory is less"}
            continue
        _free(ctx)
        if device.type == "cuda":
            out[name] = _step_memory(ctx.kind, ctx.model_dir, labels, adaptation, batch, device, ctx.precision)
        else:
            spawn = multiprocessing.get_context("spawn")
            with concurrent.futures.ProcessPoolExecutor(1, mp_context=spawn) as fresh:
                args = (spec, ctx.model_dir, labels, adaptation, batch, device, ctx.precision)
                out[name] = fresh.submit(_fresh_step_memory, *args).result()
    _free(ctx)
    q, u = out["quantized"].get("peak_bytes"), out["unquantized"].get("peak_bytes")
    out["saved_share"] = 1 - q / u if q and u else None
    if q is not None and u is not None:
        weights = [out[name]["weights_bytes"] / 2**20 for name in ("quantized", "unquantized")]
        ctx.log(
            f"probe: {spec.adaptation.quantization.bits}-bit base: a step holds {q / 2**20:,.0f} MiB against "
            f"{u / 2**20:,.0f} MiB unquantized ({_less_or_more(out['saved_share'])}; weights {weights[0]:,.1f} against "
            f"{weights[1]:,.1f} MiB)"
        )
    return out


def _less_or_more(share: float) -> str:
    return f"{share:.0%} less" if share >= 0 else f"{-share:.0%} more"


def _fresh_step_memory(spec, model_dir, labels, adaptation, batch, device, precision) -> dict:
    """_step_memory in a process of its own (spawned: nothing held before the model loads)."""
    from entrypoint.kinds import kind_for
    from entrypoint.training.environment import quiet_libraries

    quiet_libraries()
    return _step_memory(kind_for(spec), model_dir, labels, adaptation, batch, device, precision)


def _step_memory(kind, model_dir, labels, adaptation, batch, device, precision) -> dict:
    """The base loaded with `adaptation`, one plain step on `batch`: the step's peak above what was held
    before the load, the model's tensors, and the step's own increase; {"oom": True} if it does not fit."""
    gc.collect()
    torch.manual_seed(1234)
    before = _held(device)
    try:
        model = kind.model.load(model_dir, labels, adaptation).to(device)
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
        gc.collect()  # what loading needed only for a while (the unquantized weights being quantized)
        with PeakMemory(device) as peak:
            measured_step(model, [batch], kind.task.loss, False, optimizer, device, precision)
    except Exception as exc:
        if not is_oom(exc):
            raise
        return {"oom": True}
    return {
        "peak_bytes": peak.peak - before,
        "weights_bytes": _weights_bytes(model),
        "step_bytes": peak.peak - peak.start,
    }


def _held(device: torch.device) -> int:
    """Memory held now: the allocator's on a GPU, the process RSS on CPU (as PeakMemory measures)."""
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else psutil.Process().memory_info().rss


def _weights_bytes(model: torch.nn.Module) -> int:
    """The model's parameters and buffers as they sit in memory (packed quantized weights included)."""
    return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))


def _measure(ctx: PhaseContext, labels, batch: dict, parts: int, checkpointing: bool, with_checks: bool) -> StepSetup:
    """One timed optimizer step of a fresh model over `parts` microbatches. With `with_checks`, also the
    memory estimate and the parameter check after two updates."""
    model, optimizer = _fresh(ctx, labels)
    record = {"microbatch": batch["labels"].shape[0] // parts, "accumulated": parts, "checkpointing": checkpointing}
    loss_per = ctx.kind.task.loss
    try:
        measured, grads = measured_step(
            model, split_batch(batch, parts), loss_per, checkpointing, optimizer, ctx.device, ctx.precision
        )
    except Exception as exc:
        if not is_oom(exc):
            raise
        del model, optimizer  # free the failed attempt before the next setup builds its model
        gc.collect()
        if ctx.device.type == "cuda":
            torch.cuda.empty_cache()
        return StepSetup({"oom": True, **record}, None)
    record.update(measured)
    if with_checks:
        record["attn_implementation"] = getattr(getattr(model, "config", None), "_attn_implementation", None)
        record["estimate_bytes"] = estimate_step(model, measured["peak_bytes"] - measured["start_bytes"]).as_dict()
        checker = ParameterCheck(model, ctx.spec.adaptation.method)
        checker.after_update(model, 1)
        measured_step(model, [batch], loss_per, False, optimizer, ctx.device, ctx.precision)
        checker.after_update(model, 2)
        record["parameter_check"] = {"passed": checker.done, **checker.summary()}
    return StepSetup(record, grads)


def _gradient_checks(ctx: PhaseContext, processor, labels, setups: dict[str, StepSetup], k: int) -> dict[str, float]:
    """Largest relative gradient difference of each setup against what it must equal."""
    checks = {}
    if setups["checkpointing"].grads is not None:
        checks["checkpointing_vs_plain"] = max_rel_diff(setups["plain"].grads, setups["checkpointing"].grads)
    if setups["accumulation"].grads is not None:
        # Reference: one batch of k x microbatch, measured without timing (it may need more memory).
        # Eval mode (no dropout): the two batch shapes would draw different dropout masks otherwise.
        batch = _batch(ctx, processor, labels, ctx.spec.training.microbatch * k)
        loss_per = ctx.kind.task.loss
        whole = eval_gradients(_fresh(ctx, labels)[0], [batch], loss_per, ctx.device, ctx.precision)
        accumulated = eval_gradients(_fresh(ctx, labels)[0], split_batch(batch, k), loss_per, ctx.device, ctx.precision)
        checks["accumulation_vs_one_batch"] = max_rel_diff(whole, accumulated)
        if setups["combined"].grads is not None:
            checks["combined_vs_accumulation"] = max_rel_diff(setups["accumulation"].grads, setups["combined"].grads)
    return checks


def _does_not_fit(spec, setups: dict[str, StepSetup]) -> OutOfMemory:
    """The plain step did not fit: say which setting would make it fit, from the setups that did."""
    m = spec.training.microbatch
    fits = [n for n in ("checkpointing", "combined") if setups[n].grads is not None]
    hints = (
        ["set training.activation_checkpointing: true"]
        if fits
        else [
            f"halve training.microbatch to {max(1, m // 2)} and double training.grad_accum",
            "use adaptation.method: lora, precision bf16, or distribution deepspeed with offload",
        ]
    )
    return OutOfMemory(f"probe: one step at microbatch {m} x {spec.model.max_length} tokens does not fit", hints)
