"""The images' dependency lock (deploy/requirements.lock, deploy/lock.py): it pins exactly the versions this
suite runs with, every entry carries a sha256, torch stays out, and a version that differs is caught, by
`lock.py check` (what the image build runs) and by what `rentune env` records. The image built from it is
compared with the lock in tests/integration/test_docker.py."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from entrypoint.training.environment import lock_record

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "deploy/requirements.lock"

spec = importlib.util.spec_from_file_location("rentune_lock", ROOT / "deploy/lock.py")
lock = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lock)


def test_the_lock_is_what_this_suite_runs_with():
    """The lock pins every package the images need here, at the version installed here: were a release to
    change in the suite's environment without `make lock`, this fails and says which."""
    pins = lock.read_pins(LOCK)
    closure = lock.installed_closure(lock.image_requirements(ROOT / "pyproject.toml"))
    assert set(pins) == set(closure), f"make lock: missing {set(closure) - set(pins)}, extra {set(pins) - set(closure)}"
    assert lock.differences(pins, lock.installed_versions()) == []
    assert "torch" not in pins and "transformers" in pins and "deepspeed" in pins and "bitsandbytes" in pins


def test_every_entry_has_its_hashes():
    entries = re.split(
        r"\n(?=[A-Za-z0-9])", "\n".join(line for line in LOCK.read_text().splitlines() if not line.startswith("#"))
    )
    assert len(entries) == len(lock.read_pins(LOCK))
    for entry in entries:
        assert re.search(r"--hash=sha256:[0-9a-f]{64}", entry), entry.splitlines()[0]


def test_check_passes_here_and_fails_on_a_changed_version(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "deploy/lock.py"), "check", str(LOCK)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert f"{len(lock.read_pins(LOCK))} packages" in done.stdout and done.stdout.rstrip().endswith("met")
    installed = lock.read_pins(LOCK)["pyyaml"]
    changed = tmp_path / "requirements.lock"
    changed.write_text(LOCK.read_text().replace(f"\npyyaml=={installed} ", "\npyyaml==5.4.1 "))
    done = subprocess.run(
        [sys.executable, str(ROOT / "deploy/lock.py"), "check", str(changed)], capture_output=True, text=True
    )
    assert done.returncode == 1
    assert f"pyyaml: locked 5.4.1, installed {installed}" in done.stderr and "NOT MET" in done.stdout


def test_differences_name_each_package():
    pins = {"peft": "0.21.2", "safetensors": "0.8.0", "pyyaml": "6.0.4"}
    freeze = {"peft": "0.21.2", "safetensors": "0.7.0"}
    assert lock.differences(pins, freeze) == [
        "pyyaml: locked 6.0.4, installed nothing",
        "safetensors: locked 0.8.0, installed 0.7.0",
    ]


def test_constraints_are_the_pins(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "deploy/lock.py"), "constraints", str(LOCK)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.split() == [f"{n}=={v}" for n, v in sorted(lock.read_pins(LOCK).items())]


def test_an_unknown_extra_is_refused():
    with pytest.raises(SystemExit, match=r"no optional dependency group \[no-such-extra\]"):
        lock.image_requirements(ROOT / "pyproject.toml", ("no-such-extra",))


def test_env_records_the_lock_and_what_differs(tmp_path):
    assert lock_record(None) is None
    record = lock_record(str(LOCK))
    assert record["packages"] == len(lock.read_pins(LOCK)) and record["differs"] == []
    assert record["sha256"] == lock.sha256(LOCK)
    changed = tmp_path / "requirements.lock"
    changed.write_text(LOCK.read_text() + "no-such-package==1.0 \\\n    --hash=sha256:" + "0" * 64 + "\n")
    assert lock_record(str(changed))["differs"] == ["no-such-package: locked 1.0, installed nothing"]
    assert "error" in lock_record(str(tmp_path / "missing.lock"))
