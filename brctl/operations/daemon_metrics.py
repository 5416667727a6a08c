"""Prometheus ``/metrics`` for ``brctl daemon run`` (prometheus-client).

A private ``CollectorRegistry`` (no global default registry) whose collector
reads the daemon's state at scrape time: node health, events by kind, actions by
kind and state, standby pool size, ETTR (cumulative and 1 h). Served on
``daemon.metrics_address:metrics_port`` (127.0.0.1 by default: the metrics name
machines). prometheus-client is imported only when the daemon starts.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, Optional

from brctl.analysis.ettr import ratio
from brctl.operations.daemon_state import DaemonState

HEALTH_VALUE = {"ok": 1.0, "warn": 0.5, "fail": 0.0}  # anything else (no verdict): -1


class _Collector:
    """Builds the metric families from the state database at each scrape."""

    def __init__(self, state: DaemonState, health: Callable[[], dict[str, str]],
                 pool: Callable[[], int]) -> None:
        self.state, self.health, self.pool = state, health, pool

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        job = self.state.job
        g = GaugeMetricFamily("brctl_node_health", "1 ok, 0.5 warn, 0 fail, -1 no verdict",
                              labels=["job", "node", "status"])
        for node, status in self.health().items():
            g.add_metric([job, node, status], HEALTH_VALUE.get(status, -1.0))
        yield g
        c = CounterMetricFamily("brctl_daemon_events", "Events recorded, by kind",
                                labels=["job", "kind"])
        for kind, n in sorted(self.state.event_counts().items()):
            c.add_metric([job, kind], float(n))
        yield c
        a = CounterMetricFamily("brctl_daemon_actions", "Actions by kind and state",
                                labels=["job", "kind", "state"])
        for (kind, st), n in sorted(Counter((x.kind, x.state) for x in self.state.actions()).items()):
            a.add_metric([job, kind, st], float(n))
        yield a
        yield GaugeMetricFamily("brctl_standby_ready", "Checked standby machines ready to swap in",
                                value=float(self.pool()), labels=None)
        e = GaugeMetricFamily("brctl_ettr", "Effective training time ratio",
                              labels=["job", "window"])
        intervals = self.state.intervals()
        now = time.time()
        for label, value in (("all", ratio(intervals)), ("1h", ratio(intervals, now - 3600, now))):
            if value is not None:
                e.add_metric([job, label], value)
        yield e


class MetricsServer:
    """The /metrics endpoint; ``close`` stops it."""

    def __init__(self, state: DaemonState, address: str, port: int,
                 health: Callable[[], dict[str, str]], pool: Callable[[], int]) -> None:
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
        self.registry.register(_Collector(state, health, pool))
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
