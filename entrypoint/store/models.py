"""Base models in a bucket: pushed once with a manifest, downloaded and verified on every node.

    push:   rentune push-model DIR s3://bucket/prefix
            upload every file (in parallel, hashed as read) -> HEAD each -> PUT MODEL_MANIFEST.json if absent
    fetch:  model.path: s3://bucket/prefix   (each node, each process start)
            GET the manifest -> the cache folder named by its files' hashes (RENTUNE_MODEL_CACHE)
            complete there? use it : download every file (in parallel) -> size + sha256 -> rename into place

The manifest lists every file's size and sha256 and the base model's sha256 (the same definition as
`hash_base_model`: over the safetensors files), so the binding is known before any node downloads. One
process per node downloads (a file lock in the cache); the others wait and use its copy. A pushed model is
never overwritten: a second push of the same files is a no-op, of different files a Conflict.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from entrypoint.errors import Conflict, InvalidInput
from entrypoint.store import InvalidKey, ObjectExists, ObjectNotFound, Store, check_key
from entrypoint.store.base import UPLOAD_FILES_AT_ONCE
from entrypoint.store.checkpoint import upload_files
from entrypoint.store.hashing import file_sha256, weights_sha256
from entrypoint.store.objects import read_json

__all__ = ["MODEL_MANIFEST", "ModelMismatch", "fetch_model", "model_cache", "model_sha256", "push_model"]

MODEL_MANIFEST = "MODEL_MANIFEST.json"


class ModelMismatch(Conflict):
    """A model's bytes differ from those it was pinned to (exit 3); the message names the files."""


def model_cache() -> Path:
    """Where downloaded models live on this node: RENTUNE_MODEL_CACHE, else ~/.cache/rentune/models."""
    return Path(os.environ.get("RENTUNE_MODEL_CACHE") or Path.home() / ".cache/rentune/models").expanduser()


def model_sha256(files: dict[str, dict]) -> str:
    """The base model's sha256 from a manifest's files, as hash_base_model computes it from a folder."""
    return weights_sha256({name: info["sha256"] for name, info in files.items() if name.endswith(".safetensors")})


def push_model(store: Store, folder: Path, log: Callable[[str], None], follow_links: bool = False) -> dict:
    """Upload the model folder `folder` to `store` (its root is the model's prefix), manifest last.
    Returns the manifest. Raises ModelMismatch if the prefix already holds a different model, InvalidInput
    (before anything is uploaded) for a link that leads out of the folder unless `follow_links`."""
    paths = _files_of(folder, follow_links)
    paths.pop(MODEL_MANIFEST, None)  # a folder from a node's cache carries the manifest it was fetched with
    if store.head(MODEL_MANIFEST) is not None:
        return _same_or_refuse(store, paths, log)
    started = time.monotonic()
    files = upload_files(store, "", paths, UPLOAD_FILES_AT_ONCE)
    manifest = {"version": 1, "files": files, "base_model_sha256": model_sha256(files), "pushed_at": time.time()}
    try:
        store.put_if_absent(MODEL_MANIFEST, (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode())
    except ObjectExists:  # another push won the race
        return _same_or_refuse(store, paths, log)
    size = sum(info["size"] for info in files.values())
    log(f"push-model: {len(files)} files, {size / 1e6:.1f} MB in {time.monotonic() - started:.1f} s")
    return manifest


def _files_of(folder: Path, follow_links: bool) -> dict[str, Path]:
    """Every file under `folder` by its relative name. A symbolic link (or a file under a linked folder)
    that leads outside `folder` is refused, naming it, unless `follow_links`: it could carry any file of
    this machine into the bucket."""
    root, paths = folder.resolve(), {}
    for path in sorted(folder.rglob("*")):
        if not path.is_file():
            continue
        target = path.resolve()
        if not follow_links and not target.is_relative_to(root):
            raise InvalidInput(
                f"push-model: {path} links to {target}, outside {folder}; nothing was uploaded. Copy the file "
                "into the folder or remove the link, or pass --follow-links to upload what the links point to"
            )
        paths[path.relative_to(folder).as_posix()] = path
    return paths


def _same_or_refuse(store: Store, paths: dict[str, Path], log: Callable[[str], None]) -> dict:
    theirs = read_json(store, MODEL_MANIFEST)
    ours = {name: {"size": p.stat().st_size, "sha256": file_sha256(p)} for name, p in paths.items()}
    listed = theirs.get("files") or {}
    if listed != ours:
        differ = sorted(n for n in set(listed) | set(ours) if listed.get(n) != ours.get(n))
        raise ModelMismatch(
            f"{store.uri} already holds a different model (files that differ: {', '.join(differ[:10])}); "
            "nothing was overwritten: push to another prefix"
        )
    log(f"push-model: {store.uri} already holds exactly these files; nothing to upload")
    return theirs


def fetch_model(store: Store, cache: Path, log: Callable[[str], None]) -> Path:
    """The model at `store`'s root, downloaded into `cache/<hash of its files' hashes>` and verified (once per
    node: concurrent processes wait on a lock). Raises InvalidInput without a manifest, ModelMismatch
    when a downloaded file differs from it."""
    try:
        manifest = read_json(store, MODEL_MANIFEST)
    except ObjectNotFound:
        raise InvalidInput(
            f"model.path: {store.uri} has no {MODEL_MANIFEST}; upload the folder with "
            f"`rentune push-model DIR {store.uri}` first"
        ) from None
    files = manifest.get("files")
    if not isinstance(files, dict) or manifest.get("base_model_sha256") != model_sha256(files):
        raise ModelMismatch(f"model.path: {store.uri}/{MODEL_MANIFEST} is not a consistent model manifest")
    cache.mkdir(parents=True, exist_ok=True)
    # Named by every file (tokenizer and config too), not by the weights alone: two models sharing weights
    # never share a folder.
    folder = cache / hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
    with open(cache / f"{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one download per node; released when the file closes
        local = folder / MODEL_MANIFEST
        if local.is_file() and json.loads(local.read_text()).get("files") == files and _sizes_match(folder, files):
            log(f"model: {store.uri} already in the cache ({folder})")
            return folder
        partial = cache / f".{folder.name}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        started = time.monotonic()
        try:
            _download(store, files, partial)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)  # a model-sized leftover otherwise
            raise
        (partial / MODEL_MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")  # last
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(partial, folder)
    size = sum(info["size"] for info in files.values())
    seconds = time.monotonic() - started
    log(f"model: downloaded {store.uri}: {len(files)} files, {size / 1e6:.1f} MB in {seconds:.1f} s, sha256 verified")
    return folder


def _sizes_match(folder: Path, files: dict) -> bool:
    """A cached copy still holds every file at its size (a cheap check; the job's base_model.json pins the
    weights' sha256)."""
    return all((folder / n).is_file() and (folder / n).stat().st_size == i["size"] for n, i in files.items())


def _download(store: Store, files: dict, into: Path) -> None:
    def one(name: str) -> None:
        info = files[name]
        try:
            check_key(name)
        except InvalidKey:
            raise ModelMismatch(f"model.path: {store.uri}/{MODEL_MANIFEST} lists an unsafe name {name!r}") from None
        local = into / name
        try:
            store.get_file(name, local)
        except ObjectNotFound:
            raise ModelMismatch(f"model.path: {store.uri}/{name} is listed in {MODEL_MANIFEST} but missing") from None
        if local.stat().st_size != info["size"] or file_sha256(local) != info["sha256"]:
            raise ModelMismatch(
                f"model.path: {store.uri}/{name} does not match its size and sha256 in {MODEL_MANIFEST} (the "
                "object changed after push-model); refusing this model"
            )

    with ThreadPoolExecutor(max_workers=UPLOAD_FILES_AT_ONCE, thread_name_prefix="model") as pool:
        list(pool.map(one, sorted(files, key=lambda name: -files[name]["size"])))
