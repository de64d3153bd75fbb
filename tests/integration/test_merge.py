"""The merge of a LoRA adapter into a sharded base (entrypoint/training/merge.py), in real subprocesses: the
streamed merge writes the same shards and index, reproduces base + adapter's logits (and casts to bf16 as
float32-then-cast), and its peak memory stays below the full model + one shard + 20%, and below the model
itself; merging the same model in memory does not."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from entrypoint.training.merge import MergeError, stream_refusal

SHARD = 12 * 2**20  # bytes: the base is saved in shards of at most this


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> tuple[Path, Path]:
    """A 4-layer, 512-wide Llama (87 MB in float32) saved in 12 MB shards, and a rank-8 LoRA adapter
    on its attention and MLP projections with non-zero B (trained-like)."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("merge")
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=8000, hidden_size=512, intermediate_size=1536, num_hidden_layers=4, num_attention_heads=8,
        num_key_value_heads=8, max_position_embeddings=64, tie_word_embeddings=False,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(folder / "base", max_shard_size=SHARD)
    model = LlamaForCausalLM.from_pretrained(folder / "base")
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=targets))
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.02)
    peft_model.save_pretrained(folder / "adapter")
    return folder / "base", folder / "adapter"


PEAK = """
import json, sys
from pathlib import Path

def rss(field):
    return int(next(l for l in open("/proc/self/status") if l.startswith(field)).split()[1]) * 1024

import torch, peft, transformers, safetensors.torch  # imported before the first reading
from entrypoint.training.merge import merge_loaded, merge_streamed
base, adapter, out, how = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
before = rss("VmRSS")
if how == "streamed":
    merge_streamed(base, adapter, out, "float32", log=lambda m: None)
else:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    merge_loaded(PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter), out, "float32", "12MB")
print(json.dumps({"grew": rss("VmHWM") - before}))
"""


def _peak(base: Path, adapter: Path, out: Path, how: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(PEAK), str(base), str(adapter), str(out), how],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])["grew"]


def test_a_streamed_merge_keeps_the_shards_reproduces_the_adapter_and_peaks_below_the_bound(sharded, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base, adapter = sharded
    shards = sorted(base.glob("model-*.safetensors"))
    full, largest = sum(p.stat().st_size for p in shards), max(p.stat().st_size for p in shards)
    assert len(shards) >= 7 and stream_refusal(base, adapter) is None
    grew = _peak(base, adapter, tmp_path / "streamed", "streamed")
    bound = 1.2 * (full + largest)
    said = f"peak grew {grew / 1e6:.0f} MB; bound {bound / 1e6:.0f} MB (model {full / 1e6:.0f} MB)"
    assert grew < bound and grew < full, said  # and never the whole model at once

    merged = tmp_path / "streamed"
    assert sorted(p.name for p in merged.glob("model-*.safetensors")) == [p.name for p in shards]
    index = json.loads((merged / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == json.loads((base / "model.safetensors.index.json").read_text())["weight_map"]
    ids = torch.randint(0, 8000, (2, 12))
    with torch.no_grad():
        expected = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter).eval()(ids).logits
        untouched = AutoModelForCausalLM.from_pretrained(base).eval()(ids).logits
        got = AutoModelForCausalLM.from_pretrained(merged).eval()(ids).logits
    assert (expected - untouched).abs().max() > 1e-3  # the adapter changes the logits ...
    assert torch.allclose(got, expected, atol=1e-4)  # ... and the merged weights change them the same way


def test_a_merge_to_bf16_is_the_float32_merge_cast_once(sharded, tmp_path):
    from safetensors.torch import load_file

    from entrypoint.training.merge import merge_streamed

    base, adapter = sharded
    merge_streamed(base, adapter, tmp_path / "fp32", "float32", log=lambda m: None)
    merge_streamed(base, adapter, tmp_path / "bf16", "bfloat16", log=lambda m: None)
    config = json.loads((tmp_path / "bf16/config.json").read_text())
    assert config["dtype"] == config["torch_dtype"] == "bfloat16" and "quantization_config" not in config
    for shard in sorted((tmp_path / "fp32").glob("model-*.safetensors")):
        wide, narrow = load_file(shard), load_file(tmp_path / "bf16" / shard.name)
        assert all(narrow[k].dtype == torch.bfloat16 and torch.equal(narrow[k], wide[k].bfloat16()) for k in wide)


def test_a_merge_in_memory_of_the_same_model_exceeds_that_bound(sharded, tmp_path):
    """What the bound tells apart: peft's merge of the whole model loaded at once."""
    base, adapter = sharded
    shards = sorted(base.glob("model-*.safetensors"))
    full, largest = sum(p.stat().st_size for p in shards), max(p.stat().st_size for p in shards)
    assert _peak(base, adapter, tmp_path / "in-memory", "in memory") > 1.2 * (full + largest)


def test_what_cannot_be_streamed_is_named(sharded, tmp_path):
    base, adapter = sharded
    config = json.loads((adapter / "adapter_config.json").read_text())
    for change, said in (
        ({"modules_to_save": ["lm_head"]}, "modules_to_save is not empty"),
        ({"use_dora": True}, "use_dora is set"),
        ({"rank_pattern": {"q_proj": 4}}, "rank_pattern is not empty"),
    ):
        changed = tmp_path / said.split()[0]
        changed.mkdir()
        (changed / "adapter_config.json").write_text(json.dumps({**config, **change}))
        (changed / "adapter_model.safetensors").symlink_to(adapter / "adapter_model.safetensors")
        assert stream_refusal(base, changed) == said
    tied = tmp_path / "tied"  # the same adapter on a base whose embeddings are tied to its head
    shutil.copytree(base, tied)
    config = json.loads((tied / "config.json").read_text())
    (tied / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    lm_head = tmp_path / "lm_head"
    lm_head.mkdir()
    (lm_head / "adapter_config.json").write_text((adapter / "adapter_config.json").read_text())
    a, b = torch.zeros(8, 512), torch.zeros(8000, 8)
    save_file({"base_model.model.lm_head.lora_A.weight": a, "base_model.model.lm_head.lora_B.weight": b},
              lm_head / "adapter_model.safetensors")  # fmt: skip
    assert stream_refusal(tied, adapter) is None  # q/k/v/o and the MLP: nothing tied
    assert stream_refusal(tied, lm_head) == "tied embeddings and a LoRA on lm_head"
    (tied / "config.json").write_text(json.dumps({**config, "quantization_config": {"quant_method": "bitsandbytes"}}))
    with pytest.raises(MergeError, match="quantized .bitsandbytes.; merging into it would round"):
        stream_refusal(tied, adapter)
