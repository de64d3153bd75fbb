"""The data phase on real files, a real tokenizer and tiny models built from a config: versions, leaks,
inspection of what the trainer sees (incl. the causal-LM loss mask), and errors naming file and line."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from entrypoint.context import PhaseContext
from entrypoint.data.reading import DataError
from entrypoint.phases import data as data_phase
from entrypoint.store import FileStore, PrefixedStore
from jobspec import parse_spec
from tests.models import build_tiny_bert, build_tiny_causal_lm

ROOT = Path(__file__).resolve().parents[2]
TICKETS = [json.loads(line) for line in (ROOT / "examples/data/tickets.jsonl").read_text().splitlines()]
RENTUNE = Path(sys.executable).parent / "rentune"


@pytest.fixture(scope="module")
def bert(tmp_path_factory) -> Path:
    return build_tiny_bert(tmp_path_factory.mktemp("bert") / "m")


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return build_tiny_causal_lm(tmp_path_factory.mktemp("llama") / "m")


def _write(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _spec(model: Path, data: dict, task: str = "classification", **training) -> dict:
    return {
        "job": {"id": "data-test"},
        "hypothesis": {"task": task, "statement": "data checks"}
        | ({"format": {"expect_json": False, "regex": ".+"}} if task == "format" else {}),
        "model": {"path": str(model), "max_length": 48},
        "data": data,
        "training": {"microbatch": 4, "device": "cpu", **training},
    }


def _run(tmp_path: Path, spec: dict, name: str = "run") -> tuple[dict, PhaseContext, list[str]]:
    loaded = parse_spec(yaml.safe_dump(spec), source="spec.yaml")
    lines: list[str] = []
    store = PrefixedStore(FileStore(tmp_path / name / "store"), "jobs/data-test")
    ctx = PhaseContext(loaded.spec, loaded.sha256, store, tmp_path / name / "work", lines.append)
    return data_phase.run(ctx), ctx, lines


def test_version_is_stable_under_reordering_and_renaming_and_changes_with_an_example_or_a_rule(tmp_path, bert):
    first = _write(tmp_path / "tickets.jsonl", TICKETS)
    shuffled = TICKETS[:]
    random.Random(3).shuffle(shuffled)
    renamed = _write(tmp_path / "other-name.jsonl", shuffled)
    base, _, _ = _run(tmp_path, _spec(bert, {"source": first}), "a")
    again, _, _ = _run(tmp_path, _spec(bert, {"source": renamed}), "b")
    assert again["data_version"] == base["data_version"]

    edited = [dict(r) for r in TICKETS]
    edited[100]["text"] = edited[100]["text"] + " Thanks."
    changed, _, _ = _run(tmp_path, _spec(bert, {"source": _write(tmp_path / "edited.jsonl", edited)}), "c")
    assert changed["data_version"] != base["data_version"]
    ruled, _, _ = _run(tmp_path, _spec(bert, {"source": first, "clean": ["strip_html", "normalize_ws"]}), "d")
    assert ruled["data_version"] != base["data_version"]
    assert ruled["cleaning"] == {"strip_html@1": 0, "normalize_ws@1": 0}


def _leaky_files(tmp_path: Path) -> tuple[dict, dict, dict]:
    """Given splits with a planted exact duplicate (case and punctuation changed) and a planted near
    duplicate (one word changed) of two train rows in test."""
    rows = TICKETS[:]
    train, eval_, test = rows[:300], rows[300:390], rows[390:]
    exact_src = train[10]
    near_src = next(r for r in train[11:] if len(r["text"].split()) >= 20)
    exact = {"text": exact_src["text"].upper() + "!!", "label": exact_src["label"]}
    words = near_src["text"].split()
    words[len(words) // 2] = "banana"
    near = {"text": " ".join(words), "label": near_src["label"]}
    files = {
        "train": _write(tmp_path / "train.jsonl", train),
        "eval": _write(tmp_path / "eval.jsonl", eval_),
        "test": _write(tmp_path / "test.jsonl", test + [exact, near]),
    }
    return files, exact_src, near_src


def test_planted_leaks_fail_the_job_before_baseline_listing_the_pairs(tmp_path, bert):
    files, exact_src, near_src = _leaky_files(tmp_path)
    spec = _spec(bert, {"files": files, "leaks": {"near_threshold": 0.7}})
    spec["store"] = {"uri": f"file://{tmp_path / 'store'}"}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    result = subprocess.run(
        [RENTUNE, "run", str(tmp_path / "spec.yaml")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "2 duplicate(s) between splits under policy 'fail'" in result.stderr
    assert "train-test exact (similarity 1.00)" in result.stderr and "train-test near" in result.stderr
    assert exact_src["text"][:40] in result.stderr and near_src["text"][:40] in result.stderr
    job = tmp_path / "store/jobs/data-test"
    assert not (job / "phases/data/result.json").exists() and not (job / "phases/baseline").exists()
    leaks = json.loads((job / "phases/data/leaks.json").read_text())
    assert sorted(p["kind"] for p in leaks["pairs"]) == ["exact", "near"]
    assert json.loads((job / "attempts/1/ended.json").read_text())["phase"] == "data"


def test_drop_policy_removes_leaks_from_the_training_side_and_counts_them(tmp_path, bert):
    files, exact_src, near_src = _leaky_files(tmp_path)
    result, ctx, _ = _run(tmp_path, _spec(bert, {"files": files, "leaks": {"near_threshold": 0.7, "test": "drop"}}))
    assert result["leaks"]["dropped"] == {"train": 2}
    assert result["leaks"]["counts"] == {"train-test:exact": 1, "train-test:near": 1}
    train = [r["text"] for r in ctx.read_split("train")]
    assert len(train) == 298 and exact_src["text"] not in train and near_src["text"] not in train
    assert len(ctx.read_split("test")) == 92


def _causal_rows() -> list[dict]:
    rng = random.Random(5)
    rows = []
    for i in range(30):
        fmt = ["json", "csv", "yaml"][i % 3]
        item, qty = rng.choice(["lamp", "desk", "chair", "shelf"]), rng.randint(1, 9)
        response = {
            "json": json.dumps({"item": item, "qty": qty}),
            "csv": f"item,qty\n{item},{qty}",
            "yaml": f"item: {item}\nqty: {qty}",
        }[fmt]
        rows.append({"prompt": f"Order {i}: {qty} x {item}. Answer in {fmt}.", "response": response, "format": fmt})
    rows.append({"prompt": "A very long order. " + "word " * 60, "response": '{"item": "many"}', "format": "json"})
    return rows


def test_causal_inspection_masks_exactly_the_prompt_and_reports_truncation(tmp_path, llama):
    from transformers import AutoTokenizer

    rows = _causal_rows()  # formats cycle json, csv, yaml: every split below holds each one
    cut = {"prompt": "A long answer, please.", "response": "word " * 60, "format": "json"}  # trains, truncated
    files = {  # line 25 of train: a prompt past max_length, nothing to train on: dropped and named
        "train": _write(tmp_path / "train.jsonl", rows[:24] + rows[30:] + [cut]),
        "eval": _write(tmp_path / "eval.jsonl", rows[24:27]),
        "test": _write(tmp_path / "test.jsonl", rows[27:30]),
    }
    template = "### Request\n{prompt}\n### Response\n"
    spec = _spec(
        llama,
        {"files": files, "label_field": "format", "template": template, "inspect_per_category": 3},
        task="format",
    )
    result, ctx, _ = _run(tmp_path, spec)
    inspection = json.loads(ctx.store.get_bytes("phases/data/inspection.json"))
    tokenizer = AutoTokenizer.from_pretrained(llama)
    examples = inspection["examples"]
    assert {e["category"] for e in examples} == {"json", "csv", "yaml"}
    for example in examples:
        ids = [t["id"] for t in example["tokens"]]
        prompt_ids = tokenizer(template.format(prompt=example["row"]["prompt"]), add_special_tokens=False).input_ids
        response_ids = tokenizer(example["row"]["response"], add_special_tokens=False).input_ids
        expected = [tokenizer.bos_token_id, *prompt_ids, *response_ids, tokenizer.eos_token_id][:48]
        assert ids == expected
        loss_positions = [t["position"] for t in example["tokens"] if t["in_loss"]]
        assert loss_positions == list(range(1 + len(prompt_ids), len(expected)))
        assert [ids[p] for p in loss_positions] == expected[1 + len(prompt_ids) :]
    assert not [e for e in examples if e["row"]["prompt"].startswith("A very long order")]
    assert inspection["untrainable"] == {"policy": "drop", "dropped": 1, "first": f"{files['train']}:25"}
    assert result["untrainable"] == inspection["untrainable"] and result["counts"]["train"]["json"] == 9
    long = [e for e in examples if e["row"]["prompt"] == cut["prompt"]]
    assert long and long[0]["truncated"] and long[0]["full_length"] > 48 and long[0]["loss"]["count"] > 0
    total_truncated = sum(s["truncated"] for s in inspection["lengths"].values())
    assert total_truncated == 1 and result["lengths"]["train"]["max_length"] == 48
    markdown = ctx.store.get_bytes("phases/data/inspection.md").decode()
    assert "truncated from" in markdown and "⟨[CLS]⟩" in markdown and "## csv" in markdown
    assert all(s["loss"] > 0 for s in result["smoke"].values())


def test_classification_inspection_shows_special_tokens_and_sequence_loss(tmp_path, bert):
    result, ctx, _ = _run(tmp_path, _spec(bert, {"source": str(ROOT / "examples/data/tickets.jsonl")}))
    inspection = json.loads(ctx.store.get_bytes("phases/data/inspection.json"))
    assert len(inspection["examples"]) == 2 * 6
    for example in inspection["examples"]:
        assert example["tokens"][0]["piece"] == "[CLS]" and example["tokens"][-1]["piece"] == "[SEP]"
        assert example["loss"] == {
            "kind": "sequence",
            "label": example["category"],
            "label_id": result["labels"].index(example["category"]),
        }
    assert "says nothing about quality" in ctx.store.get_bytes("phases/data/inspection.md").decode()


BAD_DATA = [
    ("invalid-json", ['{"text": "a", "label": "x"}', "{not json"], {}, "bad.jsonl:2: not valid JSON"),
    (
        "missing-field",
        ['{"text": "a", "label": "x"}', '{"label": "x"}'],
        {},
        "bad.jsonl:2: field 'text' (data.text_field) is missing",
    ),
    ("wrong-type", ['{"text": 5, "label": "x"}'], {}, "bad.jsonl:1: field 'text' (data.text_field) is an int"),
    (
        "undeclared-label",
        ['{"text": "a", "label": "x"}', '{"text": "b", "label": "z"}'],
        {"labels": ["x", "y"]},
        "bad.jsonl:2: label 'z' is not one of data.labels (x, y)",
    ),
    (
        # JSON Lines ends records at \n only: U+2028 and U+0085 inside strings are text, so the bad line is 3
        "line-separators-inside-strings",
        ['{"text": "a\u2028b", "label": "x"}', '{"text": "c\u0085d", "label": "x"}', "{not json"],
        {},
        "bad.jsonl:3: not valid JSON",
    ),
    (
        "cluster-field-missing",
        ['{"text": "a", "label": "x", "doc": 7}', '{"text": "b", "label": "x"}'],
        {"cluster_field": "doc"},
        "bad.jsonl:2: field 'doc' (data.cluster_field) is missing; expected a text or number id",
    ),
    (
        "lone-surrogate",
        ['{"text": "fine \\ud83d\\ude00", "label": "x"}', '{"text": "broken \\ud800", "label": "x"}'],
        {},
        "bad.jsonl:2: a string holds a lone surrogate escape",
    ),
    (
        "same-text-two-labels-in-another-case",
        ['{"text": "Refund my order", "label": "x"}', '{"text": "  refund MY order ", "label": "y"}'],
        {},
        "the text 'Refund my order' (also as 'refund MY order') appears with labels 'x' and 'y'",
    ),
]


@pytest.mark.parametrize("case,lines,extra,message", BAD_DATA, ids=[c[0] for c in BAD_DATA])
def test_bad_rows_are_named_by_file_and_line(tmp_path, bert, case, lines, extra, message):
    (tmp_path / "bad.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError) as caught:
        _run(tmp_path, _spec(bert, {"source": str(tmp_path / "bad.jsonl"), **extra}))
    assert message in str(caught.value)


def test_empty_split_and_category_absent_from_eval(tmp_path, bert):
    train = _write(tmp_path / "train.jsonl", TICKETS[:300])
    test = _write(tmp_path / "test.jsonl", TICKETS[300:360])
    empty = tmp_path / "eval.jsonl"
    empty.write_text("")
    with pytest.raises(DataError, match=f"{empty}: no examples \\(the file is empty"):
        _run(tmp_path, _spec(bert, {"files": {"train": train, "eval": str(empty), "test": test}}), "a")
    no_returns = _write(tmp_path / "eval2.jsonl", [r for r in TICKETS[360:] if r["label"] != "returns"])
    with pytest.raises(DataError, match=r"categories \['returns'\] are absent from the eval split"):
        _run(tmp_path, _spec(bert, {"files": {"train": train, "eval": no_returns, "test": test}}), "b")


def test_each_row_keeps_its_cluster_for_the_intervals(tmp_path, bert):
    rows = [{**row, "thread": f"t{i // 4}"} for i, row in enumerate(TICKETS)]  # 4 messages per thread
    spec = _spec(bert, {"source": _write(tmp_path / "threads.jsonl", rows), "cluster_field": "thread"})
    _, ctx, _ = _run(tmp_path, spec)
    thread = {row["text"]: row["thread"] for row in rows}
    for split in ("train", "eval", "test"):
        stored = ctx.read_split(split)
        assert stored and all(row["cluster"] == thread[row["text"]] for row in stored)


def test_the_same_text_in_another_case_is_one_example(tmp_path, bert):
    rows = [*TICKETS[:300], {**TICKETS[0], "text": "  " + TICKETS[0]["text"].upper() + " "}]
    result, _, _ = _run(tmp_path, _spec(bert, {"source": _write(tmp_path / "dup.jsonl", rows)}))
    assert result["exact_duplicates_dropped"] == 1


def test_a_file_that_is_not_utf8_is_named_with_its_line(tmp_path, bert):
    bad = tmp_path / "latin1.jsonl"
    bad.write_bytes(b'{"text": "ok", "label": "x"}\n{"text": "caf\xe9", "label": "x"}\n')
    with pytest.raises(DataError, match=r"latin1.jsonl:2: not UTF-8 \(byte 0xe9 at column 14\)"):
        _run(tmp_path, _spec(bert, {"source": str(bad)}))


def test_missing_file_suggests_neighbours(tmp_path, bert):
    _write(tmp_path / "tickets-train.jsonl", TICKETS[:10])
    with pytest.raises(DataError, match=r"data.source: file not found .*files there: tickets-train.jsonl"):
        _run(tmp_path, _spec(bert, {"source": str(tmp_path / "train.jsonl")}))
