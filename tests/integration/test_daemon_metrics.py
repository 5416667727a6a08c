"""``/metrics`` of a real ``brctl daemon run``, scraped over HTTP and parsed strictly.

The daemon runs as its own process on two local machines whose job log says which
step it is at; the test scrapes the endpoint as Prometheus would, parses the text
with prometheus_client's parser and checks every line against the exposition
format, then halts the daemon through a real hand eviction (a cap of 0 restarts
without progress) and sees ``brctl_daemon_halted`` turn 1.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Optional

import pytest
import yaml

from tests.kits.cluster import scaled

ROOT = Path(__file__).resolve().parents[2]
# one sample line of the text exposition format: name{label="value",...} number
SAMPLE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\[\\"n])*"'
                    r'(,[a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\[\\"n])*")*,?)?\})? '
                    r'(-?[0-9.e+-]+|NaN|[+-]Inf)$')
META = re.compile(r"^# (HELP [a-zA-Z_:][a-zA-Z0-9_:]* .*|TYPE [a-zA-Z_:][a-zA-Z0-9_:]* "
                  r"(counter|gauge|histogram|summary|untyped))$")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> Optional[str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            return str(resp.read().decode())
    except OSError:
        return None


def families(text: str) -> dict[str, Any]:
    from prometheus_client.parser import text_string_to_metric_families

    for line in text.splitlines():
        assert SAMPLE.match(line) or META.match(line), f"not exposition format: {line!r}"
    return {f.name: f for f in text_string_to_metric_families(text)}


def wait_for(what: str, probe: Any, proc: subprocess.Popen[str], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = probe()
        if got:
            return got
        assert proc.poll() is None, f"the daemon exited {proc.returncode} before {what}"
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def metrics_port() -> int:
    pytest.importorskip("prometheus_client")
    return free_port()


def test_metrics_carry_the_job_everywhere_and_show_step_poll_build_and_halt(
        tmp_path: Path, metrics_port: int) -> None:
    log = tmp_path / "train.log"
    log.write_text("".join(f"iteration {i} loss 2.0\n" for i in range(1, 42)))
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump({
        "nodes": [{"name": "n[1-2]", "connection": "local", "gpus": 1}],
        "job": {"name": "llm-70b", "nodes": "n[1-2]", "log_paths": [str(log)],
                "restart_command": ["true"]},
        "health": {"checks": ["disk"]},
        "daemon": {"poll_interval": 0.5, "metrics_port": metrics_port,
                   "max_restarts_without_progress": 0},
    }))
    env = dict(os.environ, BRCTL_STATE=str(tmp_path / "state"), PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "brctl", "-i", str(inv), "daemon", "run",
                             "--dry-run", "--for", str(int(scaled(120)))],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    started = time.time()
    try:
        text = wait_for("a poll on /metrics", lambda: (t := scrape(metrics_port))
                        and "brctl_daemon_last_poll_timestamp_seconds{" in t and t, proc, scaled(60))
        got = families(text)
        for name in ("brctl_node_health", "brctl_daemon_events", "brctl_daemon_actions",
                     "brctl_standby_ready", "brctl_daemon_halted",
                     "brctl_daemon_last_poll_timestamp_seconds", "brctl_job_step",
                     "brctl_build_info"):
            assert name in got, f"{name} missing from /metrics"
        samples = [s for f in got.values() for s in f.samples
                   if s.name.startswith("brctl_")]
        assert samples and all(s.labels.get("job") == "llm-70b" for s in samples), samples
        value = {s.name: s for s in samples}
        assert value["brctl_job_step"].value == 41
        assert started - 1 <= value["brctl_daemon_last_poll_timestamp_seconds"].value <= time.time()
        assert value["brctl_daemon_halted"].value == 0
        assert value["brctl_standby_ready"].value == 0
        import brctl

        assert value["brctl_build_info"].value == 1
        assert value["brctl_build_info"].labels["version"] == brctl.__version__
        # a hand eviction needs a restart, which the cap of 0 forbids: the daemon halts
        evict = subprocess.run([sys.executable, "-m", "brctl", "-i", str(inv), "evict", "n2",
                                "--reason", "test", "--force"], capture_output=True, text=True,
                               env=env, timeout=scaled(60))
        assert evict.returncode == 0, evict.stderr
        halted = wait_for("brctl_daemon_halted 1", lambda: (t := scrape(metrics_port))
                          and 'brctl_daemon_halted{job="llm-70b"} 1.0' in t and t, proc, scaled(60))
        families(halted)  # still valid exposition text
    finally:
        proc.terminate()
        try:
            proc.communicate(timeout=scaled(30))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
