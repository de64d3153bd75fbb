"""Base models in a bucket: pushed once under a claim, downloaded and verified on every node.

    push:   rentune push-model DIR s3://bucket/prefix
            hash every local file (name -> size, sha256)
            MODEL_MANIFEST.json there? same files: no-op : refused (nothing uploaded)
            check that the store refuses a second conditional write (a scratch key under the prefix)
            PUT MODEL_CLAIM.json if absent (every file's size and sha256)
                lost? the claim's files = ours: go on (a same-model push resumes) : refused (nothing uploaded)
            MODEL_MANIFEST.json there meanwhile? same files: no-op : refused
            upload every file (in parallel, hashed as read; each must equal its claimed hash) -> HEAD each
            PUT MODEL_MANIFEST.json if absent (lost: same files -> OK; different -> refused loudly)
    fetch:  model.path: s3://bucket/prefix   (each node, each process start)
            GET the manifest (and the claim, if any: it must name the same files)
            -> the cache folder named by its files' hashes (RENTUNE_MODEL_CACHE)
            complete there? use it : download every file (in parallel) -> size + sha256 -> rename into place

Why a claim: the model's files live at fixed keys (`prefix/<name>`, what nodes download), so two pushes of
different models to one prefix would overwrite each other's files if both uploaded: the manifest's
put-if-absent comes too late to protect them (the winner's manifest could list files the loser had just
overwritten). The claim is the one conditional object that decides, before any byte goes up, which model a
prefix holds: only a push whose files equal the claim's uploads anything, so every object under a claimed
prefix is either the claimed bytes or being replaced by the same bytes (a resumed or concurrent push of the
same folder). A push of another model is refused before it uploads, so "nothing was uploaded or
overwritten" is true when it says so. The manifest still goes last and lists what was confirmed; a node
checks every file it downloads against it, and refuses a prefix whose claim and manifest name different
files (two writers that did not respect each other's claim: an earlier rentune, or a store that dropped a
conditional write). A store that ignores `If-None-Match: *` is refused before the claim (exit 2), as at
job start: on it a claim would protect nothing.

A prefix with a manifest and no claim was pushed by an earlier rentune: the same files again are a no-op,
different files are refused, and no claim is added. A push that stops midway (killed, a network error)
leaves the claim and some files without a manifest: nodes refuse the prefix, saying the push has not
finished; the same push run again finishes it (it uploads every file again: an object's sha256 cannot be
read back without downloading it), and any other model is refused.

The manifest lists every file's size and sha256 and the base model's sha256 (the same definition as
`hash_base_model`: over the safetensors files), so the binding is known before any node downloads. One
process per node downloads (a file lock in the cache); the others wait and use its copy. A pushed model is
never overwritten: a second push of the same files is a no-op, of different files a Conflict (exit 3).
"""

from __future__ import annotations

import contextlib
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
from entrypoint.store import (
    InvalidKey,
    ObjectExists,
    ObjectNotFound,
    Store,
    StoreError,
    check_conditional_writes,
    check_key,
)
from entrypoint.store.base import UPLOAD_FILES_AT_ONCE
from entrypoint.store.checkpoint import upload_files
from entrypoint.store.hashing import files_sha256_memo, remember, weights_sha256
from entrypoint.store.objects import read_json

__all__ = [
    "MODEL_CLAIM",
    "MODEL_MANIFEST",
    "ModelMismatch",
    "fetch_model",
    "files_sha256",
    "hash_memo",
    "model_cache",
    "model_sha256",
    "push_model",
]

MODEL_MANIFEST = "MODEL_MANIFEST.json"
MODEL_CLAIM = "MODEL_CLAIM.json"  # written first, if absent: which model this prefix holds
_NOT_MODEL_FILES = (MODEL_MANIFEST, MODEL_CLAIM)  # never uploaded as a model's file (a cached copy has one)


class ModelMismatch(Conflict):
    """A model's bytes differ from those it was pinned to (exit 3); the message names the files."""


def model_cache() -> Path:
    """Where downloaded models live on this node: RENTUNE_MODEL_CACHE, else ~/.cache/rentune/models."""
    return Path(os.environ.get("RENTUNE_MODEL_CACHE") or Path.home() / ".cache/rentune/models").expanduser()


def hash_memo(folder: Path) -> Path:
    """The memo of `folder`'s file hashes on this node (store/hashing.py's files_sha256_memo): one file per
    model folder, under the model cache, named by the folder's absolute path."""
    name = hashlib.sha256(str(Path(folder).absolute()).encode()).hexdigest()[:32]
    return model_cache() / ".hashes" / f"{name}.json"  # hidden: the cache lists models only


def model_sha256(files: dict[str, dict]) -> str:
    """The base model's sha256 from a manifest's files, as hash_base_model computes it from a folder."""
    return weights_sha256({name: info["sha256"] for name, info in files.items() if name.endswith(".safetensors")})


def files_sha256(files: dict[str, dict]) -> str:
    """One hash over every file's name, size and sha256 (tokenizer and config too): what names a model's
    folder in a node's cache, and what a claim records as the pushed model's identity."""
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


def push_model(store: Store, folder: Path, log: Callable[[str], None], follow_links: bool = False) -> dict:
    """Upload the model folder `folder` to `store` (its root is the model's prefix) under a claim, manifest
    last (the protocol in this module's docstring). Returns the manifest. Raises ModelMismatch, before
    anything is uploaded, if the prefix holds or is claimed for a different model; InvalidInput (before
    anything is uploaded) for a link that leads out of the folder unless `follow_links`; StoreUnusable for
    a store that does not honour conditional writes."""
    paths = _files_of(folder, follow_links)
    for name in _NOT_MODEL_FILES:  # a folder from a node's cache carries the manifest it was fetched with
        paths.pop(name, None)
    started = time.monotonic()
    ours = _hash_local(folder, paths)
    if store.head(MODEL_MANIFEST) is not None:  # pushed and finished (or by an earlier rentune, unclaimed)
        return _same_or_refuse(store, ours, log)
    check_conditional_writes(store, "")  # a store that ignored If-None-Match would let two claims win
    created = _claim(store, ours, log)
    if store.head(MODEL_MANIFEST) is not None:  # a push of the same files finished meanwhile
        return _same_or_refuse(store, ours, log, unclaim=created)
    files = upload_files(store, "", paths, UPLOAD_FILES_AT_ONCE)
    changed = sorted(name for name in ours if files.get(name) != ours[name])
    if changed:
        raise InvalidInput(
            f"push-model: {', '.join(changed[:10])} in {folder} changed while it was pushed (the bytes sent "
            f"differ from those hashed first); {MODEL_MANIFEST} was not written, so nodes refuse {store.uri}: "
            "keep the folder unchanged and run push-model again, or push the new files to another prefix"
        )
    manifest = {"version": 1, "files": files, "base_model_sha256": model_sha256(files), "pushed_at": time.time()}
    try:
        store.put_if_absent(MODEL_MANIFEST, _dumps(manifest))
    except ObjectExists:  # a push of the same files (the only ones the claim lets upload) finished first
        return _same_or_refuse(store, ours, log, uploaded=True)
    size = sum(info["size"] for info in files.values())
    log(f"push-model: {len(files)} files, {size / 1e6:.1f} MB in {time.monotonic() - started:.1f} s")
    return manifest


def _dumps(obj: dict) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()


def _files_of(folder: Path, follow_links: bool) -> dict[str, Path]:
    """Every file under `folder` by its relative name, linked folders descended into. Refused with
    InvalidInput, naming the path, before anything is uploaded: a link (to a file or a folder, or anywhere
    under a linked folder) that leads outside `folder` unless `follow_links` (it could carry any file of this
    machine into the bucket); a link that leads nowhere; a linked folder that contains itself (a loop); and
    anything that is neither a file nor a folder."""
    root, paths = folder.resolve(), {}

    def visit(directory: Path, prefix: str, ancestors: tuple[Path, ...]) -> None:
        for entry in sorted(os.scandir(directory), key=lambda e: e.name):
            path = Path(entry.path)
            if entry.is_symlink():
                target = path.resolve()
                if not target.exists():
                    raise InvalidInput(
                        f"push-model: {path} links to {os.readlink(path)}, which does not exist; nothing was "
                        "uploaded. Remove the link, or restore what it points to"
                    )
                if not follow_links and not target.is_relative_to(root):
                    raise InvalidInput(
                        f"push-model: {path} links to {target}, outside {folder}; nothing was uploaded. Copy the "
                        "file into the folder or remove the link, or pass --follow-links to upload what the links "
                        "point to"
                    )
            name = prefix + entry.name
            if path.is_dir():
                real = path.resolve()
                if real in ancestors:
                    raise InvalidInput(
                        f"push-model: {path} links to {real}, a folder that contains the link (a loop); nothing "
                        "was uploaded. Remove the link"
                    )
                visit(path, name + "/", (*ancestors, real))
            elif path.is_file():
                paths[name] = path
            else:
                raise InvalidInput(f"push-model: {path} is neither a file nor a folder; nothing was uploaded")

    visit(folder, "", (root,))
    return paths


def _hash_local(folder: Path, paths: dict[str, Path]) -> dict[str, dict]:
    """name -> size, sha256 of every local file (a few at once; unchanged files this node has hashed before
    from its memo), before anything is claimed or uploaded. The upload hashes what it sends again."""
    hashes = files_sha256_memo(list(paths.values()), hash_memo(folder), threads=UPLOAD_FILES_AT_ONCE)
    return {name: {"size": paths[name].stat().st_size, "sha256": hashes[paths[name]]} for name in sorted(paths)}


def _differ(listed: object, ours: dict) -> str:
    listed = listed if isinstance(listed, dict) else {}
    names = sorted(n for n in set(listed) | set(ours) if listed.get(n) != ours.get(n))
    return ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")


def _since(claim: dict) -> str:
    at = claim.get("claimed_at")
    if isinstance(at, (int, float)) and not isinstance(at, bool):
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))
    return "an unknown time"


def _claim(store: Store, ours: dict, log: Callable[[str], None]) -> bool:
    """Claim the prefix for the files `ours` (put-if-absent). True if this push wrote the claim, False if
    a claim for the same files was there (a push of the same folder, interrupted or running now); raises
    ModelMismatch, with nothing uploaded, if it names other files."""
    claim = {
        "version": 1,
        "files": ours,
        "base_model_sha256": model_sha256(ours),
        "files_sha256": files_sha256(ours),
        "claimed_at": time.time(),
    }
    try:
        store.put_if_absent(MODEL_CLAIM, _dumps(claim))
        return True
    except ObjectExists:
        pass
    theirs = read_json(store, MODEL_CLAIM)
    if theirs.get("files") != ours:
        raise ModelMismatch(
            f"push-model: {store.uri} is claimed by a push of a different model (since {_since(theirs)}; files "
            f"that differ: {_differ(theirs.get('files'), ours)}); nothing was uploaded or overwritten: push to "
            "another prefix (or, if that other push was interrupted, run it again with its folder to finish it)"
        )
    log(f"push-model: {store.uri} was claimed for these same files at {_since(theirs)}; uploading them under it")
    return False


def _same_or_refuse(
    store: Store, ours: dict, log: Callable[[str], None], unclaim: bool = False, uploaded: bool = False
) -> dict:
    """The prefix has a manifest: this push is done if it lists exactly `ours`, else refused. `unclaim`: this
    push wrote a claim (and uploaded nothing) before an unclaimed manifest appeared, and takes it back;
    `uploaded`: this push uploaded under its claim, so a different manifest means someone ignored it."""
    theirs = read_json(store, MODEL_MANIFEST)
    if theirs.get("files") == ours:
        log(f"push-model: {store.uri} already holds exactly these files; nothing to upload")
        return theirs
    differ = _differ(theirs.get("files"), ours)
    if uploaded:
        raise ModelMismatch(
            f"push-model: {store.uri}/{MODEL_MANIFEST} lists a different model (files that differ: {differ}) "
            f"although this push held its claim and uploaded its files: a writer ignored the claim (an earlier "
            "rentune, or a store that dropped a conditional write), so the objects there may be mixed; nodes "
            "refuse it: push to a new prefix"
        )
    if unclaim:  # an earlier rentune pushed there without a claim; ours would make nodes refuse its model
        with contextlib.suppress(StoreError):
            store.delete(MODEL_CLAIM)
    raise ModelMismatch(
        f"push-model: {store.uri} already holds a different model (files that differ: {differ}); nothing was "
        "uploaded or overwritten: push to another prefix"
    )


def _read_claim(store: Store) -> dict | None:
    try:
        return read_json(store, MODEL_CLAIM)
    except ObjectNotFound:
        return None


def fetch_model(store: Store, cache: Path, log: Callable[[str], None]) -> Path:
    """The model at `store`'s root, downloaded into `cache/<hash of its files' hashes>` and verified (once per
    node: concurrent processes wait on a lock). Raises InvalidInput without a manifest (saying so when a
    push has claimed the prefix but not finished), ModelMismatch when the claim names other files than the
    manifest or a downloaded file differs from it."""
    try:
        manifest = read_json(store, MODEL_MANIFEST)
    except ObjectNotFound:
        claim = _read_claim(store)
        if claim is not None:
            raise InvalidInput(
                f"model.path: {store.uri} has no {MODEL_MANIFEST} yet: a push-model started there at "
                f"{_since(claim)} and has not finished (still uploading, or interrupted); wait for it, or run "
                f"the same `rentune push-model DIR {store.uri}` again to finish it"
            ) from None
        raise InvalidInput(
            f"model.path: {store.uri} has no {MODEL_MANIFEST}; upload the folder with "
            f"`rentune push-model DIR {store.uri}` first"
        ) from None
    files = manifest.get("files")
    if not isinstance(files, dict) or manifest.get("base_model_sha256") != model_sha256(files):
        raise ModelMismatch(f"model.path: {store.uri}/{MODEL_MANIFEST} is not a consistent model manifest")
    claim = _read_claim(store)
    if claim is not None and claim.get("files") != files:
        raise ModelMismatch(
            f"model.path: {store.uri}: {MODEL_CLAIM} and {MODEL_MANIFEST} name different files "
            f"({_differ(claim.get('files'), files)}): two pushes wrote this prefix without respecting each "
            "other's claim (an earlier rentune, or a store that dropped a conditional write), so its objects "
            "may be mixed; refusing this model: push it again to a new prefix"
        )
    cache.mkdir(parents=True, exist_ok=True)
    # Named by every file (tokenizer and config too), not by the weights alone: two models sharing weights
    # never share a folder.
    folder = cache / files_sha256(files)
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
        # Every byte was hashed as it arrived and matched the manifest: the job's base-model hash (and each
        # later process's on this node) reads these from the memo instead of reading the weights again.
        with contextlib.suppress(OSError):
            remember(hash_memo(folder), {folder / name: info["sha256"] for name, info in files.items()}, None)
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
            sha256 = store.get_file(name, local)  # the sha256 of what it wrote
        except ObjectNotFound:
            raise ModelMismatch(f"model.path: {store.uri}/{name} is listed in {MODEL_MANIFEST} but missing") from None
        if local.stat().st_size != info["size"] or sha256 != info["sha256"]:
            raise ModelMismatch(
                f"model.path: {store.uri}/{name} does not match its size and sha256 in {MODEL_MANIFEST} (the "
                "object changed after push-model); refusing this model"
            )

    with ThreadPoolExecutor(max_workers=UPLOAD_FILES_AT_ONCE, thread_name_prefix="model") as pool:
        list(pool.map(one, sorted(files, key=lambda name: -files[name]["size"])))
