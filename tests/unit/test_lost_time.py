"""Lost time by cause and the data behind ``brctl report`` (pure functions)."""

from __future__ import annotations

import random

import pytest

from brctl.analysis.ettr import Interval, totals
from brctl.analysis.report.incident import Eviction, incident_report, record_of
from brctl.analysis.report.lost_time import CAUSES, Record, StepStart, attribute, lost_by_cause


def story() -> tuple[list[Interval], list[Record], list[StepStart]]:
    """A crash handled by an eviction and a swap, then a hang that ends in a replay and a
    refusal for want of a standby, then a halted daemon waiting for a human."""
    intervals = [Interval(0, 100, True), Interval(100, 400, False), Interval(400, 1000, True),
                 Interval(1000, 1300, False),
                 # not watched from 1300 to 1500: counted neither way
                 Interval(1500, 1600, False)]
    records = [Record(150, "crash", ("n2",), "training processes gone"),
               Record(200, "decision", ("n2",), "evict n2: xid 79"),
               Record(500, "fail_slow", (), "slower"),  # while training: costs nothing
               Record(1120, "hang", (), "no new step"),
               Record(1200, "refused", ("n3",), "no checked standby for n3"),
               Record(1290, "halted", (), "further actions stop")]
    steps = [StepStart("stop", 200), StepStart("evict", 210), StepStart("restore", 220),
             StepStart("swap", 260), StepStart("restart", 270), StepStart("replay", 1150)]
    return intervals, records, steps


def test_every_lost_second_has_the_cause_the_daemon_was_busy_with() -> None:
    intervals, records, steps = story()
    segments = attribute(intervals, records, steps)
    lost = lost_by_cause(segments)
    assert list(lost) == list(CAUSES)
    assert lost == {"detection": 50 + 120, "diagnosis": 50 + 30, "standby": 60 + 90,
                    "restart": 10 + 130, "replay": 50, "human": 10 + 100}
    productive, observed = totals(intervals)
    assert sum(s.seconds for s in segments) == observed
    assert sum(lost.values()) == observed - productive
    # the restart holds until the job's first productive interval, then detection again
    assert [(s.start, s.end, s.cause) for s in segments[:7]] == [
        (0, 100, None), (100, 150, "detection"), (150, 200, "diagnosis"),
        (200, 210, "restart"), (210, 270, "standby"), (270, 400, "restart"), (400, 1000, None)]


def test_attribution_covers_observed_time_exactly_on_random_histories() -> None:
    rng = random.Random(18)
    kinds = ["crash", "hang", "decision", "refused", "halted", "plan_failed", "daemon_start",
             "action_swap", "gpu_fault"]
    for _ in range(300):
        t, intervals = 0.0, []
        for _ in range(rng.randint(0, 12)):
            t += rng.choice([0.0, 0.0, rng.uniform(0, 50)])  # gaps the daemon did not watch
            length = rng.uniform(0, 80)
            intervals.append(Interval(t, t + length, rng.random() < 0.5))
            t += length
        records = [Record(rng.uniform(-10, t + 10), rng.choice(kinds), (), rng.choice(
            ["", "no checked standby for x", "caps"])) for _ in range(rng.randint(0, 10))]
        steps = [StepStart(rng.choice(["evict", "swap", "restart", "replay", "rollback"]),
                           rng.uniform(0, t + 1)) for _ in range(rng.randint(0, 6))]
        segments = attribute(intervals, records, steps)
        productive, observed = totals(intervals)
        assert sum(s.seconds for s in segments) == pytest.approx(observed, abs=1e-6)
        assert sum(lost_by_cause(segments).values()) == pytest.approx(observed - productive,
                                                                      abs=1e-6)
        for a, b in zip(segments, segments[1:]):
            assert a.end <= b.start + 1e-9 and a.start < a.end


def test_the_report_data_names_the_machines_and_what_happened_to_them() -> None:
    intervals, _, steps = story()
    events = [{"at": 150, "kind": "crash", "nodes": ["n2"],
               "detail": {"reason": "training processes gone (n2)"}},
              {"at": 200, "kind": "decision", "nodes": ["n2"],
               "detail": {"plan": {"decision": "evict", "evict": ["n2"], "reason": "xid 79"}}},
              {"at": 270, "kind": "action_swap", "nodes": [],
               "detail": {"state": "done", "detail": "n2 -> s1"}},
              {"at": 280, "kind": "daemon_start", "nodes": [], "detail": {"members": ["n1"]}},
              {"at": 900, "kind": "unevict", "nodes": ["n4"],
               "detail": {"by": "hand", "operator": "ana", "was": "flaky nic"}}]
    recs = [record_of(e) for e in events]
    assert recs[1].reason == "evict n2: xid 79" and recs[2].state == "done"
    assert recs[4].reason == "by hand (ana): flaky nic"
    evictions = [Eviction("n2", 205, "xid 79", "daemon", None, None),
                 Eviction("n4", 600, "flaky nic", "hand", "ana", 900)]
    report = incident_report("llm", intervals, recs, steps, evictions,
                             members=["n1", "s1", "n3", "n4"], listed=["n1", "n2", "n3", "n4"],
                             window=300, points=10)
    assert report.cumulative == pytest.approx(700 / 1400)
    assert report.lost_seconds == pytest.approx(700) and report.incidents == 1
    assert [r.kind for r in report.timeline] == ["crash", "decision", "action_swap", "unevict"]
    roles = {m.node: m.roles for m in report.machines}
    assert roles == {"n2": ("evicted", "swapped out"), "n4": ("released", "in the job"),
                     "s1": ("swapped in", "in the job")}
    assert len(report.series) == 10 and report.series[-1][0] == 1600
    doc = report.to_json()
    assert doc["nodes"]["n2"]["reason"] == "xid 79" and doc["lost_seconds"]["human"] == 0


def test_nothing_recorded_is_an_empty_report_not_an_error() -> None:
    report = incident_report("llm", [], [], [], [], ["n1"], ["n1"], window=60, points=5)
    assert report.start is None and report.cumulative is None and report.series == ()
    assert report.lost_seconds == 0 and report.machines == ()


def test_the_page_escapes_every_recorded_string() -> None:
    """Node answers and job-owned strings are hostile: text and attributes are escaped,
    controls made visible, and the page's one script is the only one."""
    from html.parser import HTMLParser

    from brctl.render.report import page

    evil = '"><script>alert(1)</script><img src=x onerror=alert(2)>\x1b]52;c;AAAA\x07'
    records = [Record(150, "crash", (f"n1{evil}",), f"gone {evil}"),
               Record(160, f"decision{evil}", (), evil, state=evil)]
    report = incident_report(f"llm{evil}", [Interval(100, 200, False), Interval(200, 300, True)],
                             records, [], [Eviction(f"n1{evil}", 150, evil, "hand", evil, None)],
                             members=[f"n1{evil}"], listed=["n1"], window=60, points=5)
    text = page(report, lambda t: f"t{t:.0f}")

    class Tags(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.tags: list[tuple[str, dict[str, str | None]]] = []

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            self.tags.append((tag, dict(attrs)))

    parser = Tags()
    parser.feed(text)
    names = [t for t, _ in parser.tags]
    assert names.count("script") == 1 and "img" not in names
    assert not [a for _, attrs in parser.tags for a in attrs if a.startswith("on")]
    nodes = [attrs["data-nodes"] for t, attrs in parser.tags if "data-nodes" in attrs]
    assert nodes[0] == f"n1{evil}".replace("\x1b", "\\x1b").replace("\x07", "\\x07")
    assert "\x1b" not in text and "\x07" not in text and "\\x1b]52;c;AAAA" in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    classes = [attrs.get("class") or "" for _, attrs in parser.tags]
    assert all(">" not in c and '"' not in c for c in classes)
