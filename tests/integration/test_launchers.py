"""The launch templates under deploy/skypilot and deploy/dstack, checked offline by the engines' own code.

SkyPilot 0.14.1 and dstack 0.22.5 live in .venv-launchers (`make setup`; they cannot share .venv), so
tests/launchers_check.py runs there and reports as JSON what each engine made of each file: SkyPilot's task
parser and its managed-jobs recovery executor (`should_restart_on_failure`), dstack's configuration models
and its termination-reason-to-retry-event mapping. Every file in the two folders is checked, and copies
with a typo must be refused. The dstack command that waits for a reclaim after rentune's exit 143 runs for
real under `bash -i` on a terminal, as dstack's runner starts it, with a fake `rentune` on PATH.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import select
import signal
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from entrypoint.errors import EXIT_CONFLICT, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_INVALID

ROOT = Path(__file__).resolve().parents[2]
LAUNCHERS_PYTHON = ROOT / ".venv-launchers" / "bin" / "python"
CHECK = ROOT / "tests" / "launchers_check.py"
SKYPILOT_FILES = sorted(p for p in (ROOT / "deploy" / "skypilot").iterdir() if p.suffix in (".yaml", ".yml"))
DSTACK_FILES = sorted(p for p in (ROOT / "deploy" / "dstack").iterdir() if p.suffix in (".yaml", ".yml"))
SIGKILLED = 137
FAILING = [EXIT_FAILED, EXIT_INVALID, EXIT_CONFLICT, SIGKILLED]  # rentune's exits that must not be retried

# The job_recovery keys SkyPilot's StrategyExecutor.make pops; its client-side schema lets any other key
# through (sky/utils/schemas.py), so the checker reports what make left over and a typo shows up here.
JOB_RECOVERY_KEYS = {"strategy", "max_restarts_on_errors", "recover_on_exit_codes"}

# (file's key, typo) per engine: each one is put into a copy of every file, which the engine must refuse.
SKYPILOT_TYPOS = [("resources", "resorces"), ("accelerators", "acelerators"), ("use_spot", "use_spots")]
SKYPILOT_RECOVERY_TYPO = ("max_restarts_on_errors", "max_restart_on_errors")  # accepted by the schema
DSTACK_TYPOS = [("resources", "resorces"), ("gpu", "gpus"), ("spot_policy", "spot_polcy"), ("on_events", "on_event")]


def launchers_python() -> Path:
    if not LAUNCHERS_PYTHON.exists():
        pytest.fail(f"{LAUNCHERS_PYTHON} is missing: `make setup` builds it (SkyPilot and dstack in their own venv)")
    return LAUNCHERS_PYTHON


def check(engine: str, paths: list[Path], home: Path) -> dict[str, dict]:
    """What the engine made of each file, by path (tests/launchers_check.py), offline, HOME in a temp folder."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "SKYPILOT_DISABLE_USAGE_COLLECTION": "1"}
    proc = subprocess.run(
        [str(launchers_python()), str(CHECK), engine, *map(str, paths)],
        env=env, cwd=home, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"{engine} check failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1][len("RESULT ") :])


def with_typo(source: Path, key: str, typo: str, folder: Path) -> Path:
    """A copy of `source` whose first `key:` (at any indentation) is spelled `typo:`."""
    text, count = re.subn(rf"^(\s*){re.escape(key)}:", rf"\g<1>{typo}:", source.read_text(), count=1, flags=re.M)
    assert count == 1, f"{source.name} has no key {key}"
    path = folder / f"{source.stem}.{typo}{source.suffix}"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("home")  # SkyPilot writes ~/.sky


@pytest.fixture(scope="module")
def typos(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("typos")


@pytest.fixture(scope="module")
def skypilot(home, typos) -> tuple[dict, dict]:
    """(results for the real files by name, results for the copies with a typo by (file, typo))."""
    copies = {
        (source.name, typo): with_typo(source, key, typo, typos)
        for source in SKYPILOT_FILES
        for key, typo in [*SKYPILOT_TYPOS, SKYPILOT_RECOVERY_TYPO]
    }
    results = check("skypilot", [*SKYPILOT_FILES, *copies.values()], home)
    return {p.name: results[str(p)] for p in SKYPILOT_FILES}, {case: results[str(p)] for case, p in copies.items()}


@pytest.fixture(scope="module")
def dstack(home, typos) -> tuple[dict, dict]:
    copies = {
        (source.name, typo): with_typo(source, key, typo, typos)
        for source in DSTACK_FILES
        for key, typo in DSTACK_TYPOS
    }
    results = check("dstack", [*DSTACK_FILES, *copies.values()], home)
    return {p.name: results[str(p)] for p in DSTACK_FILES}, {case: results[str(p)] for case, p in copies.items()}


def recovery_problems(result: dict) -> list[str]:
    """What is wrong with a SkyPilot file's recovery, judged by SkyPilot's own executor: 143 recovered every
    time (without using up max_restarts_on_errors), every other failure never."""
    if not result["ok"]:
        return [result["error"]]
    problems = [f"job_recovery key {key!r}: not one SkyPilot reads" for key in result["unknown_job_recovery_keys"]]
    problems += [f"job_recovery key {key!r}: unknown" for key in set(result["job_recovery"]) - JOB_RECOVERY_KEYS]
    for codes, restarts in result["restart"].items():
        expected = str(EXIT_INTERRUPTED) in codes.split(",")
        if restarts != [expected] * len(restarts):
            problems.append(f"exit codes [{codes}]: restarted {restarts}, expected {expected} every time")
    if not result["use_spot"]:
        problems.append("use_spot is not true")
    return problems


def test_both_folders_hold_the_templates():
    assert {p.name for p in SKYPILOT_FILES} >= {"worker.yaml", "multinode.yaml"}
    assert {p.name for p in DSTACK_FILES} >= {"worker.dstack.yml", "multinode.dstack.yml"}


@pytest.mark.parametrize("name", [p.name for p in SKYPILOT_FILES])
def test_skypilot_loads_each_file_and_recovers_on_143_only(skypilot, name):
    result = skypilot[0][name]
    assert result["ok"], result.get("error")
    assert recovery_problems(result) == []
    assert result["strategy"] == "EagerFailoverStrategyExecutor"  # EAGER_NEXT_REGION
    assert result["restart"][str(EXIT_INTERRUPTED)] == [True] * 5
    for code in FAILING:
        assert result["restart"][str(code)] == [False] * 5, code
    assert SIGKILLED not in result["job_recovery"]["recover_on_exit_codes"]
    # The image, run as root (SkyPilot's container setup needs it), credentials as secrets only.
    assert next(iter(result["image_id"].values())).startswith("docker:")
    assert "--user=0:0" in result["config_overrides"]["docker"]["run_options"]
    assert result["config_overrides"]["kubernetes"]["pod_config"]["spec"]["securityContext"]["runAsUser"] == 0
    assert set(result["secrets"]) >= {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
    assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"} & set(result["envs"])
    assert result["envs"]["HF_HUB_OFFLINE"] == "1"


@pytest.mark.parametrize("name", [p.name for p in SKYPILOT_FILES])
def test_skypilot_refuses_copies_with_a_typo(skypilot, name):
    for key, typo in SKYPILOT_TYPOS:
        result = skypilot[1][(name, typo)]
        assert not result["ok"], f"{name} with {typo!r} for {key!r} was accepted"
        assert typo in result["error"], result["error"]  # refused for the typo, not for something else
    # SkyPilot's client accepts unknown job_recovery keys; the key check above catches this one.
    key, typo = SKYPILOT_RECOVERY_TYPO
    assert any(typo in problem for problem in recovery_problems(skypilot[1][(name, typo)]))


def fake_rentune(folder: Path) -> tuple[dict, Path]:
    """A `rentune` on PATH that logs its arguments, rank variables and the signals it gets, then exits with
    $FAKE_EXIT after $FAKE_RUN_SECONDS. Like rentune it exits 143 on SIGTERM; like torchrun, which rentune
    starts, it handles SIGINT itself (then exits 130), so an interrupt that reaches it shows."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True)
    log = folder / "rentune.log"
    script = bin_dir / "rentune"
    script.write_text(
        f"#!{sys.executable}\n"
        "import os, signal, sys, time\n"
        "log = open(os.environ['FAKE_LOG'], 'a', buffering=1)\n"
        "log.write('args: ' + ' '.join(sys.argv[1:]) + '\\n')\n"
        "rank, rdzv = os.environ.get('RENTUNE_NODE_RANK', ''), os.environ.get('RENTUNE_RDZV_ENDPOINT', '')\n"
        "log.write(f'rank={rank} rdzv={rdzv}\\n')\n"
        "def stop(sig, frame):\n"
        "    log.write(signal.Signals(sig).name + '\\n')\n"
        "    sys.exit(143 if sig == signal.SIGTERM else 130)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "signal.signal(signal.SIGINT, stop)\n"
        "log.write('started\\n')\n"
        "time.sleep(float(os.environ.get('FAKE_RUN_SECONDS', '0')))\n"
        "code = int(os.environ['FAKE_EXIT'])\n"
        "if code == 137:\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "sys.exit(code)\n"
    )
    script.chmod(0o755)
    env = {
        "PATH": f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin",
        "HOME": str(folder),
        "FAKE_LOG": str(log),
        "TERM": "dumb",
    }
    return env, log


class OnTerminal:
    """A command on a new pseudo-terminal as its session leader: how dstack's runner starts the job's
    shell (creack/pty), which makes `bash -i` turn job control on."""

    def __init__(self, argv: list[str], env: dict):
        master, slave = os.openpty()
        self.proc = subprocess.Popen(
            argv, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True,
            preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
        )  # fmt: skip
        os.close(slave)
        self.master, self.output, self.started = master, b"", time.monotonic()

    def _read(self, timeout: float) -> None:
        if select.select([self.master], [], [], timeout)[0]:
            try:
                self.output += os.read(self.master, 65536)
            except OSError:  # EIO: every process holding the terminal has exited
                time.sleep(timeout)

    def wait_for(self, condition, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, f"timed out; output so far:\n{self.text()}"
            self._read(0.05)

    def finish(self, timeout: float = 15.0) -> tuple[int, float]:
        """(exit status, seconds since the start)."""
        self.wait_for(lambda: self.proc.poll() is not None, timeout)
        elapsed = time.monotonic() - self.started
        self._read(0.05)
        os.close(self.master)
        return self.proc.returncode, elapsed

    def text(self) -> str:
        return self.output.decode(errors="replace")


def dstack_command(dstack, name: str) -> list[str]:
    result = dstack[0][name]
    assert result["shell"] == "bash"  # else dstack uses /bin/sh for an image (JobConfigurator._shell)
    return ["/bin/bash", "-i", "-c", result["command_line"]]  # JobConfigurator._commands


@pytest.mark.parametrize("name", [p.name for p in DSTACK_FILES])
def test_dstack_loads_each_file_and_retries_interruptions_not_errors(dstack, name):
    result = dstack[0][name]
    assert result["ok"], result.get("error")
    assert result["type"] == "task" and result["image"].startswith("registry.example.com/rentune:")
    assert result["spot_policy"] == "auto"
    assert set(result["on_events"]) == {"no-capacity", "interruption"}
    retried = result["retried"]
    assert retried["INTERRUPTED_BY_NO_CAPACITY"] and retried["FAILED_TO_START_DUE_TO_NO_CAPACITY"]
    for reason in (
        "CONTAINER_EXITED_WITH_ERROR",
        "INSTANCE_UNREACHABLE",
        "MAX_DURATION_EXCEEDED",
        "TERMINATED_BY_USER",
    ):
        assert not retried[reason], reason
    assert result["max_duration"] == 7 * 24 * 3600  # rental.window 7d
    assert result["retry_duration"] > 0
    for secret in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert result["env"][secret] == f"${{{{ secrets.{secret} }}}}"
    assert result["env"]["HF_HUB_OFFLINE"] == "1"


@pytest.mark.parametrize("name", [p.name for p in DSTACK_FILES])
def test_dstack_refuses_copies_with_a_typo(dstack, name):
    for key, typo in DSTACK_TYPOS:
        result = dstack[1][(name, typo)]
        assert not result["ok"], f"{name} with {typo!r} for {key!r} was accepted"
        assert typo in result["error"], result["error"]  # refused for the typo, not for something else


@pytest.mark.parametrize("name", [p.name for p in DSTACK_FILES])
def test_dstack_command_exits_with_rentunes_code_and_waits_for_a_reclaim_only_after_143(dstack, name, tmp_path):
    command = dstack_command(dstack, name)
    for code in [0, *FAILING]:
        env, _ = fake_rentune(tmp_path / str(code))
        run = OnTerminal(command, {**env, "FAKE_EXIT": str(code), "RECLAIM_WAIT_SECONDS": "30"})
        status, elapsed = run.finish()
        assert (status, "waiting" in run.text()) == (code, False), run.text()
        assert elapsed < 10
    # 143 that no stop asked for: a provider's notice; the command waits, then exits 143.
    env, _ = fake_rentune(tmp_path / "notice")
    run = OnTerminal(command, {**env, "FAKE_EXIT": "143", "RECLAIM_WAIT_SECONDS": "1"})
    status, elapsed = run.finish()
    assert status == EXIT_INTERRUPTED and elapsed >= 1 and "waiting for the provider" in run.text()
    # A stop during that wait ends it at once.
    env, _ = fake_rentune(tmp_path / "stopped-while-waiting")
    run = OnTerminal(command, {**env, "FAKE_EXIT": "143", "RECLAIM_WAIT_SECONDS": "60"})
    run.wait_for(lambda: "waiting for the provider" in run.text())
    os.kill(run.proc.pid, signal.SIGTERM)
    status, elapsed = run.finish()
    assert status == EXIT_INTERRUPTED and elapsed < 20


@pytest.mark.parametrize("stop", ["SIGTERM", "SIGINT", "^C on the terminal"])
@pytest.mark.parametrize("name", [p.name for p in DSTACK_FILES])
def test_dstack_stop_reaches_rentune_as_sigterm_and_skips_the_wait(dstack, name, stop, tmp_path):
    """A stop, whichever way it comes (dstack's runner interrupts the job's shell; SIGTERM is handled the
    same): rentune gets SIGTERM and no SIGINT, exits 143, and the command exits 143 without waiting for a
    reclaim."""
    env, log = fake_rentune(tmp_path)
    env |= {"FAKE_EXIT": "0", "FAKE_RUN_SECONDS": "60", "RECLAIM_WAIT_SECONDS": "60"}
    run = OnTerminal(dstack_command(dstack, name), env)
    run.wait_for(lambda: log.exists() and "started" in log.read_text())
    # The stop comes while the job's shell waits for rentune, as dstack's does after the start. Sent before
    # it got there (a loaded machine: the child started, the shell not yet in `wait`), an interactive bash
    # aborts its command on SIGINT without running the rest: a gap of milliseconds after the start.
    run.wait_for(lambda: Path(f"/proc/{run.proc.pid}/wchan").read_text() == "do_wait")
    if stop == "^C on the terminal":
        os.write(run.master, b"\x03")  # SIGINT to the terminal's foreground process group
    else:
        os.kill(run.proc.pid, getattr(signal, stop))
    status, elapsed = run.finish()
    signals = [line for line in log.read_text().splitlines() if line.startswith("SIG")]
    assert (status, signals) == (EXIT_INTERRUPTED, ["SIGTERM"]), (log.read_text(), run.text())
    assert "waiting" not in run.text() and elapsed < 20


def test_dstack_multinode_maps_dstacks_node_variables(dstack, tmp_path):
    result = dstack[0]["multinode.dstack.yml"]
    assert result["nodes"] == 2 and result["files"] == [["spec.yaml", "/rentune/spec.yaml"]]
    env, log = fake_rentune(tmp_path)
    env |= {"FAKE_EXIT": "0", "DSTACK_NODE_RANK": "1", "DSTACK_MASTER_NODE_IP": "10.0.0.5"}
    assert OnTerminal(dstack_command(dstack, "multinode.dstack.yml"), env).finish()[0] == 0
    assert log.read_text().splitlines()[:2] == ["args: run /rentune/spec.yaml", "rank=1 rdzv=10.0.0.5:29400"]


def test_dstack_worker_runs_the_worker_on_the_given_store(dstack, tmp_path):
    result = dstack[0]["worker.dstack.yml"]
    assert "RENTUNE_STORE" in result["env"] and result["env"]["RENTUNE_STORE"] is None  # from `dstack apply`
    env, log = fake_rentune(tmp_path)
    env |= {"FAKE_EXIT": "0", "RENTUNE_STORE": "s3://bucket/prefix"}
    assert OnTerminal(dstack_command(dstack, "worker.dstack.yml"), env).finish()[0] == 0
    assert log.read_text().splitlines()[0] == "args: worker --store s3://bucket/prefix --exit-when-idle"


def test_skypilot_run_commands_map_the_node_variables_and_keep_rentunes_exit_code(skypilot, tmp_path):
    multinode = skypilot[0]["multinode.yaml"]
    assert multinode["num_nodes"] == 2 and multinode["file_mounts"] == {"/rentune/spec.yaml": "./spec.yaml"}
    env, log = fake_rentune(tmp_path / "multinode")
    env |= {"FAKE_EXIT": "0", "SKYPILOT_NODE_RANK": "1", "SKYPILOT_NODE_IPS": "10.0.0.5\n10.0.0.6"}
    subprocess.run(["bash", "-c", multinode["run"]], env=env, cwd=tmp_path, capture_output=True, timeout=30)
    assert log.read_text().splitlines()[:2] == ["args: run /rentune/spec.yaml", "rank=1 rdzv=10.0.0.5:29400"]
    worker = skypilot[0]["worker.yaml"]
    for code in (EXIT_INTERRUPTED, EXIT_INVALID):
        env, log = fake_rentune(tmp_path / f"worker-{code}")
        env |= {"FAKE_EXIT": str(code), "RENTUNE_STORE": "s3://bucket/prefix"}
        proc = subprocess.run(["bash", "-c", worker["run"]], env=env, cwd=tmp_path, capture_output=True, timeout=30)
        assert proc.returncode == code  # SkyPilot takes the job's exit code from the last command
        assert log.read_text().splitlines()[0] == "args: worker --store s3://bucket/prefix --exit-when-idle"
