"""The `e2e` marker (tests/conftest.py): a test that starts a rentune process, torchrun or docker, itself,
through a helper function or class of its module, or through a fixture, is marked; one that does not is not.
`make test-fast` runs `-m "not e2e"`."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from tests.conftest import _starts_processes

ROOT = Path(__file__).resolve().parents[2]

PLANTED = """
import subprocess
from tests.processes import RENTUNE, rentune


def _helper(spec):
    return subprocess.run([RENTUNE, "run", spec])


class Nodes:
    def start(self):
        return subprocess.Popen(["torchrun", "--nproc_per_node=2", "-m", "x"])


def test_direct():
    rentune("validate", "spec.yaml")


def test_through_a_helper():
    _helper("spec.yaml")


def test_through_a_class():
    Nodes().start()


def test_the_console_script_by_name(bin_dir):
    subprocess.run([str(bin_dir / "rentune"), "--version"])


def test_light():
    subprocess.run([sys.executable, "-c", "pass"], env={"RENTUNE_STORE": "file:///tmp/x"})
"""


def _module(tmp_path: Path):
    path = tmp_path / "planted_tests.py"
    path.write_text(PLANTED)
    spec = importlib.util.spec_from_file_location("planted_tests", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["planted_tests"] = module
    spec.loader.exec_module(module)
    return module


def test_the_rule_sees_process_starts_and_nothing_else(tmp_path):
    module = _module(tmp_path)
    try:
        for name in ("test_direct", "test_through_a_helper", "test_through_a_class", "test_the_console_script_by_name"):
            assert _starts_processes(getattr(module, name), set()), name
        assert not _starts_processes(module.test_light, set())  # an env var named RENTUNE_* is no process
    finally:
        del sys.modules["planted_tests"]


def test_the_suite_marks_the_whole_job_tests_and_leaves_the_in_process_ones():
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "e2e", "-p", "no:cacheprovider",
         "tests/integration/test_resume.py", "tests/integration/test_checkpoint_protocol.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    collected = [line for line in done.stdout.splitlines() if "::" in line]
    assert collected and all(line.startswith("tests/integration/test_resume.py::") for line in collected), done.stdout
