"""The `rentune` commands as a whole (entrypoint/commands/): every command that takes a store takes the
same store options, every error leaves through one exit path, `check-export` answers to its old name too,
and the commands stay above the phases."""

from __future__ import annotations

import ast
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from entrypoint.cli import main
from entrypoint.commands.exits import Refused, exits
from entrypoint.commands.options import StoreFlags
from entrypoint.errors import Conflict, InvalidInput
from entrypoint.job.state import dumps, freeze_spec, job_store
from entrypoint.store import FileStore
from entrypoint.store.hashing import weights_sha256
from jobspec import SpecError, load_spec

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = ROOT / "entrypoint/commands"
SOURCES = [ROOT / "entrypoint/cli.py", *sorted(COMMANDS.glob("*.py"))]
QUICKSTART = ROOT / "jobspec/examples/quickstart.yaml"
JOB = "quickstart-tickets"

# The commands that take no store. Any other command must take the store options: a new command either
# takes them or is named here.
NO_STORE = {"validate", "schema", "plan", "check-export", "verify-export", "convert-gguf", "env", "push-model"}
STORE_PARAMS = ("store_uri", "endpoint_url", "region", "addressing_style")
S3_PARAMS = STORE_PARAMS[1:]


def _shape(param: click.Parameter) -> tuple:
    """What a user sees of an option: its flags, its type (and choices), whether it is a flag."""
    return (param.name, tuple(param.opts), param.type.name, tuple(getattr(param.type, "choices", ())), param.is_flag)


def _params(command: click.Command) -> dict[str, click.Parameter]:
    return {param.name: param for param in command.params}


def test_every_command_that_takes_a_store_takes_the_same_store_options():
    takes_store = {name: command for name, command in main.commands.items() if name not in NO_STORE}
    assert NO_STORE <= set(main.commands), f"NO_STORE names no command: {NO_STORE - set(main.commands)}"
    assert {"run", "fetch", "status", "submit", "worker", "logs"} <= set(takes_store)
    shapes = {}
    for name, command in takes_store.items():
        params = _params(command)
        missing = [p for p in STORE_PARAMS if p not in params]
        assert not missing, f"rentune {name} lacks {missing}: use commands/options.py's store_options"
        shapes[name] = [_shape(params[p]) for p in STORE_PARAMS]
    assert len({repr(shape) for shape in shapes.values()}) == 1, shapes
    assert shapes["status"][0][:2] == ("store_uri", ("--store",))
    for name, command in takes_store.items():
        store = _params(command)["store_uri"]
        if name == "run":  # the spec's store.uri is the default; $RENTUNE_STORE is not read
            assert store.envvar is None and not store.required
        else:
            assert store.envvar == "RENTUNE_STORE" and store.required, name


def test_push_model_reaches_its_bucket_with_the_same_s3_options():
    params = _params(main.commands["push-model"])
    assert [_shape(params[p]) for p in S3_PARAMS] == [_shape(_params(main.commands["status"])[p]) for p in S3_PARAMS]


@pytest.fixture
def store(tmp_path) -> FileStore:
    """A real file:// store holding the quickstart job with a frozen spec and a committed data phase."""
    root = FileStore(tmp_path / "store")
    job = job_store(root, JOB)
    freeze_spec(job, load_spec(QUICKSTART))
    job.put_bytes("phases/data/result.json", dumps({"seconds": 1.5, "counts": {"train": {"a": 300}}}))
    return root


def test_status_reads_the_store_from_RENTUNE_STORE(store):
    by_flag = CliRunner().invoke(main, ["status", JOB, "--store", store.uri])
    by_env = CliRunner().invoke(main, ["status", JOB], env={"RENTUNE_STORE": store.uri})
    assert by_env.exit_code == 0, by_env.output
    assert JOB in by_env.output and by_env.output == by_flag.output


def test_a_command_without_a_store_names_the_missing_option(store):
    result = CliRunner().invoke(main, ["status", JOB], env={"RENTUNE_STORE": None})
    assert result.exit_code == 2 and "Missing option '--store'" in result.output


@pytest.mark.parametrize("command", ["status", "logs", "fetch"])
@pytest.mark.parametrize("job_id", ["../x", "Quickstart/../x", "a b"])
def test_every_command_that_takes_a_job_id_refuses_one_no_spec_could_have(store, tmp_path, command, job_id):
    """The installed entry point, as a real process: one line naming the id and what it can be, exit 2, no
    traceback, nothing in the store touched or written."""
    before = sorted(info.key for info in store.list(""))
    rentune = Path(sys.executable).parent / "rentune"
    done = subprocess.run(
        [rentune, command, job_id, "--store", store.uri], capture_output=True, text=True, cwd=tmp_path, check=False
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        f"rentune: job id {job_id!r}: expected what a spec's job.id can be: 1 to 63 lowercase letters, digits, "
        "'-' or '_', starting with a letter or digit"
    ]
    assert sorted(info.key for info in store.list("")) == before and not (tmp_path / "x").exists()


def test_status_and_fetch_accept_the_s3_options_of_a_file_store(store, tmp_path):
    s3 = ["--region", "eu-west-1", "--addressing-style", "path", "--endpoint-url", "http://127.0.0.1:1"]
    result = CliRunner().invoke(main, ["status", JOB, "--store", store.uri, *s3])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(main, ["fetch", JOB, "--store", store.uri, "--dest", str(tmp_path / "f"), *s3])
    assert result.exit_code == 2 and f"{store.uri}/jobs/{JOB}: no report yet" in result.output


def test_fetch_from_RENTUNE_STORE_copies_the_report_and_the_event_files(store, tmp_path):
    job = job_store(store, JOB)
    job.put_bytes("report/report.md", b"# report\n")
    job.put_bytes("export/BINDING.json", b"{}")
    job.put_bytes("export/adapter/adapter_model.safetensors", b"weights")
    job.put_bytes("trials/main/tensorboard/events.out.tfevents.1", b"events")
    dest = tmp_path / "fetched"
    result = CliRunner().invoke(main, ["fetch", JOB, "--dest", str(dest)], env={"RENTUNE_STORE": store.uri})
    assert result.exit_code == 0, result.output
    assert f"fetched 3 files to {dest}/ (report: {dest / 'report/report.md'})" in result.output
    assert f"tensorboard --logdir {dest / 'tensorboard'}" in result.output
    assert (dest / "report/report.md").read_bytes() == b"# report\n"
    assert (dest / "tensorboard/main/events.out.tfevents.1").read_bytes() == b"events"
    assert not (dest / "export/adapter").exists() and not list(dest.rglob("*.partial"))


def test_run_takes_each_store_setting_from_the_spec_unless_a_flag_gives_it():
    section = load_spec(QUICKSTART).spec.store.model_copy(update={"region": "eu-west-1", "endpoint_url": None})
    flags = StoreFlags(None, endpoint_url="http://minio:9000", region=None, addressing_style="path")
    assert flags.over(section) == StoreFlags(section.uri, "http://minio:9000", "eu-west-1", "path")
    assert StoreFlags("file:///x").over(section).uri == "file:///x"


# -- one exit path


def _exit_calls(path: Path) -> list[str]:
    """Every way `path` could end the process itself: sys.exit, exit, quit, os._exit, ctx.exit, raise
    SystemExit (or click's Exit)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        where = f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in ("exit", "_exit"):
                found.append(f"{where}: {ast.unparse(func)}()")
            elif isinstance(func, ast.Name) and func.id in ("exit", "quit"):
                found.append(f"{where}: {func.id}()")
        elif isinstance(node, ast.Raise) and node.exc is not None:
            raised = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if ast.unparse(raised).split(".")[-1] in ("SystemExit", "Exit"):
                found.append(f"{where}: raise {ast.unparse(raised)}")
        elif isinstance(node, ast.ImportFrom) and node.module in ("sys", "os"):
            found += [f"{where}: from {node.module} import {a.name}" for a in node.names if "exit" in a.name]
    return found


def test_commands_end_only_through_the_one_exit_path():
    calls = [call for path in SOURCES for call in _exit_calls(path)]
    assert len(calls) == 1 and calls[0].startswith("entrypoint/commands/exits.py:"), calls


def test_the_scan_sees_a_second_exit(tmp_path):
    path = ROOT / "entrypoint/commands/exits.py"
    assert len(_exit_calls(path)) == 1
    twice = tmp_path / "twice.py"
    twice.write_text("import sys\ndef f(ctx):\n    sys.exit(2)\n    ctx.exit(1)\n    raise SystemExit(3)\n")
    assert len(_exit_calls(twice)) == 3


@pytest.mark.parametrize(
    ("error", "source", "lines", "code"),
    [
        (SpecError(["a.yaml: job.id: missing", "a.yaml: model: missing"]), "a.yaml", ["a.yaml: job.id: missing"], 2),
        (
            Refused("a.yaml: data: cannot read", "second line"),
            "a.yaml",
            ["a.yaml: data: cannot read", "second line"],
            2,
        ),
        (InvalidInput("store.uri: bad"), "a.yaml", ["rentune: a.yaml: store.uri: bad"], 2),
        (InvalidInput("store.uri: bad"), None, ["rentune: store.uri: bad"], 2),
        (Conflict("job x: another spec"), None, ["rentune: job x: another spec"], 3),
        (KeyError("boom"), None, ["rentune: job failed: KeyError: 'boom'"], 1),
    ],
    ids=["spec", "refused", "input-with-source", "input", "conflict", "unexpected"],
)
def test_each_error_is_printed_and_mapped_to_its_exit_code(error, source, lines, code, capsys):
    with pytest.raises(SystemExit) as stopped, exits(source=source):
        raise error
    err = capsys.readouterr().err
    assert stopped.value.code == code
    assert all(line in err for line in lines), err
    assert not err.startswith("rentune: rentune:")


def test_the_innermost_exits_reports(capsys):
    with pytest.raises(SystemExit) as stopped, exits(), exits(source="spec.yaml"):
        raise InvalidInput("data: nope")
    assert stopped.value.code == 2 and capsys.readouterr().err == "rentune: spec.yaml: data: nope\n"


# -- check-export and its old name

NAMES = ("check-export", "verify-export")


@pytest.fixture
def export(tmp_path) -> tuple[Path, Path]:
    """An export folder and the base model it is bound to, as the export phase writes them."""
    base = tmp_path / "base"
    base.mkdir()
    (base / "model.safetensors").write_bytes(b"base weights")
    base_files = {"model.safetensors": hashlib.sha256(b"base weights").hexdigest()}
    folder = tmp_path / "export"
    files = {}
    for name, data in {"adapter/adapter_model.safetensors": b"adapter", "spec.yaml": b"job: {}\n"}.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
        files[name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    binding = {
        "base_model": {"sha256": weights_sha256(base_files), "files": base_files},
        "files": files,
        "trial_id": "main",
        "job_id": "bound",
    }
    (folder / "BINDING.json").write_text(json.dumps(binding))
    return folder, base


def test_check_export_and_its_hidden_old_name_verify_export_behave_alike(export):
    folder, base = export
    accepted = {name: CliRunner().invoke(main, [name, str(folder), "--base", str(base)]) for name in NAMES}
    assert {r.exit_code for r in accepted.values()} == {0}, accepted["check-export"].output
    assert accepted["check-export"].output == accepted["verify-export"].output
    assert accepted["check-export"].output.startswith(f"OK {folder}: 2 files intact; trial main of job bound")

    (folder / "adapter/adapter_model.safetensors").write_bytes(b"adaptex")
    refused = {name: CliRunner().invoke(main, [name, str(folder), "--base", str(base)]) for name in NAMES}
    assert {r.exit_code for r in refused.values()} == {2}
    assert refused["check-export"].output == refused["verify-export"].output
    output = refused["check-export"].output
    assert "rentune: refused: " in output and "adapter_model.safetensors: differs from its sha256" in output


def test_verify_export_is_hidden_from_the_help():
    help_text = CliRunner().invoke(main, ["--help"]).output
    assert "check-export" in help_text and "verify-export" not in help_text
    assert main.commands["verify-export"].hidden and not main.commands["check-export"].hidden
    assert main.commands["verify-export"].callback is main.commands["check-export"].callback


# -- layers


ALLOWED = {
    "commands",
    "runner",
    "follower",
    "notices",
    "job",
    "store",
    "report",
    "training",
    "jobspec",
    "errors",
    "data",
}


def _entrypoint_imports(path: Path) -> set[str]:
    """The units of entrypoint (and jobspec) `path` imports, at any level of the file."""
    units = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "jobspec":
                units.add("jobspec")
            elif parts[0] == "entrypoint" and len(parts) > 1:
                units.add(parts[1])
    return units


@pytest.mark.parametrize("path", sorted(COMMANDS.glob("*.py")), ids=lambda p: p.name)
def test_commands_import_neither_phases_nor_what_only_the_runner_uses(path):
    assert _entrypoint_imports(path) <= ALLOWED, f"{path.name}: {_entrypoint_imports(path) - ALLOWED}"


@pytest.mark.parametrize(
    ("module", "allowed"),
    [
        ("entrypoint/job/fetch.py", {"job", "store", "jobspec", "errors"}),
        ("entrypoint/report/binding.py", {"report", "errors", "jobspec", "store", "job", "data", "training"}),
    ],
)
def test_moved_code_stays_in_its_layer(module, allowed):
    assert _entrypoint_imports(ROOT / module) <= allowed
