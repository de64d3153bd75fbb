"""How right the lease plan is: real jobs run with `rentune run` (a fresh process each, as on a node),
then every phase and trial as the plan made right after the probe predicted it, against what it took
(entrypoint/job/lease.py, the same table as the report's "Lease" section and `rentune status`).

    .venv/bin/python bench/plan_accuracy.py [--smollm2] [--only quickstart|chat|smollm2]

Jobs:
    quickstart  jobspec/examples/quickstart.yaml: LoRA on all-MiniLM-L6-v2, 2 trials of 69 steps
    chat        a packed causal-LM chat job: a 2-layer Llama built from a config (tests/models.py) on
                examples/data/orders-chat.jsonl, packing on, grad_accum 2, 2 trials, generation on eval
    smollm2     (--smollm2) jobspec/examples/extract-chat.yaml, the SmolLM2-135M-Instruct chat demo
                (`make demo-llm` converts the model first; about 10 minutes on 2 cores)

Prints each job's table, then per job the largest error of a trial's planned training time and of the
whole job's planned total (goal: both within 15%), and the largest error of any phase after the probe.
The rows under a second are left out of the largest error (timer noise). The baseline, from the same run:
the rule rentune planned trials with before, the probe's worst-case step (every row at max_length) x the
planned steps x 1.1.

`--read DIR` reads jobs already run into the file store DIR (e.g. `runs` after `make demo` and
`make demo-llm`) instead of running them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from entrypoint.job.lease import lease_account, lease_lines  # noqa: E402
from entrypoint.job.plan import plan_revisions  # noqa: E402
from entrypoint.job.state import job_store, read_json, stored_spec  # noqa: E402
from entrypoint.store import FileStore  # noqa: E402

RENTUNE = Path(sys.executable).parent / "rentune"
GOAL = 0.15


def _chat_spec(tmp: Path) -> Path:
    """The packed tiny causal-LM chat job: its model built here from a config, on the orders chat data."""
    from tests.models import build_tiny_chat_lm

    data = ROOT / "examples/data/orders-chat.jsonl"
    rows = [json.loads(line) for line in data.read_text().splitlines() if line.strip()]
    texts = [turn["content"] for row in rows for turn in row["messages"]]
    model = build_tiny_chat_lm(tmp / "tiny-chat-lm", texts)
    spec = {
        "job": {"id": "plan-chat", "description": "packed chat fine-tuning of a tiny Llama"},
        "hypothesis": {
            "task": "extraction",
            "statement": "An adapter makes a tiny LM return the order's fields.",
            "required_fields": ["customer", "product", "quantity", "delivery_date"],
            "fields": ["customer", "product", "quantity", "delivery_date"],
        },
        "guardrails": [{"metric": "json_valid_rate", "tolerance": 1.0}],
        "model": {"path": str(model), "revision": "tiny", "max_length": 256, "max_new_tokens": 48},
        "data": {
            "source": str(data), "format": "messages", "label_field": "channel", "split": {"eval": 0.1, "test": 0.1},
        },
        "adaptation": {
            "method": "lora", "rank": 8, "alpha": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
        },
        "training": {
            "epochs": 3, "microbatch": 2, "grad_accum": 2, "packing": True, "learning_rate": 0.005,
            "device": "cpu", "eval_batch": 16, "checkpoint": {"every_steps": 25, "keep": 2},
        },
        "experiments": [
            {
                "id": "rank-4", "reference": "main", "changes": ["adaptation.rank"],
                "rationale": "is a smaller adapter enough?", "adaptation": {"rank": 4},
            },
        ],
        "rental": {"window": "3d"},
    }  # fmt: skip
    path = tmp / "chat.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def _job(name: str, tmp: Path) -> tuple[Path, str]:
    if name == "quickstart":
        return ROOT / "jobspec/examples/quickstart.yaml", "quickstart-tickets"
    if name == "chat":
        return _chat_spec(tmp), "plan-chat"
    model = ROOT / ".models/smollm2-135m-instruct"
    if not model.is_dir():
        sys.exit(f"{model} is missing: `make demo-llm` (or `make .models/smollm2-135m-instruct`) converts it first")
    return ROOT / "jobspec/examples/extract-chat.yaml", "extract-chat"


JOB_IDS = {"quickstart": "quickstart-tickets", "chat": "plan-chat", "smollm2": "extract-chat"}


def run(name: str, tmp: Path, read: Path | None) -> dict:
    if read is not None:
        store, how = read, f"read from {read}"
    else:
        spec, _ = _job(name, tmp)
        store = tmp / f"store-{name}"
        started = time.monotonic()
        done = subprocess.run(
            [RENTUNE, "run", str(spec), "--store", f"file://{store}", "--workdir", str(tmp / f"work-{name}")],
            cwd=ROOT,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            sys.exit(f"{name}: rentune run exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        how = f"`rentune run` took {time.monotonic() - started:.0f} s in all (process start included)"
    jobs = job_store(FileStore(store.resolve()), JOB_IDS[name])
    account = lease_account(stored_spec(jobs).spec, jobs, time.time())
    print(f"\n## {name}: {how}\n")
    print("\n".join(lease_lines(account)))
    trials = [r for r in account["rows"] if r["kind"] == "trial" and r["error"] is not None]
    worst = max(trials, key=lambda r: abs(r["error"]))
    # The baseline: the rule before (the probe's worst-case step x planned steps x 1.1), on the same run
    probe = read_json(jobs, "phases/probe/result.json")
    probed = next(r for r in plan_revisions(jobs) if r.get("reason") == "after probe")
    steps = {t["id"]: t["steps"] for t in probed["trials"]}
    before = [(r, steps[r["name"]] * probe["worst_case_step_seconds"] * 1.1) for r in trials]
    errors = [(r["name"], (planned - r["actual"]) / r["actual"]) for r, planned in before]
    for trial, error in errors:
        print(f"baseline (worst-case step x steps x 1.1): {trial} {error:+.0%}")
    return {
        "job": name,
        "trial": (worst["name"], worst["error"]),
        "total": account["total"]["error"],
        "phase": account["largest_error"],
        "before": max(errors, key=lambda e: abs(e[1])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smollm2", action="store_true", help="also the SmolLM2 chat demo (about 10 minutes)")
    parser.add_argument("--only", choices=["quickstart", "chat", "smollm2"])
    parser.add_argument("--keep", type=Path, help="keep the stores and work dirs in this folder")
    parser.add_argument("--read", type=Path, help="read the jobs from this file store instead of running them")
    args = parser.parse_args()
    names = [args.only] if args.only else ["quickstart", "chat", *(["smollm2"] if args.smollm2 else [])]
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        found = [run(name, folder.resolve(), args.read) for name in names]
    print(f"\n{'job':<12} {'worst trial':>20} {'total':>8} {'worst phase after probe':>24}  15%  {'rule before':>20}")
    for f in found:
        trial = f"{f['trial'][0]} {f['trial'][1]:+.1%}"
        phase = f"{f['phase']['name']} {f['phase']['error']:+.1%}" if f["phase"] else "-"
        ok = "yes" if abs(f["trial"][1]) <= GOAL and abs(f["total"]) <= GOAL else "NO"
        before = f"{f['before'][0]} {f['before'][1]:+.0%}"
        print(f"{f['job']:<12} {trial:>20} {f['total']:>+8.1%} {phase:>24}  {ok:<3}  {before:>20}")


if __name__ == "__main__":
    main()
