"""A full disk named as such (training/disk.py): on a real, full tmpfs, the OSError of a plain write and
the RuntimeError of torch.save both become a DiskFull naming the folder and what is free; the check before
a save refuses when the last checkpoint's size does not fit. Other errors pass through."""

from __future__ import annotations

import errno

import pytest
import torch

from entrypoint.errors import DiskFull
from entrypoint.training.disk import check_room, disk_full
from tests.tmpfs import fill, small_tmpfs


@pytest.fixture
def full_disk(tmp_path):
    with small_tmpfs(tmp_path / "disk", 4) as folder:
        fill(folder, leave_bytes=8192)
        yield folder


def test_a_plain_write_on_a_full_disk_is_named(full_disk):
    with pytest.raises(OSError) as caught:
        (full_disk / "big.bin").write_bytes(b"x" * 1_000_000)
    assert caught.value.errno == errno.ENOSPC
    full = disk_full(caught.value, full_disk / "job", needed=1_000_000, what="a checkpoint")
    assert isinstance(full, DiskFull)
    assert f"the work dir {full_disk / 'job'} is out of space: 0.0 MB free on its filesystem" in str(full)
    assert "a checkpoint needs about 1.0 MB" in str(full) and "No space left on device" in str(full)


def test_torch_save_on_a_full_disk_is_named(full_disk):
    with pytest.raises(Exception) as caught:  # torch's zip writer: RuntimeError "... unexpected pos ..."
        torch.save({"w": torch.zeros(500_000)}, full_disk / "optimizer.pt")
    full = disk_full(caught.value, full_disk)
    assert isinstance(full, DiskFull), repr(caught.value)
    assert f"the work dir {full_disk} is out of space" in str(full)


def test_the_check_before_a_save_compares_free_space_with_the_last_checkpoint(full_disk, tmp_path):
    with pytest.raises(DiskFull, match=r"0\.0 MB free on its filesystem; the checkpoint of step 8 needs about 2\.0 MB"):
        check_room(full_disk / "trainer", 2_000_000, "the checkpoint of step 8")
    check_room(full_disk, 1_000, "a small file")  # fits: no error
    check_room(tmp_path, 2_000_000, "the same checkpoint elsewhere")


def test_the_error_torch_gave_in_the_field_and_chained_errors_are_recognised(tmp_path):
    seen = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 9664 vs 9556")
    assert "unexpected pos 9664" in str(disk_full(seen, tmp_path))
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise RuntimeError("saving the checkpoint failed") from inner
    except RuntimeError as outer:
        assert isinstance(disk_full(outer, tmp_path), DiskFull)
    assert disk_full(ValueError("not a disk"), tmp_path) is None
    assert disk_full(OSError(errno.EACCES, "Permission denied"), tmp_path) is None
