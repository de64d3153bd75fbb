"""QLoRA chat jobs on a tiny Llama through real `rentune` processes, with the real bitsandbytes on CPU: the
base loaded in 4-bit NF4 (and 8-bit) runs every phase; the quantized tensors are compared bit for bit by
the parameter check; SIGKILL after a committed checkpoint and a resume in a fresh process on a fresh work
dir (re-quantizing the base) end with the adapter of an uninterrupted run; a node whose re-quantization
gives other bytes is refused naming what differs; the merged export, made on the dequantized 4-bit
weights, answers eval exactly as the quantized base + adapter did.

The model is 256 wide (not the usual 32) so that its linear layers, which are quantized, outweigh the
embeddings, which are not: about 8 MB of weights in fp32 against about 2 MB with the 4-bit layers.
"""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from entrypoint.store import PrefixedStore, get_tree
from entrypoint.store.s3 import S3Store
from entrypoint.training.quantize import quantized_base
from tests.integration.test_chat_job import _rows, _spec, _texts
from tests.integration.test_resume import _finish, _wait_for_manifest
from tests.models import build_tiny_chat_lm
from tests.processes import rentune, start_run
from tests.s3server import create_bucket
from tests.specs import load

WIDE = {"hidden_size": 256, "intermediate_size": 768, "num_key_value_heads": 2}
STEPS, EVERY = 12, 4


@pytest.fixture(scope="module")
def wide_model(tmp_path_factory) -> Path:
    return build_tiny_chat_lm(tmp_path_factory.mktemp("qlora") / "llama", _texts(), **WIDE)


def _qlora_spec(folder: Path, model: Path, bits: int, store: str, **s3) -> Path:
    data = folder / "orders.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    spec = _spec(model, data)
    spec["job"]["id"] = f"qlora{bits}"
    spec["adaptation"]["quantization"] = {"bits": bits}
    spec["training"].update(
        max_steps=STEPS, seed=5, deterministic=True, learning_rate=0.005, checkpoint={"every_steps": EVERY}
    )
    spec["store"] = {"uri": store, **s3}
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _job(folder: Path, bits: int) -> Path:
    return folder / f"store/jobs/qlora{bits}"


@pytest.fixture(scope="module")
def four_bit(tmp_path_factory, wide_model) -> Path:
    """An uninterrupted 4-bit job on a file store: what the resumed one must reproduce."""
    folder = tmp_path_factory.mktemp("four-bit")
    spec = _qlora_spec(folder, wide_model, 4, f"file://{folder / 'store'}")
    code, out = _finish(start_run(spec, folder / "work"))
    assert code == 0, out[-4000:]
    return _job(folder, 4)


def test_a_4bit_job_trains_checks_its_frozen_quantized_tensors_and_exports_a_merge_that_answers_the_same(
    four_bit, wide_model, tmp_path
):
    base = json.loads((four_bit / "base_model.json").read_text())
    quantized = base["quantized"]
    assert quantized["bits"] == 4 and quantized["quant_type"] == "nf4" and quantized["double_quant"] is True
    assert quantized["quantized_modules"] == 14 and len(quantized["sha256"]) == 64  # 7 Linear4bit per layer

    probe = json.loads((four_bit / "phases/probe/result.json").read_text())
    check = probe["setups"]["plain"]["parameter_check"]
    assert check["passed"] and check["declared_trainable"] == 8  # A and B of q_proj and v_proj, 2 layers
    # The model's tensors in memory: 4-bit packed weights and their state against fp32. (The step's process
    # RSS, measured too, is not lower on CPU at this size: docs/qlora.md; both are in the report.)
    memory = probe["quantization"]
    assert memory["quantized"]["weights_bytes"] < memory["unquantized"]["weights_bytes"] / 3
    assert memory["quantized"]["peak_bytes"] > memory["quantized"]["weights_bytes"]
    assert memory["unquantized"]["peak_bytes"] > memory["unquantized"]["weights_bytes"]
    report = (four_bit / "report/report.md").read_text()
    assert "## Quantized base (QLoRA)" in report and "4-bit nf4, double quantization" in report
    assert f"{memory['quantized']['peak_bytes'] / 2**20:,.0f} MiB" in report
    assert f"{memory['unquantized']['peak_bytes'] / 2**20:,.0f} MiB" in report

    losses = json.loads((four_bit / "trials/main/result.json").read_text())["losses"]
    assert losses[-1]["loss"] < losses[0]["loss"], losses
    config = json.loads((four_bit / "trials/main/eval/eval_config.json").read_text())
    assert config["model"].startswith("the 4-bit quantized base + the adapter")
    baseline = json.loads((four_bit / "phases/baseline/result.json").read_text())
    assert baseline["eval_config"]["baseline"]["base"].startswith("quantized as trained")

    # Checkpoints hold the adapter and the optimizer, never the base.
    step = four_bit / f"trials/main/checkpoints/step-{STEPS:08d}"
    weights = load_file(step / "adapter_model.safetensors")
    assert weights and all("lora_" in name for name in weights)

    binding = json.loads((four_bit / "export/BINDING.json").read_text())
    assert binding["quantization"] == quantized
    merged = binding["merged"]
    assert merged["parity"] == "ok" and merged["merge_base"] == "dequantized"
    parity = json.loads((four_bit / "export/parity.json").read_text())
    assert all(parity["equal_per_example"]) and parity["largest_logit_difference"] < 1e-4, parity
    trial = [json.loads(line)["output"] for line in (four_bit / "trials/main/eval/predictions.jsonl").open()]
    assert parity["outputs"]["merged"] == trial  # the merged model's greedy answers are the trial's own
    checked = rentune("check-export", str(four_bit / "export"), "--base", str(wide_model), "--requantize", "cpu")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"quantized to 4 bits (sha256 {quantized['sha256'][:16]}... reproduced)" in checked.stdout
    # BINDING.json saying other quantized bytes: the re-quantized base does not match it.
    copy = tmp_path / "export"
    shutil.copytree(four_bit / "export", copy)
    (copy / "BINDING.json").write_text(json.dumps({**binding, "quantization": {**quantized, "sha256": "0" * 64}}))
    refused = rentune("check-export", str(copy), "--base", str(wide_model), "--requantize", "cpu")
    assert refused.returncode == 2 and "not to the 0000000000000000... job qlora4 was trained" in refused.stderr, (
        refused.stderr
    )


def test_8bit_job_runs_every_phase_and_measures_a_merge_into_the_original_base(tmp_path, wide_model):
    spec = _qlora_spec(tmp_path, wide_model, 8, f"file://{tmp_path / 'store'}")
    written = yaml.safe_load(spec.read_text())
    spec.write_text(yaml.safe_dump({**written, "export": {"merge_base": "original"}}))
    done = rentune("run", str(spec), "--workdir", str(tmp_path / "work"), cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    job = _job(tmp_path, 8)
    assert json.loads((job / "base_model.json").read_text())["quantized"]["bits"] == 8
    probe = json.loads((job / "phases/probe/result.json").read_text())
    # 14 int8 weights and their 14 scale vectors stayed bit-identical through two updates
    assert probe["setups"]["plain"]["parameter_check"]["passed"]
    losses = json.loads((job / "trials/main/result.json").read_text())["losses"]
    assert losses[-1]["loss"] < losses[0]["loss"], losses
    binding = json.loads((job / "export/BINDING.json").read_text())
    assert binding["quantization"]["bits"] == 8 and binding["quantization"]["compute_dtype"] == "float32"
    # Merged into the full-precision base: its difference from the 8-bit base + adapter is measured and said.
    merged = binding["merged"]
    assert merged["merge_base"] == "original" and merged["method"] == "streamed"
    assert merged["largest_logit_difference"] > 0 and merged["parity"] in ("ok", "failed")
    serving = (job / "export/report.md").read_text()
    assert "into the original base" in serving and f"{merged['equal_outputs']} eval answers identical" in serving
    assert "MatMul8bitLt" not in done.stdout + done.stderr and "kernels-community" not in done.stdout + done.stderr


def test_sigkill_then_a_node_that_quantizes_differently_is_refused_and_a_matching_one_resumes_exactly(
    tmp_path, wide_model, s3_server, four_bit
):
    bucket = create_bucket(s3_server)
    spec = _qlora_spec(tmp_path, wide_model, 4, f"s3://{bucket}/runs", endpoint_url=s3_server, addressing_style="path")
    job = PrefixedStore(
        S3Store.from_uri(f"s3://{bucket}/runs", endpoint_url=s3_server, addressing_style="path"), "jobs/qlora4"
    )
    first = start_run(spec, tmp_path / "node-a")
    _wait_for_manifest(job, first, 2 * EVERY)
    first.send_signal(signal.SIGKILL)
    first.wait()

    # The job's record says its base was quantized to other bytes (fp4, as another node's stack might):
    # a fresh node re-quantizing with nf4 must refuse rather than train the adapter on another base.
    recorded = json.loads(job.get_bytes("base_model.json"))
    written = yaml.safe_load(spec.read_text())
    written["adaptation"]["quantization"]["quant_type"] = "fp4"
    other = load(written).spec
    fp4 = quantized_base(other, wide_model, other.adaptation.quantization, None).rentune_quantized
    assert fp4["sha256"] != recorded["quantized"]["sha256"]
    job.put_bytes("base_model.json", json.dumps({**recorded, "quantized": fp4}).encode())
    code, out = _finish(start_run(spec, tmp_path / "node-b", None, "--until", "train"))
    assert code == 3, out[-3000:]
    assert "quant_type fp4 there, nf4 here" in out and "Refusing to go on" in out
    assert job.head("phases/train/result.json") is None  # nothing trained on the other base

    job.put_bytes("base_model.json", json.dumps(recorded).encode())
    code, out = _finish(start_run(spec, tmp_path / "node-c", None, "--until", "train"))  # the rest: tested above
    assert code == 0, out[-4000:]
    result = json.loads(job.get_bytes("trials/main/result.json"))
    assert result["resumed_from_step"] is not None and result["resumed_from_step"] >= 2 * EVERY
    resumed = load_file(get_tree(job, "trials/main/final", tmp_path / "final") / "adapter_model.safetensors")
    reference = load_file(four_bit / "trials/main/final/adapter_model.safetensors")
    assert resumed.keys() == reference.keys()
    assert [n for n in reference if not (resumed[n] == reference[n]).all()] == []
