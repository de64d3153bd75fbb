"""A job continues when its spec changes only in form or in where things are, and is refused, naming every
field, when it changes in content. Real `rentune run` processes on a tiny BERT and a file store; the verify
phase's recheck runs in a fresh process, so a moved model must reach it too."""

from __future__ import annotations

import hashlib
import shutil

from tests.models import build_tiny_bert
from tests.processes import rentune
from tests.specs import tiny_job, write_spec

JOB = "moved"


def test_a_moved_model_and_a_comment_continue_the_job_and_a_changed_field_is_named(tmp_path):
    first_home = build_tiny_bert(tmp_path / "first/bert")
    store = tmp_path / "store"
    started = write_spec(tmp_path / "started.yaml", tiny_job(JOB, first_home))
    run = rentune(
        "run", str(started), "--store", f"file://{store}", "--workdir", str(tmp_path / "w1"), "--until", "probe"
    )
    assert run.returncode == 0, run.stderr[-3000:]
    frozen = (store / f"jobs/{JOB}/spec.yaml").read_bytes()

    # Another node: the same model mounted elsewhere (the first path is gone), the spec reformatted
    second_home = tmp_path / "second/mnt/bert"
    shutil.copytree(first_home, second_home)
    shutil.rmtree(tmp_path / "first")
    moved = tmp_path / "moved.yaml"
    write_spec(moved, tiny_job(JOB, second_home))
    moved.write_text("# the same job, on a node that mounts the model elsewhere\n" + moved.read_text())

    changed = write_spec(tmp_path / "changed.yaml", tiny_job(JOB, second_home, training={"learning_rate": 0.01}))
    refused = rentune("run", str(changed), "--store", f"file://{store}", "--workdir", str(tmp_path / "w2"))
    assert refused.returncode == 3, refused.stderr[-3000:]
    assert "1 field(s) differ: training.learning_rate: stored 0.005, yours 0.01" in refused.stderr
    assert "model.path" not in refused.stderr  # a move is not a difference

    run = rentune("run", str(moved), "--store", f"file://{store}", "--workdir", str(tmp_path / "w3"))
    assert run.returncode == 0, run.stderr[-3000:] + run.stdout[-3000:]
    assert f"spec: model.path is '{second_home}' on this node (the stored spec says '{first_home}'" in run.stdout
    assert "verify: " in run.stdout and (store / f"jobs/{JOB}/export/BINDING.json").is_file()
    assert (store / f"jobs/{JOB}/spec.yaml").read_bytes() == frozen  # the frozen spec is the job's, untouched
    log = (store / f"jobs/{JOB}/attempts/2/log.txt").read_text()
    assert "spec: model.path is" in log
    results = (store / f"jobs/{JOB}/report/results.json").read_text()
    assert hashlib.sha256(frozen).hexdigest() in results  # the job keeps its identity: the stored spec's sha256
