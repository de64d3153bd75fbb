"""model.max_length against the base model's positions (jobspec/model_limits.py), through the real
`rentune validate` and `rentune run`: a tiny BERT has 128 learned positions, so max_length 512 is refused
before anything is stored (it used to pass validate, then fail in the data phase with a bare torch size
mismatch, and the corrected spec was refused as a change of the stored job)."""

from __future__ import annotations

from tests.models import build_tiny_bert, build_tiny_causal_lm
from tests.processes import rentune
from tests.specs import tiny_job, write_spec


def test_a_max_length_past_the_model_s_positions_is_refused_before_the_job_is_stored(tmp_path):
    model = build_tiny_bert(tmp_path / "bert")
    spec = tiny_job("long", model)
    spec["model"]["max_length"] = 512
    path = write_spec(tmp_path / "long.yaml", spec)
    expected = f"model.max_length: 512 is more than the model's 128 positions (max_position_embeddings in {model}"

    checked = rentune("validate", str(path), cwd=tmp_path)
    assert checked.returncode == 2 and expected in checked.stderr and "expected at most 128" in checked.stderr

    store = tmp_path / "store"
    ran = rentune("run", str(path), "--store", f"file://{store}", "--workdir", str(tmp_path / "work"), cwd=tmp_path)
    assert ran.returncode == 2 and expected in ran.stderr and "nothing was stored" in ran.stderr, ran.stderr
    assert not (store / "jobs/long").exists()

    spec["model"]["max_length"] = 128  # the corrected spec starts the job: nothing stood in its way
    write_spec(path, spec)
    assert rentune("validate", str(path), cwd=tmp_path).returncode == 0


def test_a_rotary_model_past_its_trained_context_gets_a_warning_not_a_refusal(tmp_path):
    model = build_tiny_causal_lm(tmp_path / "llama")
    spec = tiny_job("rope", model)
    spec["model"]["max_length"] = 4096
    checked = rentune("validate", str(write_spec(tmp_path / "rope.yaml", spec)), cwd=tmp_path)
    assert checked.returncode == 0 and "warning: model.max_length: 4096 is more than the" in checked.stderr
