"""training/quantize.py with the real bitsandbytes on CPU, on a tiny Llama saved and loaded back with
from_pretrained: hashing, the refusal of other bytes, the CPU path pin, the parameter check over quantization
state, and bitsandbytes hidden from processes that do not ask for it. The whole jobs are in
tests/integration/test_qlora.py."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from entrypoint.store.models import ModelMismatch
from entrypoint.training.paramcheck import ParameterCheck, ParameterCheckError
from entrypoint.training.quantize import check_quantized, load_quantized
from jobspec.schema import Adaptation, Quantization
from tests.models import tiny_llama

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("llama") / "model"
    tiny_llama(96, 64, pad_token_id=0).save_pretrained(folder, safe_serialization=True)
    return folder


def _load(folder: Path, **settings):
    from transformers import AutoModelForCausalLM

    return load_quantized(AutoModelForCausalLM, folder, Quantization(**settings), "fp32", torch.device("cpu"))


def test_the_quantized_hash_is_the_same_on_every_load_and_another_quant_type_is_refused_by_name(llama):
    first, again, fp4 = _load(llama), _load(llama), _load(llama, quant_type="fp4")
    assert first.rentune_quantized == again.rentune_quantized
    assert first.rentune_quantized["quantized_modules"] == 14  # q, k, v, o, gate, up, down in 2 layers
    check_quantized(first.rentune_quantized, again.rentune_quantized, "job")
    with pytest.raises(ModelMismatch) as refused:
        check_quantized(first.rentune_quantized, fp4.rentune_quantized, "job")
    assert "quant_type nf4 there, fp4 here" in str(refused.value) and "job job" in str(refused.value)
    other_build = {**first.rentune_quantized, "bitsandbytes": "0.49.0", "sha256": "0" * 64}
    with pytest.raises(ModelMismatch, match=r"bitsandbytes 0.49.0 there, 0.50.2 here"):
        check_quantized(other_build, first.rentune_quantized, "job")
    check_quantized(None, first.rentune_quantized, "job")  # nothing recorded: nothing to compare


def test_eval_under_no_grad_computes_as_training_does_and_leaves_the_weights_alone(llama):
    """On CPUs with AVX512-BF16, bitsandbytes would take another path here unless pinned (module docstring
    of training/quantize.py); on other CPUs both paths are the same and this holds anyway."""
    model = _load(llama)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(0))
    model.train()
    with torch.no_grad():
        trained = model(input_ids=ids).logits
    model.eval()
    with torch.no_grad():
        evaluated = model(input_ids=ids).logits
    assert torch.equal(trained, evaluated)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_the_parameter_check_sees_a_quantization_state_that_moved(llama):
    from entrypoint.training.model import adapt
    from entrypoint.training.quantize import prepare_for_training

    adaptation = Adaptation(rank=4, target_modules=["q_proj", "v_proj"], quantization=Quantization())
    model = adapt(prepare_for_training(_load(llama)), {"missing_keys": []}, llama, adaptation, task_type="CAUSAL_LM")
    check = ParameterCheck(model, "lora")
    for param in model.parameters():  # the update: LoRA moves
        if param.requires_grad:
            param.data.add_(0.01)
    absmax = model.base_model.model.model.layers[1].mlp.up_proj.weight.quant_state.absmax
    absmax.view(torch.uint8)[0] ^= 1  # one bit of one block's scale, not the packed weight itself
    with pytest.raises(ParameterCheckError, match=r"layers\.1\.mlp\.up_proj\.weight"):
        check.after_update(model, 1)


def test_the_parameter_check_sees_an_int8_scale_that_moved(llama):
    from entrypoint.training.model import adapt
    from entrypoint.training.quantize import prepare_for_training

    adaptation = Adaptation(rank=4, target_modules=["q_proj", "v_proj"], quantization=Quantization(bits=8))
    model = adapt(prepare_for_training(_load(llama, bits=8)), {"missing_keys": []}, llama, adaptation, "CAUSAL_LM")
    check = ParameterCheck(model, "lora")
    for param in model.parameters():
        if param.requires_grad:
            param.data.add_(0.01)
    layer = model.base_model.model.model.layers[0].mlp.down_proj
    scales = layer.weight.SCB if layer.weight.SCB is not None else layer.state.SCB
    scales.view(torch.uint8)[0] ^= 1
    with pytest.raises(ParameterCheckError, match=r"layers\.0\.mlp\.down_proj\.SCB"):
        check.after_update(model, 1)


def test_bitsandbytes_stays_unimported_until_a_qlora_load_asks_for_it_and_peft_then_wraps_its_layers(llama):
    """As `rentune worker` may: a LoRA job first (peft looks for bitsandbytes and caches its absence), then
    a QLoRA job in the same process."""
    script = textwrap.dedent(
        f"""
        import sys
        import torch
        import entrypoint
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM
        base = AutoModelForCausalLM.from_pretrained({str(llama)!r})
        plain = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj"]))
        assert sys.modules.get("bitsandbytes") is None, "imported by peft"
        from entrypoint.training.quantize import load_quantized
        from jobspec.schema import Quantization
        model = load_quantized(AutoModelForCausalLM, {str(llama)!r}, Quantization(bits=8), "fp32", torch.device("cpu"))
        model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj"]))
        layer = model.base_model.model.model.layers[0].self_attn.q_proj
        print(type(layer).__module__, type(layer).__name__)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["peft.tuners.lora.bnb", "Linear8bitLt"]
    assert "kernels-community" not in done.stderr and "MatMul8bitLt" not in done.stderr


def test_a_qlora_job_without_bitsandbytes_is_refused_before_any_phase(monkeypatch):
    import importlib.metadata

    from entrypoint.training.device import Unsupported, preflight
    from jobspec.schema import Training

    installed = importlib.metadata.version

    def version(name):
        if name == "bitsandbytes":
            raise importlib.metadata.PackageNotFoundError(name)
        return installed(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    preflight(Training(device="cpu"))  # a job without quantization does not need it
    with pytest.raises(Unsupported, match=r"adaptation.quantization: bitsandbytes is not installed.*rentune\[qlora\]"):
        preflight(Training(device="cpu"), quantized=True)
