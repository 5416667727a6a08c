"""JSON Schemas of every document brctl prints with ``--json``, and of the inventory.

``python -m brctl.schemas`` lists them; ``python -m brctl.schemas NAME`` prints one
(``brctl.health/1``, ``brctl.inventory/1``…). The output documents are written out
here (``documents.py``) and checked against real outputs by the test suite; the
inventory's is derived from the inventory's own dataclasses, so it cannot drift.

Every output document has ``schema`` (its name), ``generated_at`` (UTC,
``2026-11-30T22:52:37Z``) and, where the command judges, ``status`` (the exit code
in words: ok, findings, incomplete, refused, error, interrupted). Results keyed by
machine are an object named ``nodes``; plain lists of machine names are ``members``.
"""

from __future__ import annotations

from typing import Any

from brctl.schemas.documents import DOCUMENTS

INVENTORY = "brctl.inventory/1"


def names() -> list[str]:
    """Every schema name, output documents first (sorted), then the inventory."""
    return [*sorted(DOCUMENTS), INVENTORY]


def get(name: str) -> dict[str, Any]:
    """The JSON Schema called ``name``.

    Raises:
        KeyError: no such schema.
    """
    if name == INVENTORY:
        from brctl.schemas.inventory import inventory_schema

        return inventory_schema()
    return DOCUMENTS[name]
