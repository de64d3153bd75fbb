"""Tokenized once: the data phase stores every split encoded (Arrow files under phases/data/tokens/<key>/),
and later phases on another node (another work directory) train from those files without calling the
kind's encoder: asserted by making the encoder fail, not assumed from a log line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from entrypoint.data import tokens as tokens_module
from entrypoint.data.tokens import TokenizedSplit, features_of, open_tokens, tokens_store_key
from entrypoint.kinds.causal_lm import CausalLM
from entrypoint.kinds.text_classifier import TextClassifier
from entrypoint.runner import run_job
from entrypoint.store import FileStore, PrefixedStore
from entrypoint.store.objects import CorruptObject
from tests.models import build_tiny_bert, build_tiny_causal_lm
from tests.specs import TICKETS as TICKETS_FILE
from tests.specs import kind_of, load, tiny_job


@pytest.fixture(scope="module")
def bert(tmp_path_factory) -> Path:
    return build_tiny_bert(tmp_path_factory.mktemp("bert") / "m")


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return build_tiny_causal_lm(tmp_path_factory.mktemp("llama") / "m")


def _data_result(store_root: Path, job: str) -> dict:
    return json.loads((store_root / f"jobs/{job}/phases/data/result.json").read_text())


def _refuse_encoding(monkeypatch) -> list[int]:
    calls: list[int] = []

    def encode(self, processor, rows, labels):
        calls.append(len(rows))
        raise AssertionError(f"tokenized {len(rows)} rows again after the data phase")

    for kind in (TextClassifier, CausalLM):
        monkeypatch.setattr(kind, "encode", encode)
    return calls


def test_a_second_work_directory_trains_from_the_stored_tokens_without_tokenizing(tmp_path, bert, monkeypatch):
    spec = tiny_job("tokens", bert, training={"max_steps": 4})
    store = FileStore(tmp_path / "store")
    run_job(load(spec), store, tmp_path / "node-a", lambda line: None, until="data")
    record = _data_result(tmp_path / "store", "tokens")["tokens"]
    assert record["format"] == "arrow-ipc-1" and set(record["files"]) == {"train", "eval", "test"}

    # what is stored is exactly what the kind's encoder gives, example by example
    kind, job_store = kind_of(spec), PrefixedStore(store, "jobs/tokens")
    processor = kind.model.processor(bert)
    rows = [json.loads(line) for line in job_store.get_bytes("phases/data/train.jsonl").decode().splitlines()]
    labels = _data_result(tmp_path / "store", "tokens")["labels"]
    stored = TokenizedSplit(tmp_path / f"node-a/tokens/tokens/{record['key']}/train.arrow")
    direct = kind.model.encode(processor, rows, labels)
    assert len(stored) == len(direct) == record["files"]["train"]["rows"]
    assert list(features_of(stored)) == [e.features for e in direct]
    assert [(e.full_length, e.truncated) for e in stored] == [(e.full_length, e.truncated) for e in direct]

    calls = _refuse_encoding(monkeypatch)
    lines: list[str] = []
    outcome = run_job(load(spec), store, tmp_path / "node-b", lines.append, until="train")
    assert outcome.ran == ["baseline", "probe", "train"]
    assert calls == []  # the encoder was never called on node b
    trial = json.loads((tmp_path / "store/jobs/tokens/trials/main/result.json").read_text())
    assert trial["status"] == "completed" and trial["data"]["examples"] == record["files"]["train"]["rows"]
    fetched = tmp_path / f"node-b/tokens/tokens/{record['key']}/train.arrow"
    assert (
        fetched.read_bytes()
        == (tmp_path / f"store/jobs/tokens/{tokens_store_key(record['key'], 'train')}").read_bytes()
    )
    assert any("train tokens fetched to this node" in line for line in lines)


def test_packed_causal_training_maps_the_stored_tokens_too(tmp_path, llama, monkeypatch):
    spec = tiny_job(
        "packed-tokens",
        llama,
        hypothesis={
            "task": "format",
            "statement": "A tiny model answers.",
            "format": {"expect_json": False, "regex": ".+"},
        },
        data={
            "source": str(Path(__file__).resolve().parents[2] / "examples/data/tickets.jsonl"),
            "prompt_field": "text",
            "response_field": "label",
        },
        adaptation={"method": "lora", "rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
        training={"max_steps": 3, "packing": True},
    )
    spec["model"]["max_length"] = 64
    spec["model"]["max_new_tokens"] = 4  # the baseline's generations are not what this test checks
    store = FileStore(tmp_path / "store")
    run_job(load(spec), store, tmp_path / "node-a", lambda line: None, until="data")
    calls = _refuse_encoding(monkeypatch)
    outcome = run_job(load(spec), store, tmp_path / "node-b", lambda line: None, until="train")
    assert outcome.ran == ["baseline", "probe", "train"] and calls == []
    trial = json.loads((tmp_path / "store/jobs/packed-tokens/trials/main/result.json").read_text())
    assert trial["status"] == "completed" and trial["data"]["packed_rows"] < trial["data"]["examples"]


def test_stored_tokens_that_differ_from_the_record_are_refused_naming_the_object(tmp_path, bert, monkeypatch):
    monkeypatch.setattr(tokens_module, "CHUNK", 50)  # several record batches per file
    spec = tiny_job("tampered", bert)
    store = FileStore(tmp_path / "store")
    run_job(load(spec), store, tmp_path / "node-a", lambda line: None, until="data")
    record = _data_result(tmp_path / "store", "tampered")["tokens"]
    local = TokenizedSplit(tmp_path / f"node-a/tampered/tokens/{record['key']}/train.arrow")
    assert len(local._batches) > 1 and len(local) == record["files"]["train"]["rows"]
    assert local[len(local) - 1].features == local.feature(-1)

    stored = tmp_path / f"store/jobs/tampered/{tokens_store_key(record['key'], 'train')}"
    data = bytearray(stored.read_bytes())
    data[len(data) // 2] ^= 0x01
    stored.write_bytes(bytes(data))
    job_store = PrefixedStore(store, "jobs/tampered")
    with pytest.raises(CorruptObject, match=r"train.arrow: sha256 .* differs from the data phase's record"):
        open_tokens(job_store, record, "train", tmp_path / "node-b", lambda line: None)
    assert not (tmp_path / f"node-b/tokens/{record['key']}/train.arrow").exists()


def test_tokens_from_tokenizer_processes_equal_those_encoded_in_process(tmp_path, llama, monkeypatch):
    """Large data is tokenized by a pool of spawned processes (each loads the tokenizer itself); the
    stored files must be byte-identical to one process's, and no process may outlive the phase."""
    import psutil

    monkeypatch.setattr(tokens_module, "CHUNK", 40)  # several chunks per process, results kept in order
    spec = tiny_job("workers", llama)
    spec["hypothesis"] = {"task": "format", "statement": "answers", "format": {"expect_json": False, "regex": ".+"}}
    spec["data"] = {"source": str(TICKETS_FILE), "prompt_field": "text", "response_field": "label"}
    spec["adaptation"]["target_modules"] = ["q_proj", "v_proj"]
    stored, before = {}, {p.pid for p in psutil.Process().children(recursive=True)}  # e.g. the tests' S3 server
    for workers in ("1", "2"):
        monkeypatch.setenv("RENTUNE_TOKENIZE_PROCESSES", workers)
        lines: list[str] = []
        root = tmp_path / f"store-{workers}"
        run_job(load(spec), FileStore(root), tmp_path / f"work-{workers}", lines.append, until="data")
        record = _data_result(root, "workers")["tokens"]
        stored[workers] = {
            split: (root / f"jobs/workers/{tokens_store_key(record['key'], split)}").read_bytes()
            for split in record["files"]
        }
        assert any("tokenizing in 2 processes" in line for line in lines) == (workers == "2")
    assert stored["1"] == stored["2"]
    # multiprocessing's resource tracker stays for the life of this process, by design; no pool worker may
    left = [p.cmdline() for p in psutil.Process().children(recursive=True) if p.pid not in before and p.is_running()]
    assert not [c for c in left if "resource_tracker" not in " ".join(c)], left
