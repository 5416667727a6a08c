"""A transport for long-running callers: one host's unusable settings never stop the others.

``run_all`` first asks the transport's ``check_config`` to judge the settings of
every host it is about to contact; for a command run by hand an ssh config setting
brctl cannot honour is exit 2 before anything runs, so the operator fixes it. The
daemon cannot stop watching a job over one host's config: through ``PerHost`` that
check is skipped, and such a host's run is reported for that host alone
(``SshTransport`` returns ``unreachable`` naming the host and the setting), while
the fan-out goes on to the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, BinaryIO

from brctl.core.transport import Node, RunResult, Transport


class PerHost:
    """``inner`` without ``check_config``; everything else is ``inner``'s."""

    def __init__(self, inner: Transport) -> None:
        self._inner = inner

    def run(self, node: Node, argv: Sequence[str], *, timeout: float,
            stdin: bytes | None = None) -> RunResult:
        return self._inner.run(node, argv, timeout=timeout, stdin=stdin)

    def stream(self, node: Node, argv: Sequence[str], *, timeout: float, stdin: BinaryIO | None = None,
               stdout: BinaryIO | None = None) -> RunResult:
        return self._inner.stream(node, argv, timeout=timeout, stdin=stdin, stdout=stdout)

    def cancel(self) -> None:
        self._inner.cancel()

    def close(self) -> None:
        self._inner.close()

    def __getattr__(self, name: str) -> Any:
        if name == "check_config":  # run_all looks it up with getattr(..., None)
            raise AttributeError(name)
        return getattr(self._inner, name)
