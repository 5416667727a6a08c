"""Bounded capture of one node's output stream: the first and last N bytes, and the count.

A node may print gigabytes (``brctl exec -- journalctl``, a broken probe): every
transport keeps, per node and stream, the first ``keep`` and the last ``keep``
bytes, reads on to the end, and marks the cut with the total byte count. Memory
per stream is at most ~2 × ``keep`` plus one chunk, so a fan-out costs O(fan-out × keep).
The tail is a queue of blocks of up to ``BLOCK`` bytes (small chunks are appended to
the last block: a node writing a byte or two at a time would otherwise cost an object
of ~40 bytes per kept byte), dropped whole from the front: nothing is copied twice.
"""

from __future__ import annotations

from collections import deque

DEFAULT_KEEP = 2 << 20  # bytes kept at each end of each stream (inventory ssh.output_keep)
BLOCK = 1 << 16  # tail chunks smaller than this are gathered into blocks of this size
MARKER = "[brctl: output truncated: {total} bytes in all; the first and last {keep} kept]"


def kept_bytes(head: bytes, tail: bytes, total: int, keep: int) -> bytes:
    """A stream of ``total`` bytes of which ``head`` and ``tail`` were kept, with the marker
    where it was cut (for people: what brctl knows of the cut travels out of band, in
    ``RunResult.stdout_total``; a node can print a line that looks like the marker)."""
    if total <= len(head) + len(tail):
        return head + tail
    return b"".join((head, b"\n", MARKER.format(total=total, keep=keep).encode(), b"\n", tail))


def kept_text(head: bytes, tail: bytes, total: int, keep: int) -> str:
    """``kept_bytes`` decoded, invalid UTF-8 replaced (also for captures made on a node)."""
    return kept_bytes(head, tail, total, keep).decode(errors="replace")


def not_utf8(data: bytes) -> bytes | None:
    """``data`` when it is not valid UTF-8 (its text then lost bytes to U+FFFD), else None."""
    try:
        data.decode()
    except UnicodeDecodeError:
        return data
    return None


class Capture:
    """Collects one stream: ``add`` chunks as they come, ``text()`` at the end."""

    def __init__(self, keep: int = DEFAULT_KEEP) -> None:
        """Args: keep: bytes kept at each end (at least 1)."""
        self.keep = max(1, keep)
        self.total = 0
        self._head = bytearray()
        self._tail: deque[bytearray] = deque()
        self._tail_len = 0

    def add(self, data: bytes) -> None:
        """Take one chunk."""
        self.total += len(data)
        room = self.keep - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if data:
            if self._tail and len(self._tail[-1]) + len(data) <= BLOCK:
                self._tail[-1] += data
            else:
                self._tail.append(bytearray(data))
            self._tail_len += len(data)
            while self._tail_len - len(self._tail[0]) >= self.keep:  # the rest still covers keep
                self._tail_len -= len(self._tail.popleft())

    @property
    def truncated(self) -> bool:
        """More came than is kept."""
        return self.total > len(self._head) + min(self._tail_len, self.keep)

    def data(self) -> bytes:
        """What was kept, with the marker where it was cut."""
        return kept_bytes(bytes(self._head), b"".join(self._tail)[-self.keep:], self.total, self.keep)

    def text(self) -> str:
        """``data()`` decoded (invalid UTF-8 replaced)."""
        return self.data().decode(errors="replace")

    @property
    def cut_total(self) -> int | None:
        """``total`` when more came than is kept (``RunResult.stdout_total``), else None."""
        return self.total if self.truncated else None
