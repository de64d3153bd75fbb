"""A node's disk fills up during training: the real `rentune` process stops with a message that names the
work dir, what is free and what the checkpoint needs, the store keeps everything committed, and once space
exists the same command resumes and finishes. The work dir is a real tmpfs mounted for the test (skipped,
saying why, where mounting is not allowed); the unit tests in tests/unit/test_disk.py cover the errors
torch and the OS give on a full disk."""

from __future__ import annotations

import json

from tests.models import build_tiny_bert
from tests.processes import rentune
from tests.specs import tiny_job, write_spec
from tests.tmpfs import fill, small_tmpfs

JOB = "full"


def test_a_full_work_dir_is_named_nothing_is_lost_and_the_job_resumes_once_there_is_room(tmp_path):
    spec = write_spec(tmp_path / "spec.yaml", tiny_job(JOB, build_tiny_bert(tmp_path / "bert")))
    store = tmp_path / "store"
    with small_tmpfs(tmp_path / "disk", 48) as disk:
        args = ("run", str(spec), "--store", f"file://{store}", "--workdir", str(disk))
        first = rentune(*args, "--until", "probe")
        assert first.returncode == 0, first.stderr[-3000:]
        committed = sorted(p.relative_to(store).as_posix() for p in store.rglob("*") if p.is_file())

        filler = fill(disk, leave_bytes=200_000)  # less than the first checkpoint needs
        full = rentune(*args)
        assert full.returncode == 1, full.stdout[-3000:] + full.stderr[-3000:]
        assert f"the work dir {disk}/{JOB}/" in full.stderr and " is out of space: 0." in full.stderr
        assert "MB free on its filesystem; the checkpoint of step " in full.stderr
        assert "needs about" in full.stderr and "run the same command again to resume" in full.stderr
        assert "Traceback" not in full.stderr and "inline_container" not in full.stderr
        ended = json.loads((store / f"jobs/{JOB}/attempts/2/ended.json").read_text())
        assert ended["outcome"] == "error" and ended["phase"] == "train" and "DiskFull" in ended["error"]
        now = {p.relative_to(store).as_posix() for p in store.rglob("*") if p.is_file()}
        assert set(committed) <= now  # nothing committed was lost
        assert not (store / f"jobs/{JOB}/phases/train/result.json").exists()

        filler.unlink()
        done = rentune(*args)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert (store / f"jobs/{JOB}/export/BINDING.json").is_file()


def test_a_full_disk_in_the_verify_phase_s_fresh_process_is_named_with_sizes_and_its_stderr_kept(tmp_path):
    model = build_tiny_bert(tmp_path / "bert")
    spec = write_spec(tmp_path / "spec.yaml", tiny_job("verify-full", model, adaptation={"method": "full"}))
    store = tmp_path / "store"
    with small_tmpfs(tmp_path / "disk", 48) as disk:
        args = ("run", str(spec), "--store", f"file://{store}", "--workdir", str(disk))
        first = rentune(*args, "--until", "evaluate")
        assert first.returncode == 0, first.stderr[-3000:]
        filler = fill(disk, leave_bytes=100_000)  # less than the fresh process's copy of the checkpoint
        full = rentune(*args)
        assert full.returncode == 1, full.stdout[-3000:] + full.stderr[-3000:]
        assert f"the work dir {disk}/verify-full/verify is out of space: 0." in full.stderr, full.stderr[-3000:]
        assert (
            "its copy of the checkpoint needs about" in full.stderr
            and "(writing failed: the verify process:" in full.stderr
        )
        assert "_base.py" not in full.stderr and "VerificationFailed" not in full.stderr
        log = (store / "jobs/verify-full/attempts/2/log.txt").read_text()
        assert "verify: stderr: Traceback (most recent call last):" in log  # the child's stderr, whole
        ended = json.loads((store / "jobs/verify-full/attempts/2/ended.json").read_text())
        assert ended["phase"] == "verify" and ended["error"].startswith("DiskFull: ")

        filler.unlink()
        done = rentune(*args)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
