"""One exception root and the exit-code contract (the table in README.md and brctl(1))."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """The only exit codes brctl uses; they never depend on counts."""

    OK = 0
    FINDINGS = 1
    USAGE = 2
    INCOMPLETE = 3
    REFUSED = 4
    INTERNAL = 70
    INTERRUPTED = 130

    @classmethod
    def worst(cls, *codes: ExitCode) -> ExitCode:
        """The one that wins when a run has several outcomes: 4 > 3 > 1 > 0 (0 when none)."""
        return max(codes, key=_PRECEDENCE.index, default=cls.OK)


# A report's outcomes, weakest first: a refusal says most (brctl would not act), then no
# answer (no verdict), then findings. Usage and internal errors end a run, never fold.
_PRECEDENCE = (ExitCode.OK, ExitCode.FINDINGS, ExitCode.INCOMPLETE, ExitCode.REFUSED)


def exit_code_of(*, refused: bool = False, incomplete: bool = False,
                 findings: bool = False) -> ExitCode:
    """Every report's exit code from what it found: 4 when brctl refused a machine (a
    safety rule), else 3 when something gave no answer, else 1 for findings, else 0."""
    return ExitCode.worst(*(code for code, seen in ((ExitCode.REFUSED, refused),
                                                    (ExitCode.INCOMPLETE, incomplete),
                                                    (ExitCode.FINDINGS, findings)) if seen))


class BrctlError(Exception):
    """An expected failure; the CLI prints ``brctl: error: <message>`` and exits with ``code``.

    Args:
        message: what went wrong, naming what and where.
        hint: optional next step for the user.
        file: the input file at fault (an inventory, a playbook, a plan), if any.
        key: the key path in it (``nodes[2].gpus``), if any.
        line: its line (1-based), if known.

    ``file``/``key``/``line`` are the machine-readable "where" of ``brctl.error/1``.
    """

    code: ExitCode = ExitCode.USAGE

    def __init__(self, message: str, *, hint: str | None = None, file: str | None = None,
                 key: str | None = None, line: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.file = file
        self.key = key
        self.line = line


class UsageError(BrctlError):
    """Bad options or arguments."""


class InputError(BrctlError):
    """A bad inventory, playbook, node set or other input (file, key path and expected form)."""


class RemoteDataError(BrctlError):
    """A node returned something brctl cannot use (garbage, wrong schema)."""


class IncompleteError(BrctlError):
    """No verdict could be reached: nodes unreachable or groups that could not run."""

    code = ExitCode.INCOMPLETE


class RefusedError(BrctlError):
    """A safety limit stopped an action (eviction cap, live job, another daemon's lease)."""

    code = ExitCode.REFUSED


class InterruptedRun(BrctlError):
    """Ctrl-C during a fan-out; the message names the nodes that had not finished."""

    code = ExitCode.INTERRUPTED
