"""The daemon as separate ``brctl daemon run`` processes, killed with a real ``kill -9``.

The job's machines are local "machines" of this host (the hooks run on the
controller anyway, and what is under test is the daemon's process and its state
database): the representative subset of the crash-point harness whose unit tier
(tests/process/test_daemon_crashpoints.py) covers every step kind × boundary.

- ``kill -9`` while stop_command or restart_command runs (after the intent, the
  action begun): a new daemon takes the lease over at once (its holder's pid is
  gone, although the lease has minutes left), cannot know whether the hook took
  effect, abandons the plan with a page and halts: the hook ran exactly once.
- a hand eviction (``brctl evict``) followed by a ``kill -9`` between polls: the
  new daemon finishes it (swap a checked standby in, restart once), recorded as
  ``source: hand`` with the operator.
- the shipped unit's ``Restart*`` settings, applied by a small supervisor loop
  (these machines do not boot systemd): restarted after ``kill -9``, never after
  exit 2.
- two daemons and a ``--dry-run`` racing while a hook runs longer than the lease
  TTL: the heartbeat keeps the lease, the second daemon is refused (4), the dry
  run leaves the lease alone, the hook runs once.
- a webhook answering garbage: the plan goes on, the failure is an event, the
  webhook's secret path is shown nowhere.

Every hook appends one line to ``hooks.log`` as it starts (they count themselves);
a hook whose ``<kind>.gate`` file exists waits there until the test removes it.
"""

from __future__ import annotations

import configparser
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import pytest
import yaml

from brctl.operations.ledger.state import DaemonState
from brctl.state import Store
from tests.conftest import validated
from tests.kits.cluster import scaled

ROOT = Path(__file__).resolve().parents[2]

HOOK = r'''
import os, sys, time
here = os.path.dirname(os.path.abspath(__file__))
kind = sys.argv[1]
with open(os.path.join(here, "hooks.log"), "a") as fh:
    fh.write(" ".join(sys.argv[1:]) + "\n")
gate = os.path.join(here, kind + ".gate")
if os.path.exists(gate):
    open(os.path.join(here, kind + ".waiting"), "w").close()
    while os.path.exists(gate):
        time.sleep(0.05)
seconds = float(os.environ.get("HOOK_SLEEP_" + kind.upper(), "0") or 0)
time.sleep(seconds)
'''


def setup(tmp_path: Path, **daemon: Any) -> Path:
    """The job n[1-4] with standbys s[1-2], its hooks, and the inventory's path."""
    (tmp_path / "hook.py").write_text(HOOK)
    hook = [sys.executable, str(tmp_path / "hook.py")]
    record = "import json,sys; open(sys.argv[1],'a').write(json.dumps(sys.argv[2:])+'\\n')"
    doc = {
        "nodes": [{"name": "n[1-4]", "connection": "local", "gpus": 1}],
        "standby": [{"name": "s[1-2]", "connection": "local", "gpus": 1}],
        "job": {"name": "llm", "nodes": "n[1-4]",
                "restart_command": [*hook, "restart", "{nodes}"],
                "stop_command": [*hook, "stop", "{nodes}"],
                "evict_command": [*hook, "evict", "{node}"]},
        "health": {"checks": ["disk"]},
        "ckpt": {"dir": str(tmp_path / "ckpt")},
        "daemon": {"poll_interval": 1, "metrics_port": 0, "standby_stages": [],
                   "stall_after": 3600, "startup_grace": 3600, "command_timeout": scaled(60),
                   # long: a successor must take over because the holder is provably dead
                   "lease_ttl": scaled(300),
                   "notify_command": [sys.executable, "-c", record, str(tmp_path / "pages.jsonl"),
                                      "{kind}", "{state}", "{reason}"], **daemon},
    }
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump(doc))
    (tmp_path / "state").mkdir()
    return path


def env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return dict(os.environ, BRCTL_STATE=str(tmp_path / "state"), PYTHONPATH=str(ROOT),
                USER="oncall-alice", SUDO_USER="", **extra)


def brctl(tmp_path: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "brctl", "-i", str(tmp_path / "inv.yaml"), *args],
                          capture_output=True, text=True, timeout=scaled(120),
                          env=env(tmp_path, **extra))


def daemon(tmp_path: Path, *args: str, **extra: str) -> subprocess.Popen[str]:
    log = (tmp_path / "daemon.log").open("a")
    return subprocess.Popen([sys.executable, "-m", "brctl", "-i", str(tmp_path / "inv.yaml"),
                             "--json", "daemon", "run", "--for", str(int(scaled(300))), *args],
                            stdout=subprocess.PIPE, stderr=log, text=True, env=env(tmp_path, **extra))


def wait(what: str, pred: Callable[[], Any], tmp_path: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + scaled(timeout)
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    log = (tmp_path / "daemon.log").read_text()[-3000:] if (tmp_path / "daemon.log").exists() else ""
    raise AssertionError(f"timed out waiting for {what}\n{log}")


def events(tmp_path: Path, kind: Optional[str] = None) -> list[dict[str, Any]]:
    path = tmp_path / "state" / "daemon-events.jsonl"
    if not path.exists():
        return []
    docs = [json.loads(line) for line in path.read_text().splitlines()]
    return [d for d in docs if kind is None or d["kind"] == kind]


def hooks(tmp_path: Path) -> list[str]:
    path = tmp_path / "hooks.log"
    return path.read_text().splitlines() if path.exists() else []


def started(tmp_path: Path, proc: subprocess.Popen[str], before: int) -> dict[str, Any]:
    """Wait for ``proc``'s daemon_start (it must not exit: never refused); its detail."""
    wait("the daemon's start", lambda: proc.poll() is not None
         or len(events(tmp_path, "daemon_start")) > before, tmp_path)
    assert proc.poll() is None, (tmp_path / "daemon.log").read_text()[-2000:]
    return events(tmp_path, "daemon_start")[-1]["detail"]


def state_of(tmp_path: Path) -> tuple[Store, DaemonState]:
    store = Store(tmp_path / "state")
    return store, DaemonState(store, "llm")


def stop(proc: Optional[subprocess.Popen[str]]) -> None:
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("hook", ["stop", "restart"])
def test_kill_9_mid_hook_takeover_at_once_abandons_and_pages(tmp_path: Path, hook: str) -> None:
    setup(tmp_path)
    first = second = None
    try:
        assert brctl(tmp_path, "evict", "n3", "--reason", "xid 79").returncode == 0
        (tmp_path / f"{hook}.gate").touch()
        first = daemon(tmp_path)
        wait(f"{hook}_command under way", (tmp_path / f"{hook}.waiting").exists, tmp_path)
        first.send_signal(signal.SIGKILL)
        first.wait()
        t0 = time.monotonic()
        second = daemon(tmp_path)
        detail = started(tmp_path, second, 1)
        assert detail["took_over"] and "is gone" in detail["took_over"]  # not the lease's expiry
        assert time.monotonic() - t0 < scaled(30)
        wait("the abandoned plan", lambda: events(tmp_path, "plan_abandoned"), tmp_path)
        (tmp_path / f"{hook}.gate").unlink()  # the orphaned hook finishes on its own
        time.sleep(scaled(2))  # polls of the halted daemon: nothing runs again
        second.send_signal(signal.SIGTERM)
        out, _ = second.communicate(timeout=scaled(60))
        assert second.returncode == 0, (tmp_path / "daemon.log").read_text()[-2000:]  # SIGTERM
        assert any("abandoned" in r for r in validated(json.loads(out))["refusals"])  # halted, reporting
    finally:
        stop(first)
        stop(second)
    runs = [line.split()[0] for line in hooks(tmp_path)]
    assert runs.count(hook) == 1 and runs.count("evict") == 1  # once, even across the kill
    if hook == "stop":
        assert "restart" not in runs
    pages = [json.loads(line) for line in (tmp_path / "pages.jsonl").read_text().splitlines()]
    assert any(p[:2] == ["plan", "abandoned"] and "cannot be checked" in p[2] for p in pages)
    store, st = state_of(tmp_path)
    try:
        plan = next(a for a in st.actions() if a.kind == "plan")
        assert plan.state == "abandoned" and st.unfinished() == []
        assert st.action(f"{plan.key}/{hook}").state == "unknown"  # type: ignore[union-attr]
        swapped = hook == "restart"  # the swap comes before the restart
        assert st.members(["n1", "n2", "n3", "n4"]) == (
            ["n1", "n2", "s1", "n4"] if swapped else ["n1", "n2", "n3", "n4"])
    finally:
        store.close()


def test_hand_eviction_then_kill_9_between_polls_is_finished_by_the_next_daemon(
        tmp_path: Path) -> None:
    setup(tmp_path, poll_interval=scaled(60))  # the first daemon sleeps between polls
    first = second = None
    try:
        first = daemon(tmp_path)
        started(tmp_path, first, 0)
        wait("the first poll", lambda: brctl(tmp_path, "--json", "daemon", "status").returncode == 0
             and validated(json.loads(brctl(tmp_path, "--json", "daemon", "status").stdout))["last_poll"],
             tmp_path)
        res = brctl(tmp_path, "--json", "evict", "n2", "--reason", "ECC storm")
        assert res.returncode == 0, res.stderr
        assert "swaps a checked standby in" in validated(json.loads(res.stdout))["nodes"]["n2"]["remains"]
        first.send_signal(signal.SIGKILL)
        first.wait()
        assert [line.split()[0] for line in hooks(tmp_path)] == ["evict"]
        second = daemon(tmp_path)
        started(tmp_path, second, 1)
        wait("the restart", lambda: any(h.startswith("restart") for h in hooks(tmp_path)), tmp_path)
        wait("the plan done", lambda: events(tmp_path, "action_restart"), tmp_path)
        second.send_signal(signal.SIGTERM)
        second.communicate(timeout=scaled(60))
        assert second.returncode == 0, (tmp_path / "daemon.log").read_text()[-2000:]  # SIGTERM
    finally:
        stop(first)
        stop(second)
    assert hooks(tmp_path) == ["evict n2", "stop n1,n2,n3,n4", "restart n1,s1,n3,n4"]
    store, st = state_of(tmp_path)
    try:
        plan = next(a for a in st.actions() if a.kind == "plan")
        assert plan.state == "done" and plan.payload["source"] == "hand"
        assert plan.payload["by"] == [f"oncall-alice@{socket.gethostname()}"]
        assert [s["id"] for s in plan.payload["steps"]] == [  # no evict of ours: done by hand
            "stop", "restore/s1", "swap", "apply", "restart"]
        assert st.members([]) == ["n1", "s1", "n3", "n4"]
        assert st.quarantined()["n2"].operator == f"oncall-alice@{socket.gethostname()}"
    finally:
        store.close()


def unit_settings() -> dict[str, str]:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string((ROOT / "contrib" / "brctl-daemon.service").read_text())
    return dict(parser["Service"])


class Supervisor:
    """systemd's Restart=, RestartPreventExitStatus= for one service, as a loop.

    RestartSec is taken from the unit but capped at 0.5 s to keep the test short.
    """

    def __init__(self, start: Callable[[], subprocess.Popen[str]]) -> None:
        cfg = unit_settings()
        assert cfg["Restart"] == "always", cfg
        self.prevent = {int(c) for c in cfg["RestartPreventExitStatus"].split()}
        self.delay = min(float(cfg["RestartSec"]), 0.5)
        self.start = start
        self.exits: list[int] = []
        self.proc: Optional[subprocess.Popen[str]] = None
        self.done = threading.Event()
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.halt.is_set():
            self.proc = self.start()
            code = self.proc.wait()
            self.exits.append(code)
            if code in self.prevent or self.halt.is_set():
                break
            time.sleep(self.delay)
        self.done.set()

    def close(self) -> None:
        self.halt.set()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
        self.done.wait(scaled(60))


def test_the_units_restart_settings_restart_after_kill_9_and_never_after_exit_2(
        tmp_path: Path) -> None:
    setup(tmp_path)
    sup = Supervisor(lambda: daemon(tmp_path))
    try:
        wait("the first start", lambda: len(events(tmp_path, "daemon_start")) == 1, tmp_path)
        assert sup.proc is not None
        sup.proc.send_signal(signal.SIGKILL)
        wait("the restart", lambda: len(events(tmp_path, "daemon_start")) == 2, tmp_path)
        assert sup.exits == [-signal.SIGKILL]
        detail = events(tmp_path, "daemon_start")[-1]["detail"]
        assert detail["took_over"] and "is gone" in detail["took_over"]  # re-armed at once
    finally:
        sup.close()
    # a bad configuration: exit 2, and the supervisor gives up at once
    (tmp_path / "inv.yaml").write_text((tmp_path / "inv.yaml").read_text().replace(
        "poll_interval: 1", "poll_interval: -1"))
    bad = Supervisor(lambda: daemon(tmp_path))
    assert bad.done.wait(scaled(60)) and bad.exits == [2]


def test_two_daemons_and_a_dry_run_race_a_hook_longer_than_the_lease(tmp_path: Path) -> None:
    ttl = scaled(2)
    setup(tmp_path, lease_ttl=ttl)
    first = None
    try:
        assert brctl(tmp_path, "evict", "n4", "--reason", "bad NIC").returncode == 0
        (tmp_path / "restart.gate").touch()
        first = daemon(tmp_path)
        wait("the long restart", (tmp_path / "restart.waiting").exists, tmp_path)
        store, st = state_of(tmp_path)
        lease = st.lease()
        assert lease is not None
        deadline = time.monotonic() + 3 * ttl  # the hook outlives the TTL three times
        refused = 0
        while time.monotonic() < deadline:
            second = brctl(tmp_path, "daemon", "run", "--max-iterations", "1")
            assert second.returncode == 4 and "leased by" in second.stderr, second.stderr
            refused += 1
            dry = brctl(tmp_path, "--json", "daemon", "run", "--dry-run", "--max-iterations", "1")
            assert dry.returncode in (0, 1), dry.stderr
            now = st.lease()
            assert now is not None and now["generation"] == lease["generation"]
            assert now["owner"] == lease["owner"] and now["expires"] >= lease["expires"]
        store.close()
        (tmp_path / "restart.gate").unlink()
        wait("the restart done", lambda: events(tmp_path, "action_restart"), tmp_path)
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=scaled(60))
        assert first.returncode == 0, (tmp_path / "daemon.log").read_text()[-2000:]  # SIGTERM
    finally:
        stop(first)
    assert refused >= 1
    assert [h.split()[0] for h in hooks(tmp_path)] == ["evict", "stop", "restart"]
    assert not events(tmp_path, "lease_lost")


def test_a_webhook_answering_garbage_never_stops_the_loop(tmp_path: Path) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    answered: list[int] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    conn.recv(65536)
                    conn.sendall(b"\x00\xffNOT HTTP AT ALL\r\n\r\n")
                    answered.append(1)
                except OSError:
                    pass

    threading.Thread(target=serve, daemon=True).start()
    secret = "T0KEN-s3cr3t-path"
    setup(tmp_path, notify_webhook=f"http://127.0.0.1:{server.getsockname()[1]}/hooks/{secret}")
    try:
        assert brctl(tmp_path, "evict", "n1", "--reason", "xid 48").returncode == 0
        proc = daemon(tmp_path, "--max-iterations", "3")
        out, _ = proc.communicate(timeout=scaled(120))
    finally:
        server.close()
    assert proc.returncode == 1, (tmp_path / "daemon.log").read_text()[-2000:]
    assert answered  # the webhook was reached and answered garbage
    assert [h.split()[0] for h in hooks(tmp_path)] == ["evict", "stop", "restart"]
    failed = events(tmp_path, "notify_failed")
    assert failed and all("BadStatusLine" in " ".join(e["detail"]["errors"])
                          or "RemoteDisconnected" in " ".join(e["detail"]["errors"])
                          for e in failed), failed
    everything = out + (tmp_path / "daemon.log").read_text() + \
        (tmp_path / "state" / "daemon-events.jsonl").read_text()
    assert secret not in everything
    store, st = state_of(tmp_path)
    try:
        assert secret not in json.dumps([a.to_json() for a in st.actions()] + st.events(1000))
    finally:
        store.close()
