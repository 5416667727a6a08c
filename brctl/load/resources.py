"""Find brctl's shipped data (playbooks, man pages) in a wheel install or a checkout.

The wheel installs ``playbooks/*.yaml`` to ``<prefix>/share/brctl/playbooks`` and the
man pages to ``<prefix>/share/man/man1|5``; a checkout has them at the top level.
"""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

import brctl

_SHARE = {"playbooks": ("brctl", "playbooks"), "man": ("man",),
          "examples": ("brctl", "examples")}  # under <prefix>/share


def _prefixes() -> list[Path]:
    seen: list[Path] = []
    for raw in (sysconfig.get_path("data"), sys.prefix, sys.base_prefix):
        path = Path(raw)
        if path not in seen:
            seen.append(path)
    return seen


def data_dir(name: str) -> Path | None:
    """The installed ``share/...`` directory for ``name``, else the checkout's, else None."""
    for prefix in _prefixes():
        candidate = prefix.joinpath("share", *_SHARE[name])
        if candidate.is_dir():
            return candidate
    checkout = Path(brctl.__file__).resolve().parent.parent / name
    return checkout if checkout.is_dir() else None


def example(name: str) -> Path | None:
    """A shipped example inventory (``local.yaml``, ``inventory.example.yaml``), or None."""
    found = data_dir("examples")
    if found is not None and (found / name).is_file():
        return found / name
    top = Path(brctl.__file__).resolve().parent.parent / name  # a checkout's inventory.example.yaml
    return top if top.is_file() else None
