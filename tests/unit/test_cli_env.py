"""The real commands, run through ``cli.run(argv, env=...)`` over a ``FakeTransport``.

``Env`` owns every resource of a run: the transport it is given, the state store
(opened once, 0600, closed when the command ends).
"""

from __future__ import annotations

import io
import json
import stat
from collections.abc import Sequence
from pathlib import Path

import yaml

from brctl.cli.app import run
from brctl.core.transport import Node, NodeState
from brctl.env import Env
from brctl.remote.fake import FakeTransport, Reply
from brctl.render.output import Output


def inventory(tmp_path: Path) -> Path:
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump({
        "nodes": [{"name": "gpu[1-2]", "address": "127.0.0.[1-2]", "gpus": 8}],
        "standby": [{"name": "gpu3", "address": "127.0.0.3", "gpus": 8}],
        "job": {"name": "llm", "nodes": "gpu[1-2]", "tp": 8},
        "daemon": {"max_evict_fraction": 1.0},
    }))
    return path


def env_for(tmp_path: Path, transport: FakeTransport) -> tuple[Env, io.StringIO, io.StringIO]:
    out, err = io.StringIO(), io.StringIO()
    env = Env(output=Output(stdout=out, stderr=err), transport_given=transport,
              environ={"BRCTL_STATE": str(tmp_path / "state")})
    return env, out, err


def answer(node: Node, argv: Sequence[str], stdin: bytes | None) -> Reply:
    if node.name == "gpu2":
        return Reply(stdout="", stderr="no route", state=NodeState.UNREACHABLE)
    return Reply(stdout=f"{node.name} says {' '.join(argv)}\n", exit_code=0)


def test_exec_runs_over_the_injected_transport(tmp_path: Path) -> None:
    fake = FakeTransport(answer)
    env, out, err = env_for(tmp_path, fake)
    code = run(["-i", str(inventory(tmp_path)), "--json", "exec", "-w", "gpu[1-2]", "--",
                "echo", "hi"], env=env)
    assert code == 3, err.getvalue()  # gpu2 unreachable: incomplete
    doc = json.loads(out.getvalue())
    assert doc["nodes"]["gpu1"]["stdout"] == "gpu1 says echo hi\n"
    assert doc["nodes"]["gpu2"]["state"] == "unreachable"
    assert sorted(c.node for c in fake.calls) == ["gpu1", "gpu2"]
    assert [c.argv for c in fake.calls if c.node == "gpu1"] == [("echo", "hi")]


def test_global_options_apply_to_the_injected_env(tmp_path: Path) -> None:
    fake = FakeTransport(answer)
    env, out, err = env_for(tmp_path, fake)
    code = run(["-i", str(inventory(tmp_path)), "exec", "-w", "gpu1", "true"], env=env)
    assert code == 0, err.getvalue()
    assert "gpu1" in out.getvalue() and not out.getvalue().lstrip().startswith("{")
    assert env.inventory_path is None  # the caller's Env is not changed by one run


def test_the_state_store_is_private_and_closed_after_the_command(tmp_path: Path) -> None:
    env, _, err = env_for(tmp_path, FakeTransport(answer))
    inv = str(inventory(tmp_path))
    assert run(["-i", inv, "evict", "gpu3", "--reason", "bad ECC"], env=env) == 0, err.getvalue()
    db = tmp_path / "state" / "brctl.db"
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    assert not db.with_name("brctl.db-wal").exists()  # the last connection closed it
    env2, out2, err2 = env_for(tmp_path, FakeTransport(answer))
    assert run(["-i", inv, "--json", "standby", "list"], env=env2) == 0, err2.getvalue()
    doc = json.loads(out2.getvalue())
    assert "quarantined" in json.dumps(doc)


def test_a_wider_database_mode_is_tightened(tmp_path: Path) -> None:
    from brctl.state import Store

    (tmp_path / "state").mkdir()
    db = tmp_path / "state" / "brctl.db"
    db.touch(mode=0o644)
    db.chmod(0o644)
    Store(tmp_path / "state").close()
    assert stat.S_IMODE(db.stat().st_mode) == 0o600


def test_nodes_checks_groups_before_contacting_any_machine(tmp_path: Path) -> None:
    fake = FakeTransport(answer)
    env, _, _ = env_for(tmp_path, fake)
    code = run(["-i", str(inventory(tmp_path)), "nodes", "--probe", "--groups", "bogus"], env=env)
    assert code == 2
    assert fake.calls == []


def test_commands_hold_no_exit_code_literals() -> None:
    """A command returns its report's exit code; the report decides it."""
    import ast

    import brctl.commands as commands

    wrong = []
    for path in sorted(Path(commands.__path__[0]).glob("[!_]*.py")):
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, ast.FunctionDef) or ast.unparse(fn.returns or ast.Pass()) != "int":
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Return) and node.value is not None:
                    wrong += [f"{path.name}:{node.lineno}" for c in ast.walk(node.value)
                              if isinstance(c, ast.Constant) and type(c.value) is int]
    assert wrong == []


def test_renderers_pass_the_reports_exit_code_as_a_documents_status() -> None:
    """``status=`` of a JSON document is the report's exit code, never a number decided here."""
    import ast

    import brctl.commands as commands

    wrong = [f"{path.name}:{kw.value.lineno}"
             for path in sorted(Path(commands.__path__[0]).glob("*.py"))
             for call in ast.walk(ast.parse(path.read_text())) if isinstance(call, ast.Call)
             for kw in call.keywords if kw.arg == "status"
             if any(isinstance(c, ast.Constant) and type(c.value) is int for c in ast.walk(kw.value))]
    assert wrong == []


def test_every_report_with_an_exit_code_has_its_json() -> None:
    """A command only parses, calls and renders: the report decides its code and its JSON."""
    import importlib
    import inspect
    import pkgutil

    import brctl

    missing = []
    for info in pkgutil.walk_packages(brctl.__path__, "brctl."):
        if info.name.endswith("__main__"):
            continue  # running it is the CLI
        module = importlib.import_module(info.name)
        for name, cls in inspect.getmembers(module, inspect.isclass):
            reports = cls.__module__ == info.name and isinstance(getattr(cls, "exit_code", None),
                                                                 property)
            if reports and not callable(getattr(cls, "to_json", None)):
                missing.append(f"{info.name}.{name}")
    assert missing == []


def test_standby_check_of_a_machine_that_gave_no_usable_answer_is_incomplete(
        tmp_path: Path) -> None:
    def garbage(node: Node, argv: Sequence[str], stdin: bytes | None) -> Reply:
        return Reply(stdout="not a probe document\n", exit_code=0)

    env, out, err = env_for(tmp_path, FakeTransport(garbage))
    code = run(["-i", str(inventory(tmp_path)), "--json", "standby", "check"], env=env)
    assert code == 3, err.getvalue()  # no answer is no verdict: never 'failed' (1)
    assert "not JSON" in out.getvalue()


def test_an_error_goes_to_the_injected_env_streams(tmp_path: Path) -> None:
    env, out, err = env_for(tmp_path, FakeTransport(answer))
    code = run(["-i", str(tmp_path / "missing.yaml"), "--json", "nodes"], env=env)
    assert code == 2
    doc = json.loads(out.getvalue())
    assert doc["schema"] == "brctl.error/1" and doc["exit"] == 2
    assert err.getvalue().startswith("brctl: error: ") and "missing.yaml" in err.getvalue()


def test_standby_check_of_a_refused_machine_exits_4_like_every_command(tmp_path: Path) -> None:
    def refuse(node: Node, argv: Sequence[str], stdin: bytes | None) -> Reply:
        return Reply(stdout="", stderr="a safety rule", state=NodeState.REFUSED)

    env, out, err = env_for(tmp_path, FakeTransport(refuse))
    code = run(["-i", str(inventory(tmp_path)), "--json", "standby", "check"], env=env)
    assert code == 4, err.getvalue()  # brctl would not act: not "no answer" (3)
    assert json.loads(out.getvalue())["status"] == "refused"


def test_the_env_leaves_a_given_transport_to_its_giver(tmp_path: Path) -> None:
    closed: list[bool] = []

    class Tracked(FakeTransport):
        def close(self) -> None:
            closed.append(True)

    fake = Tracked(answer)
    env, _, err = env_for(tmp_path, fake)
    assert run(["-i", str(inventory(tmp_path)), "exec", "-w", "gpu1", "true"], env=env) == 0, \
        err.getvalue()
    assert closed == []  # the caller may run another command over it
    assert run(["-i", str(inventory(tmp_path)), "exec", "-w", "gpu1", "true"], env=env) == 0
    assert len(fake.calls) == 2


def test_daemon_status_follow_reads_what_is_written_between_polls(tmp_path: Path) -> None:
    from brctl.analysis.inventory import from_document
    from brctl.operations.daemon.report import follow, read_status
    from brctl.operations.ledger.state import DaemonState
    from brctl.state import Store

    inv = from_document(yaml.safe_load(inventory(tmp_path).read_text()), "inv.yaml")
    store = Store(tmp_path / "state")
    state = DaemonState(store, "llm")
    state.event("crash", ["gpu1"], {"why": "before"}, 1.0)
    waits: list[float] = []

    def poll_later(seconds: float) -> None:  # the daemon writes while status waits
        waits.append(seconds)
        state.event("restart", ["gpu2"], {"why": f"poll {len(waits)}"}, 1.0 + len(waits))

    first = read_status(inv, store)
    polls = follow(inv, store, first, events=20, every=7.0, sleep=poll_later)
    fresh = [next(polls), next(polls)]
    assert waits == [7.0, 7.0]
    assert [[e["kind"] for e in r.events] for r in fresh] == [["restart"], ["restart"]]
    assert [r.events[0]["nodes"] for r in fresh] == [["gpu2"], ["gpu2"]]
    store.close()
