"""A full fine-tune saved in shards (`model-0000x-of-0000y.safetensors` and their index), as save_pretrained
writes a large model: the recheck process finds every shard, loads every tensor, and names a missing one."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from entrypoint.trial.recheck import SHARD_INDEX, RecheckError, load_weights, weight_files
from tests.models import build_tiny_causal_lm


def test_sharded_weights_are_found_loaded_and_checked(tmp_path):
    model = AutoModelForCausalLM.from_pretrained(build_tiny_causal_lm(tmp_path / "base"))
    folder = tmp_path / "sharded"
    model.save_pretrained(folder, max_shard_size="300KB")  # the real save_pretrained sharding
    names = weight_files(folder)
    assert len(names) > 1 and all(n.startswith("model-") and "-of-" in n for n in names)
    assert (folder / SHARD_INDEX).is_file()

    loaded = load_weights(folder, names)
    expected = {k: v for k, v in model.state_dict().items() if k in loaded}
    assert loaded.keys() == expected.keys() and len(loaded) >= len(model.state_dict()) - 1  # tied lm_head
    assert all(torch.equal(loaded[k], expected[k]) for k in loaded)
    reloaded = AutoModelForCausalLM.from_pretrained(folder)  # as the verify process reloads it
    assert all(torch.equal(reloaded.state_dict()[k], v) for k, v in loaded.items())

    (folder / names[-1]).unlink()
    with pytest.raises(RecheckError, match=names[-1]):
        weight_files(folder)


def test_a_single_file_wins_over_an_index_and_a_folder_without_weights_has_none(tmp_path):
    (tmp_path / "adapter_model.safetensors").write_bytes(b"")
    (tmp_path / SHARD_INDEX).write_text('{"weight_map": {"a": "model-00001-of-00002.safetensors"}}')
    assert weight_files(tmp_path) == ["adapter_model.safetensors"]
    assert weight_files(tmp_path / "nothing-here") == []
