"""What `rentune validate` checks of a spec's local model folder before any model library is imported: it
exists, holds transformers weights and a config, and is not a GGUF file (the data files' first rows:
entrypoint/data/reading.py's first_rows_problems). A bucket's objects are checked by `run`, on the node."""

from __future__ import annotations

from pathlib import Path

from jobspec.model_limits import max_length_problem
from jobspec.schema import JobSpec

__all__ = ["local_inputs", "local_path", "model_folder_check", "node_paths_problems"]

WEIGHTS = ("*.safetensors", "pytorch_model*.bin", "model.safetensors.index.json", "pytorch_model.bin.index.json")


def local_path(location: str | None) -> Path | None:
    """A spec's path on this machine (`file://` allowed), or None for a bucket's (s3://, hf://, ...)."""
    if location is None or "://" in location.removeprefix("file://"):
        return None
    return Path(location.removeprefix("file://")).expanduser()


def local_inputs(spec: JobSpec) -> dict[str, Path]:
    """Every file or folder the spec names on the machine that runs it, by field (model.path, data.source,
    data.files.*, data.chat_template); a bucket's (s3://) are left out."""
    data = spec.data
    fields = {"model.path": spec.model.path, "data.source": data.source, "data.chat_template": data.chat_template}
    if data.files is not None:
        fields |= {f"data.files.{split}": getattr(data.files, split) for split in ("train", "eval", "test")}
    found = {field: local_path(location) for field, location in fields.items() if location is not None}
    return {field: path for field, path in found.items() if path is not None}


def node_paths_problems(spec: JobSpec) -> list[str]:
    """What `rentune submit` refuses: a local path, which a worker on another node cannot read."""
    return [
        f"{field}: {path} is a path on this machine, which a worker on a node cannot read: upload it to the "
        "bucket and name its s3:// URI (`rentune push-model` for a model folder, `aws s3 cp` for data), or pass "
        "--node-paths when the path is the node's own (a volume mounted there)"
        for field, path in local_inputs(spec).items()
    ]


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
