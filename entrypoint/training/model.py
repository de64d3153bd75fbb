"""Base model location, its content hash, and the model objects each phase needs.

Weights load only from safetensors (`use_safetensors=True`) and `trust_remote_code` is never set: a spec
may come from a queue, and neither pickle files nor repository code run here.
"""

from __future__ import annotations

import fcntl
import functools
import importlib.util
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from entrypoint.errors import InvalidInput
from entrypoint.job import layout
from entrypoint.job.state import dumps, read_json
from entrypoint.store import ObjectExists, ObjectNotFound, Store
from entrypoint.store.hashing import file_sha256, file_signature, files_sha256_memo, weights_sha256
from entrypoint.store.models import ModelMismatch, hash_memo
from jobspec.schema import Adaptation, Model
from jobspec.schema import Store as StoreOptions

__all__ = [
    "SAFE_LOADING",
    "BaseModelHash",
    "ModelError",
    "adapt",
    "adaptation_summary",
    "classifier_options",
    "convert_gguf",
    "hash_base_model",
    "match_base_model",
    "load_adapter",
    "load_encoder",
    "resolve_model_dir",
    "sharded_weights",
]

_PICKLE_WEIGHTS = ("pytorch_model.bin", "tf_model.h5", "model.ckpt.index", "flax_model.msgpack")


# Every from_pretrained call: weights from safetensors only, never repository code.
SAFE_LOADING = {"use_safetensors": True, "trust_remote_code": False}


class ModelError(InvalidInput):
    """The base model cannot be used as specified; the message names the spec field."""


# What a model download takes from the hub: configs, tokenizer files and safetensors weights, never pickles.
HUB_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.jinja"]


def _hub_snapshot(model: Model, log) -> Path:
    """`model.hub_id` at `model.revision` (a 40-hex commit: it cannot move): downloaded into the hub cache
    (HF_HUB_CACHE) unless HF_HUB_OFFLINE is set, else read from there. A download that cannot reach the
    hub falls back to the cache (the commit pins the bytes either way). One process per node downloads;
    the others wait on a lock in the cache."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    failed = None
    if not constants.HF_HUB_OFFLINE:
        cache = Path(constants.HF_HUB_CACHE)
        cache.mkdir(parents=True, exist_ok=True)
        with open(cache / f".rentune-{model.hub_id.replace('/', '--')}-{model.revision}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            started = time.monotonic()
            try:
                folder = Path(snapshot_download(model.hub_id, revision=model.revision, allow_patterns=HUB_FILES))
            except Exception as exc:  # noqa: BLE001 - no network, hub down, unknown repo: say so, try the cache
                failed = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                log(f"model: could not download {model.hub_id}@{model.revision[:12]} ({failed}); reading the cache")
            else:
                size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
                log(f"model: {model.hub_id}@{model.revision[:12]}: {size / 1e6:.1f} MB in the hub cache after "
                    f"{time.monotonic() - started:.1f} s")  # fmt: skip
                return folder
    try:
        return Path(snapshot_download(model.hub_id, revision=model.revision, local_files_only=True))
    except (LocalEntryNotFoundError, FileNotFoundError):
        why = f"the download failed ({failed})" if failed else "HF_HUB_OFFLINE is set"
        raise ModelError(
            f"model.hub_id: {model.hub_id} at revision {model.revision} is not in the local hub cache "
            f"(HF_HUB_CACHE) and {why}; put it there before the run (e.g. in the image or a mounted "
            "volume) or let the node download it"
        ) from None


def resolve_model_dir(model: Model, store_options: StoreOptions | None = None, log=print) -> Path:
    """The local folder holding the base model: `model.path` (a local folder, or an s3:// folder pushed
    with `rentune push-model`, downloaded into the node's cache and verified), `model.package`, or
    `model.hub_id` at its pinned revision (downloaded when the node is online, else from the hub cache).
    `store_options` (endpoint, region, addressing) reach the model's bucket."""
    if model.hub_id is not None:
        folder = _hub_snapshot(model, log)
    elif model.path is not None and model.path.startswith("s3://"):
        from entrypoint.store.models import fetch_model, model_cache
        from entrypoint.store.s3 import S3Store

        options = store_options or StoreOptions()
        store = S3Store.from_uri(
            model.path.rstrip("/"),
            endpoint_url=options.endpoint_url,
            region=options.region,
            addressing_style=options.addressing_style,
        )
        folder = fetch_model(store, model_cache(), log)
    elif model.package is not None:
        spec = importlib.util.find_spec(model.package)
        if spec is None or spec.origin is None:
            raise ModelError(
                f"model.package: no installed package {model.package!r}; install it (for the quickstart: "
                "pip install 'rentune[demo]')"
            )
        folder = Path(spec.origin).parent / "model"
    else:
        folder = Path(str(model.path).removeprefix("file://")).expanduser()
    if folder.suffix == ".gguf":
        raise ModelError(
            f"model.path: {folder} is a GGUF file; convert it once into a safetensors folder with "
            f"`rentune convert-gguf {folder} DIR` and set model.path to DIR (the binding then covers exactly "
            "the weights that are trained on)"
        )
    if not (folder / "config.json").is_file():
        raise ModelError(f"model: expected a folder with config.json at {folder}")
    config = json.loads((folder / "config.json").read_text())
    if config.get("auto_map"):
        raise ModelError(
            f"model: {folder} needs its own Python code (config.json auto_map); rentune never runs repository "
            "code (trust_remote_code); use an architecture transformers ships"
        )
    sharded_weights(folder)  # a partial copy of sharded weights is not a model
    if not any(folder.glob("*.safetensors")):
        found = [name for name in _PICKLE_WEIGHTS if (folder / name).exists()]
        hint = f" (found {', '.join(found)}: convert to safetensors first)" if found else ""
        raise ModelError(f"model: expected *.safetensors weights in {folder}{hint}")
    return folder.resolve()


SHARD_INDEX = "model.safetensors.index.json"  # weights saved in shards: model-0000x-of-0000y.safetensors
HASH_THREADS = 4  # weight files hashed at once: sha256 runs at about 1-2 GB/s a core, a disk reads faster


def sharded_weights(folder: Path) -> list[str]:
    """The shards `folder`'s index names, sorted ([] without an index); ModelError if the index is not one
    or a shard it names is missing."""
    index = folder / SHARD_INDEX
    if not index.is_file():
        return []
    try:
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ModelError(f"model: {index}: expected a JSON object with a weight_map ({exc})") from None
    missing = [name for name in shards if not (folder / name).is_file()]
    if missing:
        raise ModelError(f"model: {index} names shards that are not in {folder}: {', '.join(missing)}")
    return shards


@dataclass(frozen=True)
class BaseModelHash:
    sha256: str  # over the per-file hashes below, in sorted file order
    files: dict[str, str]  # relative path -> sha256 of its bytes


def hash_base_model(folder: Path, memo: bool = True) -> BaseModelHash:
    """sha256 of every weight file (`*.safetensors`, recursively) and one overall hash over them.

    The overall hash is sha256 of lines `"<relative path>\\t<file sha256>\\n"` in sorted path order, so
    it depends on the exact weight bytes and file names only, never on directory listing order. Files are
    hashed a few at a time; with `memo`, a file unchanged since this node last hashed it (or downloaded it,
    verified) is not read again (store/hashing.py's files_sha256_memo). `memo=False` reads every byte: what
    check-export does, whose answer a user relies on without a job's history.
    """
    paths = sorted(folder.rglob("*.safetensors"))
    signature = tuple((str(p), *file_signature(p)) for p in paths)
    return _hash_files(folder, signature, memo)


@functools.lru_cache(maxsize=8)
def _hash_files(folder: Path, signature: tuple, memo: bool) -> BaseModelHash:
    """Baseline, train and export each ask within one run: once per process, again only if a file's
    signature changed."""
    paths = [Path(entry[0]) for entry in signature]
    hashes = files_sha256_memo(paths, hash_memo(folder) if memo else None, threads=HASH_THREADS)
    files = {path.relative_to(folder).as_posix(): sha256 for path, sha256 in hashes.items()}
    return BaseModelHash(sha256=weights_sha256(files), files=files)


def match_base_model(store: Store, spec, model_dir: Path, record: bool) -> None:
    """Record the base model's sha256 (and each weight file's) at the job's first use of it (`record`),
    compare at every later one. A QLoRA job also records the sha256 of its base quantized (the `quantized`
    entry: training/quantize.py), which every later quantized load compares with. A copy that differs
    raises ModelMismatch (exit 3) naming the files, before anything runs on it. The weights are hashed once
    per process (hash_base_model caches)."""
    mine = hash_base_model(model_dir)
    entry = {"sha256": mine.sha256, "files": mine.files, "source": spec.model.model_dump(exclude_none=True)}
    if record and spec.adaptation.quantization is not None and store.head(layout.BASE_MODEL) is None:
        from entrypoint.training.quantize import first_record

        entry["quantized"] = first_record(spec, model_dir, SAFE_LOADING)  # every later load compares with it
    if record:
        try:
            store.put_if_absent(layout.BASE_MODEL, dumps(entry))
            return
        except ObjectExists:  # an earlier process recorded it: compare
            pass
    try:
        recorded = read_json(store, layout.BASE_MODEL)
    except ObjectNotFound:  # nothing recorded yet (record=False): the lead records it first
        return
    if recorded.get("sha256") == mine.sha256:
        return
    theirs = recorded.get("files") or {}
    differ = sorted(n for n in set(theirs) | set(mine.files) if theirs.get(n) != mine.files.get(n))
    raise ModelMismatch(
        f"model: this node's copy of the base model ({model_dir}, sha256 {mine.sha256[:16]}...) is not the "
        f"one job {spec.job.id} started with (sha256 {str(recorded.get('sha256'))[:16]}...); files that "
        f"differ: {', '.join(differ[:10])}. Refusing to go on with it: restore that copy of the model, or "
        "clear this node's model cache (RENTUNE_MODEL_CACHE) if it came from a bucket"
    )


def load_encoder(folder: Path) -> torch.nn.Module:
    """The untouched base model without a task head, for the zero-shot baseline."""
    from transformers import AutoModel

    return AutoModel.from_pretrained(folder, **SAFE_LOADING).eval()


def classifier_options(labels: Sequence[str]) -> dict:
    """from_pretrained options for a classifier over `labels`: safetensors only, no repository code."""
    return {
        "num_labels": len(labels),
        "id2label": dict(enumerate(labels)),
        "label2id": {label: i for i, label in enumerate(labels)},
        **SAFE_LOADING,
    }


def adapt(
    model: torch.nn.Module,
    loading_info: dict,
    folder: Path,
    adaptation: Adaptation,
    new_head: Sequence[str] = (),
    task_type: str | None = None,
    saved: Sequence[str] = (),
) -> torch.nn.Module:
    """The model to train from a freshly loaded one: LoRA-wrapped (peft `task_type`; `saved` modules train
    in full and are saved with the adapter) or fully trainable. `new_head` names the modules created fresh
    on top of the checkpoint; `loading_info` is from_pretrained's (`output_loading_info=True`).

    Raises ModelError when weights other than a new head are missing from the checkpoint (they would be
    random, and frozen under LoRA) or when a LoRA target module matches nothing in the real model.
    """
    trained_anyway = (*new_head, *adaptation.modules_to_save)
    missing = sorted(k for k in loading_info["missing_keys"] if k.split(".")[0] not in trained_anyway)
    if missing and adaptation.method == "lora":
        raise ModelError(
            f"model: the checkpoint in {folder} lacks weights {missing[:8]}; they would be random and frozen. "
            "Add their modules to adaptation.modules_to_save, or use a complete checkpoint"
        )
    if adaptation.method == "full":
        return model
    from peft import LoraConfig, get_peft_model

    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    unmatched = [target for target in adaptation.target_modules or () if target not in names]
    if unmatched:
        raise ModelError(
            f"adaptation.target_modules: {unmatched} match no module of {type(model).__name__}; "
            f"candidates include {sorted(n for n in names if n and not n.isdigit())[:20]}"
        )
    modules_to_save = list(dict.fromkeys([*adaptation.modules_to_save, *saved]))
    config = LoraConfig(
        task_type=task_type,
        r=adaptation.rank,
        lora_alpha=adaptation.alpha,
        lora_dropout=adaptation.dropout,
        target_modules=list(adaptation.target_modules) if adaptation.target_modules else None,
        modules_to_save=modules_to_save or None,
    )
    try:
        return get_peft_model(model, config)
    except ValueError as exc:  # peft has no default targets for this architecture
        raise ModelError(f"adaptation.target_modules: {exc}; name the modules to wrap") from None


def load_adapter(base: torch.nn.Module, weights_folder: Path) -> torch.nn.Module:
    """The base model plus the saved peft adapter, loaded the way a user would (`PeftModel.from_pretrained`)."""
    from peft import PeftModel

    return PeftModel.from_pretrained(base, weights_folder)


def adaptation_summary(model: torch.nn.Module) -> dict:
    """What the adaptation resolved to on the real model: wrapped modules, extra saved modules, counts."""
    names = [name for name, _ in model.named_modules()]
    lora = sorted({name.rsplit(".lora_A", 1)[0] for name in names if ".lora_A" in name})
    saved = sorted({name.rsplit(".modules_to_save", 1)[0] for name in names if name.endswith(".modules_to_save")})
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {
        "lora_modules": lora,
        "modules_to_save": saved,
        "trainable_parameters": trainable,
        "total_parameters": sum(p.numel() for p in model.parameters()),
    }


def convert_gguf(gguf: Path, out: Path) -> dict:
    """Dequantize a GGUF causal LM (weights, config, tokenizer with its chat template) into `out` as a
    safetensors folder rentune trains on, with GGUF_SOURCE.json naming the file and its sha256. The same
    GGUF file gives byte-identical weights. Returns what GGUF_SOURCE.json holds.

    transformers dequantizes to float32 on load: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K-Q6_K
    and the IQ types load, for the architectures transformers maps from GGUF (Llama, Mistral, Qwen2, Phi3,
    GPT2 and others); SmolLM2-135M-Instruct's Q4_1 file is what the suite loads."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf, out = Path(gguf).resolve(), Path(out)
    if not gguf.is_file():
        raise ModelError(f"{gguf}: no such GGUF file")
    if out.exists() and any(out.iterdir()):
        raise ModelError(f"{out}: exists and is not empty; choose a new folder (nothing was overwritten)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except (ValueError, KeyError, OSError) as exc:
        raise ModelError(f"{gguf}: transformers cannot load this GGUF file ({exc})") from None
    # The loaded model still says it was quantized, and transformers refuses to save such a model: rebuild
    # it from its config without that note and copy the dequantized weights in.
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict())
    out.mkdir(parents=True, exist_ok=True)
    plain.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    source = {
        "gguf_file": gguf.name,
        "gguf_sha256": file_sha256(gguf),
        "gguf_bytes": gguf.stat().st_size,
        "dequantized_to": "float32",
        "architecture": type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    (out / "GGUF_SOURCE.json").write_text(json.dumps(source, indent=2, sort_keys=True) + "\n")
    for path in out.rglob("*"):  # safetensors writes 0600: the images run as uid 1000 through a mount
        path.chmod(0o755 if path.is_dir() else 0o644)
    return source
