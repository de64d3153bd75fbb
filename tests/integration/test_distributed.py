"""Two processes through torchrun on CPU (gloo): train a tiny model, commit checkpoints from rank 0 only,
stop on SIGTERM (forwarded by rentune to torchrun and its ranks), and resume in a fresh launch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.models import build_tiny_bert
from tests.specs import tiny_job, write_spec

ROOT = Path(__file__).resolve().parents[2]
RENTUNE = Path(sys.executable).parent / "rentune"

# A commit at step 20, SIGTERM right after it (under load it can take > 20 steps to land), steps left to resume.
MAX_STEPS = 80


@pytest.fixture(scope="module")
def bert(tmp_path_factory) -> Path:
    return build_tiny_bert(tmp_path_factory.mktemp("bert") / "m")


def _spec(tmp_path: Path, model: Path, distribution: dict) -> Path:
    spec = tiny_job(
        "dist",
        model,
        training={
            "max_steps": MAX_STEPS,
            "microbatch": 4,
            "log_every_steps": 10,
            "checkpoint": {"every_steps": 10, "keep": 2},
        },
        distribution=distribution,
        store={"uri": f"file://{tmp_path / 'store'}"},
    )
    return write_spec(tmp_path / "spec.yaml", spec)


def _start(spec: Path, workdir: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [RENTUNE, "run", str(spec), "--workdir", str(workdir), "--until", "train"],
        cwd=spec.parent,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.parametrize(
    "distribution",
    [
        {"strategy": "ddp", "nproc_per_node": 2},
        {"strategy": "deepspeed", "nproc_per_node": 2, "zero_stage": 2},
        {"strategy": "deepspeed", "nproc_per_node": 2, "zero_stage": 3},
    ],
    ids=["ddp", "deepspeed-zero2", "deepspeed-zero3"],
)
def test_two_processes_checkpoint_stop_and_resume_in_a_fresh_launch(tmp_path, bert, distribution):
    spec = _spec(tmp_path, bert, distribution)
    checkpoints = tmp_path / "store/jobs/dist/trials/main/checkpoints"
    first = _start(spec, tmp_path / "node-a")
    deadline = time.monotonic() + 300
    while not (checkpoints / "step-00000020/MANIFEST.json").exists():
        assert first.poll() is None, first.stdout.read()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    first.send_signal(signal.SIGTERM)
    out, _ = first.communicate(timeout=300)
    assert first.returncode == 143, out[-3000:]
    assert "train: SIGTERM received; forwarding SIGTERM to the torchrun ranks" in out
    manifests = sorted(checkpoints.glob("step-*/MANIFEST.json"))
    stopped_at = json.loads(manifests[-1].read_text())
    assert {"rng_state_0.pth", "rng_state_1.pth"} <= set(stopped_at["files"])  # rank 0 waited for rank 1
    assert stopped_at["step"] < MAX_STEPS

    second = _start(spec, tmp_path / "node-b")
    out, _ = second.communicate(timeout=600)
    assert second.returncode == 0, out[-3000:]
    result = json.loads((tmp_path / "store/jobs/dist/trials/main/result.json").read_text())
    assert result["world_size"] == 2 and result["launcher"] == "torchrun"
    assert result["resumed_from_step"] == stopped_at["step"] and result["steps"] == MAX_STEPS
    assert (tmp_path / "store/jobs/dist/trials/main/final/adapter_model.safetensors").exists()


# Loaded by every Python process started with this folder on PYTHONPATH: rank 1 of a torchrun launch runs
# out of memory on any microbatch of 8 (a CUDA OOM, as torch raises it), the other rank does not.
_OOM_ON_RANK_1 = """
import os

if os.environ.get("RANK") == "1":
    import torch
    import transformers

    _step = transformers.Trainer.training_step

    def training_step(self, model, inputs, *args, **kwargs):
        if inputs["input_ids"].shape[0] >= 8:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected by the test)")
        return _step(self, model, inputs, *args, **kwargs)

    transformers.Trainer.training_step = training_step
"""


def test_a_rank_out_of_memory_under_torchrun_records_the_trial_invalid_and_the_next_trial_runs(tmp_path, bert):
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(_OOM_ON_RANK_1)
    spec = tiny_job(
        "oom",
        bert,
        training={"max_steps": 12, "microbatch": 8, "checkpoint": {"every_steps": 5, "grace_seconds": 20}},
        distribution={"strategy": "ddp", "nproc_per_node": 2},
        store={"uri": f"file://{tmp_path / 'store'}"},
        experiments=[
            {
                "id": "half-batch",
                "changes": ["training.microbatch", "training.grad_accum"],
                "rationale": "the same examples per step in microbatches that fit",
                "training": {"microbatch": 4, "grad_accum": 2},
            }
        ],
    )
    path = write_spec(tmp_path / "spec.yaml", spec)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join([str(inject), str(ROOT)])}
    done = subprocess.run(
        [RENTUNE, "run", str(path), "--workdir", str(tmp_path / "work"), "--until", "train"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    trials = tmp_path / "store/jobs/oom/trials"
    main = json.loads((trials / "main/result.json").read_text())
    assert main["status"] == "invalid" and main["evaluable"] is False
    assert main["reason"].startswith("out of memory on rank 1") and "injected by the test" in main["reason"]
    assert main["launcher"] == "torchrun"
    variant = json.loads((trials / "half-batch/result.json").read_text())
    assert variant["status"] == "completed" and variant["steps"] == 12 and variant["world_size"] == 2


@pytest.mark.parametrize("kill", ["process-group", "main-process"])
def test_a_sigkilled_rentune_takes_torchrun_and_its_ranks_with_it(tmp_path, bert, kill):
    """SIGKILL of rentune's process group (`kill -9 -PGID`), or of its main process alone (as the OOM killer
    does): torchrun and both ranks die with it (entrypoint/training/lifeline.py); before, they trained on
    and committed checkpoints into the trial, beside any process that resumed it."""
    import psutil

    spec = _spec(tmp_path, bert, {"strategy": "ddp", "nproc_per_node": 2})
    checkpoints = tmp_path / "store/jobs/dist/trials/main/checkpoints"
    proc = subprocess.Popen(
        [RENTUNE, "run", str(spec), "--workdir", str(tmp_path / "node-a"), "--until", "train"],
        cwd=tmp_path,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group, as a shell job or a container's init gives it
    )
    deadline = time.monotonic() + 300
    while not (checkpoints / "step-00000010/MANIFEST.json").exists():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    family = psutil.Process(proc.pid).children(recursive=True)
    ranks = [
        p for p in family if "entrypoint.processes.rank" in p.cmdline() and "torch.distributed.run" not in p.cmdline()
    ]
    assert len(ranks) == 2, [p.cmdline() for p in family]
    if kill == "process-group":
        os.killpg(proc.pid, signal.SIGKILL)
    else:
        proc.kill()
    proc.wait()
    gone, alive = psutil.wait_procs(family, timeout=15)
    assert not alive, [p.cmdline()[:4] for p in alive]
    committed = sorted(p.parent.name for p in checkpoints.glob("step-*/MANIFEST.json"))
    time.sleep(3)  # nothing writes into the trial any more
    assert sorted(p.parent.name for p in checkpoints.glob("step-*/MANIFEST.json")) == committed
    assert committed[-1] < f"step-{MAX_STEPS:08d}"
