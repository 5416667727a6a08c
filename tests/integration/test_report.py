"""``brctl report`` end to end: a real daemon loop writes the state database (scripted
machines, real SQLite, real hook processes), the real CLI writes the page, and a real
headless Chromium renders it; the test asserts on the DOM the browser built.

Chromium is Debian's ``chromium`` (``scripts/test`` installs it as root); where no
browser can be installed the browser tests are skipped with the reason, and in CI
(``BRCTL_REQUIRE_INTEGRATION=1``, root) a missing browser is a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, ClassVar, Optional

import pytest
import yaml

from brctl.analysis.daemon.policy import Finding
from brctl.load.inventory import load_inventory
from brctl.operations.daemon.loop import Daemon
from brctl.operations.jobadapter import JobAdapter
from brctl.operations.ledger.state import DaemonState
from brctl.operations.report import BROWSERS
from brctl.render.report import duration
from brctl.state import Store
from tests.conftest import validated
from tests.kits.cluster import scaled
from tests.process.test_daemon_loop import RECORD, Clock, Script, tick

ROOT = Path(__file__).resolve().parents[2]
# What a compromised machine might answer: markup that would run if it reached the page raw.
HOSTILE = ("<script>document.documentElement.dataset.pwned='script'</script>"
           "<img src=x onerror=\"document.documentElement.dataset.pwned='img'\">\x1b[2J")


def chromium() -> str:
    found = next((p for name in BROWSERS if (p := shutil.which(name))), None)
    if found:
        return found
    if os.environ.get("BRCTL_REQUIRE_INTEGRATION") == "1" and os.geteuid() == 0:
        pytest.fail("no Chromium on $PATH: scripts/test installs Debian's chromium as root")
    pytest.skip("no Chromium on $PATH and none can be installed here (scripts/test installs "
                "Debian's chromium as root)")


def dump_dom(browser: str, page: Path) -> str:
    """The DOM Chromium built from ``page`` after its scripts ran, serialised."""
    with tempfile.TemporaryDirectory(prefix="brctl-test-chromium-") as profile:
        argv = [browser, "--headless", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", f"--user-data-dir={profile}",
                *(["--no-sandbox"] if os.geteuid() == 0 else []),
                "--dump-dom", page.resolve().as_uri()]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=scaled(120),
                              check=False, start_new_session=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    children: list[Element] = field(default_factory=list)
    text: str = ""

    def all(self, tag: str, **attrs: str) -> list[Element]:
        found = [self] if self.tag == tag and all(
            self.attrs.get(k.rstrip("_")) == v for k, v in attrs.items()) else []
        for child in self.children:
            found += child.all(tag, **attrs)
        return found

    def one(self, tag: str, **attrs: str) -> Element:
        found = self.all(tag, **attrs)
        assert len(found) == 1, (tag, attrs, len(found))
        return found[0]

    def content(self) -> str:
        return self.text + "".join(c.content() for c in self.children)


class Tree(HTMLParser):
    """A small DOM of the browser's serialisation (stdlib only)."""

    VOID: ClassVar[set[str]] = {"meta", "img", "br", "input", "link", "hr", "line", "rect", "polyline"}

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Element("#root", {})
        self.stack = [self.root]
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, Optional[str]]]) -> None:
        el = Element(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(el)
        if tag not in self.VOID:
            self.stack.append(el)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, Optional[str]]]) -> None:
        self.stack[-1].children.append(Element(tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self.stack) - 1, 0, -1):
            if self.stack[i].tag == tag:
                del self.stack[i:]
                return

    def handle_data(self, data: str) -> None:
        self.stack[-1].children.append(Element("#text", {}, text=data))


def write_inventory(tmp_path: Path) -> Path:
    log, py = tmp_path / "hooks.jsonl", sys.executable
    doc = {
        "nodes": [{"name": "n[1-4]", "connection": "local", "gpus": 2}],
        "standby": [{"name": "s[1-2]", "connection": "local", "gpus": 2}],
        "job": {"name": "llm", "nodes": "n[1-4]", "tp": 2, "pp": 2,
                "restart_command": [py, "-c", RECORD, str(log), "restart", "{nodes}"],
                "evict_command": [py, "-c", RECORD, str(log), "evict", "{node}", "{reason}"]},
        "daemon": {"poll_interval": 1, "stall_after": 5, "startup_grace": 5, "metrics_port": 0,
                   "max_restarts_without_progress": 5},
    }
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@dataclass
class TimedScript(Script):
    """The scripted machines, with the time their work takes on the daemon's clock."""

    clock: Clock = field(default_factory=Clock)

    def restore(self, evicted: Any, standby: Any, members: Any) -> str:
        self.clock.now += 40  # copying the evicted machine's shards onto the standby
        return super().restore(evicted, standby, members)

    def diagnose(self, nodes: Any, history: Any) -> Finding:
        self.clock.now += 15  # the ladder's stages
        return super().diagnose(nodes, history)

    def rollback(self, nodes: Any, version: str, sha256: str) -> str:
        self.clock.now += 5
        return super().rollback(nodes, version, sha256)


def record_story(inv_path: Path, state: Path) -> None:
    """Training; a GPU fault on n3 with a hostile reason (evict, swap s1 in, restart);
    training; a crash diagnose blames on user code (roll back, restart); training."""
    inv = load_inventory(inv_path)
    store = Store(state)
    try:
        clock = Clock()
        script = TimedScript(clock=clock)
        daemon = Daemon(inv, DaemonState(store, "llm"), script, JobAdapter(inv, 30), owner="t",
                        clock=clock)
        daemon.start()
        for _ in range(20):
            tick(daemon, clock, script, dt=10)
        script.evict = {"n3": f"xid 79 {HOSTILE}"}
        tick(daemon, clock, script, steps=0, dt=10)
        script.evict = {}
        for _ in range(2):
            tick(daemon, clock, script, steps=0, dt=2)  # relaunching: no step yet
        for _ in range(20):
            tick(daemon, clock, script, dt=10)
        script.running = False
        script.diagnose_finding = Finding("rollback", (), "Traceback in train.py: user code",
                                          "user_code")
        tick(daemon, clock, script, steps=0, dt=10)
        script.running = True
        for _ in range(2):
            tick(daemon, clock, script, steps=0, dt=2)
        for _ in range(20):
            tick(daemon, clock, script, dt=10)
        daemon.stop()
    finally:
        store.close()


def brctl(*args: str, state: Path, path: Optional[str] = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "BRCTL_STATE": str(state), "PYTHONPATH": str(ROOT)}
    if path is not None:
        env["PATH"] = path
    return subprocess.run([sys.executable, "-m", "brctl", *args], capture_output=True, text=True,
                          timeout=scaled(120), env=env, check=False)


def test_report_page_rendered_by_chromium_tells_the_incident(tmp_path: Path) -> None:
    browser = chromium()
    inv, state = write_inventory(tmp_path), tmp_path / "state"
    record_story(inv, state)
    page = tmp_path / "out" / "llm.html"
    page.parent.mkdir()
    res = brctl("-i", str(inv), "--json", "report", "-o", str(page), state=state)
    assert res.returncode == 0, res.stderr
    doc = validated(json.loads(res.stdout))
    assert doc["schema"] == "brctl.report/1" and doc["html"] == str(page) and doc["png"] is None
    assert doc["nodes"]["n3"]["roles"] == ["evicted", "swapped out"]
    assert doc["nodes"]["s1"]["roles"] == ["swapped in", "in the job"]
    dom = Tree(dump_dom(browser, page)).root
    html = dom.one("html")
    assert html.attrs.get("data-ready") == "1"  # the page's own script ran in the browser
    assert "data-pwned" not in html.attrs  # the hostile reason did not
    assert not [s for s in dom.all("script") if "pwned" in s.content()]
    assert not dom.all("img")
    # the ETTR chart: the axis 0-100 %, a line, the lost time coloured by cause
    chart = dom.one("svg", id="ettr-chart")
    assert [t.content() for t in chart.all("text") if t.attrs.get("class") == "y-tick"] == [
        "0%", "25%", "50%", "75%", "100%"]
    assert len([t for t in chart.all("text") if t.attrs.get("class") == "x-tick"]) == 7
    assert chart.all("polyline")
    causes = {r.attrs["data-cause"] for r in chart.all("rect")}
    assert {"productive", "detection", "standby", "restart"} <= causes, causes
    assert len([m for m in chart.all("line") if m.attrs.get("class") == "incident-mark"]) == 2
    # lost time by cause: every cause a row, the seconds add up to the summary
    lost = {r.attrs["data-cause"]: r for r in dom.one("table", id="lost").all("tr")
            if "data-cause" in r.attrs}
    assert list(lost) == ["detection", "diagnosis", "standby", "restart", "replay", "human"]
    seconds = {c: int(r.all("td")[1].attrs["data-seconds"]) for c, r in lost.items()}
    assert seconds["restart"] > 0 and seconds["standby"] > 0
    assert sum(seconds.values()) == pytest.approx(sum(doc["lost_seconds"].values()), abs=6)
    # the incident timeline: detections, decisions, the eviction, swap, restarts, rollback
    rows = [r for r in dom.one("table", id="incidents").all("tr") if r.attrs.get("data-nodes")
            is not None]
    kinds = [r.all("td")[1].content() for r in rows]
    for kind in ("gpu_fault", "decision", "action_evict", "action_restore", "action_swap",
                 "action_restart", "crash", "analysis", "action_rollback"):
        assert kind in kinds, (kind, kinds)
    fault = rows[kinds.index("gpu_fault")]
    assert fault.all("td")[2].content() == "n3"
    reason = fault.all("td")[4].content()
    assert "<script>document.documentElement.dataset.pwned='script'</script>" in reason
    assert "\\x1b[2J" in reason  # a control character shown, not sent
    rollback = rows[kinds.index("analysis")].all("td")[4].content()
    assert "rollback: Traceback in train.py: user code" in rollback
    # the machines involved, with what happened to each
    machines = {r.attrs["data-node"]: r for r in dom.one("table", id="machines").all("tr")
                if "data-node" in r.attrs}
    assert machines["n3"].all("td")[1].content() == "evicted, swapped out"
    assert machines["s1"].all("td")[1].content() == "swapped in, in the job"
    assert "pwned" in machines["n3"].all("td")[5].content()  # as text
    # the summary agrees with the JSON document
    assert dom.one("span", id="incident-count").content() == str(doc["incidents"]) == "2"
    assert dom.one("p", id="filter-note").content() == f"{len(rows)} entries"


def test_report_png_is_taken_by_chromium_and_refused_clearly_without_one(tmp_path: Path) -> None:
    inv, state = write_inventory(tmp_path), tmp_path / "state"
    record_story(inv, state)
    page = tmp_path / "llm.html"
    bare = tmp_path / "bin"
    bare.mkdir()  # a $PATH with no browser on it
    res = brctl("-i", str(inv), "report", "-o", str(page), "--png", state=state, path=str(bare))
    assert res.returncode == 2 and "no Chromium" in res.stderr and "chromium" in res.stderr
    assert not page.exists()  # refused before anything was written
    chromium()
    res = brctl("-i", str(inv), "report", "-o", str(page), "--png", state=state)
    assert res.returncode == 0, res.stderr
    picture = page.with_suffix(".png").read_bytes()
    assert picture.startswith(b"\x89PNG\r\n\x1a\n") and len(picture) > 10_000
    width, height = int.from_bytes(picture[16:20], "big"), int.from_bytes(picture[20:24], "big")
    assert (width, height) == (1280, 1600)
    assert f"wrote {page} and {page.with_suffix('.png')}" in res.stdout


def test_ettr_in_the_terminal_has_an_axis_and_the_lost_time_by_cause(tmp_path: Path) -> None:
    inv, state = write_inventory(tmp_path), tmp_path / "state"
    record_story(inv, state)
    res = brctl("-i", str(inv), "--utc", "ettr", "--window", "100", "--points", "40",
                state=state)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("job llm: ETTR ") and " lost); last 1m 40s: " in lines[0]
    assert lines[1] == "ETTR over a sliding 1m 40s window:"
    assert lines[2].startswith(" 100% ┤") and lines[4].startswith("  50% ┤")
    assert lines[6].startswith("   0% └┬") and len(lines[2]) == len(" 100% ┤") + 40
    assert lines[7].lstrip().startswith("-") and lines[7].endswith("end")
    assert lines[8].strip().startswith("from ") and lines[8].endswith("Z")
    assert lines[9].startswith("lost time by cause (")
    causes = [ln.split()[0] for ln in lines[10:16]]
    assert causes == ["detection", "diagnosis", "standby", "restart", "replay", "human"]
    doc = brctl("-i", str(inv), "--json", "ettr", state=state)
    body = validated(json.loads(doc.stdout))
    restart = body["lost_seconds"]["restart"]
    shown = duration(restart).split()
    assert restart > 0 and lines[13].split()[:1 + len(shown)] == ["restart", *shown]


def test_simulate_page_is_the_reports_picture_rendered_by_chromium(tmp_path: Path) -> None:
    """``brctl simulate -o``: the report's chart (axis, one windowed-ETTR line per sweep
    value) and lost-time table (one per value, a row per cause), in a real browser."""
    from brctl.analysis.daemon.simulate import CAUSES

    browser = chromium()
    page = tmp_path / "sim.html"
    res = brctl("--json", "simulate", "--machines", "300", "--days", "6", "--runs", "2",
                "--window", "12h", "--sweep", "standby.size=0,4", "-o", str(page),
                state=tmp_path / "state")
    assert res.returncode == 0, res.stderr
    doc = validated(json.loads(res.stdout))
    assert doc["window"] == 43200 and [len(r["ettr_series"]) for r in doc["rows"]] == [12, 12]
    dom = Tree(dump_dom(browser, page)).root
    assert dom.one("html").attrs.get("data-ready") == "1"
    chart = dom.one("svg", id="ettr-chart")
    assert [t.content() for t in chart.all("text") if t.attrs.get("class") == "y-tick"] == [
        "0%", "25%", "50%", "75%", "100%"]
    xticks = [t.content() for t in chart.all("text") if t.attrs.get("class") == "x-tick"]
    assert len(xticks) == 7 and xticks[0] == "day 0" and xticks[-1] == "day 6"
    lines = chart.all("polyline")
    assert sorted({p.attrs["data-value"] for p in lines}) == ["0", "4"]
    # one row per sweep value, ETTR as the JSON has it
    rows = [r for r in dom.one("table", id="sweep").all("tr") if "data-value" in r.attrs]
    assert [r.attrs["data-value"] for r in rows] == ["0", "4"]
    for row, body in zip(rows, doc["rows"]):
        assert row.all("td")[1].content() == f"{body['ettr']:.2%}"
    # lost time by cause: a table per value, every simulated cause a row, seconds as the JSON's
    tables = [t for t in dom.all("table") if t.attrs.get("class") == "lost"]
    assert [t.attrs["data-value"] for t in tables] == ["0", "4"]
    for table, body in zip(tables, doc["rows"]):
        causes = {r.attrs["data-cause"]: r for r in table.all("tr") if "data-cause" in r.attrs}
        assert list(causes) == list(CAUSES)
        for cause, row in causes.items():
            assert int(row.all("td")[1].attrs["data-seconds"]) == pytest.approx(
                body["lost_seconds"][cause], abs=1)
    resolved = [r for r in dom.one("table", id="resolved").all("tr") if "data-value" in r.attrs]
    assert [r.attrs["data-value"] for r in resolved] == ["0", "4"]
