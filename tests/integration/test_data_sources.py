"""Data sources other than JSONL, through the real data phase: Parquet files (pyarrow, several row groups)
and folders written by the real `datasets.Dataset.save_to_disk`, local and in a bucket on a moto server.
The same examples give the same data version whatever the source; damaged files and wrong column types
are refused naming the file and the row."""

from __future__ import annotations

import random
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from entrypoint.data.reading import DataError
from tests.integration.test_data_phase import TICKETS, _run, _spec, _write
from tests.models import build_tiny_bert, build_tiny_chat_lm

datasets.disable_progress_bars()


@pytest.fixture(scope="module")
def bert(tmp_path_factory) -> Path:
    return build_tiny_bert(tmp_path_factory.mktemp("bert") / "m")


@pytest.fixture(scope="module")
def chat_lm(tmp_path_factory) -> Path:
    return build_tiny_chat_lm(tmp_path_factory.mktemp("chat") / "m", [r["text"] for r in TICKETS])


def _parquet(path: Path, rows: list[dict], row_group_size: int = 100) -> str:
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=row_group_size)
    return str(path)


def _saved(path: Path, rows: list[dict]) -> str:
    datasets.Dataset.from_list(rows).save_to_disk(str(path))
    return str(path)


def _upload(store, folder_or_file: Path, key: str) -> None:
    """A local file, or every file of a folder, under `key` in the store's bucket."""
    files = [folder_or_file] if folder_or_file.is_file() else sorted(folder_or_file.iterdir())
    for file in files:
        name = key if folder_or_file.is_file() else f"{key}/{file.name}"
        store.client.put_object(Bucket=store.bucket, Key=name, Body=file.read_bytes())


def _chat(rows: list[dict]) -> list[dict]:
    """Tickets as conversations; every other one carries a system turn, every third assistant turn a
    `name` (in Arrow every turn then has a `name`, null where JSONL has none)."""
    out = []
    for i, r in enumerate(rows):
        turns = [{"role": "user", "content": r["text"]}, {"role": "assistant", "content": r["label"]}]
        if i % 3 == 0:
            turns[1]["name"] = "agent"
        if i % 2:
            turns.insert(0, {"role": "system", "content": "Sort the ticket."})
        out.append({"messages": turns, "team": r["label"]})
    return out


def test_jsonl_parquet_and_saved_dataset_give_one_data_version_locally_and_from_a_bucket(
    tmp_path, bert, s3_server, s3_store
):
    shuffled = TICKETS[:]
    random.Random(5).shuffle(shuffled)
    sources = {
        "jsonl": _write(tmp_path / "tickets.jsonl", TICKETS),
        "parquet": _parquet(tmp_path / "tickets.parquet", shuffled, row_group_size=64),
        "saved": _saved(tmp_path / "tickets-ds", shuffled),
    }
    _upload(s3_store, tmp_path / "tickets.parquet", "data/tickets.parquet")
    _upload(s3_store, tmp_path / "tickets-ds", "data/tickets-ds")
    bucket = {"endpoint_url": s3_server, "addressing_style": "path"}
    sources["s3-parquet"] = f"s3://{s3_store.bucket}/data/tickets.parquet"
    sources["s3-saved"] = f"s3://{s3_store.bucket}/data/tickets-ds/"
    results = {}
    for name, source in sources.items():
        spec = _spec(bert, {"source": source})
        if name.startswith("s3"):
            spec["store"] = {"uri": f"s3://{s3_store.bucket}/jobs", **bucket}
        results[name], _, _ = _run(tmp_path, spec, name)
    versions = {name: r["data_version"] for name, r in results.items()}
    assert len(set(versions.values())) == 1, versions
    assert {name: r["rows_read"] for name, r in results.items()} == {n: {"all": len(TICKETS)} for n in sources}
    # the source hash is of the bytes read: the Parquet file is the same file locally and in the bucket
    assert results["parquet"]["sources"][sources["parquet"]] == results["s3-parquet"]["sources"][sources["s3-parquet"]]
    assert results["saved"]["sources"][sources["saved"]] == results["s3-saved"]["sources"][sources["s3-saved"]]


def test_chat_rows_from_parquet_and_a_saved_dataset_match_jsonl(tmp_path, chat_lm):
    rows = _chat(TICKETS[:240])
    sources = {
        "jsonl": _write(tmp_path / "chat.jsonl", rows),
        "parquet": _parquet(tmp_path / "chat.parquet", rows[::-1], row_group_size=50),
        "saved": _saved(tmp_path / "chat-ds", rows),
    }
    versions = {}
    for name, source in sources.items():
        data = {"source": source, "format": "messages", "label_field": "team"}
        result, _, _ = _run(tmp_path, _spec(chat_lm, data, task="format"), name)
        versions[name] = result["data_version"]
    assert len(set(versions.values())) == 1, versions


def test_a_wrong_column_type_is_refused_naming_file_row_group_and_row(tmp_path, bert):
    rows = [dict(r) for r in TICKETS[:300]]
    for i in (130, 131):
        rows[i]["text"] = None  # a null in a text column: the row lacks the field
    path = _parquet(tmp_path / "tickets.parquet", rows, row_group_size=100)
    with pytest.raises(DataError) as caught:
        _run(tmp_path, _spec(bert, {"source": path}))
    assert f"{path}: row 130 (row group 1, index 30): field 'text' (data.text_field) is missing; expected text" in str(
        caught.value
    )
    numbers = [{"text": len(r["text"]), "label": r["label"]} for r in TICKETS[:10]]  # an int64 column
    path = _parquet(tmp_path / "numbers.parquet", numbers, row_group_size=4)
    with pytest.raises(DataError) as caught:
        _run(tmp_path, _spec(bert, {"source": path}), "numbers")
    message = str(caught.value)
    assert f"{path}: row 0 (row group 0, index 0): field 'text' (data.text_field) is an int; expected text" in message
    assert f"{path}: row 9 (row group 2, index 1): field 'text'" in message


def test_a_damaged_parquet_file_is_refused_naming_the_file_and_the_row_group(tmp_path, bert):
    good = Path(_parquet(tmp_path / "tickets.parquet", TICKETS, row_group_size=100))
    data = good.read_bytes()
    truncated = tmp_path / "truncated.parquet"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match=f"{truncated}: not a readable Parquet file \\(.*magic bytes"):
        _run(tmp_path, _spec(bert, {"source": str(truncated)}), "a")

    # overwrite the second row group's first page header: the footer still reads, that group does not
    second = pq.ParquetFile(good).metadata.row_group(1).column(0)
    start = second.dictionary_page_offset or second.data_page_offset
    damaged = bytearray(data)
    damaged[start : start + 64] = bytes(64 * [0xFF])
    broken = tmp_path / "damaged.parquet"
    broken.write_bytes(bytes(damaged))
    with pytest.raises(DataError, match=f"{broken}: row group 1 \\(rows 100 to 199\\) cannot be read"):
        _run(tmp_path, _spec(bert, {"source": str(broken)}), "b")

    renamed = _write(tmp_path / "rows.parquet", TICKETS[:5])
    with pytest.raises(DataError, match="rows.parquet: not a Parquet file \\(it does not start with"):
        _run(tmp_path, _spec(bert, {"source": renamed}), "c")


def test_folders_that_are_not_one_saved_dataset_are_refused_with_what_to_point_at(tmp_path, bert):
    splits = datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(TICKETS[:200]), "test": datasets.Dataset.from_list(TICKETS[200:])}
    )
    splits.save_to_disk(str(tmp_path / "dict"))
    with pytest.raises(DataError, match=r"is a DatasetDict \(splits train, test\); point data.source at one"):
        _run(tmp_path, _spec(bert, {"source": str(tmp_path / "dict")}), "a")
    # one split's folder of it is a saved dataset: given files work
    files = {"train": str(tmp_path / "dict/train"), "eval": str(tmp_path / "dict/test"), "test": None}
    files["test"] = _parquet(tmp_path / "test.parquet", TICKETS[300:])
    files["eval"] = _write(tmp_path / "eval.jsonl", TICKETS[200:300])
    result, _, _ = _run(tmp_path, _spec(bert, {"files": files}), "b")
    assert result["rows_read"] == {"train": 200, "eval": 100, "test": len(TICKETS) - 300}

    (tmp_path / "plain").mkdir()
    with pytest.raises(DataError, match="plain is a folder without state.json"):
        _run(tmp_path, _spec(bert, {"source": str(tmp_path / "plain")}), "c")
