"""Bounded capture of one node's output stream: the first and last N bytes, and the count.

A node may print gigabytes (``brctl exec -- journalctl``, a broken probe): every
transport keeps, per node and stream, the first ``keep`` and the last ``keep``
bytes, reads on to the end, and marks the cut with the total byte count. Memory
per stream is at most ~2 × ``keep`` plus one chunk, so a fan-out costs O(fan-out × keep).
The tail is a queue of the chunks as they came, dropped whole from the front:
no buffer is ever reallocated or copied while the stream runs.
"""

from __future__ import annotations

import re
from collections import deque

DEFAULT_KEEP = 2 << 20  # bytes kept at each end of each stream (inventory ssh.output_keep)
MARKER = "[brctl: output truncated: {total} bytes in all; the first and last {keep} kept]"
_MARKER_RX = re.compile(r"^\[brctl: output truncated: (\d+) bytes in all;", re.M)


def kept_text(head: bytes, tail: bytes, total: int, keep: int) -> str:
    """A stream of ``total`` bytes of which ``head`` and ``tail`` were kept, decoded (invalid
    UTF-8 replaced), with the marker where it was cut (also for captures made on a node)."""
    if total <= len(head) + len(tail):
        return (head + tail).decode(errors="replace")
    marker = MARKER.format(total=total, keep=keep)
    return f"{head.decode(errors='replace')}\n{marker}\n{tail.decode(errors='replace')}"


def truncated_total(text: str) -> int | None:
    """The byte count in ``text``'s truncation marker, or None when it was kept whole."""
    if "[brctl: output truncated: " not in text:
        return None  # a substring scan is ~20x cheaper than the regex over a large answer
    found = _MARKER_RX.search(text)
    return int(found.group(1)) if found else None


class Capture:
    """Collects one stream: ``add`` chunks as they come, ``text()`` at the end."""

    def __init__(self, keep: int = DEFAULT_KEEP) -> None:
        """Args: keep: bytes kept at each end (at least 1)."""
        self.keep = max(1, keep)
        self.total = 0
        self._head = bytearray()
        self._tail: deque[bytes] = deque()
        self._tail_len = 0

    def add(self, data: bytes) -> None:
        """Take one chunk."""
        self.total += len(data)
        room = self.keep - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if data:
            self._tail.append(bytes(data))
            self._tail_len += len(data)
            while self._tail_len - len(self._tail[0]) >= self.keep:  # the rest still covers keep
                self._tail_len -= len(self._tail.popleft())

    @property
    def truncated(self) -> bool:
        """More came than is kept."""
        return self.total > len(self._head) + min(self._tail_len, self.keep)

    def text(self) -> str:
        """What was kept, decoded (invalid UTF-8 replaced), with the marker where it was cut."""
        return kept_text(bytes(self._head), b"".join(self._tail)[-self.keep:], self.total, self.keep)
