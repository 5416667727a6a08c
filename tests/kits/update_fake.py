"""A FakeTransport whose machines run the real release probe in-process, each on its own root.

Used by the update unit tests: the node-side code is the real one (files under a
tmp dir per machine), only the transport is fake, so faults (a machine down, a
switch that fails) are injected here without processes or sockets.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Sequence
from pathlib import Path

from brctl.core.transport import Node, NodeState
from brctl.diagnostics import release
from brctl.remote.fake import FakeTransport, Reply
from brctl.remote.probes import probe_call

Fault = Callable[[str, dict], "Reply | None"]


class Machines:
    """Fake machines: ``down`` are unreachable; ``fault(node, request)`` may answer instead."""

    def __init__(self) -> None:
        self.down: set[str] = set()
        self.fault: Fault | None = None
        self.requests: list[tuple[str, dict]] = []
        self.transport = FakeTransport(self.handle)

    def handle(self, node: Node, argv: Sequence[str], stdin: bytes | None) -> Reply:
        if node.name in self.down:
            return Reply(stderr="connection refused", state=NodeState.UNREACHABLE)
        module, args = probe_call(argv)
        assert module == "brctl.diagnostics.release", module
        data = stdin or b""
        request = json.loads(args[0] if args else data.decode())
        self.requests.append((node.name, request))
        if self.fault is not None:
            reply = self.fault(node.name, request)
            if reply is not None:
                return reply
        out = io.StringIO()
        code = release.main(args, io.BytesIO(data), out)
        return Reply(stdout=out.getvalue(), exit_code=code)


def inventory_doc(root: Path, n: int = 4, **job: object) -> dict:
    """A local-node inventory document with a per-node update root under ``root``."""
    return {
        "nodes": [{"name": f"m[1-{n}]", "connection": "local", "gpus": 2}],
        "job": {"name": "demo", "nodes": f"m[1-{n}]", **job},
        "update": {"root": str(root / "{node}")},
    }
