"""I/O orchestration of each subcommand; returns dataclasses and never prints."""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

Track = Callable[[str, Sequence[str]], Callable[[Any], None]]
"""Progress of a run in stages: ``track(stage, machines)`` says a stage starts on those
machines and returns its ``advance(result)``, called as each machine finishes (the fan-out's
``on_done``). The command passes ``Output.stages``' tracker; operations never draw."""


@dataclass(frozen=True)
class Finished:
    """A machine whose part of a stage is over, for an ``advance`` that is not fed a
    fan-out result (a copy done when the last of its lanes is)."""

    node: str


def untracked(_stage: str, _machines: Sequence[str]) -> Callable[[Any], None]:
    """The ``Track`` that shows nothing."""
    return _ignore


def _ignore(_result: Any = None) -> None:
    """An ``advance`` that shows nothing."""
