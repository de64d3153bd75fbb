"""QLoRA on CPU: step time and peak memory of LoRA on SmolLM2-135M-Instruct with the base weights in fp32
(the baseline), in 8-bit (bitsandbytes LLM.int8) and in 4-bit NF4 with double quantization, at the same
batch, each in a fresh process, printed side by side with ratios against fp32 from the same run.

    .venv/bin/python bench/qlora.py [--batch 4] [--length 128] [--steps 5] [--checkpointing]
                                    [--only fp32,int8,nf4] [--rounds 1] [--model .models/smollm2-135m-instruct]

Each configuration runs in its own child process, so one's peak RSS cannot raise another's. The child
imports torch, transformers, peft and bitsandbytes (all three configurations, so the figures before
loading match), records its RSS, loads the model (fp32 weights, or as rentune loads a quantized base:
entrypoint/training/quantize.py's `load_quantized` in 8-bit or 4-bit NF4 + double quant with fp32 compute
on the CPU, then `prepare_for_training`), adds LoRA r=8, alpha 16 on q_proj, k_proj, v_proj and o_proj,
and trains with AdamW (lr 1e-4) on seeded random token batches of `--batch` x `--length` tokens (labels =
input ids; the same batches in every configuration): one warm-up step, then `--steps` timed steps.

Figures per configuration: median wall seconds of a timed step; CPU seconds per step (time.process_time,
every thread); peak RSS, sampled every 2 ms by a background thread (`PeakMemory`) over loading and over
the steps, and the kernel's high-water mark (ru_maxrss) of the whole child as a check; the peak's increase
over the RSS before loading (the interpreter and libraries excluded); the weights' bytes in memory (every
parameter and buffer at its dtype, plus the quantization constants bitsandbytes keeps beside the packed
weights: absmax, code, SCB); and the loss of the first (warm-up) and the last step. `--checkpointing`
turns on activation checkpointing (non-reentrant) in all three. `--rounds N` runs every configuration N
times, each going first in turn, and reports the medians.

No figure is asserted. On a shared 2-core machine other processes change step times several-fold (torch's
OpenMP threads spin while they wait for a thread that is not scheduled, which counts as CPU time too), so
each row also says how many cores other processes kept busy during its steps (the machine's busy CPU
time, host steal included, less this process's, over the steps' wall time): compare rows with about
the same figure there, or rerun with `--rounds`.

On CPUs with AVX512-BF16, bitsandbytes' 4-bit layers repack their weights into another layout the first
time they run in eval mode without gradients; `load_quantized` switches that off (`support_avx512bf16_for_cpu`)
so that every step runs the same 4-bit code path.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONFIGS = ("fp32", "int8", "nf4")
BASELINE = "fp32"
DEFAULT_MODEL = ROOT / ".models/smollm2-135m-instruct"
MB = 1e6


def _rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def _busy_cpu() -> float:
    """CPU seconds the whole machine has spent busy (every core, every process; time stolen by the host
    counts as busy: this process could not run then)."""
    import psutil

    times = psutil.cpu_times()
    return (
        sum(times)
        - times.idle
        - getattr(times, "iowait", 0)
        - getattr(times, "guest", 0)
        - getattr(times, "guest_nice", 0)
    )


def _weight_bytes(model) -> tuple[int, int]:
    """Bytes of every parameter and buffer at its dtype, and of the quantization constants beside them."""
    import torch

    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    weights += sum(b.numel() * b.element_size() for b in model.buffers())
    seen: set[int] = set()
    constants = 0

    def add(tensor) -> None:
        nonlocal constants
        if isinstance(tensor, torch.Tensor) and tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            constants += tensor.numel() * tensor.element_size()

    for module in model.modules():
        weight = getattr(module, "weight", None)
        state = getattr(weight, "quant_state", None)  # Linear4bit
        if state is not None:
            for tensor in (state.absmax, state.code, state.offset):
                add(tensor)
            if state.state2 is not None:
                add(state.state2.absmax)
                add(state.state2.code)
        add(getattr(weight, "SCB", None))  # Linear8bitLt: one fp32 scale per row, on the weight or its state
        add(getattr(getattr(module, "state", None), "SCB", None))
    return weights, constants


def child(config: str, args: argparse.Namespace) -> dict:
    """One configuration in this (fresh) process; returns its figures."""
    import warnings

    import peft
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    from entrypoint.training.memory import PeakMemory
    from entrypoint.training.quantize import bitsandbytes_version, load_quantized, prepare_for_training
    from jobspec.schema import Quantization

    bitsandbytes_version()  # imported in all three configurations, so that the RSS before loading matches

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()  # keeps stderr short, for the parent to print on failure
    warnings.filterwarnings("ignore", message=".*MatMul8bitLt: inputs will be cast.*")  # every int8 call on CPU
    # peft calls transformers' old names for activation checkpointing, deprecated in transformers 5
    warnings.filterwarnings("ignore", message=".*gradient_checkpointing.*deprecated", category=FutureWarning)
    cpu = torch.device("cpu")
    before = _rss()

    # rentune's own loading (entrypoint/training/quantize.py): bitsandbytes imported quietly, the 4-bit
    # layers pinned to the path every CPU takes, the unquantized weights in fp32 (prepare_for_training)
    quantization = {"fp32": None, "int8": Quantization(bits=8), "nf4": Quantization(bits=4, quant_type="nf4")}[config]
    started = time.perf_counter()
    with PeakMemory(cpu) as load:
        if quantization is None:
            model = AutoModelForCausalLM.from_pretrained(args.model, use_safetensors=True, dtype=torch.float32)
        else:
            model = load_quantized(AutoModelForCausalLM, args.model, quantization, "fp32", cpu, use_safetensors=True)
            model = prepare_for_training(model)
        load_seconds = time.perf_counter() - started
        model.config.use_cache = False  # training: no KV cache
        if args.checkpointing:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        weights, constants = _weight_bytes(model)
        torch.manual_seed(args.seed)  # the same LoRA initialisation in every configuration
        lora = peft.LoraConfig(
            r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], task_type="CAUSAL_LM"
        )
        model = peft.get_peft_model(model, lora)
        model.train()
        trainable = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(trainable, lr=1e-4)

    generator = torch.Generator().manual_seed(args.seed)
    vocab = model.config.vocab_size
    batches = [torch.randint(0, vocab, (args.batch, args.length), generator=generator) for _ in range(1 + args.steps)]
    losses, seconds, cpu_seconds = [], [], []
    machine, own, wall_started = _busy_cpu(), time.process_time(), time.perf_counter()
    with PeakMemory(cpu) as steps:
        for i, ids in enumerate(batches):
            wall, cpu_time = time.perf_counter(), time.process_time()
            optimizer.zero_grad(set_to_none=True)
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            if i > 0:  # step 0 warms up: not timed
                seconds.append(time.perf_counter() - wall)
                cpu_seconds.append(time.process_time() - cpu_time)
    other = (_busy_cpu() - machine) - (time.process_time() - own)  # other processes' CPU seconds meanwhile

    return {
        "config": config,
        "rss_before": before,
        "load_seconds": load_seconds,
        "load_peak": load.peak,
        "steps_peak": steps.peak,
        "peak": max(load.peak, steps.peak),
        "ru_maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,  # kB on Linux
        "weights": weights + constants,
        "quant_constants": constants,
        "trainable": sum(p.numel() for p in trainable),
        "step_seconds": statistics.median(seconds),
        "step_seconds_all": seconds,
        "cpu_per_step": statistics.median(cpu_seconds),
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "threads": torch.get_num_threads(),
        "other_cores": max(0.0, other / (time.perf_counter() - wall_started)),
    }


def _ratio(value: float, base: dict | None, key: str) -> str:
    return f"{value / base[key]:.2f}" if base else "-"


def _combine(runs: list[dict]) -> dict:
    """One configuration's rounds: the median of each figure that moves with the machine's load."""
    combined = dict(runs[0])
    for key in ("step_seconds", "cpu_per_step", "peak", "over", "other_cores", "load_seconds"):
        combined[key] = statistics.median(r[key] for r in runs)
    return combined


def report(runs: dict[str, list[dict]], args: argparse.Namespace) -> None:
    for r in (r for rounds in runs.values() for r in rounds):
        r["over"] = r["peak"] - r["rss_before"]  # what loading and training added to the process
    results = [_combine(rounds) for rounds in runs.values() if rounds]
    base = next((r for r in results if r["config"] == BASELINE), None)
    rounds = f", median of {args.rounds} rounds" if args.rounds > 1 else ""
    print(
        f"\n{args.model.name}: LoRA r=8 on q/k/v/o, batch {args.batch} x {args.length} tokens, median of "
        f"{args.steps} steps after a warm-up{rounds}, activation checkpointing "
        f"{'on' if args.checkpointing else 'off'}, {results[0]['threads']} torch threads"
    )
    print(
        f"{'config':<6} {'step s':>7} {'CPU s/step':>10} {'peak RSS':>9} {'over pre-load':>13} {'weights':>8} "
        f"{'time/fp32':>9} {'peak/fp32':>9} {'over/fp32':>9} {'weights/fp32':>12} {'other load':>10}  "
        "loss first -> last"
    )
    for r in results:
        print(
            f"{r['config']:<6} {r['step_seconds']:7.2f} {r['cpu_per_step']:10.2f} {r['peak'] / MB:6,.0f} MB "
            f"{r['over'] / MB:10,.0f} MB {r['weights'] / MB:5,.0f} MB "
            f"{_ratio(r['step_seconds'], base, 'step_seconds'):>9} {_ratio(r['peak'], base, 'peak'):>9} "
            f"{_ratio(r['over'], base, 'over'):>9} {_ratio(r['weights'], base, 'weights'):>12} "
            f"{r['other_cores']:5.2f} cores  {r['loss_first']:.3f} -> {r['loss_last']:.3f}"
        )
    print(
        "\nper round: RSS before load, load s, load peak, steps peak, ru_maxrss; quantization constants; "
        "trainable params; each timed step's s"
    )
    for config, rounds in runs.items():
        for r in rounds:
            print(
                f"{config:<6} {r['rss_before'] / MB:,.0f} MB, {r['load_seconds']:.1f} s, "
                f"{r['load_peak'] / MB:,.0f} MB, {r['steps_peak'] / MB:,.0f} MB, {r['ru_maxrss'] / MB:,.0f} MB; "
                f"{r['quant_constants'] / MB:.1f} MB; {r['trainable']:,}; "
                + " ".join(f"{s:.2f}" for s in r["step_seconds_all"])
            )
    if base is None:
        print(f"(no {BASELINE} run: --only without {BASELINE}, or it failed; no ratios)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=128, help="tokens per row")
    parser.add_argument("--steps", type=int, default=5, help="timed steps, after one warm-up step")
    parser.add_argument("--checkpointing", action="store_true", help="activation checkpointing in every config")
    parser.add_argument("--only", default=",".join(CONFIGS), help="comma-separated, of: " + ",".join(CONFIGS))
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="a safetensors folder of a causal LM")
    parser.add_argument("--rounds", type=int, default=1, help="every config this many times, taking turns first")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--one", choices=CONFIGS, help=argparse.SUPPRESS)  # a single config, in a child process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(child(args.one, args)))
        return

    small = [f"--{name}" for name in ("batch", "length", "steps", "rounds") if getattr(args, name) < 1]
    if small:
        parser.error(f"{', '.join(small)}: at least 1")
    configs = [c.strip() for c in args.only.split(",") if c.strip()]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown or not configs:
        parser.error(f"--only: unknown {', '.join(unknown) or '(empty)'}; choose from {', '.join(CONFIGS)}")
    configs = [c for c in CONFIGS if c in configs]  # the baseline first
    if not (args.model / "config.json").is_file():
        print(
            f"{args.model} is missing: `make .models/smollm2-135m-instruct` converts SmolLM2-135M-Instruct into it "
            "(or pass --model PATH)",
            file=sys.stderr,
        )
        sys.exit(2)

    flags = ["--batch", str(args.batch), "--length", str(args.length), "--steps", str(args.steps)]
    flags += ["--model", str(args.model), "--seed", str(args.seed)]
    flags += ["--checkpointing"] if args.checkpointing else []
    runs: dict[str, list[dict]] = {config: [] for config in configs}
    failed = 0
    for round_ in range(args.rounds):
        for k in range(len(configs)):  # each config goes first in turn
            config = configs[(round_ + k) % len(configs)]
            print(f"{config}: running in a fresh process ...", flush=True)
            started = time.perf_counter()
            done = subprocess.run([sys.executable, __file__, "--one", config, *flags], capture_output=True, text=True)
            if done.returncode != 0:
                print(f"{config}: failed (exit {done.returncode})\n{done.stderr[-3000:]}", flush=True)
                failed += 1
                continue
            runs[config].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"{config}: done in {time.perf_counter() - started:.0f} s", flush=True)
    if any(runs.values()):
        report(runs, args)
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
