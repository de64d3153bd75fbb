"""What `rentune validate` checks of a spec's local model folder before any model library is imported: it
exists, holds transformers weights and a config, and is not a GGUF file (the data files' first rows:
entrypoint/data/reading.py's first_rows_problems). A bucket's objects are checked by `run`, on the node."""

from __future__ import annotations

from pathlib import Path

from jobspec.model_limits import max_length_problem
from jobspec.schema import JobSpec

__all__ = ["local_path", "model_folder_check"]

WEIGHTS = ("*.safetensors", "pytorch_model*.bin", "model.safetensors.index.json", "pytorch_model.bin.index.json")


def local_path(location: str | None) -> Path | None:
    """A spec's path on this machine (`file://` allowed), or None for a bucket's (s3://, hf://, ...)."""
    if location is None or "://" in location.removeprefix("file://"):
        return None
    return Path(location.removeprefix("file://")).expanduser()


def model_folder_check(spec: JobSpec) -> tuple[list[str], list[str]]:
    """model.path, when local: a transformers folder with weights and config.json, whose position embeddings
    hold model.max_length. Returns (problems, warnings)."""
    folder = local_path(spec.model.path)
    if folder is None:
        return [], []
    if folder.is_file() and folder.suffix == ".gguf":
        return [
            f"model.path: {folder} is a GGUF file; rentune trains from a transformers folder: convert it with "
            f"`rentune convert-gguf {folder} FOLDER`, then set model.path to FOLDER"
        ], []
    if not folder.is_dir():
        return [f"model.path: {folder}: no such folder (resolved from {Path.cwd()})"], []
    problems, warnings = [], []
    if not any(next(folder.glob(pattern), None) for pattern in WEIGHTS):
        there = sorted(p.name for p in folder.iterdir())[:8]
        problems.append(
            f"model.path: {folder} holds no weights (no *.safetensors or pytorch_model*.bin); expected a folder "
            f"written by save_pretrained (or `rentune convert-gguf`); files there: {', '.join(there) or 'none'}"
        )
    if not (folder / "config.json").is_file():
        problems.append(f"model.path: {folder} has no config.json; expected a folder written by save_pretrained")
    found = max_length_problem(spec.model.max_length, folder)
    if found is not None:
        (problems if found[1] else warnings).append(found[0])
    return problems, warnings
