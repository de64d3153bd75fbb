"""Two nodes on one machine, sharing nothing but the S3 store (moto) and a c10d rendezvous on 127.0.0.1:
`rentune run` on node rank 0 (the lead: every phase, and torchrun --nnodes 2) and `rentune run
--node-rank 1` (joins the lead's training launches only), each with its own work directory.

For DDP and DeepSpeed ZeRO-2 (gloo, one process per node): an uninterrupted two-node run; then a run
stopped by SIGTERM to both nodes after a committed checkpoint, whose manifest lists both ranks' files
(each node uploaded its own), resumed by two fresh launches on empty work directories; the resumed run's
final weights and per-step losses equal the uninterrupted run's.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from entrypoint.store.checkpoint import MANIFEST
from tests.models import build_tiny_bert
from tests.s3server import _free_port, create_bucket, raw_client
from tests.specs import s3_section, tiny_job, write_spec

RENTUNE = Path(sys.executable).parent / "rentune"
MAX_STEPS = 60  # room for SIGTERM to reach both nodes' ranks after step 20 (under load it took > 20 steps)
EVERY = 10


@pytest.fixture(scope="module")
def bert(tmp_path_factory) -> Path:
    return build_tiny_bert(tmp_path_factory.mktemp("bert") / "m")


def _spec(path: Path, model: Path, job_id: str, endpoint: str, bucket: str, distribution: dict) -> Path:
    training = {
        "max_steps": MAX_STEPS,
        "microbatch": 4,
        "seed": 11,
        "deterministic": True,
        "log_every_steps": 1,  # result.json's losses are then every step's
        "checkpoint": {"every_steps": EVERY, "keep": 2, "grace_seconds": 120},
    }
    spec = tiny_job(
        job_id,
        model,
        training=training,
        distribution={**distribution, "nproc_per_node": 1, "nnodes": 2},
        store=s3_section(endpoint, bucket),
    )
    return write_spec(path, spec)


class TwoNodes:
    """`rentune run SPEC --until train` on node ranks 0 and 1, each in its own fresh work directory."""

    def __init__(self, spec: Path, workdirs: Path):
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",
            "RENTUNE_RDZV_ENDPOINT": f"127.0.0.1:{_free_port()}",  # new nodes, new endpoint: the spec is frozen
            # Two "nodes" share this machine's cores: one thread each, as torchrun sets for several
            # processes on one node (with a whole core count each, DeepSpeed's steps crawl here).
            "OMP_NUM_THREADS": "1",
        }
        self.procs = []
        for node in (0, 1):
            workdir = workdirs / f"node-{node}"
            workdir.mkdir(parents=True)
            command = [RENTUNE, "run", str(spec), "--workdir", str(workdir), "--until", "train"]
            self.procs.append(
                subprocess.Popen(
                    command,
                    cwd=workdir,
                    env={**env, "RENTUNE_NODE_RANK": str(node)},
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    start_new_session=True,
                )
            )

    def running(self) -> bool:
        return all(p.poll() is None for p in self.procs)

    def signal(self, signum: int) -> None:
        for proc in self.procs:
            proc.send_signal(signum)

    def wait(self, timeout: float = 900) -> list[tuple[int, str]]:
        outs = [p.communicate(timeout=timeout)[0] for p in self.procs]
        return [(p.returncode, out) for p, out in zip(self.procs, outs, strict=True)]

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _json(client, bucket: str, key: str) -> dict:
    return json.loads(client.get_object(Bucket=bucket, Key=key)["Body"].read())


def _keys(client, bucket: str, prefix: str) -> list[str]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return [item["Key"] for page in pages for item in page.get("Contents", [])]


def _sha256(client, bucket: str, key: str) -> str:
    return hashlib.sha256(client.get_object(Bucket=bucket, Key=key)["Body"].read()).hexdigest()


def _final_hashes(client, bucket: str, prefix: str) -> dict[str, str]:
    return {key[len(prefix) :]: _sha256(client, bucket, key) for key in _keys(client, bucket, prefix)}


def _run_to_end(spec: Path, workdirs: Path) -> list[str]:
    nodes = TwoNodes(spec, workdirs)
    try:
        ended = nodes.wait()
    finally:
        nodes.kill()
    for code, out in ended:
        assert code == 0, out[-4000:]
    return [out for _, out in ended]


@pytest.mark.parametrize(
    "distribution",
    [{"strategy": "ddp"}, {"strategy": "deepspeed", "zero_stage": 2}],
    ids=["ddp", "deepspeed-zero2"],
)
def test_two_nodes_stop_on_sigterm_and_resume_on_fresh_nodes_as_if_never_stopped(
    tmp_path, bert, s3_server, distribution
):
    client, bucket = raw_client(s3_server), create_bucket(s3_server)
    jobs = "runs/jobs"

    # The uninterrupted reference.
    ref = _spec(tmp_path / "ref.yaml", bert, "ref", s3_server, bucket, distribution)
    lead_out, other_out = _run_to_end(ref, tmp_path / "ref")
    assert "node 1: training is done" in other_out
    assert "data: starting" in lead_out and "data: starting" not in other_out  # phases run once, on the lead
    reference = _json(client, bucket, f"{jobs}/ref/trials/main/result.json")
    assert reference["world_size"] == 2 and reference["steps"] == MAX_STEPS

    # Stopped by SIGTERM to both nodes once step 20 is committed...
    cut = _spec(tmp_path / "cut.yaml", bert, "cut", s3_server, bucket, distribution)
    checkpoints = f"{jobs}/cut/trials/main/checkpoints"
    nodes = TwoNodes(cut, tmp_path / "first")
    try:
        deadline = time.monotonic() + 600
        while f"{checkpoints}/step-00000020/{MANIFEST}" not in _keys(client, bucket, checkpoints):
            assert nodes.running(), [out[-3000:] for _, out in nodes.wait()]
            assert time.monotonic() < deadline
            time.sleep(0.2)
        nodes.signal(signal.SIGTERM)
        ended = nodes.wait(timeout=300)
    finally:
        nodes.kill()
    for code, out in ended:
        assert code == 143, out[-4000:]
    steps = sorted(k for k in _keys(client, bucket, checkpoints) if k.endswith(MANIFEST))
    stopped = _json(client, bucket, steps[-1])
    assert 20 <= stopped["step"] < MAX_STEPS
    files = set(stopped["files"])
    assert {"rng_state_0.pth", "rng_state_1.pth", "trainer_state.json"} <= files
    if distribution["strategy"] == "deepspeed":  # each rank's optimizer shard, from its own node's disk
        shards = {f for f in files if "zero_pp_rank_" in f}
        assert len(shards) == 2, files
    step_key = steps[-1].rsplit("/", 1)[0]
    report = _json(client, bucket, f"{step_key}/NODE-1.json")  # node 1's own upload, reported to node 0
    assert set(report["files"]) and set(report["files"]) <= files
    assert all(stopped["files"][name] == info for name, info in report["files"].items())

    # ... and resumed by two fresh launches on empty work directories.
    lead_out, other_out = _run_to_end(cut, tmp_path / "second")
    assert f"resuming from committed checkpoint step {stopped['step']}" in lead_out
    resumed = _json(client, bucket, f"{jobs}/cut/trials/main/result.json")
    assert resumed["resumed_from_step"] == stopped["step"] and resumed["steps"] == MAX_STEPS
    assert resumed["losses"] == reference["losses"]  # every step's loss, bit for bit
    assert len(resumed["losses"]) == MAX_STEPS
    final = {job: _final_hashes(client, bucket, f"{jobs}/{job}/trials/main/final/") for job in ("ref", "cut")}
    assert "adapter_model.safetensors" in final["ref"]
    assert final["cut"] == final["ref"]
