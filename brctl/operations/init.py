"""``brctl init``: write a shipped example inventory where brctl looks for one."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from brctl.core.errors import ExitCode, InputError
from brctl.load.resources import example


@dataclass(frozen=True)
class InitReport:
    """What ``init`` wrote."""

    path: str
    example: str

    exit_code = ExitCode.OK

    def to_json(self) -> dict[str, Any]:
        """``{path, example}``."""
        return {"path": self.path, "example": self.example}


def write_example(name: str, dest: Path, *, force: bool) -> InitReport:
    """Copy the shipped example ``name`` to ``dest`` (never over a file unless ``force``).

    Raises:
        InputError: ``dest`` exists (without ``force``), cannot be written, or the
            example is not installed.
    """
    source = example(name)
    if source is None:
        raise InputError(f"init: the example {name} is not installed with this brctl",
                         hint="reinstall brctl from its wheel or a checkout")
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if force else os.O_EXCL)
    try:
        fd = os.open(dest, flags, 0o644)
    except FileExistsError:
        raise InputError(f"init: {dest} exists; not overwritten",
                         hint="give another --output FILE, or --force to replace it") from None
    except OSError as exc:
        raise InputError(f"init: {dest}: {exc.strerror}") from None
    with os.fdopen(fd, "wb") as out:
        out.write(source.read_bytes())
    return InitReport(str(dest), name)
