"""Faults of a bad day in the store, each met with an error that names the object or setting and exits
with its documented code (2), never a traceback and never an overwrite: a store that ignores conditional
writes, garbage in committed objects, unusable `file://` paths, a bad addressing style. Read-only
commands write nothing."""

from __future__ import annotations

import errno
import hashlib
import tempfile

import pytest
from click.testing import CliRunner

from entrypoint.cli import main
from entrypoint.errors import EXIT_INVALID, exit_code
from entrypoint.job.state import dumps, freeze_spec, job_store, read_json
from entrypoint.runner import run_job
from entrypoint.store import FileStore, StoreUnusable, check_conditional_writes
from entrypoint.store.objects import CorruptObject
from tests.specs import load, tiny_job

JOB = "faults"


class DropsConditionalWrites(FileStore):
    """A store behind a gateway that drops `If-None-Match`: put-if-absent overwrites like a plain PUT."""

    def put_if_absent(self, key: str, data: bytes) -> None:
        self.put_bytes(key, data)


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output


@pytest.fixture
def job(tmp_path):
    """A job with a frozen spec and a committed data phase, as a running job leaves them."""
    root = FileStore(tmp_path / "store")
    store = job_store(root, JOB)
    freeze_spec(store, load(tiny_job(JOB, tmp_path / "model")))
    store.put_bytes("phases/data/result.json", dumps({"seconds": 1.5}))
    return root, store


def test_a_store_that_ignores_conditional_writes_is_refused_before_the_spec_is_replaced(tmp_path):
    first = load(tiny_job(JOB, tmp_path / "model"))
    freeze_spec(job_store(FileStore(tmp_path / "store"), JOB), first)
    second = load(tiny_job(JOB, tmp_path / "model", training={"learning_rate": 0.1}))
    root = DropsConditionalWrites(tmp_path / "store")
    with pytest.raises(StoreUnusable, match="does not honour conditional writes") as caught:
        run_job(second, root, tmp_path / "work", lambda line: None)
    assert root.endpoint in str(caught.value) and exit_code(caught.value) == EXIT_INVALID
    stored = root.get_bytes(f"jobs/{JOB}/spec.yaml")
    assert hashlib.sha256(stored).hexdigest() == first.sha256
    assert [info.key for info in root.list()] == [f"jobs/{JOB}/spec.yaml"]  # no attempt, no scratch key left


def test_the_check_passes_on_a_store_that_honours_conditional_writes_and_leaves_nothing(tmp_path):
    store = FileStore(tmp_path / "store")
    check_conditional_writes(store, "scratch")
    assert list(store.list()) == []


@pytest.mark.parametrize(
    "key", ["phases/data/result.json", "trials/main/result.json", "plan.json", "attempts/1/started.json"]
)
@pytest.mark.parametrize("garbage", [b'{"seconds": 1.5, "cou', b"\xff\xfe\x00garbage", b"[1]"])
def test_garbage_in_a_committed_object_is_named_by_status(job, key, garbage):
    root, store = job
    store.put_bytes(key, garbage)
    code, output = _cli("status", JOB, "--store", root.uri)
    assert code == EXIT_INVALID, output
    assert f"{store.uri}/{key}:" in output and "expected" in output and "Traceback" not in output


def test_a_missing_field_is_named_with_its_object(job):
    root, store = job
    store.put_bytes("phases/data/result.json", dumps({"took": 1.5}))
    code, output = _cli("status", JOB, "--store", root.uri)
    assert code == EXIT_INVALID
    assert f"{store.uri}/phases/data/result.json: no field 'seconds'" in output


def test_nested_objects_name_their_object_too(job):
    _, store = job
    store.put_bytes("x.json", dumps({"settings": {"adaptation": {}}}))
    with pytest.raises(CorruptObject, match=r"/x\.json: no field 'method'"):
        read_json(store, "x.json")["settings"]["adaptation"]["method"]


@pytest.mark.parametrize("garbage", [b"\xff\xfe not utf-8", b"job: [unclosed", b"job:\n  id: faults\n"])
@pytest.mark.parametrize("command", ["status", "run"])
def test_garbage_in_the_stored_spec_is_named(job, tmp_path, garbage, command):
    root, store = job
    store.put_bytes("spec.yaml", garbage)
    if command == "status":
        code, output = _cli("status", JOB, "--store", root.uri)
    else:
        spec = tmp_path / "spec.yaml"
        spec.write_text(load(tiny_job(JOB, tmp_path / "model")).text)
        code, output = _cli("run", str(spec), "--store", root.uri, "--workdir", str(tmp_path / "work"))
    assert code == EXIT_INVALID, output
    assert f"{store.uri}/spec.yaml" in output and "expected the spec frozen" in output
    assert store.get_bytes("spec.yaml") == garbage


def test_an_empty_file_uri_is_refused_and_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, output = _cli("status", JOB, "--store", "file://")
    assert code == EXIT_INVALID and "file:// names no directory" in output
    with pytest.raises(StoreUnusable):
        FileStore("")
    assert list(tmp_path.iterdir()) == []


def test_a_store_path_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "store").write_text("not a folder")
    code, output = _cli("status", JOB, "--store", f"file://{tmp_path / 'store'}")
    assert code == EXIT_INVALID and "is a file; expected a directory" in output


def test_a_store_path_under_a_file_cannot_be_written(tmp_path):
    (tmp_path / "afile").write_text("not a folder")
    store = FileStore(tmp_path / "afile" / "store")
    with pytest.raises(StoreUnusable, match=r"cannot write jobs/x/spec\.yaml"):
        store.put_if_absent("jobs/x/spec.yaml", b"spec")
    with pytest.raises(StoreUnusable):
        check_conditional_writes(store, "scratch")


def test_a_read_only_file_system_is_named(tmp_path, monkeypatch):
    """Simulated (the tests may run as root, which writes through permissions): every write the file
    system refuses with EROFS becomes StoreUnusable naming the store and key."""

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(tmp_path))

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    store = FileStore(tmp_path / "store")
    with pytest.raises(StoreUnusable, match="cannot write spec.yaml: Read-only file system"):
        store.put_bytes("spec.yaml", b"x")


def test_status_of_a_store_that_does_not_exist_creates_nothing(tmp_path):
    code, output = _cli("status", JOB, "--store", f"file://{tmp_path / 'nowhere'}")
    assert code == EXIT_INVALID and f"no job {JOB!r}" in output
    assert not (tmp_path / "nowhere").exists()
    code, output = _cli("logs", JOB, "--store", f"file://{tmp_path / 'nowhere'}")
    assert code == EXIT_INVALID and not (tmp_path / "nowhere").exists()


def test_status_counts_only_steps_with_a_manifest(job):
    root, store = job
    store.put_bytes("trials/main/checkpoints/step-00000004/MANIFEST.json", dumps({"step": 4}))
    store.put_bytes("trials/main/checkpoints/step-00000008/adapter_model.safetensors", b"upload in flight")
    code, output = _cli("status", JOB, "--store", root.uri)
    assert code == 0, output
    assert [line.split()[:3] for line in output.splitlines() if line.startswith("main ")] == [
        ["main", "training", "4*"]
    ]
    store.delete("trials/main/checkpoints/step-00000004/MANIFEST.json")  # withdrawn by discovery, say
    _, output = _cli("status", JOB, "--store", root.uri)
    assert [line.split()[:3] for line in output.splitlines() if line.startswith("main ")] == [["main", "pending", "-"]]


def test_a_bogus_addressing_style_is_named(monkeypatch):
    monkeypatch.setenv("RENTUNE_S3_ADDRESSING_STYLE", "bogus")
    code, output = _cli("status", JOB, "--store", "s3://some-bucket/runs")
    assert code == EXIT_INVALID, output
    assert "$RENTUNE_S3_ADDRESSING_STYLE='bogus': expected one of auto, virtual, path" in output
