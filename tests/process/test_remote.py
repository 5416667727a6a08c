"""Fan-out, the local backend and probe shipping (no sockets: local subprocesses only)."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from brctl.core.transport import Node, NodeState, RunResult, with_env
from brctl.remote.fake import FakeTransport, Reply
from brctl.remote.fanout import run_all
from brctl.remote.local import LocalTransport
from brctl.remote.probes import ProbeRunner, probe_bundle
from tests.kits.waiting import PATIENCE, alive, deadline, scaled, wait_for


def local(name: str, **kw: object) -> Node:
    return Node(name=name, address=name, connection="local", **kw)  # type: ignore[arg-type]


def test_fanout_bounds_concurrency_and_keeps_order() -> None:
    live, peak, changed = 0, 0, threading.Condition()

    def handler(node: Node, argv: Sequence[str], stdin: bytes | None) -> Reply:
        # The first ones hold their slot until four run at once: a peak of 4 is seen,
        # not hoped for from a sleep (a fifth, were it let in, would push it past 4).
        nonlocal live, peak
        with changed:
            live += 1
            peak = max(peak, live)
            changed.notify_all()
            assert changed.wait_for(lambda: peak >= 4, scaled(PATIENCE)), f"peak {peak}"
            live -= 1
        return Reply(stdout=node.name)

    nodes = [local(f"n{i:02d}") for i in range(20)]
    results = run_all(FakeTransport(handler), nodes, ["true"], concurrency=4)
    assert list(results) == [n.name for n in nodes]
    assert peak == 4
    assert all(r.stdout == r.node for r in results.values())


def test_fanout_never_raises_and_keeps_states_distinct() -> None:
    states = {"a": NodeState.UNREACHABLE, "b": NodeState.AUTH, "c": NodeState.HOSTKEY}

    def handler(node: Node, argv: Sequence[str], stdin: bytes | None) -> Reply:
        if node.name in states:
            return Reply(state=states[node.name], exit_code=None)
        return Reply(exit_code=3 if node.name == "d" else 0)

    res = run_all(FakeTransport(handler), [local(n) for n in "abcde"], ["x"])
    assert [r.state for r in res.values()] == [NodeState.UNREACHABLE, NodeState.AUTH,
                                              NodeState.HOSTKEY, NodeState.FAILED, NodeState.OK]
    assert res["a"].exit_code is None and res["d"].exit_code == 3


def test_fanout_deadline_times_out_nodes_never_started() -> None:
    def handler(node: Node, argv: Sequence[str], stdin: bytes | None) -> Reply:
        time.sleep(0.3)
        return Reply()

    res = run_all(FakeTransport(handler), [local("a"), local("b")], ["x"], concurrency=1,
                  deadline=0.1)
    assert res["b"].state is NodeState.TIMEOUT and "deadline" in res["b"].stderr


def test_local_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    script = f"sleep 600 & echo $! > {pidfile}; wait"
    with deadline(10, "a 0.5 s timeout of a command that waits 600 s"):
        res = LocalTransport().run(local("a"), ["sh", "-c", script], timeout=0.5)
    assert res.state is NodeState.TIMEOUT and res.exit_code is None
    child = int(pidfile.read_text())
    try:
        wait_for(lambda: not alive(child), f"the background child {child} to be killed")
    finally:
        if alive(child):
            os.kill(child, 9)


def test_local_env_stdin_and_exit_codes() -> None:
    node = local("a", env={"BRCTL_T": "v1"})
    t = LocalTransport()
    res = t.run(node, ["sh", "-c", 'read x; echo "$BRCTL_T $x"; exit 4'], timeout=5, stdin=b"in\n")
    assert (res.state, res.exit_code, res.stdout) == (NodeState.FAILED, 4, "v1 in\n")
    missing = t.run(node, ["/nonexistent/tool"], timeout=5)
    assert missing.state is NodeState.FAILED and missing.exit_code == 127


def test_with_env_prefixes_without_shell() -> None:
    assert with_env(["a b"], {"K": "v w"}) == ["env", "K=v w", "a b"]
    assert with_env(["x"], {}) == ["x"]


def test_brctl_s_own_node_programs_get_the_env_only_through_their_request() -> None:
    """A declared PATH picks the python3 that `env` runs, LD_PRELOAD what it loads: as root,
    before any check. The bootstrap and installer apply the env themselves, once checked."""
    from brctl.core.transport import NODE_PROGRAM
    from brctl.diagnostics.isolate import TRUSTED_PYTHON

    assert NODE_PROGRAM[0] == TRUSTED_PYTHON  # the interpreter the node side trusts to check
    env = {"PATH": "/home/job/bin:/usr/bin", "LD_PRELOAD": "/home/job/evil.so"}
    node = Node("n1", "h", env=env)
    runner = ProbeRunner(FakeTransport(lambda node, argv, stdin: Reply()))
    for argv in (runner.command(node, "brctl.diagnostics.sysinfo"),
                 runner.as_job_user(replace(node, job_user="job"), ["true"])):
        assert tuple(argv[:4]) == NODE_PROGRAM and with_env(argv, env) == argv
        assert json.loads(argv[-1])["env"] == env
    assert with_env(["python3", "-I", "x.py"], env)[0] == "env"  # anything else: as declared
    # An operator's command with the same interpreter flags is theirs: it gets the env.
    assert with_env(["python3", "-I", "-S", "-c", "print(1)"], env)[0] == "env"
    assert with_env(list(NODE_PROGRAM), env)[0] == "env"


def test_bundle_is_deterministic_and_holds_only_node_code() -> None:
    import zipfile
    from io import BytesIO

    a, b = probe_bundle(), probe_bundle()
    assert a.data == b.data and a.digest == b.digest
    names = zipfile.ZipFile(BytesIO(a.data)).namelist()
    assert "brctl/__init__.py" in names and "brctl/diagnostics/sysinfo.py" in names
    assert all(n == "brctl/__init__.py" or n.startswith("brctl/diagnostics/") for n in names)


@pytest.fixture
def bare_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Node:
    """A local node whose python has no brctl: HOME is private, cwd is not the checkout."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    # -S: no site-packages, so an installed (editable) brctl cannot be found: like a bare node.
    bare = tmp_path / "bare-python"
    bare.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    bare.chmod(0o755)
    return local("bare", python=str(bare), env={"PYTHONPATH": ""})


def test_probe_ships_once_then_runs_from_cache(bare_node: Node, tmp_path: Path) -> None:
    runner = ProbeRunner(LocalTransport())
    done: list[str] = []
    first = runner.run([bare_node], "brctl.diagnostics.sysinfo", {"echo": 1},
                       on_done=lambda r: done.append(r.node))["bare"]
    assert first.ok, first.error
    assert done == ["bare"]  # progress once per node, after shipping and the rerun
    assert first.document is not None and first.document["echo"] == 1
    shipped = runner.bytes_shipped
    assert shipped == len(runner.bundle.data) > 0
    assert ".cache/brctl/" + runner.bundle.digest in first.document["brctl_path"]
    second = runner.run([bare_node], "brctl.diagnostics.sysinfo", {"echo": 2})["bare"]
    assert second.document is not None and second.document["echo"] == 2
    assert runner.bytes_shipped == shipped  # the second run shipped nothing


def test_probe_reships_when_the_cached_copy_is_corrupt(bare_node: Node, tmp_path: Path) -> None:
    runner = ProbeRunner(LocalTransport())
    assert runner.run([bare_node], "brctl.diagnostics.sysinfo", {})["bare"].ok
    cached = tmp_path / "home/.cache/brctl" / runner.bundle.digest / "brctl.zip"
    cached.write_bytes(b"garbage")
    again = runner.run([bare_node], "brctl.diagnostics.sysinfo", {})["bare"]
    assert again.ok and runner.bytes_shipped == 2 * len(runner.bundle.data)



def test_probe_cache_others_may_change_is_never_used(bare_node: Node, tmp_path: Path) -> None:
    """A file hashed there could be swapped before it is imported or run: a cache others
    may write is refused, naming it, and nothing from it runs."""
    from brctl.remote.probes import Bundle

    runner = ProbeRunner(LocalTransport())
    assert runner.run([bare_node], "brctl.diagnostics.sysinfo", {})["bare"].ok
    cache = tmp_path / "home/.cache/brctl"
    assert (cache / runner.bundle.digest).stat().st_mode & 0o777 == 0o700
    cache.chmod(0o777)  # e.g. a shared home, or a careless chmod -R
    again = runner.run([bare_node], "brctl.diagnostics.sysinfo", {})["bare"]
    assert not again.ok
    assert f"{cache} may be changed by others" in (again.error or ""), again.error
    tool = Bundle("tool", b"#!/bin/sh\necho hi\n", 0o755)
    placed = runner.ensure_file([bare_node], tool)["bare"]
    assert isinstance(placed, RunResult) and placed.state is NodeState.FAILED
    assert f"{cache} may be changed by others" in placed.stderr
    cache.chmod(0o755)  # root's (or the user's) alone again: used
    assert runner.run([bare_node], "brctl.diagnostics.sysinfo", {})["bare"].ok
    assert runner.ensure_file([bare_node], tool)["bare"] == str(cache / tool.digest / "tool")


def test_probe_garbage_and_failures_become_per_node_errors() -> None:
    replies = {
        "garbage": Reply(stdout="Segmentation fault\n"),
        "silent": Reply(stdout="", stderr="Killed", exit_code=137),
        "down": Reply(state=NodeState.UNREACHABLE, exit_code=None, stderr="connection refused"),
        "error": Reply(stdout='{"probe_error": "ValueError: x"}\n', exit_code=1),
        "array": Reply(stdout="[1, 2]\n"),
    }
    fake = FakeTransport(lambda node, argv, stdin: replies[node.name])
    out = ProbeRunner(fake).run([local(n) for n in replies], "brctl.diagnostics.sysinfo", {})
    assert "not JSON" in (out["garbage"].error or "")
    assert "printed nothing" in (out["silent"].error or "") and "Killed" in (out["silent"].error or "")
    assert (out["down"].error or "").startswith("unreachable")
    assert "ValueError: x" in (out["error"].error or "")
    assert "not a JSON object" in (out["array"].error or "")
    assert not any(r.ok for r in out.values())


def test_interrupt_names_the_unfinished_nodes() -> None:
    from brctl.core.errors import ExitCode, InterruptedRun

    def handler(node: Node, argv: Sequence[str], stdin: bytes | None) -> Reply:
        if node.name == "a":
            raise KeyboardInterrupt  # stands in for Ctrl-C arriving while we wait
        return Reply()

    with pytest.raises(InterruptedRun) as err:
        run_all(FakeTransport(handler), [local("a"), local("b"), local("c")], ["x"], concurrency=1)
    assert err.value.code is ExitCode.INTERRUPTED and "not finished: a" in err.value.message


def test_capture_keeps_head_and_tail_and_counts_everything() -> None:
    from brctl.core.capture import Capture

    whole = Capture(keep=8)
    whole.add(b"0123")
    whole.add(b"4567")
    assert (whole.text(), whole.truncated) == ("01234567", False)
    cut = Capture(keep=4)
    for chunk in (b"ab", b"cdef", b"g" * 100, b"wxyz"):
        cut.add(chunk)
    text = cut.text()
    assert cut.truncated and text.startswith("abcd\n") and text.endswith("\nwxyz")
    assert (cut.total, cut.cut_total, whole.cut_total) == (110, 110, None)
    bad = Capture(keep=16)
    bad.add(b"\xff\xfeok")
    assert bad.text() == "\ufffd\ufffdok"


def test_local_output_is_bounded_and_a_huge_probe_answer_is_refused() -> None:
    from brctl.remote.probes import PROBE_DOC_MAX, parse_document

    node = replace(local("a"), output_keep=1000)
    res = LocalTransport().run(node, ["sh", "-c", "head -c 5000000 /dev/zero | tr '\\0' x; echo; echo end"],
                               timeout=30)
    assert res.state is NodeState.OK and len(res.stdout) < 2200
    assert res.stdout.endswith("x\nend\n") and "5000005 bytes in all" in res.stdout
    huge = RunResult("a", NodeState.OK, 0, "{}" + " " * PROBE_DOC_MAX, "", 0.1)
    doc, why = parse_document(huge)
    assert doc is None and why is not None and "too large" in why


def test_local_timeout_kills_a_sigterm_ignoring_setsid_escapee(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    script = f"trap '' TERM; setsid sh -c 'trap \"\" TERM; echo $$ > {pidfile}; exec sleep 30' & sleep 30"
    res = LocalTransport().run(local("a"), ["sh", "-c", script], timeout=1)
    assert res.state is NodeState.TIMEOUT and res.exit_code is None, res
    pid = int(pidfile.read_text())
    try:
        wait_for(lambda: not alive(pid), f"the SIGTERM-ignoring escapee {pid} to be killed")
    finally:
        if alive(pid):
            os.kill(pid, 9)


def test_a_child_tracked_after_cancel_is_stopped_too() -> None:
    # LocalTransport checks ``cancelled``, starts the command, then tracks it: a Ctrl-C in
    # between found nothing to kill, and that command ran on to its timeout.
    import signal
    import subprocess

    from brctl.remote.children import Children

    children = Children()
    proc = subprocess.Popen(["sleep", "30"])
    try:
        children.cancel()
        with children.tracked(proc):
            assert proc.wait(timeout=scaled(PATIENCE)) == -signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()


def test_ctrl_c_while_commands_are_still_being_handed_out_kills_those_started(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The pool is given every node before the wait: a Ctrl-C landing while it still is
    # skipped transport.cancel(), so the commands already started ran on to their timeout.
    from concurrent.futures import ThreadPoolExecutor

    from brctl.core.errors import InterruptedRun
    from brctl.remote import threads
    from tests.kits.procs import local_pids

    submit, handed = ThreadPoolExecutor.submit, list[tuple[object, ...]]()

    def submit_until_ctrl_c(pool: ThreadPoolExecutor, *args: object) -> object:
        if len(handed) == 2:
            # both started, then the operator's Ctrl-C
            wait_for(lambda: len(local_pids(r"^sleep 1241")) == 2, "the two commands handed out")
            raise KeyboardInterrupt
        handed.append(args)
        return submit(pool, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(ThreadPoolExecutor, "submit", submit_until_ctrl_c)
    nodes = [local(f"n{i}") for i in range(4)]
    try:
        with pytest.raises(InterruptedRun) as err:
            threads.run_threads(LocalTransport(), nodes, ["sleep", "1241"], timeout=60)
        assert "not finished: n[0-3]" in err.value.message
        wait_for(lambda: not local_pids(r"^sleep 1241"), "the started commands to be killed")
    finally:
        for pid in local_pids(r"^sleep 1241"):
            os.kill(pid, 9)
