"""The probe's four measured step set-ups, the parameter check against planted bugs, and gradient accumulation
through the real HF Trainer as rentune configures it: N microbatches equal one batch N times the size."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from entrypoint.context import PhaseContext
from entrypoint.data.packing import step_rows
from entrypoint.phases import data as data_phase
from entrypoint.phases import probe as probe_phase
from entrypoint.store import FileStore, PrefixedStore
from entrypoint.training.memory import OutOfMemory
from entrypoint.training.model import ModelError
from entrypoint.training.paramcheck import ParameterCheck, ParameterCheckError
from entrypoint.training.trainer import build_trainer
from jobspec import parse_spec
from jobspec.schema import Adaptation
from tests.models import build_tiny_bert, build_tiny_causal_lm
from tests.specs import kind_of, tiny_job

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bert(tmp_path_factory) -> Path:
    return build_tiny_bert(tmp_path_factory.mktemp("bert") / "m", dropout=0.0)


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return build_tiny_causal_lm(tmp_path_factory.mktemp("llama") / "m")


def _ctx(tmp_path: Path, spec: dict) -> PhaseContext:
    loaded = parse_spec(yaml.safe_dump(spec), source="spec.yaml")
    store = PrefixedStore(FileStore(tmp_path / "store"), "jobs/p")
    return PhaseContext(loaded.spec, loaded.sha256, store, tmp_path / "work", lambda m: None)


def _classification_spec(model: Path, **training) -> dict:
    return {
        "job": {"id": "p"},
        "hypothesis": {"task": "classification", "statement": "probe"},
        "model": {"path": str(model), "max_length": 32},
        "data": {"source": str(ROOT / "examples/data/tickets.jsonl")},
        "adaptation": {"method": "lora", "rank": 4, "dropout": 0.0},
        "training": {"microbatch": 4, "grad_accum": 2, "device": "cpu", "seed": 3, **training},
    }


def test_probe_records_four_step_setups_and_verifies_them(tmp_path, bert):
    ctx = _ctx(tmp_path, _classification_spec(bert))
    ctx.store.put_bytes("phases/data/result.json", json.dumps(data_phase.run(ctx)).encode())
    result = probe_phase.run(ctx)
    setups = result["setups"]
    assert set(setups) == {"plain", "checkpointing", "accumulation", "combined"}
    for name, setup in setups.items():
        assert setup["seconds"] > 0 and setup["peak_bytes"] >= setup["start_bytes"] > 0, name
    assert setups["accumulation"]["accumulated"] == 2 and setups["combined"]["checkpointing"]
    checks = result["gradient_checks"]["max_relative_difference"]
    assert set(checks) == {"checkpointing_vs_plain", "accumulation_vs_one_batch", "combined_vs_accumulation"}
    assert all(diff <= probe_phase.GRAD_RTOL["fp32"] for diff in checks.values())
    assert (result["precision"], result["precision_setting"]) == ("fp32", "auto")  # auto on the CPU
    assert result["train_rows"] == len(ctx.read_split("train")) and not result["packing"]
    assert setups["plain"]["parameter_check"]["passed"]
    estimate = result["estimate_bytes"]
    assert estimate["gradients"] > 0 and estimate["optimizer"] == 2 * estimate["gradients"]  # fp32 AdamW
    assert result["predicted_peak_bytes"] == setups["plain"]["peak_bytes"]


def test_probe_that_does_not_fit_says_what_would(tmp_path, bert, monkeypatch):
    ctx = _ctx(tmp_path, _classification_spec(bert))
    ctx.store.put_bytes("phases/data/result.json", json.dumps(data_phase.run(ctx)).encode())
    real_step = probe_phase.measured_step

    def step_that_fits_only_with_checkpointing(model, micro, causal, checkpointing, optimizer, device, precision):
        if not checkpointing:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real_step(model, micro, causal, checkpointing, optimizer, device, precision)

    monkeypatch.setattr(probe_phase, "measured_step", step_that_fits_only_with_checkpointing)
    with pytest.raises(OutOfMemory) as caught:
        probe_phase.run(ctx)
    assert caught.value.advice == ["set training.activation_checkpointing: true"]
    assert "does not fit" in str(caught.value)


def test_parameter_check_catches_a_frozen_layer_made_trainable(bert):
    model = _lora_classifier(bert, Adaptation(rank=4))
    model.base_model.model.bert.embeddings.word_embeddings.weight.requires_grad_(True)
    with pytest.raises(ParameterCheckError, match="requires_grad disagrees .*word_embeddings"):
        ParameterCheck(model, "lora")


def test_parameter_check_catches_a_frozen_weight_changed_by_a_step(bert):
    model = _lora_classifier(bert, Adaptation(rank=4))
    check = ParameterCheck(model, "lora")
    with torch.no_grad():  # a bug that writes into a frozen tensor (e.g. a shared buffer) during a step
        model.base_model.model.bert.encoder.layer[0].output.dense.weight[0, 0] += 1e-3
    with pytest.raises(ParameterCheckError, match="should be frozen changed: .*layer.0.output.dense.weight"):
        check.after_update(model, 1)


def test_parameter_check_catches_a_declared_parameter_that_never_trains(bert):
    model = _lora_classifier(bert, Adaptation(rank=4))
    check = ParameterCheck(model, "lora")
    check.after_update(model, 1)  # within the grace: LoRA A matrices may not move at step 1
    with pytest.raises(ParameterCheckError, match="never changed"):
        check.after_update(model, 2)


def test_lora_target_that_matches_nothing_is_an_error(bert):
    with pytest.raises(ModelError, match=r"\['attn_q'\] match no module"):
        _lora_classifier(bert, Adaptation(target_modules=["query", "attn_q"]))


def _lora_classifier(model: Path, adaptation: Adaptation):
    """The text classifier's model to train, as the train phase builds it."""
    return kind_of(tiny_job("p", model)).model.load(model, ["a", "b"], adaptation)


def _one_sgd_step(tmp_path: Path, spec: dict, rows: list[dict], labels: list[str]) -> dict:
    ctx = _ctx(tmp_path, spec)
    kind, folder = ctx.kind, ctx.model_dir
    tokenizer = kind.model.processor(folder)
    torch.manual_seed(0)
    model = kind.model.load(folder, labels, ctx.spec.adaptation)
    features = step_rows(ctx.spec, [e.features for e in kind.model.encode(tokenizer, rows, labels)])
    trainer = build_trainer(
        model,
        kind.model.collator(tokenizer),
        features,
        ctx.spec.training,
        output_dir=tmp_path / "out",
        device=torch.device("cpu"),
        loss_per=kind.task.loss,
    )
    trainer.train()
    model.save_pretrained(tmp_path / "saved")
    return load_file(tmp_path / "saved" / "adapter_model.safetensors")


@pytest.mark.parametrize("task", ["classification", "causal"])
def test_accumulation_equals_one_batch_of_n_times_the_size(tmp_path, bert, llama, task):
    """One SGD step (so the update is proportional to the gradient, unlike Adam's first step) with 4
    microbatches of 2 accumulated, against one batch of 8. Causal rows have very different response
    lengths: a per-microbatch mean would weight their tokens differently and fail this test."""
    rng = random.Random(0)
    if task == "classification":
        rows = [
            dict(text=r["text"], label=r["label"]) for r in map(json.loads, open(ROOT / "examples/data/tickets.jsonl"))
        ]
        rows, labels, model = rows[:64], sorted({r["label"] for r in rows}), bert
    else:
        rows = [
            {
                "prompt": f"item {i}",
                "response": " ".join(rng.choice(["a", "b", "c"]) for _ in range(rng.randint(1, 20))),
            }
            for i in range(64)
        ]
        rows, labels, model = [{**r, "label": "all"} for r in rows], ["all"], llama
    spec = _classification_spec(model)
    if task != "classification":
        spec["hypothesis"].update({"task": "format", "format": {"expect_json": False, "regex": ".+"}})
    spec["adaptation"]["target_modules"] = ["query", "value"] if task == "classification" else ["q_proj", "v_proj"]
    # No clipping: clipping both updates to the same norm would hide a gradient scaled by the accumulation.
    common = {"max_steps": 1, "optimizer": "sgd", "learning_rate": 0.5, "seed": 11, "max_grad_norm": 0}
    spec["training"].update(common, microbatch=2, grad_accum=4)
    accumulated = _one_sgd_step(tmp_path / "acc", spec, rows, labels)
    spec["training"].update(common, microbatch=8, grad_accum=1)
    whole = _one_sgd_step(tmp_path / "whole", spec, rows, labels)
    assert accumulated.keys() == whole.keys()
    moved = 0
    for name in whole:
        torch.testing.assert_close(accumulated[name], whole[name], rtol=1e-5, atol=1e-7)
        moved += int((whole[name] != 0).any())
    assert moved > 0


def _causal_rows(n: int = 64) -> list[dict]:
    rng = random.Random(0)
    return [
        {"prompt": f"item {i}", "response": " ".join(rng.choice(["a", "b", "c"]) for _ in range(rng.randint(1, 20)))}
        for i in range(n)
    ]


def _causal_spec(model: Path, **training) -> dict:
    spec = _classification_spec(model, **training)
    spec["hypothesis"].update({"task": "format", "format": {"expect_json": False, "regex": ".+"}})
    spec["adaptation"]["target_modules"] = ["q_proj", "v_proj"]
    return spec


def test_a_packed_step_equals_the_unpacked_step_over_the_same_examples(tmp_path, llama):
    """One SGD step over all 64 examples through the real Trainer: padded batches (2 x 32 examples) and
    packed rows (2 microbatches of rows). Per-token normalisation across the accumulated batch and no
    attention between examples make the update the same."""
    rows = [{**r, "label": "all"} for r in _causal_rows()]
    common = {"max_steps": 1, "optimizer": "sgd", "learning_rate": 0.5, "seed": 11, "max_grad_norm": 0}
    spec = _causal_spec(llama, **common)
    spec["training"].update(microbatch=32, grad_accum=2)
    unpacked = _one_sgd_step(tmp_path / "padded", spec, rows, ["all"])
    ctx = _ctx(tmp_path / "count", {**spec, "training": {**spec["training"], "packing": True}})
    tokenizer = ctx.kind.model.processor(ctx.model_dir)
    n_rows = len(step_rows(ctx.spec, [e.features for e in ctx.kind.model.encode(tokenizer, rows, ["all"])]))
    assert n_rows < 40  # several examples per row, or the test would not test packing
    spec["training"].update(microbatch=-(-n_rows // 2), grad_accum=2, packing=True)
    packed = _one_sgd_step(tmp_path / "packed", spec, rows, ["all"])
    assert packed.keys() == unpacked.keys()
    for name in unpacked:
        torch.testing.assert_close(packed[name], unpacked[name], rtol=1e-4, atol=1e-6)
    assert any((unpacked[name] != 0).any() for name in unpacked)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_probe_measures_full_packed_rows(tmp_path, llama, precision):
    """With packing the probe's step is microbatch rows of exactly max_length tokens (the worst case), its
    checks pass in the precision training uses, and it counts the rows a training epoch draws from."""
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({**r, "response": r["response"]}) + "\n" for r in _causal_rows(80)))
    spec = _causal_spec(llama, packing=True, precision=precision)
    spec["data"] = {"source": str(data), "leaks": {"test": "warn", "eval": "warn"}}
    spec["model"]["max_length"] = 48
    ctx = _ctx(tmp_path, spec)
    ctx.store.put_bytes("phases/data/result.json", json.dumps(data_phase.run(ctx)).encode())
    shapes = []
    real_step = probe_phase.measured_step

    def recording_step(model, micro, *args):
        shapes.extend(tuple(m["input_ids"].shape) for m in micro)
        assert all("position_ids" in m and "attention_mask" not in m for m in micro)
        return real_step(model, micro, *args)

    probe_phase.measured_step, saved = recording_step, probe_phase.measured_step
    try:
        result = probe_phase.run(ctx)
    finally:
        probe_phase.measured_step = saved
    assert set(shapes) == {(4, 48)}  # microbatch 4 rows, each full
    assert result["precision"] == precision and result["packing"]
    examples = len(ctx.read_split("train"))
    assert 0 < result["train_rows"] < examples
    checks = result["gradient_checks"]
    assert checks["tolerance"] == probe_phase.GRAD_RTOL[precision]
    assert all(diff <= checks["tolerance"] for diff in checks["max_relative_difference"].values())


def _hub_cache(tmp_path: Path, source: Path, commit: str) -> Path:
    """The layout the Hugging Face hub cache uses, filled from a model folder built here."""
    import shutil

    snapshot = tmp_path / "hub" / "models--acme--tiny-bert" / "snapshots" / commit
    shutil.copytree(source, snapshot)
    (tmp_path / "hub" / "models--acme--tiny-bert" / "refs").mkdir()
    (tmp_path / "hub" / "models--acme--tiny-bert" / "refs" / "main").write_text(commit)
    return tmp_path / "hub"


def test_hub_id_resolves_from_the_local_cache_pinned_to_a_commit(tmp_path, bert, monkeypatch):
    import huggingface_hub.constants

    from entrypoint.training.model import resolve_model_dir
    from jobspec.schema import Model

    commit = "0123456789abcdef0123456789abcdef01234567"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(_hub_cache(tmp_path, bert, commit)))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    folder = resolve_model_dir(Model(hub_id="acme/tiny-bert", revision=commit))
    assert folder.name == commit and (folder / "model.safetensors").is_file()
    with pytest.raises(ModelError, match="not in the local hub cache .* and HF_HUB_OFFLINE is set"):
        resolve_model_dir(Model(hub_id="acme/tiny-bert", revision="f" * 40))
    with pytest.raises(ValueError, match="40-hex commit"):
        Model(hub_id="acme/tiny-bert", revision="main")


def test_hub_id_online_tries_the_endpoint_and_says_why_it_failed(tmp_path, bert, monkeypatch):
    """Online (HF_HUB_OFFLINE unset), the download goes to HF_ENDPOINT: here a local port nobody listens
    on, so it fails (after huggingface_hub's own retries, about 20 s); a commit the cache does not hold
    either is refused, saying the download failed and why."""
    import huggingface_hub.constants

    from entrypoint.training.model import resolve_model_dir
    from jobspec.schema import Model
    from tests.s3server import _free_port

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(_hub_cache(tmp_path, bert, "8" * 40)))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", f"http://127.0.0.1:{_free_port()}")
    lines: list[str] = []
    with pytest.raises(ModelError, match=r"not in the local hub cache \(HF_HUB_CACHE\) and the download failed"):
        resolve_model_dir(Model(hub_id="acme/tiny-bert", revision="e" * 40), log=lines.append)
    assert lines[0].startswith("model: could not download acme/tiny-bert@eeeeeeeeeeee")


def test_models_that_need_their_own_code_are_refused(tmp_path, bert):
    import shutil

    from entrypoint.training.model import resolve_model_dir
    from jobspec.schema import Model

    shutil.copytree(bert, tmp_path / "remote")
    config = json.loads((tmp_path / "remote" / "config.json").read_text())
    config["auto_map"] = {"AutoModel": "modeling_evil.EvilModel"}
    (tmp_path / "remote" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelError, match="never runs repository code"):
        resolve_model_dir(Model(path=str(tmp_path / "remote")))
    (tmp_path / "remote" / "model.safetensors").rename(tmp_path / "remote" / "pytorch_model.bin")
    config.pop("auto_map")
    (tmp_path / "remote" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelError, match="found pytorch_model.bin: convert to safetensors first"):
        resolve_model_dir(Model(path=str(tmp_path / "remote")))


def test_adaptation_summary_names_what_lora_wrapped(bert):
    from entrypoint.training.model import adaptation_summary

    model = _lora_classifier(bert, Adaptation(rank=4, target_modules=["query", "value"]))
    summary = adaptation_summary(model)
    assert len(summary["lora_modules"]) == 4  # query and value in each of the 2 layers
    assert all(name.endswith((".query", ".value")) for name in summary["lora_modules"])
    assert summary["modules_to_save"] == ["base_model.model.classifier"]
    assert 0 < summary["trainable_parameters"] < summary["total_parameters"]


def test_a_warmup_from_zero_does_not_fail_the_parameter_check(bert, tmp_path):
    """Linear warmup makes the first update a no-op (learning rate 0), and LoRA's A matrices get no gradient
    until B has moved once: the check counts only updates with a learning rate above 0."""
    from entrypoint.runner import run_job
    from tests.specs import load

    spec = tiny_job("warmup", bert, training={"max_steps": 8, "warmup_ratio": 0.25})  # 2 warmup steps: lr 0 first
    outcome = run_job(load(spec), FileStore(tmp_path / "store"), tmp_path / "work", lambda line: None, until="train")
    assert outcome.ran == ["data", "baseline", "probe", "train"]
    result = json.loads((tmp_path / "store/jobs/warmup/trials/main/result.json").read_text())
    assert result["parameter_check"]["passed"] is True
