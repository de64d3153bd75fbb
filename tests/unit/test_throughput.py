"""Throughput accounting (entrypoint/training/throughput.py) and the preflight checks of the settings that
decide it (precision auto, attention implementation, Liger)."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest
import torch

from entrypoint.data.encoding import IGNORE_INDEX
from entrypoint.data.packing import PackedCollator, pack
from entrypoint.training.device import Unsupported, preflight, resolve_precision
from entrypoint.training.throughput import CountingCollator, ThroughputMeter, flops_per_token, peak_flops
from jobspec.schema import Model, Training

SHAPE = {"vocab": 300, "hidden": 32, "intermediate": 64, "layers": 2, "heads": 4, "kv_heads": 2}


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=SHAPE["vocab"],
        hidden_size=SHAPE["hidden"],
        intermediate_size=SHAPE["intermediate"],
        num_hidden_layers=SHAPE["layers"],
        num_attention_heads=SHAPE["heads"],
        num_key_value_heads=SHAPE["kv_heads"],
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config)


def _matrix_parameters() -> int:
    """By hand from the shape: q and o (h x h), k and v (h x kv width), three MLP matrices, the LM head."""
    h, i, kv = SHAPE["hidden"], SHAPE["intermediate"], SHAPE["hidden"] // SHAPE["heads"] * SHAPE["kv_heads"]
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * i
    return SHAPE["layers"] * per_layer + SHAPE["vocab"] * h


def test_flops_per_token_full_fine_tune_counts_six_per_weight_plus_attention():
    flops, parts = flops_per_token(_llama(), context=50)
    attention = 12 * SHAPE["layers"] * SHAPE["hidden"] * 50
    assert parts["trainable_matrix_parameters"] == _matrix_parameters()  # embeddings are lookups: not counted
    assert parts["frozen_matrix_parameters"] == 0
    assert flops == 6 * _matrix_parameters() + attention


def test_flops_per_token_with_lora_counts_four_per_frozen_weight():
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(_llama(), LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    flops, parts = flops_per_token(model, context=50)
    h, kv, r = SHAPE["hidden"], SHAPE["hidden"] // SHAPE["heads"] * SHAPE["kv_heads"], 4
    lora = SHAPE["layers"] * ((r * h + h * r) + (r * h + kv * r))  # A and B of q_proj (h -> h), v_proj (h -> kv)
    assert parts["frozen_matrix_parameters"] == _matrix_parameters()
    assert parts["trainable_matrix_parameters"] == lora
    assert flops == 4 * _matrix_parameters() + 6 * lora + 12 * SHAPE["layers"] * SHAPE["hidden"] * 50


def test_peak_flops_only_where_a_peak_is_known(monkeypatch):
    monkeypatch.delenv("RENTUNE_PEAK_TFLOPS", raising=False)
    assert peak_flops(torch.device("cpu"), "fp32") == (None, "no MFU on cpu")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 PCIe")
    assert peak_flops(torch.device("cuda", 0), "bf16")[0] == 756e12  # the PCIe part, not the SXM one
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    assert peak_flops(torch.device("cuda", 0), "bf16")[0] == pytest.approx(989.4e12)
    assert peak_flops(torch.device("cuda", 0), "fp32")[0] is None  # no tensor-core peak to compare fp32 with
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Some New Accelerator")
    assert peak_flops(torch.device("cuda", 0), "bf16") == (
        None,
        "peak of 'Some New Accelerator' unknown: set RENTUNE_PEAK_TFLOPS",
    )
    monkeypatch.setenv("RENTUNE_PEAK_TFLOPS", "500")
    assert peak_flops(torch.device("cuda", 0), "bf16") == (500e12, "RENTUNE_PEAK_TFLOPS")


def _features(lengths: list[int]) -> list[dict]:
    return [{"input_ids": list(range(5, 5 + n)), "labels": [IGNORE_INDEX] + list(range(6, 5 + n))} for n in lengths]


def test_counting_collator_counts_real_and_padded_tokens():
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import DataCollatorForSeq2Seq, PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel({"[PAD]": 0, "[UNK]": 1}, unk_token="[UNK]")), pad_token="[PAD]"
    )
    padded = CountingCollator(DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=IGNORE_INDEX))
    padded(_features([10, 4, 2]))
    assert padded.take() == (16, 30) and padded.take() == (0, 0)
    packed = CountingCollator(PackedCollator(pad_token_id=0))
    packed(pack(_features([10, 4, 2, 9]), 16))  # rows [10, 4, 2] and [9]: the second padded to 16
    assert packed.take() == (25, 32)


def test_meter_counts_training_steps_only_not_eval_or_saves():
    counter = CountingCollator(PackedCollator(pad_token_id=0))
    meter = ThroughputMeter(counter, flops=1e6, parts={}, peak=None, peak_source="no MFU on cpu")
    args, control = SimpleNamespace(world_size=1), SimpleNamespace()
    meter.on_train_begin(args, None, control)
    rows = pack(_features([8, 8]), 16)
    for step in (1, 2):
        counter(rows)  # the step's batch
        meter.on_log(args, SimpleNamespace(global_step=step), control, logs={"loss": 1.0})
        counter(pack(_features([16] * 4), 16))  # an eval pass's batches: discarded
        meter.on_evaluate(args, None, control)
    counter(rows)
    meter.on_log(args, SimpleNamespace(global_step=3), control, logs={"loss": 1.0})
    assert [s[1:3] for s in meter.steps] == [(16, 16)] * 3
    figures = meter.window()
    assert figures["padding_share"] == 0.0 and figures["mfu"] is None and figures["tokens_per_s"] > 0
    assert meter.window() == {"tokens_per_s": 0.0, "tokens_per_s_per_device": 0.0, "padding_share": None, "mfu": None}
    summary = meter.summary()
    assert summary["windows"][0]["step"] == 3 and summary["flops_per_token"] == 1e6


def test_precision_auto_is_fp32_on_the_cpu_and_explicit_values_stand():
    cpu = torch.device("cpu")
    assert resolve_precision(Training(), cpu) == "fp32"
    assert resolve_precision(Training(precision="bf16"), cpu) == "bf16"
    assert preflight(Training(device="cpu")).type == "cpu"


def test_flash_attention_and_liger_are_refused_where_missing():
    with pytest.raises(Unsupported, match="flash_attention_2 needs a CUDA or ROCm device"):
        preflight(Training(device="cpu"), Model(path="m", attn_implementation="flash_attention_2"))
    preflight(Training(device="cpu"), Model(path="m", attn_implementation="eager"))
    if importlib.util.find_spec("liger_kernel") is None:
        with pytest.raises(Unsupported, match="training.liger: the liger-kernel package is not installed"):
            preflight(Training(device="cpu", liger=True))


def test_report_throughput_row_shows_figures_and_dashes_for_what_was_not_measured():
    from entrypoint.report.markdown import _throughput_lines

    measured = {
        "tokens_per_s": 14210.4,
        "tokens_per_s_per_device": 7105.2,
        "padding_share": 0.031,
        "mfu": 0.384,
        "precision": "bf16",
        "attn_implementation": "sdpa",
        "liger": True,
        "packing": True,
        "peak_source": "H100 SXM",
    }
    on_cpu = {**measured, "mfu": None, "tokens_per_s_per_device": None, "liger": False, "peak_source": None}
    lines = _throughput_lines([{"id": "main", "throughput": measured}, {"id": "cpu", "throughput": on_cpu}])
    assert lines[-2] == "| main | bf16 | sdpa + liger | yes | 14,210 | 7,105 | 3.1% | 38.4% | H100 SXM |"
    assert lines[-1] == "| cpu | bf16 | sdpa | yes | 14,210 | - | 3.1% | - | - |"
