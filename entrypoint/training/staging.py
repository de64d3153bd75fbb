"""Staged checkpoint saves: the training loop copies a checkpoint's weights and optimizer state aside and
goes on; the commit thread writes them to disk, then uploads them (entrypoint/store/committer.py).

    training thread:  wait until the previous staged copy is on disk (its buffers are reused)
                      copy every tensor into its buffer (CPU; one buffer per tensor, made once)   <- blocked
                      defer the writes (save_pretrained, torch.save) to the commit
    commit thread:    run the deferred writes -> the copy's buffers are free -> upload -> manifest

The Trainer's own save writes a full fine-tune's every byte before the next step (6 GB for a 0.5B model
with AdamW, 100+ GB at 7B), at the disk's pace; a copy in memory runs at memory bandwidth. The files are
the ones the Trainer writes, byte for byte (the same save_pretrained and torch.save calls, on a copy whose
tensors alias as the originals do: tied weights stay one tensor), so resuming reads them as before.

The cost is one more copy of the state in host memory for the life of the trainer: what
`torch.distributed.checkpoint.async_save` stages too. Its buffers are made and touched in a background
thread once the optimizer has state (`reserve`, after the first step): a first copy into fresh memory pays
a page fault per 4 KB page and runs at about a quarter of a copy into touched memory, which made the first
checkpoint of a 6 GB state block 5.6 s against 1.1 s for the later ones.

Staging is left out (the Trainer saves as it always did, and the log says why) where that copy would not
fit in the host memory available, under DeepSpeed or FSDP (their engines save their own shards), and for
states under STAGE_FROM_BYTES (a LoRA adapter: written in milliseconds, nothing to gain).
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable

import psutil
import torch

__all__ = ["STAGE_FROM_BYTES", "Stager", "state_bytes"]

STAGE_FROM_BYTES = 16 << 20  # below this a state is written in line: staging would save milliseconds
HEADROOM = 1.25  # host memory available must exceed the copy by this factor (the writes' own buffers, the OS)


def _tensors(obj) -> list[torch.Tensor]:
    if torch.is_tensor(obj):
        return [obj]
    if isinstance(obj, dict):
        return [t for value in obj.values() for t in _tensors(value)]
    if isinstance(obj, list | tuple):
        return [t for value in obj for t in _tensors(value)]
    return []


def _alias_key(t: torch.Tensor) -> tuple:
    """Equal for two names of one tensor (tied weights): the same memory seen the same way."""
    return (t.data_ptr(), t.dtype, tuple(t.shape), t.stride())


def state_bytes(obj) -> int:
    """Bytes of the distinct tensors in a (nested) state dict: aliased tensors (tied weights) count once."""
    return sum({_alias_key(t): t.numel() * t.element_size() for t in _tensors(obj)}.values())


class Stager:
    """Copies of checkpoint states in reused CPU buffers, and the writes deferred to the commit thread.

    `stage(name, state)` returns a copy of `state` (dicts, lists and tuples rebuilt, tensors copied into
    this stager's buffer for their place, other values deep-copied), the first of a checkpoint once the
    previous checkpoint's writes are done; `defer(write)` queues a write of it; `take()` hands the queued
    writes over, to be passed to `run` (in the commit thread) or `drop`. `decline(name, state)` says why a
    state is written in line instead (None: stage it).
    """

    def __init__(self, log: Callable[[str], None], available: Callable[[], int] | None = None):
        self.log = log
        self._available = available or (lambda: psutil.virtual_memory().available)
        self._buffers: dict[str, torch.Tensor] = {}
        self._pending: list[Callable[[], None]] = []
        self._written = threading.Event()
        self._written.set()
        self._open = False  # a checkpoint's staging has begun and its writes are not handed over yet
        self.waited = 0.0  # seconds stage() waited for the previous copy's writes, since the last take()
        self.made_in_line = 0  # bytes of buffers stage() had to make itself, since the last take()
        self._said: set[str] = set()
        self._reserver: threading.Thread | None = None

    def decline(self, name: str, state) -> str | None:
        """Why `state` should be written in line rather than staged, or None."""
        size = state_bytes(state)
        if size < STAGE_FROM_BYTES:
            return f"{size / 1e6:.3g} MB: written in line"
        held = sum(b.numel() * b.element_size() for key, b in self._buffers.items() if key.startswith(name + "."))
        needed = (size - held) * HEADROOM
        if needed > self._available():
            reason = (
                f"a copy of the {name} state ({size / 1e9:.3g} GB) would not fit in the host memory available "
                f"({self._available() / 1e9:.3g} GB): the Trainer writes it in line, blocking training meanwhile"
            )
            if name not in self._said:
                self._said.add(name)
                self.log(f"checkpoint: {reason}")
            return reason
        return None

    def reserve(self, states: dict[str, object]) -> None:
        """Make and touch the buffers of `states` ({name: state}, as `stage` will see them) in a background
        thread; `stage` waits for it to finish. Those `decline` refuses get none."""

        def run() -> None:
            for name, state in states.items():
                if self.decline(name, state) is None:
                    self._walk(name, state, {}, copy_values=False)

        self._reserver = threading.Thread(target=run, name="rentune-stage-reserve", daemon=True)
        self._reserver.start()

    def stage(self, name: str, state):
        if self._reserver is not None:  # its buffers are this copy's
            self._reserver.join()
            self._reserver = None
        if not self._open:  # the first state of this checkpoint: the previous checkpoint's writes must be done
            started = time.monotonic()
            self._written.wait()
            self.waited += time.monotonic() - started
            self._written.clear()  # until the writes of this checkpoint have run
            self._open = True
        aliases: dict[tuple, torch.Tensor] = {}
        staged = self._walk(name, state, aliases, copy_values=True)
        if any(t.is_cuda for t in _tensors(state)):
            torch.cuda.synchronize()  # the device-to-host copies were asynchronous
        return staged

    def _walk(self, path: str, value, aliases: dict, copy_values: bool):
        """`value` rebuilt with every tensor replaced by its buffer (made where missing), the tensors copied
        in when `copy_values`, else the new buffers only touched (`reserve`)."""
        if torch.is_tensor(value):
            key = _alias_key(value)
            if key in aliases:  # tied weights: one tensor under two names, as in the original
                return aliases[key]
            buffer = self._buffers.get(path)
            if buffer is None or buffer.shape != value.shape or buffer.dtype != value.dtype:
                buffer = self._buffer(value)
                self._buffers[path] = buffer
                if copy_values:
                    self.made_in_line += buffer.numel() * buffer.element_size()
                elif not buffer.is_pinned():  # pinned memory is touched as it is locked
                    buffer.zero_()
            if copy_values:
                buffer.copy_(value.detach(), non_blocking=value.is_cuda)
            aliases[key] = buffer
            return buffer
        if isinstance(value, dict):
            return type(value)((k, self._walk(f"{path}.{k}", v, aliases, copy_values)) for k, v in value.items())
        if isinstance(value, list | tuple):
            return type(value)(self._walk(f"{path}.{i}", v, aliases, copy_values) for i, v in enumerate(value))
        return copy.deepcopy(value) if copy_values else None

    def _buffer(self, like: torch.Tensor) -> torch.Tensor:
        """A CPU tensor shaped as `like`: page-locked for a GPU tensor (a faster copy), unless the process may
        not lock that much memory (a container's memlock limit), then an ordinary one."""
        if like.is_cuda:
            try:
                return torch.empty(like.shape, dtype=like.dtype, device="cpu", pin_memory=True)
            except RuntimeError:
                pass
        return torch.empty(like.shape, dtype=like.dtype, device="cpu")

    def defer(self, write: Callable[[], None]) -> None:
        self._pending.append(write)

    def take(self) -> tuple[list[Callable[[], None]], float]:
        """The writes deferred since the last take (the next commit's), and the seconds stage() waited
        meanwhile for the copy before them to be written (`made_in_line` is reset too: read it first)."""
        pending, waited, self._pending, self.waited = self._pending, self.waited, [], 0.0
        self.made_in_line = 0
        self._open = False
        if not pending:
            self._written.set()  # nothing staged holds the buffers
        return pending, waited

    def run(self, writes: list[Callable[[], None]]) -> None:
        """Run `writes` (the commit thread, before its upload); the buffers are free again afterwards, even
        when a write fails (the commit then fails with its error)."""
        try:
            for write in writes:
                write()
        finally:
            self._written.set()

    def drop(self, writes: list[Callable[[], None]]) -> None:
        """Give up `writes` (a checkpoint that will not be committed); the buffers are free again."""
        self._written.set()
