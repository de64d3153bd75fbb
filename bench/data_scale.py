"""The data phase at scale: the real `phases/data.run` (read, clean, de-duplicate, split, leak check,
commit the splits, version, tokenize once and store, inspect, smoke pass) on synthetic text
classification data of several sizes, each size in a fresh process, with its wall time and peak RSS.

    .venv/bin/python bench/data_scale.py [--sizes 100000 500000 2000000] [--chars 500]

Data: seeded JSONL rows of about `--chars` characters (words drawn from a 20k-word vocabulary with a
Zipf-like law, 6 labels), written once per size to a temporary folder (not timed). Model: MiniLM's real
tokenizer with a tiny 2-layer BERT (max_length 128). Store: file:// in the same temporary folder.

Prints, per size: seconds, rows per second, seconds per row relative to the smallest size (1.0 = linear)
and the process's peak RSS (getrusage ru_maxrss: the interpreter, torch and transformers included, about
0.5 GB before any data is read; measured before the tokenizer figure below). Then, in the same process
after the phase, the bare fast tokenizer on the first 50,000 texts (`encode_batch_fast`, untruncated, on
its own threads): the encoding every data phase must do to know each text's full length, and the phase's
rate as a share of it. Goal: time grows linearly and the peak RSS at 2M rows stays under 1.5 GB.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LABELS = ["billing", "shipping", "returns", "account", "technical", "other"]


def write_data(path: Path, rows: int, chars: int, seed: int = 7) -> None:
    """`rows` JSONL rows of about `chars` characters each, unique texts, 6 labels."""
    import numpy as np

    rng = np.random.default_rng(seed)
    vocabulary = np.array([f"w{i:05d}"[: 2 + (i % 7)] + chr(97 + i % 26) for i in range(20_000)])
    weights = 1.0 / np.arange(1, len(vocabulary) + 1)
    weights /= weights.sum()
    words_per_row = max(4, chars // 6)
    with path.open("w") as out:
        for start in range(0, rows, 10_000):
            n = min(10_000, rows - start)
            picks = vocabulary[rng.choice(len(vocabulary), size=(n, words_per_row), p=weights)]
            labels = rng.integers(0, len(LABELS), size=n)
            for i in range(n):
                text = f"ticket {start + i} " + " ".join(picks[i])
                out.write(json.dumps({"text": text[:chars], "label": LABELS[labels[i]]}) + "\n")


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def one(size: int, folder: Path, chars: int) -> dict:
    """Run the data phase once in this process; returns seconds and peak RSS."""
    import transformers

    from entrypoint.context import PhaseContext
    from entrypoint.phases import data as data_phase
    from entrypoint.store import FileStore, PrefixedStore
    from jobspec import parse_spec
    from tests.models import build_tiny_bert

    transformers.logging.set_verbosity_error()
    model = build_tiny_bert(folder / "bert")
    source = folder / f"data-{size}.jsonl"
    if not source.exists():
        write_data(source, size, chars)
    spec = parse_spec(
        f"""
job: {{id: scale}}
hypothesis: {{task: classification, statement: scale}}
model: {{path: {model}, max_length: 128}}
data: {{source: {source}, leaks: {{eval: drop, test: drop}}}}
training: {{device: cpu}}
"""
    )
    before = peak_rss_mb()
    store = PrefixedStore(FileStore(folder / f"store-{size}"), "jobs/scale")
    lines: list[str] = []
    ctx = PhaseContext(spec.spec, spec.sha256, store, folder / f"work-{size}", lines.append)
    started = time.perf_counter()
    result = data_phase.run(ctx)
    seconds = time.perf_counter() - started
    peak = peak_rss_mb()
    return {
        "rows": size,
        "seconds": seconds,
        "peak_rss_mb": peak,
        "rss_before_mb": before,
        "rows_read": result["rows_read"],
        "leaks_dropped": result["leaks"]["dropped"],
        "tokenizer_rows_per_s": tokenizer_alone(model, source),
    }


def tokenizer_alone(model: Path, source: Path, rows: int = 50_000) -> float:
    """Rows per second of the bare fast tokenizer on the first `rows` texts of `source` (read beforehand),
    untruncated, without special tokens or offsets, 10,000 texts per call on its own threads (every core):
    the encoding alone, the floor under any data phase that must know each text's full length."""
    from transformers import AutoTokenizer

    with source.open() as lines:
        texts = [json.loads(line)["text"] for _, line in zip(range(rows), lines, strict=False)]
    backend = AutoTokenizer.from_pretrained(model).backend_tokenizer
    backend.no_truncation()
    started = time.perf_counter()
    for start in range(0, len(texts), 10_000):
        backend.encode_batch_fast(texts[start : start + 10_000], add_special_tokens=False)
    return len(texts) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 500_000, 2_000_000])
    parser.add_argument("--chars", type=int, default=500)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a single size, in a child process
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.folder, args.chars)))
        return
    folder = Path(tempfile.mkdtemp(prefix="rentune-data-scale-"))
    results = []
    for size in args.sizes:
        write_data(folder / f"data-{size}.jsonl", size, args.chars)
        mb = (folder / f"data-{size}.jsonl").stat().st_size / 1e6
        done = subprocess.run(
            [sys.executable, __file__, "--one", str(size), "--folder", str(folder), "--chars", str(args.chars)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            print(f"{size:>9,} rows ({mb:,.0f} MB): failed (exit {done.returncode})\n{done.stderr[-2000:]}")
            break
        result = json.loads(done.stdout.strip().splitlines()[-1])
        result["mb"] = mb
        results.append(result)
        first = results[0]
        per_row = (result["seconds"] / size) / (first["seconds"] / first["rows"])
        rate, ceiling = size / result["seconds"], result["tokenizer_rows_per_s"]
        print(
            f"{size:>9,} rows ({mb:,.0f} MB of JSONL): {result['seconds']:7.1f} s, {rate:,.0f} rows/s, time per row "
            f"x{per_row:.2f} of the smallest size, peak RSS {result['peak_rss_mb']:,.0f} MB (before the phase "
            f"{result['rss_before_mb']:,.0f} MB); the tokenizer alone {ceiling:,.0f} rows/s, the phase "
            f"{rate / ceiling:.2f} of it",
            flush=True,
        )
    print(json.dumps(results))
    shutil.rmtree(folder, ignore_errors=True)  # the generated data: gigabytes at 2M rows


if __name__ == "__main__":
    main()
