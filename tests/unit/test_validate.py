"""`rentune validate`: every bad spec exits 2 with a message naming the file and the field."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from entrypoint.cli import main
from jobspec import SpecError, load_spec, parse_spec

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "jobspec" / "examples" / "quickstart.yaml"
GOOD = yaml.safe_load(QUICKSTART.read_text())


def _with(path: str, value, base: dict = GOOD) -> dict:
    """A copy of `base` with the dotted `path` set to `value` (a `_DELETE` value removes the key)."""
    spec = copy.deepcopy(base)
    *parents, last = path.split(".")
    node = spec
    for part in parents:
        node = node[part]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return spec


_DELETE = object()

# (case id, spec, the field path the message must name, a word the message must contain)
BAD_SPECS = [
    ("unknown-top-key", _with("trainer", {"epochs": 1}), "trainer", "unknown key; did you mean training?"),
    (
        "unknown-nested-key",
        _with("training.learning_rat", 0.1),
        "training.learning_rat",
        "mean training.learning_rate?",
    ),
    ("unknown-far-key", _with("training.zzz", 1), "training.zzz", "unknown key; expected one of: "),
    ("missing-section", _with("model", _DELETE), "model", "missing"),
    ("missing-job-id", _with("job.id", _DELETE), "job.id", "missing"),
    ("wrong-type-epochs", _with("training.epochs", "many"), "training.epochs", "number"),
    ("wrong-type-section", _with("adaptation", [1, 2]), "adaptation", "expected"),
    ("negative-rank", _with("adaptation.rank", -4), "adaptation.rank", "greater than 0"),
    ("zero-lr", _with("training.learning_rate", 0), "training.learning_rate", "greater than 0"),
    ("huge-microbatch", _with("training.microbatch", 10**9), "training.microbatch", "less than or equal"),
    ("unknown-window", _with("rental.window", "5d"), "rental.window", "'3d', '7d' or '30d'"),
    ("bad-margin", _with("rental.margin", "two hours"), "rental.margin", "duration"),
    ("dotdot-data-path", _with("data.source", "../../etc/passwd"), "data.source", "'..'"),
    ("dotdot-store-uri", _with("store.uri", "s3://bucket/../other"), "store.uri", "'..'"),
    ("bad-store-scheme", _with("store.uri", "ftp://host/x"), "store.uri", "expected"),
    ("secret-key", _with("store.aws_secret_access_key", "abc"), "store.aws_secret_access_key", "credential"),
    ("secret-value", _with("job.description", "key AKIAABCDEFGHIJKLMNOP"), "job.description", "access key"),
    ("bad-job-id", _with("job.id", "Has Spaces"), "job.id", "pattern"),
    ("unknown-task", _with("hypothesis.task", "summarise"), "hypothesis.task", "classification"),
    ("both-model-sources", _with("model.path", "models/x"), "model", "exactly one"),
    ("dropout-one", _with("adaptation.dropout", 1.0), "adaptation.dropout", "less than 1"),
    ("eval-share-half", _with("data.split.eval", 0.6), "data.split.eval", "less than 0.5"),
    ("empty-targets", _with("adaptation.target_modules", []), "adaptation.target_modules", "at least 1"),
    ("packing-classifier", _with("training.packing", True), "training.packing", "causal LMs"),
    ("attn-classifier", _with("model.attn_implementation", "eager"), "model.attn_implementation", "causal LMs"),
    ("attn-unknown", _with("model.attn_implementation", "flash3"), "model.attn_implementation", "flash_attention_2"),
    ("precision-unknown", _with("training.precision", "fp8"), "training.precision", "'auto'"),
]
# Credentials in a URL: the spec is stored with the job and its exports, so none may ride along in it.
_S3 = _with("store", {"uri": "s3://bucket/runs", "endpoint_url": "http://host:9000"})
_MLFLOW = _with("tracking", {"mlflow": {"tracking_uri": "http://mlflow:5000"}})
CREDENTIAL_URLS = [
    (
        "userinfo-endpoint",
        _with("store.endpoint_url", "http://AKIAEXAMPLE:SeCrEt99@host:9000", _S3),
        "store.endpoint_url",
    ),
    ("userinfo-store-uri", _with("store.uri", "s3://AKIAEXAMPLE:SeCrEt99@bucket/runs", _S3), "store.uri"),
    (
        "token-mlflow",
        _with("tracking.mlflow.tracking_uri", "http://mlflow/?token=SeCrEt99", _MLFLOW),
        "tracking.mlflow",
    ),
    (
        "password-mlflow",
        _with("tracking.mlflow.tracking_uri", "https://u:SeCrEt99@mlflow/", _MLFLOW),
        "tracking.mlflow",
    ),
    ("presigned-data", _with("data.source", "s3://b/t.jsonl?X-Amz-Signature=SeCrEt99"), "data.source"),
    ("api-key-endpoint", _with("store.endpoint_url", "https://host/?api_key=SeCrEt99", _S3), "store.endpoint_url"),
]
BAD_SPECS += [(case, spec, field, "credentials as") for case, spec, field in CREDENTIAL_URLS]


@pytest.mark.parametrize("case,spec,field", CREDENTIAL_URLS, ids=[c[0] for c in CREDENTIAL_URLS])
def test_a_credential_in_a_url_is_refused_where_it_is_and_never_repeated(tmp_path, case, spec, field):
    path = tmp_path / f"{case}.yaml"
    path.write_text(yaml.safe_dump(spec))
    rentune = Path(sys.executable).parent / "rentune"  # the installed entry point, as a real process
    result = subprocess.run([rentune, "validate", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"{path}: {field}" in result.stderr and "in the environment" in result.stderr, result.stderr
    assert "SeCrEt99" not in result.stdout + result.stderr  # the message says where it goes, not what it was


def test_urls_without_credentials_still_validate():
    for spec in (_S3, _MLFLOW, _with("tracking.mlflow.tracking_uri", "http://mlflow:5000/?experiment=x", _MLFLOW)):
        parse_spec(yaml.safe_dump(spec), source="s.yaml")


_IN_BUCKET = _with("model", {"path": "s3://models-bucket/minilm/", "revision": "v1"})
for case, path in [
    ("model-s3-one-slash", "s3:/models-bucket/minilm"),
    ("model-s3-no-prefix", "s3://models-bucket"),
    ("model-s3-bad-bucket", "s3://Models_Bucket/minilm"),
]:
    BAD_SPECS.append((case, _with("model.path", path, _IN_BUCKET), "model", "expected s3://bucket/prefix"))


def test_a_model_folder_in_a_bucket_is_a_valid_model_path():
    loaded = parse_spec(yaml.safe_dump(_IN_BUCKET), source="s.yaml")
    assert loaded.spec.model.path == "s3://models-bucket/minilm/"


# QLoRA (docs/qlora.md): what quantization works with, checked before any phase.
_EXTRACT = yaml.safe_load((ROOT / "jobspec/examples/extract-json.yaml").read_text())
_QLORA = _with("adaptation.quantization", {"bits": 4}, _EXTRACT)
_VARIANT = {"id": "int8", "changes": ["adaptation.quantization"], "rationale": "r", "adaptation": {"quantization": {}}}
BAD_SPECS += [
    ("qlora-classifier", _with("adaptation.quantization", {"bits": 4}), "adaptation.quantization", "causal LM"),
    ("qlora-full", _with("adaptation.method", "full", _QLORA), "adaptation.quantization", "method lora"),
    (
        "qlora-zero3",
        _with("distribution", {"strategy": "deepspeed", "nproc_per_node": 2, "zero_stage": 3}, _QLORA),
        "adaptation.quantization",
        "zero_stage 2",
    ),
    ("qlora-3-bits", _with("adaptation.quantization", {"bits": 3}, _EXTRACT), "adaptation.quantization.bits", "4"),
    (
        "qlora-8bit-quant-type",
        _with("adaptation.quantization", {"bits": 8, "quant_type": "nf4"}, _EXTRACT),
        "adaptation.quantization",
        "4-bit settings",
    ),
    ("merge-base-alone", _with("export", {"merge_base": "original"}, _EXTRACT), "export.merge_base", "quantization"),
    ("truncation-classifier", _with("data.truncation", "fail"), "data.truncation", "expected unset for task"),
    ("resamples-true", _with("evaluation", {"resamples": True}), "evaluation.resamples", "expected a number, got True"),
    (
        "qlora-full-variant",
        _with(
            "experiments", [{**_VARIANT, "changes": ["adaptation.method"], "adaptation": {"method": "full"}}], _QLORA
        ),
        "experiments.0.adaptation.method",
        "expected lora",
    ),
    (
        "qlora-variant",
        _with("experiments", [_VARIANT], _QLORA),
        "experiments.0.adaptation.quantization",
        "same quantized base",
    ),
]


def test_a_qlora_spec_validates_with_its_defaults():
    spec = parse_spec(yaml.safe_dump(_with("export", {"merge_base": "original"}, _QLORA)), source="s.yaml").spec
    q = spec.adaptation.quantization
    assert (q.bits, q.quant_type, q.double_quant, q.compute_dtype) == (4, "nf4", True, "auto")
    assert spec.export.merge_base == "original" and spec.merges


@pytest.mark.parametrize("case,spec,field,word", BAD_SPECS, ids=[c[0] for c in BAD_SPECS])
def test_bad_spec_exits_2_naming_file_and_field(tmp_path, case, spec, field, word):
    path = tmp_path / f"{case}.yaml"
    path.write_text(yaml.safe_dump(spec))
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if f"{path}: {field}" in line]
    assert lines, f"no line names {path}: {field}\n{result.output}"
    assert any(word in line for line in lines), result.output


def test_every_problem_is_reported_at_once(tmp_path):
    spec = _with("adaptation.rank", -1, _with("training.epochs", "x", _with("extra", 1)))
    with pytest.raises(SpecError) as caught:
        parse_spec(yaml.safe_dump(spec), source="s.yaml")
    fields = sorted(line.split(": ")[1] for line in caught.value.errors)
    assert fields == ["adaptation.rank", "extra", "training.epochs"]


def test_yaml_syntax_error_names_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("job:\n  id: x\n  description: [unclosed\n")
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2
    assert f"{path}:" in result.output and "not valid YAML" in result.output


def test_missing_file_is_a_clear_error(tmp_path):
    result = CliRunner().invoke(main, ["validate", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2 and "file not found" in result.output


def test_examples_validate():
    for example in sorted((ROOT / "jobspec" / "examples").glob("*.yaml")):
        assert load_spec(example).spec.job.id


def test_console_script_validate_exit_codes(tmp_path):
    """The installed `rentune` entry point, as a real process."""
    rentune = Path(sys.executable).parent / "rentune"
    ok = subprocess.run([rentune, "validate", QUICKSTART], capture_output=True, text=True)
    assert ok.returncode == 0 and ok.stdout.startswith("OK"), ok.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(_with("adaptation.rank", 0)))
    failed = subprocess.run([rentune, "validate", bad], capture_output=True, text=True)
    assert failed.returncode == 2 and f"{bad}: adaptation.rank" in failed.stderr


def test_schema_command_prints_json_schema():
    result = CliRunner().invoke(main, ["schema"])
    schema = json.loads(result.output)
    assert set(schema["required"]) == {"job", "hypothesis", "model", "data"}
    assert schema["additionalProperties"] is False


def test_yaml_aliases_are_refused_quickly(tmp_path):
    """A few nested aliases would expand into millions of nodes ("billion laughs")."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}]" for i in range(1, 30)]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2 and "aliases (*name) are not allowed" in result.output


# -- local files, checked before any model library loads


def _validate_file(tmp_path: Path, spec: dict) -> tuple[int, str]:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    result = CliRunner().invoke(main, ["validate", str(path)])
    return result.exit_code, result.output


def test_validate_names_a_missing_data_file_a_gguf_model_and_a_folder_without_weights(tmp_path):
    gguf = tmp_path / "smollm2.Q8_0.gguf"
    gguf.write_bytes(b"GGUF")
    empty = tmp_path / "empty-model"
    empty.mkdir()
    (empty / "tokenizer.json").write_text("{}")
    cases = [
        (_with("data.source", str(tmp_path / "nowhere.jsonl")), "data.source: file not found"),
        ({**_with("model", {"path": str(gguf)}), "model": {"path": str(gguf)}},
         f"model.path: {gguf} is a GGUF file; rentune trains from a transformers folder: convert it with "
         f"`rentune convert-gguf {gguf} FOLDER`"),
        (_with("model", {"path": str(empty)}), f"model.path: {empty} holds no weights"),
        (_with("model", {"path": str(empty)}), f"model.path: {empty} has no config.json"),
        (_with("model", {"path": str(tmp_path / "gone")}), f"model.path: {tmp_path / 'gone'}: no such folder"),
    ]  # fmt: skip
    for spec, expected in cases:
        code, out = _validate_file(tmp_path, spec)
        assert code == 2 and expected in out, out
        assert "spec.yaml: " in out  # the file named
    # a spec for another machine: its paths are the node's
    skipped = CliRunner().invoke(main, ["validate", str(tmp_path / "spec.yaml"), "--skip-files"])
    assert skipped.exit_code == 0 and skipped.output.startswith("OK "), skipped.output


def test_validate_reads_the_first_rows_of_local_data_and_names_the_line(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"text": "a", "label": "billing"}\n[1, 2]\n')
    code, out = _validate_file(tmp_path, _with("data.source", str(rows)))
    assert code == 2 and "data.source: " in out and "rows.jsonl:2" in out, out


def test_validate_with_check_store_writes_and_reads_the_store(tmp_path):
    spec = _with("store", {"uri": f"file://{tmp_path / 'store'}"})
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    result = CliRunner().invoke(main, ["validate", str(path), "--check-store"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert f"store file://{tmp_path / 'store'}: reachable, writable, conditional writes honoured" in result.output
