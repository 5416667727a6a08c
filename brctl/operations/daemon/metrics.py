"""Prometheus ``/metrics`` for ``brctl daemon run`` (prometheus-client).

A private ``CollectorRegistry`` (no global default registry) whose collector
reads the daemon's state at scrape time; every family carries the ``job`` label:

- ``brctl_node_health{node,status}``: 1 ok, 0.5 warn, 0 fail, -1 no verdict.
- ``brctl_daemon_events_total{kind}``; ``brctl_daemon_actions_total{kind,state}``:
  actions of the job's whole history that reached each final state (done, failed,
  refused, abandoned, unknown, skipped: a row reaches one once and keeps it, so the
  counter never decreases and ``increase()``/``rate()`` count real actions).
- ``brctl_daemon_actions_in_flight{kind,state}``: actions written as ``intent``
  and not finished yet (a gauge: it goes down when they finish).
- ``brctl_standby_ready``: checked standbys ready to swap in.
- ``brctl_ettr{window="all"|"1h"}``: effective training time ratio.
- ``brctl_daemon_halted``: 1 while a cap holds the daemon back (it stays up; a
  human must look), else 0.
- ``brctl_daemon_last_poll_timestamp_seconds``: when the loop last polled (a
  daemon that stopped polling: ``time() - x > 3 * poll_interval``).
- ``brctl_job_step``: the job's last training step seen (the stall alert:
  ``changes(brctl_job_step[30m]) == 0``); absent until a step is seen.
- ``brctl_build_info{version,python}``: 1.

Served on ``daemon.metrics_address:metrics_port`` (127.0.0.1 by default: the
metrics name machines). prometheus-client is imported only when the daemon starts.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

import brctl
from brctl.analysis.ettr import ratio
from brctl.operations.ledger.state import FINAL, INTENT, DaemonState

HEALTH_VALUE = {"ok": 1.0, "warn": 0.5, "fail": 0.0}  # anything else (no verdict): -1


@dataclass(frozen=True)
class DaemonView:
    """What the running loop knows that the state database does not (read at each scrape)."""

    health: Mapping[str, str] = field(default_factory=dict)  # node → last health status
    standby_ready: int = 0
    halted: Optional[str] = None  # why a cap holds the daemon back
    last_poll: Optional[float] = None
    step: Optional[int] = None  # the job's last step seen


class _Collector:
    """Builds the metric families from the state database and the loop at each scrape."""

    def __init__(self, state: DaemonState, view: Callable[[], DaemonView]) -> None:
        self.state, self.view = state, view

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        job, view = self.state.job, self.view()
        g = GaugeMetricFamily("brctl_node_health", "1 ok, 0.5 warn, 0 fail, -1 no verdict",
                              labels=["job", "node", "status"])
        for node, status in view.health.items():
            g.add_metric([job, node, status], HEALTH_VALUE.get(status, -1.0))
        yield g
        c = CounterMetricFamily("brctl_daemon_events", "Events recorded, by kind",
                                labels=["job", "kind"])
        for kind, n in sorted(self.state.event_counts().items()):
            c.add_metric([job, kind], float(n))
        yield c
        counts = self.state.action_counts()  # the whole history, not the newest rows
        a = CounterMetricFamily("brctl_daemon_actions",
                                "Actions that reached each final state, by kind",
                                labels=["job", "kind", "state"])
        flight = GaugeMetricFamily("brctl_daemon_actions_in_flight",
                                   "Actions begun (intent) and not finished, by kind",
                                   labels=["job", "kind", "state"])
        for (kind, st), n in sorted(counts.items()):
            if st in FINAL:
                a.add_metric([job, kind, st], float(n))
            elif st == INTENT:
                flight.add_metric([job, kind, st], float(n))
        yield a
        yield flight
        ready = GaugeMetricFamily("brctl_standby_ready", "Checked standby machines ready to swap in",
                                  labels=["job"])
        ready.add_metric([job], float(view.standby_ready))
        yield ready
        e = GaugeMetricFamily("brctl_ettr", "Effective training time ratio",
                              labels=["job", "window"])
        intervals = self.state.intervals()
        now = time.time()
        for label, value in (("all", ratio(intervals)), ("1h", ratio(intervals, now - 3600, now))):
            if value is not None:
                e.add_metric([job, label], value)
        yield e
        yield from self._loop(job, view)

    @staticmethod
    def _loop(job: str, view: DaemonView) -> Iterator[Any]:
        """The loop's own families: halted, last poll, the job's step, the build."""
        from prometheus_client.core import GaugeMetricFamily

        halted = GaugeMetricFamily("brctl_daemon_halted",
                                   "1 while a safety cap holds the daemon back (a human must look)",
                                   labels=["job"])
        halted.add_metric([job], 1.0 if view.halted else 0.0)
        yield halted
        polled = GaugeMetricFamily("brctl_daemon_last_poll_timestamp_seconds",
                                   "Unix time of the daemon's last poll", labels=["job"])
        if view.last_poll is not None:
            polled.add_metric([job], view.last_poll)
        yield polled
        step = GaugeMetricFamily("brctl_job_step", "The job's last training step seen",
                                 labels=["job"])
        if view.step is not None:
            step.add_metric([job], float(view.step))
        yield step
        build = GaugeMetricFamily("brctl_build_info", "brctl's version and Python (always 1)",
                                  labels=["job", "version", "python"])
        build.add_metric([job, brctl.__version__, platform.python_version()], 1.0)
        yield build


class MetricsServer:
    """The /metrics endpoint; ``close`` stops it."""

    def __init__(self, state: DaemonState, address: str, port: int,
                 view: Callable[[], DaemonView]) -> None:
        """Start serving (raises OSError when the port is taken, InputError without
        prometheus_client)."""
        try:
            from prometheus_client import CollectorRegistry, start_http_server
        except ImportError:
            from brctl.core.errors import InputError

            raise InputError("daemon.metrics_port is set but prometheus_client is not installed",
                             hint="pip install 'brctl[daemon]', or set daemon.metrics_port: 0 "
                                  "to run without /metrics") from None

        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(state, view))
        self._server: Optional[Any] = None
        self._thread: Optional[Any] = None
        started = start_http_server(port, addr=address, registry=self.registry)
        if isinstance(started, tuple):  # prometheus-client >= 0.17 returns (server, thread)
            self._server, self._thread = started
        self.port = self._server.server_port if self._server is not None else port

    def close(self) -> None:
        """Stop serving."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
