"""The probe protocol: JSON request on stdin → one JSON document on stdout.

Node-side; standard library only. A probe that fails writes
``{"probe_error": "..."}`` and exits 1 so the controller reports it per node.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Callable

PROBE_SCHEMA = "brctl.probe/1"


def serve(handler: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """Read the request, call ``handler``, print its document; never a traceback."""
    raw = sys.stdin.read()
    try:
        request = json.loads(raw) if raw.strip() else {}
    except ValueError as exc:
        _fail(f"bad request JSON: {exc}")
        return
    if not isinstance(request, dict):
        _fail("request must be a JSON object")
        return
    try:
        document = handler(request)
    except Exception as exc:  # report, never crash with a traceback on the node
        _fail(f"{type(exc).__name__}: {exc}")
        return
    document.setdefault("schema", PROBE_SCHEMA)
    sys.stdout.write(json.dumps(document, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def _fail(message: str) -> None:
    sys.stdout.write(json.dumps({"schema": PROBE_SCHEMA, "probe_error": message}) + "\n")
    sys.stdout.flush()
    sys.exit(1)
