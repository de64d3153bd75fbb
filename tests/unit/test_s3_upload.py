"""The pieces of entrypoint/store/s3_upload.py that need no server: part sizes and the buffer pool.
Uploads themselves are tested against real servers in tests/integration/test_store_contract.py."""

from __future__ import annotations

import threading

import pytest

from entrypoint.store.s3_upload import MAX_PARTS, PartBuffers, part_size_for

MiB = 1 << 20


def test_part_size_stays_unless_the_file_needs_more_than_10000_parts():
    part = 16 * MiB
    assert part_size_for(0, part) == part
    assert part_size_for(part * MAX_PARTS, part) == part  # exactly 10,000 parts
    bigger = part_size_for(part * MAX_PARTS + 1, part)
    assert bigger % MiB == 0 and bigger > part
    assert -(-(part * MAX_PARTS + 1) // bigger) <= MAX_PARTS
    five_tb = 5 * (1 << 40)  # S3's largest object
    assert -(-five_tb // part_size_for(five_tb, part)) <= MAX_PARTS


def test_buffers_are_made_once_and_handed_out_again():
    buffers = PartBuffers(size=1024, limit=2)
    first = buffers.take()
    buffers.give(first)
    assert buffers.take() is first
    assert buffers.made == 1 and buffers.in_use == 1
    second = buffers.take()
    assert second is not first and len(second) == 1024
    assert buffers.made == 2 and buffers.in_use == 2


def test_take_waits_while_every_buffer_is_out():
    buffers = PartBuffers(size=8, limit=1)
    held = buffers.take()
    got: list[bytearray] = []
    waiter = threading.Thread(target=lambda: got.append(buffers.take()))
    waiter.start()
    waiter.join(timeout=0.3)
    assert waiter.is_alive() and got == []  # blocked: the one buffer is out
    buffers.give(held)
    waiter.join(timeout=10)
    assert got == [held] and buffers.made == 1


@pytest.mark.parametrize("size, limit", [(0, 1), (8, 0)])
def test_buffers_refuse_nonsense_sizes(size, limit):
    with pytest.raises(ValueError, match="expected both >= 1"):
        PartBuffers(size=size, limit=limit)
