"""``brctl report`` and ``brctl ettr``: read the daemon's records, write the page.

``gather`` reads the state database (ETTR intervals, the event log, the steps'
start times, the quarantine, the job's machines) into the pure
``analysis.report.incident.IncidentReport``. ``write`` puts a rendered page on
disk atomically and, with a PNG asked for, has a headless Chromium take its
picture (``screenshot``). The page itself is rendered by the caller (render layer).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from brctl.analysis.inventory import Inventory
from brctl.analysis.report.incident import Eviction, IncidentReport, incident_report, record_of
from brctl.analysis.report.lost_time import Cause, StepStart
from brctl.core.errors import ExitCode, InputError, UsageError, exit_code_of
from brctl.diagnostics import safefs
from brctl.operations import safe_write
from brctl.operations.ledger.state import SKIPPED, DaemonState
from brctl.state import Store

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# Chromium on a machine without network: no background connections, no first-run work.
_QUIET_FLAGS = ("--headless", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--hide-scrollbars", "--mute-audio")
PNG_SIZE = (1280, 1600)
_SCREENSHOT_TIMEOUT = 90.0


def gather(inv: Inventory, store: Store, *, window: float, points: int
           ) -> tuple[IncidentReport, list[dict[str, str]]]:
    """The report of ``inv``'s job from the state database (nothing is contacted), and
    the rows skipped because they did not decode (``{table, key, why}``).

    Raises:
        UsageError: no job in the inventory, or a bad window or point count.
    """
    if inv.job is None:
        raise UsageError(f"{inv.source} has no job: section")
    if window <= 0:
        raise UsageError(f"--window {window:g}: expected seconds greater than 0")
    if points < 1:
        raise UsageError(f"--points {points}: expected at least 1")
    state = DaemonState(store, inv.job.name)
    records = [record_of(e) for e in state.events(limit=-1)]  # SQLite: no limit
    steps = [StepStart(a.kind, a.created) for a in state.actions(limit=-1)
             if a.kind != "plan" and a.state != SKIPPED]
    evictions = [Eviction(e.node, e.at, e.reason, e.source, e.operator, e.released)
                 for e in state.eviction_history() if e.job == inv.job.name]
    report = incident_report(inv.job.name, state.intervals(), records, steps, evictions,
                             state.members(inv.job.nodes), inv.job.nodes, window=window,
                             points=points)
    return report, [d.to_json() for d in state.skipped()]


@dataclass(frozen=True)
class EttrReport:
    """``brctl ettr``: the cumulative and windowed ratio, its series, lost time by cause."""

    cumulative: Optional[float]
    window: float
    window_ettr: Optional[float]
    productive_seconds: float
    observed_seconds: float
    series: tuple[tuple[float, Optional[float]], ...]
    lost: Mapping[Cause, float]
    skipped: tuple[dict[str, str], ...] = ()  # rows that did not decode: not counted

    @property
    def exit_code(self) -> ExitCode:
        """3 when rows were skipped (the figures may lack them); else 0: nothing recorded
        yet is a fact to report (the output says so), not a finding."""
        return exit_code_of(incomplete=bool(self.skipped))

    def to_json(self) -> dict[str, Any]:
        """``{cumulative, window_seconds, window, productive_seconds, observed_seconds, series,
        lost_seconds}``."""
        return {"cumulative": self.cumulative, "window_seconds": self.window,
                "window": self.window_ettr, "productive_seconds": self.productive_seconds,
                "observed_seconds": self.observed_seconds,
                "series": [{"at": t, "ettr": v} for t, v in self.series],
                "lost_seconds": dict(self.lost), "skipped_rows": list(self.skipped)}


def ettr(inv: Inventory, store: Store, *, window: float, points: int) -> EttrReport:
    """ETTR of ``inv``'s job: the same figures as the report (the window's ratio is the
    series' last sample, which ends at the last observed second)."""
    r, skipped = gather(inv, store, window=window, points=points)
    return EttrReport(r.cumulative, window, r.series[-1][1] if r.series else None,
                      r.productive_seconds, r.observed_seconds, r.series, r.lost,
                      tuple(skipped))


@dataclass(frozen=True)
class Written:
    """``brctl report``: the page on disk (and its picture), with what it shows."""

    report: IncidentReport
    html: Path
    png: Optional[Path]
    skipped: tuple[dict[str, str], ...] = ()  # rows that did not decode: not on the page

    @property
    def exit_code(self) -> ExitCode:
        """3 when rows were skipped; else 0: a report is written, also of a job with
        nothing recorded yet (it says so)."""
        return exit_code_of(incomplete=bool(self.skipped))

    def to_json(self) -> dict[str, Any]:
        """The payload of ``brctl.report/1``."""
        return {"html": str(self.html), "png": str(self.png) if self.png else None,
                **self.report.to_json(), "skipped_rows": list(self.skipped)}


def browser(environ: Mapping[str, str]) -> Optional[str]:
    """The Chromium on ``$PATH`` (the first of ``BROWSERS``), or None."""
    path = environ.get("PATH", os.defpath)
    return next((found for name in BROWSERS if (found := shutil.which(name, path=path))), None)


def write_report(inv: Inventory, store: Store, page: Callable[[IncidentReport], str],
                 html: Path, *, window: float, points: int, png: bool,
                 environ: Mapping[str, str], timeout_scale: float = 1.0) -> Written:
    """``gather`` the report, write ``page(report)`` to ``html`` (whole or not at all) and,
    with ``png``, its picture beside it (``html`` with the suffix ``.png``).

    Raises:
        UsageError: no job, bad options, or ``png`` and no Chromium on ``$PATH`` (checked
            before anything is written).
        InputError: the file cannot be written, or Chromium failed.
    """
    chromium = browser(environ) if png else None
    if png and chromium is None:
        raise UsageError("report --png: no Chromium found on $PATH (looked for "
                         f"{', '.join(BROWSERS)})",
                         hint="install Debian's chromium (apt-get install chromium), "
                              "or share the HTML page")
    report, skipped = gather(inv, store, window=window, points=points)
    text = page(report)
    write_atomic(html, text)
    picture = None
    if chromium is not None:
        picture = html.with_suffix(".png")
        screenshot(chromium, text, picture, timeout=_SCREENSHOT_TIMEOUT * timeout_scale)
    return Written(report, html, picture, tuple(skipped))


def write_atomic(path: Path, text: str) -> None:
    """``path`` replaced by ``text`` in one rename: a reader never sees half a page. As
    root into a directory others may share: reached following only root's or the
    operator's links, written by its fd (``operations.safe_write``)."""
    safe_write.replace(path, text.encode("utf-8"), "-o")


def screenshot(chromium: str, page: str, png: Path, *, timeout: float) -> None:
    """Have headless Chromium load ``page`` (HTML text, no network) and save ``png``.

    Chromium (root's, ``--no-sandbox``) loads a copy of the page brctl writes by fd into
    its private temporary directory, never the ``-o`` path: that one sits in a directory
    the job user may write, who could swap it for a link to a root-only file in between.
    Runs with a fresh profile in a temporary directory, no background networking;
    ``--no-sandbox`` only as root (Chromium refuses to start otherwise).

    Raises:
        InputError: Chromium exited non-zero, timed out, or wrote no picture.
    """
    width, height = PNG_SIZE
    with tempfile.TemporaryDirectory(prefix="brctl-chromium-") as profile:
        # Chromium writes by path, following links: into this private directory, never
        # beside the page; brctl moves the picture in through a checked directory fd.
        shot = os.path.join(profile, "shot.png")
        copy = os.path.join(profile, "page.html")
        fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(page.encode("utf-8"))
        argv = [chromium, *_QUIET_FLAGS, *(["--no-sandbox"] if os.geteuid() == 0 else []),
                f"--user-data-dir={os.path.join(profile, 'profile')}",
                f"--window-size={width},{height}", f"--screenshot={shot}",
                Path(copy).as_uri()]
        try:  # its own process group: a timeout ends Chromium's helpers too
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, text=True, start_new_session=True)
        except OSError as exc:
            raise InputError(f"report --png: cannot run {chromium}: {exc.strerror}") from None
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise InputError(f"report --png: {chromium} took longer than {timeout:.0f}s") from None
        picture = _read_picture(profile)
        if proc.returncode != 0 or not picture:
            tail = (err or "").strip().splitlines()[-3:]
            raise InputError(f"report --png: {chromium} exited {proc.returncode} without a "
                             "picture" + (f": {' / '.join(tail)}" if tail else ""))
        safe_write.replace(png, picture, "--png")


def _read_picture(profile: str) -> bytes:
    """The screenshot Chromium left in its private directory ('' when none), no link followed."""
    try:
        dfd = safefs.open_dir(safefs.resolve_path(profile, safefs.TRUSTED))
        try:
            fd = safefs.open_file(dfd, "shot.png")
        finally:
            os.close(dfd)
    except OSError:
        return b""
    with os.fdopen(fd, "rb") as fh:
        return fh.read()
