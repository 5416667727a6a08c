"""``HookRun``: the record of one controller-side hook (a job adapter command, a built-in
scheduler hook, update's restart hook), kept in the action log."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class HookRun:
    """What one controller-side hook (a job adapter command, update's restart hook) did."""

    argv: tuple[str, ...]
    exit_code: Optional[int]  # None: it timed out (and was killed)
    stdout: str
    stderr: str
    seconds: float

    @property
    def ok(self) -> bool:
        """Exited 0."""
        return self.exit_code == 0

    @property
    def output(self) -> str:
        """stdout then stderr, for one-line reasons."""
        return "\n".join(part for part in (self.stdout, self.stderr) if part.strip())

    def to_json(self) -> dict[str, Any]:
        """``{argv, exit_code, stdout, stderr, seconds}``."""
        return {"argv": list(self.argv), "exit_code": self.exit_code, "stdout": self.stdout,
                "stderr": self.stderr, "seconds": round(self.seconds, 3)}
