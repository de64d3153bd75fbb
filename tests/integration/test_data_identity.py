"""The data phase's outputs are byte for byte those of the one-row-at-a-time code it replaced: the data version,
the splits, leaks.json and the stored tokens of four jobs, compared with sha256 recorded from a run of
commit 7bcfe28 (before batched encoding, numpy MinHash and the word-by-word normaliser):

- the quickstart (MiniLM's tokenizer, 1,800 support tickets);
- bench/data_scale.py's synthetic tickets, 20,000 rows of 500 characters, plus 300 near duplicates of
  some of them (one word changed) so that the leak check finds and drops pairs; tokenized in two processes,
  the path a large job takes;
- a prompt/response causal LM job (MiniLM's WordPiece as a causal tokenizer, bos and eos) on the test tickets;
- the chat job of `make demo-llm` (orders-chat.jsonl) with SmolLM2's own tokenizer and chat template,
  read from its GGUF file, over a tiny Llama.

Run `python tests/integration/test_data_identity.py [JOB...]` to print the figures of the code in the
working tree.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

# From `python tests/integration/test_data_identity.py` on commit 7bcfe28.
GOLDEN: dict[str, dict[str, str]] = {
    "quickstart": {
        "data_version": "a3503449a0913a398af4ec127f1610bd0f6e5e8959549020448fda9ca529a040",
        "tokens_key": "f811ae9cfabbfde1d8f1fd61fdc0302b6c096e95d3bf81f8f02ec0dc0429b7ba",
        "train.jsonl": "7b729337d9076f43747d0204e8a9636c7f36ab7ba09b67dcc8d872e965714411",
        "eval.jsonl": "2d0ed3a1da2b2ec90840879593ee62ff43630c55c225938327e15cec132606d5",
        "test.jsonl": "29a13053abcb723a28d67b2f0b2218b8bff2b9663e6fb97d0371cd10bf3e7099",
        "leaks.json": "c0e153c57b45bf5c36fe5f16790315e49e5bc0ce7fc22bd9a287741bf2e0c39d",
        "tokens/eval.arrow": "730e6b2257bab25e1b021710fe91dd32add8a6d8297e5e9877a8814b9f386599",
        "tokens/test.arrow": "c58705ba5bad0d523f5bf021726b1090bc9c6b5c7973838de39822bb8f35456c",
        "tokens/train.arrow": "32408e7d50e4d0baf678b79796e87960d09e48cf4f8f8dd230f15e629370ed3f",
    },
    "bench-tickets": {
        "data_version": "194aa060f78a8f96c21df93fde795f12d42de7ec052aa4bbd47bb638725605b5",
        "tokens_key": "eba06271acc13c7ac7a225b467cb193ac3921dd6c3f6c358c6a2a3e8cdf9e862",
        "train.jsonl": "82d7311bfa0309be64fd7e5891152a7b56c7f497451c0b13eef40bdb746f48ea",
        "eval.jsonl": "622ebf51f27938a06b8172678fdce1125902cfd47d3f9d38d07e8ee147d2b745",
        "test.jsonl": "966837116cabeb5388ec8c60f23a61c401304513f1842294f10d9d5fb8569742",
        "leaks.json": "403f57de3a1598a5508afb5f21ca0542eeb3741f8d5d61a8d9a95d37190c3d9e",
        "tokens/eval.arrow": "9551a2aa4567e816c4afc4452234fe371c6740bde3241e1ed4874884a95a4d63",
        "tokens/test.arrow": "276b913946141c3e88c0e54a85cfa78d01badd90ec75ee2095ab50d2b4ec7b46",
        "tokens/train.arrow": "bf03f4b8202dd43736cd4a492a3de776c7ffc0fa99c17a54374c98fa90f0e974",
    },
    "causal": {
        "data_version": "ff243de218d15383a9c9efd2646e16715122fbb1112f2565ecd2ca64c393062c",
        "tokens_key": "7eb856ea99369a8f1ed703a095914a81ad6160ae1f8a181174adb38fb2ff8f56",
        "train.jsonl": "796e8c8ffd52f74969d7a476c209d34f8c3f69ebea5c73f4b8aa2577b229f2a6",
        "eval.jsonl": "ab807e5dc5108e980ec394bd41d5b460ad52cfdccbb9b49dd4b1c4868280b32a",
        "test.jsonl": "b0a4c81986afbf7333803bd4ea634b9ca1e9fab298cacd67ba304d7aec982953",
        "leaks.json": "c0e153c57b45bf5c36fe5f16790315e49e5bc0ce7fc22bd9a287741bf2e0c39d",
        "tokens/eval.arrow": "b9e0a4dedf67c521ddddd8ad52f40012cb3a894437ec372c8a68df5d48dae9e9",
        "tokens/test.arrow": "e87e3344ee5d59d1a993267b8d8488660702566129e7e4114bdb2bcb249d76f1",
        "tokens/train.arrow": "2c203696179cbf3a1fbbbf7bee8fdcab7ed9a900c1f3616f7ef6b2a4aa67dec2",
    },
    "chat": {
        "data_version": "7d632efbe9a7de0034b089fd042f85889ff33109ca7ef14bc3c109df9bb695ef",
        "tokens_key": "c0d880b2f0d1d6fa1312443dd4001eabb10d97e62f066be435210668fd54c407",
        "train.jsonl": "6f17ac5ac982a0fad2a0ae68ea10e1edb465c0f5787e7d64f754d05d06dfa414",
        "eval.jsonl": "63ac4ea57900372c86b9386eaf25990fc10787ec0d909108553dd2a737adc990",
        "test.jsonl": "bbe224093ad3d74ade11685670eb0cef873c7b74eefdc7b417890dc83a5be297",
        "leaks.json": "c0e153c57b45bf5c36fe5f16790315e49e5bc0ce7fc22bd9a287741bf2e0c39d",
        "tokens/eval.arrow": "f762cd6ff2b379be827cbdfaee5932fdd0811cd548ac9564271cf9deea98c2cd",
        "tokens/test.arrow": "fede4d50fa4681c5d774910f868ce55720b7b2f8aa262dfe2f167f5b83b30702",
        "tokens/train.arrow": "43a411a9857bb26045cbdbef121b97e0ca6865f8d717bff78a2afbe0bf00f9d7",
    },
}


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _data_phase(spec: dict, folder: Path) -> dict[str, str]:
    """Run the data phase in this process; the sha256 of everything it stored that is not a timing."""
    from entrypoint.context import PhaseContext
    from entrypoint.phases import data as data_phase
    from entrypoint.store import FileStore, PrefixedStore
    from jobspec import parse_spec

    loaded = parse_spec(yaml.safe_dump(spec), source="spec.yaml")
    store_root = folder / "store"
    store = PrefixedStore(FileStore(store_root), "jobs/j")
    ctx = PhaseContext(loaded.spec, loaded.sha256, store, folder / "work", print)
    result = data_phase.run(ctx)
    phase = store_root / "jobs/j/phases/data"
    found = {"data_version": result["data_version"], "tokens_key": result["tokens"]["key"]}
    for name in ("train.jsonl", "eval.jsonl", "test.jsonl", "leaks.json"):
        found[name] = _digest(phase / name)
    for path in sorted((phase / "tokens").rglob("*.arrow")):
        found[f"tokens/{path.name}"] = _digest(path)
    return found


def _quickstart(folder: Path) -> dict:
    spec = yaml.safe_load((ROOT / "jobspec/examples/quickstart.yaml").read_text())
    spec["data"]["source"] = str(ROOT / spec["data"]["source"])
    spec.pop("store", None)
    return spec


def _bench_tickets(folder: Path) -> dict:
    from bench.data_scale import write_data
    from tests.models import build_tiny_bert

    source = folder / "tickets.jsonl"
    write_data(source, 20_000, 500)
    rows = [json.loads(line) for line in source.read_text().splitlines()]
    rng = random.Random(5)
    with source.open("a") as out:
        for row in rng.sample(rows, 300):  # near duplicates: one word of the text changed
            words = row["text"].split(" ")
            words[rng.randrange(2, len(words))] = "changed"
            out.write(json.dumps({"text": " ".join(words), "label": row["label"]}) + "\n")
    model = build_tiny_bert(folder / "bert")
    return {
        "job": {"id": "j"},
        "hypothesis": {"task": "classification", "statement": "identity"},
        "model": {"path": str(model), "max_length": 128},
        "data": {"source": str(source), "leaks": {"eval": "drop", "test": "drop"}},
        "training": {"device": "cpu"},
    }


def _causal_tickets(folder: Path) -> dict:
    from tests.models import build_tiny_causal_lm

    rows = [json.loads(line) for line in (ROOT / "examples/data/tickets.jsonl").read_text().splitlines()]
    source = folder / "pairs.jsonl"
    source.write_text("".join(json.dumps({"prompt": r["text"], "response": r["label"]}) + "\n" for r in rows))
    model = build_tiny_causal_lm(folder / "llama")
    return {
        "job": {"id": "j"},
        "hypothesis": {"task": "format", "statement": "identity", "format": {"expect_json": False, "regex": ".+"}},
        "model": {"path": str(model), "max_length": 24},
        "data": {"source": str(source), "format": "prompt_response", "template": "Ticket: {prompt}\nTeam:"},
        "training": {"device": "cpu"},
    }


def _chat_orders(folder: Path) -> dict:
    from transformers import AutoTokenizer

    from tests.models import _save_tiny_llama, smollm2_gguf

    gguf = smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    _save_tiny_llama(folder / "chat", tokenizer, len(tokenizer), max_positions=512, seed=0)
    spec = yaml.safe_load((ROOT / "jobspec/examples/extract-chat.yaml").read_text())
    spec["model"]["path"] = str(folder / "chat")
    spec["model"]["max_length"] = 200  # the longest orders are cut: truncated conversations count too
    spec["data"]["source"] = str(ROOT / spec["data"]["source"])
    spec.pop("store", None)
    return spec


JOBS = {"quickstart": _quickstart, "bench-tickets": _bench_tickets, "causal": _causal_tickets, "chat": _chat_orders}


@pytest.mark.parametrize("job", list(JOBS))
def test_data_phase_outputs_are_byte_identical(job, tmp_path, monkeypatch):
    monkeypatch.setenv("RENTUNE_TOKENIZE_PROCESSES", "2" if job == "bench-tickets" else "1")
    assert _data_phase(JOBS[job](tmp_path), tmp_path) == GOLDEN[job]


if __name__ == "__main__":
    import tempfile

    os.environ["HF_HUB_OFFLINE"] = "1"
    figures = {}
    for job, make in JOBS.items():
        if len(sys.argv) > 1 and job not in sys.argv[1:]:
            continue
        os.environ["RENTUNE_TOKENIZE_PROCESSES"] = "2" if job == "bench-tickets" else "1"
        with tempfile.TemporaryDirectory() as folder:
            figures[job] = _data_phase(make(Path(folder)), Path(folder))
    print("GOLDEN = " + json.dumps(figures, indent=4))
