"""Checkpoints in the store: the commit protocol, discovery with fallback, and rotation.

A checkpoint is the folder `trials/<trial>/checkpoints/step-<8 digits>/` and exists only if its
`MANIFEST.json` exists and every file it lists downloads with the listed size and sha256.

    commit:   upload every file (in parallel, hashed as read) -> HEAD each (size confirmed)
              -> PUT MANIFEST.json if absent
    nodes:    across nodes, each node commits the files its ranks wrote into the same step folder and
              reports them in NODE-<k>.json; node 0 waits for every report of this launch, then writes
              the one manifest listing every node's files
    discover: list step-* -> newest first: manifest? every file size + sha256 ok? -> take it, else log why
    rotate:   after a commit, delete all but the newest `keep` valid steps, and debris older than them

The manifest goes last and never over another one, so a process killed mid-upload leaves only files
without a manifest, which discovery ignores and rotation later removes. No "latest" pointer exists to
be trusted or corrupted. This module imports no torch: it moves bytes and checks hashes.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from entrypoint.store import InvalidKey, ObjectExists, ObjectNotFound, Store, StoreError, check_key, join_key
from entrypoint.store.base import UPLOAD_FILES_AT_ONCE
from entrypoint.store.hashing import file_sha256
from entrypoint.store.objects import CorruptObject, read_json

__all__ = [
    "MANIFEST",
    "Checkpoint",
    "CheckpointError",
    "Nodes",
    "checkpoint_prefix",
    "commit_checkpoint",
    "find_latest",
    "list_steps",
    "node_report_key",
    "rotate",
    "upload_files",
]

MANIFEST = "MANIFEST.json"
DOWNLOAD_TRIES = 3  # downloads of a file that does not verify before its checkpoint is withdrawn
REJECTED = "REJECTED.json"  # a step whose manifest did not verify; why, for the post-mortem
MANIFEST_VERSION = 1
NODE_WAIT_S = 600.0  # how long node 0 waits for another node's report of a step before the commit fails
_STEP_DIR = re.compile(r"^step-(\d{8})$")


class CheckpointError(RuntimeError):
    """A checkpoint could not be committed (an upload did not confirm, or another writer disagreed)."""


@dataclass(frozen=True)
class Checkpoint:
    step: int
    folder: Path  # local, verified copy
    manifest: dict


@dataclass(frozen=True)
class Nodes:
    """This process's place in a commit shared by `count` nodes (without a shared filesystem, each node
    holds the files its own ranks wrote): node `node` of this torchrun launch `launch_id`, which tells its
    reports apart from those an earlier launch left in the same step folder."""

    node: int
    count: int
    launch_id: str
    wait_s: float = field(default=NODE_WAIT_S, compare=False)

    @property
    def lead(self) -> bool:
        return self.node == 0


def checkpoint_prefix(trial_id: str) -> str:
    return join_key("trials", trial_id, "checkpoints")


def _step_key(prefix: str, step: int) -> str:
    return join_key(prefix, f"step-{step:08d}")


def node_report_key(prefix: str, step: int, node: int) -> str:
    return join_key(_step_key(prefix, step), f"NODE-{node}.json")


def commit_checkpoint(
    store: Store,
    prefix: str,
    step: int,
    folder: Path,
    meta: dict,
    threads: int = UPLOAD_FILES_AT_ONCE,
    nodes: Nodes | None = None,
) -> dict:
    """Upload every file under `folder` as checkpoint `step`, confirm each, then write the manifest.

    Files go up `threads` at a time, largest first; each file's sha256 comes from the read that uploads
    it (Store.put_file), so every byte is read from disk once. `meta` (trial id, spec sha256, data
    version, base model sha256, env summary...) goes into the manifest. Returns the manifest. If a
    manifest for this step already exists (another writer won the race), returns it when it lists the
    same files and hashes, else raises CheckpointError.

    With `nodes`, a node other than 0 uploads and confirms its files, reports them (NODE-<k>.json, or
    the error that stopped it) and returns that report; node 0 adds every other node's report of the
    same launch to its own files before writing the manifest, and fails if one is missing after
    `nodes.wait_s` or names a file differently from another node.
    """
    key = _step_key(prefix, step)
    paths = {p.relative_to(folder).as_posix(): p for p in Path(folder).rglob("*") if p.is_file()}
    if store.head(join_key(key, MANIFEST)) is not None:  # never overwrite the files of a committed step
        files = {name: {"size": p.stat().st_size, "sha256": file_sha256(p)} for name, p in sorted(paths.items())}
        return _same_or_refuse(store, key, step, files, all_files=nodes is None or nodes.count == 1)
    if nodes is not None and not nodes.lead:
        return _commit_node_files(store, prefix, step, paths, threads, nodes)
    files = upload_files(store, key, paths, threads)
    if nodes is not None and nodes.count > 1:
        files = _gather(store, prefix, step, files, nodes)
    manifest = {"version": MANIFEST_VERSION, "step": step, "files": files, "committed_at": time.time(), **meta}
    body = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
    try:
        store.put_if_absent(join_key(key, MANIFEST), body)
    except ObjectExists:
        return _same_or_refuse(store, key, step, files)
    return manifest


def upload_files(store: Store, key: str, paths: dict[str, Path], threads: int) -> dict:
    """Upload `paths` (name -> local file) under `key`, largest first, and confirm each (a HEAD right after
    its upload, while the others still go up); name -> size, sha256."""
    sizes = {name: p.stat().st_size for name, p in paths.items()}  # the Trainer is done writing: final

    def where(name: str) -> str:
        return join_key(key, name) if key else name

    def upload(name: str) -> tuple[str, dict]:
        sha256 = store.put_file(where(name), paths[name])
        if not (isinstance(sha256, str) and len(sha256) == 64):  # a Store that breaks its protocol
            raise CheckpointError(f"{store.uri}/{where(name)}: the store's put_file returned {sha256!r}, not a sha256")
        seen = store.head(where(name))
        if seen is None or seen.size != sizes[name]:
            raise CheckpointError(
                f"{store.uri}/{where(name)}: upload not confirmed (expected {sizes[name]} bytes, saw {seen})"
            )
        return name, {"size": sizes[name], "sha256": sha256}

    largest_first = sorted(paths, key=lambda name: (-sizes[name], name))
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(paths))), thread_name_prefix="upload") as pool:
        return dict(sorted(pool.map(upload, largest_first)))  # the first failure is raised here


def _commit_node_files(
    store: Store, prefix: str, step: int, paths: dict[str, Path], threads: int, nodes: Nodes
) -> dict:
    """A node other than 0: upload and confirm its files, then report them (or why it could not) to node 0."""
    report: dict = {"node": nodes.node, "launch_id": nodes.launch_id, "step": step}
    try:
        report["files"] = upload_files(store, _step_key(prefix, step), paths, threads)
    except Exception as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"
        with contextlib.suppress(StoreError):  # best effort: the store may be what fails
            store.put_bytes(node_report_key(prefix, step, nodes.node), json.dumps(report).encode())
        raise
    store.put_bytes(node_report_key(prefix, step, nodes.node), json.dumps(report, sort_keys=True).encode())
    return report


def _gather(store: Store, prefix: str, step: int, files: dict, nodes: Nodes) -> dict:
    """Node 0's files plus every other node's reported files of this launch; CheckpointError if a node
    reports an error, says nothing within `nodes.wait_s`, or holds a file node 0 (or another) holds
    with different bytes."""
    merged, deadline, pause = dict(files), time.monotonic() + nodes.wait_s, 0.1
    for node in range(1, nodes.count):
        while True:
            try:
                report = read_json(store, node_report_key(prefix, step, node))
            except (ObjectNotFound, CorruptObject):  # not yet (or half-written by a dead process)
                report = {}
            if report.get("launch_id") == nodes.launch_id:
                break
            if time.monotonic() > deadline:
                raise CheckpointError(
                    f"step {step}: node {node} did not report its checkpoint files within {nodes.wait_s:.0f} s"
                )
            time.sleep(pause)
            pause = min(pause * 1.5, 2.0)
        if "error" in report:
            raise CheckpointError(f"step {step}: node {node} could not commit its files: {report['error']}")
        if not isinstance(report.get("files"), dict):
            raise CheckpointError(f"{node_report_key(prefix, step, node)}: expected a files object or an error")
        for name, info in report["files"].items():
            if merged.setdefault(name, info) != info:
                raise CheckpointError(f"step {step}: node {node} wrote a different {name} than another node")
    return merged


def _same_or_refuse(store: Store, key: str, step: int, files: dict, all_files: bool = True) -> dict:
    """Another writer committed this step first: fine if it holds the same files (with `all_files`
    False: at least these, unchanged), else CheckpointError."""
    theirs = read_json(store, join_key(key, MANIFEST))
    listed = theirs.get("files") or {}
    same = listed == files if all_files else all(listed.get(name) == info for name, info in files.items())
    if not same:
        raise CheckpointError(f"{key}: another writer committed different files for step {step}")
    return theirs


def list_steps(store: Store, prefix: str) -> dict[int, set[str]]:
    """Every step folder under `prefix` (committed or not) -> the file names it holds."""
    steps: dict[int, set[str]] = {}
    for info in store.list(prefix):
        head, _, name = info.key[len(prefix) + 1 :].partition("/")
        match = _STEP_DIR.match(head)
        if match and name:
            steps.setdefault(int(match.group(1)), set()).add(name)
    return steps


def _download(store: Store, key: str, name: str, local: Path, info: dict) -> str | None:
    """Download `key` into `local`; None if it matches `info` (size and sha256), else what differs (the
    wrong sha256 itself named: two downloads that agree on it saw the same stored bytes)."""
    try:
        sha256 = store.get_file(key, local)
    except ObjectNotFound:
        return f"{name} is missing"
    if not (isinstance(sha256, str) and len(sha256) == 64):  # a Store that breaks its protocol: no verdict
        raise CheckpointError(f"{store.uri}/{key}: the store's get_file returned {sha256!r}, not a sha256")
    if local.stat().st_size != info["size"]:
        return f"{name} has {local.stat().st_size} bytes, manifest says {info['size']}"
    if sha256 != info["sha256"]:
        return f"{name} does not match its sha256 in the manifest (read {sha256[:16]}...)"
    return None


def _verify_into(store: Store, key: str, manifest: dict, folder: Path) -> str | None:
    """Download every listed file of `key` into `folder`; None if all verify, else the reason (of the first
    failing file in name order). A name that could escape `folder` or an entry without size and sha256 is a
    reason, never a download. A file that does not verify is downloaded again, DOWNLOAD_TRIES times in all:
    it is a reason only when every download gave the same answer (the stored bytes are wrong, or gone); a
    file whose downloads disagree (a connection that flips bits) raises CheckpointError, withdrawing nothing.
    The files download in parallel, each hashed by get_file (S3: right after its download, from the page
    cache); none is fsynced: the copy is scratch, and the next process verifies it again."""
    shutil.rmtree(folder, ignore_errors=True)
    listed = sorted(manifest.get("files", {}).items())
    for name, info in listed:
        try:
            check_key(name)
        except InvalidKey:
            return f"the manifest lists an unsafe file name {name!r}"
        if not (isinstance(info, dict) and isinstance(info.get("size"), int) and isinstance(info.get("sha256"), str)):
            return f"the manifest entry for {name} lacks an integer size and a sha256"

    def fetch(item: tuple[str, dict]) -> str | None:
        name, info = item
        seen: list[str] = []  # what each download gave, when it did not verify
        for _ in range(DOWNLOAD_TRIES):
            problem = _download(store, join_key(key, name), name, folder / name, info)
            if problem is None:
                return None
            seen.append(problem)
        if len(set(seen)) == 1:  # every download gave the same wrong answer: the stored object is so
            return seen[0]
        raise CheckpointError(
            f"{store.uri}/{key}/{name}: {DOWNLOAD_TRIES} downloads gave different bytes ({'; '.join(seen)}): "
            "the connection to the store corrupts data. The checkpoint is left as it is (never withdrawn on "
            "an answer that is not reproducible); run again once the store answers consistently"
        )

    largest_first = sorted(listed, key=lambda item: (-item[1]["size"], item[0]))
    threads = max(1, min(UPLOAD_FILES_AT_ONCE, len(listed)))
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="restore") as pool:
        problems = dict(zip((name for name, _ in largest_first), pool.map(fetch, largest_first), strict=True))
    return next((problems[name] for name, _ in listed if problems[name] is not None), None)


def find_latest(store: Store, prefix: str, into: Path, log: Callable[[str], None]) -> Checkpoint | None:
    """The newest checkpoint whose manifest and every file verify, downloaded into `into/step-N`.

    Newer candidates that fail are logged with the reason and skipped; None if no step verifies.
    """
    for step in sorted(list_steps(store, prefix), reverse=True):
        key = _step_key(prefix, step)
        try:
            manifest = read_json(store, join_key(key, MANIFEST))
        except ObjectNotFound:
            log(f"checkpoint step {step}: no manifest (upload never finished), skipped")
            continue
        except CorruptObject as exc:
            problem = f"unreadable manifest ({exc})"
        else:
            problem = None
            if manifest.get("step") != step or not isinstance(manifest.get("files"), dict):
                problem = "the manifest does not describe this step"
        folder = Path(into) / f"step-{step:08d}"
        problem = problem or _verify_into(store, key, manifest, folder)
        if problem:
            log(f"checkpoint step {step}: {problem}; falling back to an older checkpoint")
            shutil.rmtree(folder, ignore_errors=True)
            _reject(store, key, problem)
            continue
        return Checkpoint(step=step, folder=folder, manifest=manifest)
    return None


def _reject(store: Store, key: str, reason: str) -> None:
    """Withdraw a committed step that does not verify: keep the evidence in REJECTED.json, delete the
    manifest, so the step no longer counts and training can commit it again when it gets there."""
    store.put_bytes(join_key(key, REJECTED), json.dumps({"reason": reason, "at": time.time()}).encode())
    store.delete(join_key(key, MANIFEST))


def rotate(store: Store, prefix: str, keep: int, log: Callable[[str], None]) -> list[int]:
    """Keep the newest `keep` committed steps; delete older committed steps and uncommitted debris older
    than the newest committed one. Steps newer than it are left alone (another writer may be uploading).
    Returns the deleted steps. The manifest is deleted first, so a half-deleted step is never valid."""
    steps = list_steps(store, prefix)
    committed = sorted((s for s, names in steps.items() if MANIFEST in names), reverse=True)
    if not committed:
        return []
    kept = set(committed[:keep])
    doomed = sorted(s for s in steps if s not in kept and s < committed[0])
    for step in doomed:
        key = _step_key(prefix, step)
        names = sorted(steps[step], key=lambda n: n != MANIFEST)
        for name in names:
            store.delete(join_key(key, name))
    if doomed:
        log(f"checkpoints: rotated out steps {doomed}, keeping {sorted(kept)}")
    return doomed
