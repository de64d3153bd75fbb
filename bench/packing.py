"""Useful (non-padding) tokens/s with padding-free packing against padded batches, in one run on CPU,
through rentune's own training pieces: the HF Trainer from `build_trainer`, the collators, packing and
the throughput meter that prints tokens/s in every job's log.

    .venv/bin/python bench/packing.py [--steps 30] [--repeats 2]

Data: 400 synthetic examples whose lengths follow a log-normal (median 120 tokens, long tail cut at
max_length 512), as chat fine-tuning data does; the loss is on each example's second half. Padded:
microbatch 8 examples, padded to the longest of each batch. Packed: microbatch 2 rows of up to 512 tokens
(about as many real tokens per step). Model: a 4-layer, 128-wide Llama (random weights, sdpa attention).
The two modes alternate, `repeats` times each; each run's figure is its steady tokens/s (after the first
logging window), and the median per mode is compared.

Prints the padding share of each mode and the ratio packed / padded (goal: >= 1.5).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import DataCollatorForSeq2Seq, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402

from entrypoint.data.encoding import IGNORE_INDEX  # noqa: E402
from entrypoint.data.packing import PackedCollator, pack  # noqa: E402
from entrypoint.training.throughput import CountingCollator, ThroughputMeter, flops_per_token  # noqa: E402
from entrypoint.training.trainer import ProgressCallback, build_trainer  # noqa: E402
from jobspec.schema import Training  # noqa: E402

transformers.logging.set_verbosity_error()
MAX_LENGTH, VOCAB = 512, 2000


def examples(n: int = 400, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = min(MAX_LENGTH, max(16, round(math.exp(rng.gauss(math.log(120), 0.8)))))
        ids = [rng.randrange(4, VOCAB) for _ in range(length)]
        half = length // 2
        out.append({"input_ids": ids, "attention_mask": [1] * length, "labels": [IGNORE_INDEX] * half + ids[half:]})
    return out


def model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=352,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=MAX_LENGTH,
        pad_token_id=0,
    )
    config._attn_implementation = "sdpa"
    return LlamaForCausalLM(config)


def tokenizer() -> PreTrainedTokenizerFast:
    """Only for padding (DataCollatorForSeq2Seq pads through a tokenizer): a word-level one with pad id 0."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    vocab = {"[PAD]": 0, "[UNK]": 1}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="[UNK]")), pad_token="[PAD]")


def run(mode: str, features: list[dict], steps: int, out: Path) -> dict:
    if mode == "packed":
        rows = pack([{k: f[k] for k in ("input_ids", "labels")} for f in features], MAX_LENGTH)
        collate, microbatch = PackedCollator(pad_token_id=0), 2
    else:
        rows = features
        collate, microbatch = DataCollatorForSeq2Seq(tokenizer(), label_pad_token_id=IGNORE_INDEX), 8
    counter = CountingCollator(collate)
    net = model()
    context = statistics.mean(len(f["input_ids"]) for f in features)
    meter = ThroughputMeter(counter, *flops_per_token(net, context), None, "cpu")
    training = Training(max_steps=steps, microbatch=microbatch, device="cpu", learning_rate=1e-3)
    trainer = build_trainer(
        net,
        counter,
        rows,
        training,
        output_dir=out,
        device=torch.device("cpu"),
        loss_per="token",
        callbacks=[meter, ProgressCallback(lambda line: None, every=5, meter=meter)],
    )
    trainer.train()
    return meter.summary()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    features = examples()
    lengths = [len(f["input_ids"]) for f in features]
    print(f"data: {len(features)} examples, {sum(lengths)} tokens, median length {statistics.median(lengths)}")
    tmp = Path(tempfile.mkdtemp(prefix="rentune-packing-"))
    results: dict[str, list[dict]] = {"padded": [], "packed": []}
    run("padded", features, 5, tmp / "warmup")  # first-use costs (threads, allocator) land in no result
    for repeat in range(args.repeats):
        for mode in ("padded", "packed") if repeat % 2 == 0 else ("packed", "padded"):
            summary = run(mode, features, args.steps, tmp / f"{mode}-{repeat}")
            results[mode].append(summary)
            print(
                f"{mode:7s} run {repeat + 1}: {summary['tokens_per_s']:8.0f} useful tokens/s, "
                f"padding {summary['padding_share']:.0%}"
            )
    median = {mode: statistics.median(r["tokens_per_s"] for r in runs) for mode, runs in results.items()}
    padding = {mode: statistics.mean(r["padding_share"] for r in runs) for mode, runs in results.items()}
    ratio = median["packed"] / median["padded"]
    print(
        f"padded: {median['padded']:.0f} tokens/s at {padding['padded']:.0%} padding; packed: {median['packed']:.0f} "
        f"tokens/s at {padding['packed']:.0%} padding"
    )
    print(f"ratio packed / padded (useful tokens/s): {ratio:.2f}  (goal >= 1.5)")
    if padding["padded"] < 0.4:
        print("note: the padded batches have under 40% padding; the goal is set for at least 40%")


if __name__ == "__main__":
    main()
