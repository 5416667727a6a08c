"""Keepalives that want a reply ride paramiko internals; a paramiko without them still gets
its own keepalive, never an AttributeError on every connection."""

from __future__ import annotations

from typing import Any

from brctl.remote.ssh.liveness import keepalive_with_replies


class _Bare:
    """A transport exposing only paramiko's public keepalive."""

    def __init__(self) -> None:
        self.asked: list[int] = []

    def set_keepalive(self, interval: int) -> None:
        self.asked.append(interval)


def test_without_the_internals_paramikos_own_keepalive_is_used() -> None:
    bare: Any = _Bare()
    keepalive_with_replies(bare, 15)
    assert bare.asked == [15]

