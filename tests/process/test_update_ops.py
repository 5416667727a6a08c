"""Update operations over fake machines that run the real probe on per-machine tmp roots."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest

from brctl.analysis.inventory import from_document
from brctl.core.errors import ExitCode, InputError
from brctl.operations.update import ops as up
from brctl.remote.fake import Reply
from brctl.remote.probes import probe_call
from brctl.state import Store
from tests.kits.update_fake import Machines, inventory_doc


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def world(tmp_path: Path):
    machines = Machines()
    clock = Clock()
    src = tmp_path / "src"
    src.mkdir()
    marker = tmp_path / "restarted"
    hook = [sys.executable, "-c", "import sys; open(sys.argv[1], 'a').write(sys.argv[2] + '\\n')",
            str(marker), "{version} {nnodes} {nodes_folded}"]
    inv = from_document(inventory_doc(tmp_path / "nodes", restart_command=hook), "inv.yaml")
    store = Store(tmp_path / "state")

    def ctx(**kw) -> up.UpdateContext:
        return up.UpdateContext(inv, machines.transport, store, tmp_path / "artifacts", "me@ctl",
                                now=clock, **kw)

    def write(version: str) -> None:
        (src / "train.py").write_text(f"VERSION = {version!r}\n")

    def current(node: str) -> str | None:
        link = tmp_path / "nodes" / node / "current"
        return link.readlink().name if link.is_symlink() else None

    class W:
        pass

    w = W()
    w.__dict__.update(machines=machines, clock=clock, src=src, marker=marker, ctx=ctx,
                      write=write, current=current, store=store, root=tmp_path / "nodes")
    yield w
    store.close()


NODES = ["m1", "m2", "m3", "m4"]


def test_lazy_push_then_apply(world) -> None:
    world.write("v1")
    rep = up.push(world.ctx(), str(world.src), "v1")
    assert rep.exit_code is ExitCode.OK and rep.pending is not None and rep.switch is None
    assert {o.state for o in rep.nodes.values()} == {"staged"}
    assert rep.bytes_sent == 4 * rep.size
    assert [world.current(n) for n in NODES] == [None] * 4  # lazy: nothing switched
    st = up.status(world.ctx())
    assert st.pending.version == "v1" and all(s.pending_staged for s in st.nodes.values())
    sw = up.apply(world.ctx())
    assert sw.outcome == "ok" and sw.exit_code is ExitCode.OK
    assert [world.current(n) for n in NODES] == ["v1"] * 4
    assert not world.marker.exists()  # apply without --restart leaves the job alone
    state = up.job_state(world.store, "demo")
    assert state.version == "v1" and state.pending is None
    events = up.history(world.store, "demo")
    assert [(e.action, e.version, e.outcome) for e in events] == [("push", "v1", "ok"),
                                                                   ("apply", "v1", "ok")]
    assert events[0].sha256 == rep.sha256 and events[0].who == "me@ctl"
    assert events[0].machines == tuple(NODES) and events[1].detail["switched"]
    again = up.push(world.ctx(), str(world.src), "v1")  # resumable: nothing to send
    assert again.bytes_sent == 0 and {o.state for o in again.nodes.values()} == {"present"}
    assert again.pending is None  # the job already runs v1


def test_if_due_waits_for_the_window(world) -> None:
    world.write("v1")
    up.push(world.ctx(), str(world.src), "v1", window_s=3600)
    assert up.apply(world.ctx(), if_due=True).outcome == "noop"
    world.clock.t += 3600
    rep = up.apply(world.ctx(), if_due=True, restart=True)
    assert rep.outcome == "ok" and rep.restart is not None and rep.restart.ok
    assert world.marker.read_text() == "v1 4 m[1-4]\n"


def test_urgent_push_switches_and_runs_the_restart_hook(world) -> None:
    world.write("v1")
    up.push(world.ctx(), str(world.src), "v1")
    up.apply(world.ctx())
    world.write("v2")
    rep = up.push(world.ctx(), str(world.src), "v2", urgent=True)
    assert rep.exit_code is ExitCode.OK and rep.switch is not None
    assert rep.switch.outcome == "ok" and rep.switch.from_version == "v1"
    assert [world.current(n) for n in NODES] == ["v2"] * 4
    assert world.marker.read_text() == "v2 4 m[1-4]\n"
    assert rep.pending is None


def test_unreachable_machine_is_reported_then_caught_up(world) -> None:
    world.write("v1")
    world.machines.down = {"m3"}
    rep = up.push(world.ctx(), str(world.src), "v1", urgent=True)
    assert rep.exit_code is ExitCode.INCOMPLETE and rep.nodes["m3"].state == "unreachable"
    assert rep.switch is None and rep.pending.urgent  # never switched the other three alone
    assert [world.current(n) for n in NODES] == [None] * 4
    sw = up.apply(world.ctx())  # still down: refused before any switch
    assert sw.outcome == "incomplete" and sw.exit_code is ExitCode.INCOMPLETE
    assert not [r for _n, r in world.machines.requests if r["action"] == "switch"]
    world.machines.down = set()
    sw = up.apply(world.ctx(), if_due=True, restart=True)  # urgent is always due
    assert sw.outcome == "ok" and sw.nodes["m3"].state == "switched"
    assert [world.current(n) for n in NODES] == ["v1"] * 4
    received = [n for n, r in world.machines.requests if r["action"] == "receive"]
    assert received.count("m3") == 1 and received.count("m1") == 1


def test_a_failed_switch_is_rolled_back_everywhere(world) -> None:
    world.write("v1")
    up.push(world.ctx(), str(world.src), "v1")
    up.apply(world.ctx())
    world.write("v2")
    up.push(world.ctx(), str(world.src), "v2")

    def fail_m2(node, request):
        if node == "m2" and request["action"] == "switch" and request["version"] == "v2":
            return Reply(stdout='{"probe_error": "disk on fire"}\n', exit_code=1)
        return None

    world.machines.fault = fail_m2
    sw = up.apply(world.ctx(), restart=True)
    assert sw.outcome == "rolled_back" and sw.exit_code is ExitCode.FINDINGS
    assert "m2" in sw.reason and "disk on fire" in sw.reason and "switched back" in sw.reason
    assert [world.current(n) for n in NODES] == ["v1"] * 4
    assert {sw.nodes[n].state for n in ("m1", "m3", "m4")} == {"reverted"}
    assert not world.marker.exists()  # no restart after a failed apply
    state = up.job_state(world.store, "demo")
    assert state.version == "v1" and state.pending.version == "v2"  # still pending
    assert up.history(world.store, "demo")[-1].outcome == "rolled_back"


def test_mixed_versions_are_reported_loudly_when_the_switch_back_fails(world) -> None:
    world.write("v1")
    up.push(world.ctx(), str(world.src), "v1")
    up.apply(world.ctx())
    world.write("v2")
    up.push(world.ctx(), str(world.src), "v2")

    def fault(node, request):
        if request["action"] == "switch" and (
                (node == "m2" and request["version"] == "v2") or
                (node == "m4" and request["version"] == "v1")):
            return Reply(stdout='{"probe_error": "read-only file system"}\n', exit_code=1)
        return None

    world.machines.fault = fault
    sw = up.apply(world.ctx())
    assert sw.outcome == "failed" and "MIXED" in sw.reason and "m4" in sw.reason
    assert sw.exit_code is ExitCode.FINDINGS


def test_rollback_and_rollback_to(world) -> None:
    for v in ("v1", "v2", "v3"):
        world.write(v)
        up.push(world.ctx(), str(world.src), v)
        up.apply(world.ctx())
    rep = up.rollback(world.ctx(), restart=True)
    assert (rep.version, rep.from_version, rep.outcome) == ("v2", "v3", "ok")
    assert world.marker.read_text() == "v2 4 m[1-4]\n"
    assert up.rollback(world.ctx()).version == "v1"
    assert [world.current(n) for n in NODES] == ["v1"] * 4
    with pytest.raises(InputError, match="no earlier release"):
        up.rollback(world.ctx())
    assert up.rollback(world.ctx(), to="v3").version == "v3"
    with pytest.raises(InputError, match="never pushed"):
        up.rollback(world.ctx(), to="v9")
    assert [e.action for e in up.history(world.store, "demo", limit=3)] == [
        "rollback", "rollback", "rollback"]


def test_status_flags_the_drifted_machine_and_apply_fixes_it(world) -> None:
    for v in ("v1", "v2"):
        world.write(v)
        up.push(world.ctx(), str(world.src), v)
        up.apply(world.ctx())
    link = world.root / "m3" / "current"
    link.unlink()
    link.symlink_to("releases/v1")  # someone switched m3 by hand
    st = up.status(world.ctx())
    assert st.drifted == ["m3"] and st.exit_code is ExitCode.FINDINGS
    assert st.nodes["m3"].current == "v1" and st.nodes["m1"].releases == ("v1", "v2")
    sw = up.apply(world.ctx())
    assert sw.nodes["m3"].state == "switched" and sw.nodes["m1"].state == "already"
    assert up.status(world.ctx()).exit_code is ExitCode.OK
    world.machines.down = {"m1"}
    assert up.status(world.ctx()).exit_code is ExitCode.INCOMPLETE


def test_same_version_other_code_is_refused(world) -> None:
    world.write("v1")
    up.push(world.ctx(), str(world.src), "v1")
    world.write("v1-changed")
    with pytest.raises(InputError, match="immutable"):
        up.push(world.ctx(), str(world.src), "v1")


def test_a_cut_transfer_resumes_from_the_partial(world) -> None:
    world.write("v1")
    (world.src / "blob.bin").write_bytes(hashlib.sha256(b"x").digest() * 40000)
    rep = up.push(world.ctx(), str(world.src), "v1")
    # m2 holds the first 1000 bytes of a v2 transfer that was cut
    world.write("v2")
    art = up.update_pack.pack(str(world.src), None, world.ctx().artifacts)
    incoming = world.root / "m2" / ".incoming"
    (incoming / f"{art.sha256}.partial").write_bytes(art.path.read_bytes()[:1000])
    rep = up.push(world.ctx(), str(world.src), "v2")
    assert rep.exit_code is ExitCode.OK
    assert rep.nodes["m2"].bytes_sent == art.size - 1000 and rep.nodes["m1"].bytes_sent == art.size


def test_corrupted_transfer_fails_that_machine_only(world) -> None:
    world.write("v1")
    orig = world.machines.handle

    def handle(node, argv, stdin):
        if node.name == "m4" and stdin and probe_call(argv)[1]:  # the artifact stream
            stdin = bytes(stdin[:10]) + bytes([stdin[10] ^ 1]) + bytes(stdin[11:])
        return orig(node, argv, stdin)

    world.machines.transport.handler = handle
    rep = up.push(world.ctx(), str(world.src), "v1")
    assert rep.exit_code is ExitCode.FINDINGS and rep.nodes["m4"].state == "failed"
    assert "sha256 mismatch" in rep.nodes["m4"].message
    assert not (world.root / "m4" / "releases" / "v1").exists()
    sw = up.apply(world.ctx())  # the link still flips a bit: apply refuses to switch anyone
    assert sw.outcome == "failed" and "catching up failed on m4" in sw.reason
    assert [world.current(n) for n in NODES] == [None] * 4
    world.machines.transport.handler = orig  # link repaired: apply catches m4 up, then switches
    assert up.apply(world.ctx()).outcome == "ok"


def test_symlinks_leaving_the_release_are_refused_before_sending(world) -> None:
    world.write("v1")
    (world.src / "sub").mkdir()
    (world.src / "sub" / "ok.py").symlink_to("../train.py")
    up.push(world.ctx(), str(world.src), "v1")  # inside: fine
    (world.src / "bad.py").symlink_to("/etc/passwd")
    with pytest.raises(InputError, match="points outside the release"):
        up.push(world.ctx(), str(world.src), "v2")
    assert not [r for _n, r in world.machines.requests if r.get("version") == "v2"]


def test_urgent_push_to_a_subset_still_switches_the_whole_job(world) -> None:
    world.write("v1")
    up.push(world.ctx(), str(world.src), "v1")
    rep = up.push(world.ctx(nodes=[world.ctx().inventory.node("m1")]), str(world.src), "v1",
                  urgent=True)
    assert rep.switch is not None and rep.switch.outcome == "ok"
    assert [world.current(n) for n in NODES] == ["v1"] * 4


def test_apply_without_anything_to_do_records_nothing(world) -> None:
    assert up.apply(world.ctx()).outcome == "noop"  # nothing pushed yet
    world.write("v1")
    up.push(world.ctx(), str(world.src), "v1")
    up.apply(world.ctx())
    before = len(up.history(world.store, "demo"))
    rep = up.apply(world.ctx())
    assert rep.outcome == "noop" and rep.exit_code is ExitCode.OK and "no drift" in rep.reason
    assert len(up.history(world.store, "demo")) == before


def test_old_releases_are_pruned_after_a_switch(world, tmp_path: Path) -> None:
    import dataclasses

    small = dataclasses.replace(world.ctx().inventory,
                                update=dataclasses.replace(world.ctx().inventory.update, keep=2))

    def ctx() -> up.UpdateContext:
        return up.UpdateContext(small, world.machines.transport, world.store,
                                tmp_path / "artifacts", "me@ctl", now=world.clock)

    for v in ("v1", "v2", "v3", "v4"):
        world.write(v)
        up.push(ctx(), str(world.src), v)
        up.apply(ctx())
    for node in NODES:
        assert sorted(p.name for p in (world.root / node / "releases").iterdir()) == ["v3", "v4"]
    assert len(list((tmp_path / "artifacts").glob("*.tar.gz"))) == 2
    pruned = [e.detail["pruned"]["removed"].get("m1") for e in up.history(world.store, "demo")
              if e.action == "apply"]
    assert pruned == [None, None, ["v1"], ["v2"]]
    assert up.rollback(ctx()).version == "v3"  # the previous release is always kept
    with pytest.raises(InputError, match=r"release v1: its artifact .* is no longer in"):
        up.rollback(ctx(), to="v1")  # pruned everywhere, artifact gone too


@pytest.mark.parametrize("said", [
    {"deep": [[[[1]]]]},  # not a list
    ["v9" * 200],  # no release name
    ["v2"],  # the one it was told to keep
    ["../../etc"],
    ["old"] * 2,
    ["x"] * (up.MAX_PRUNED + 1),
])
def test_a_machine_s_prune_answer_is_kept_only_when_it_names_releases(world, said: object) -> None:
    import json as json_mod

    def lie(node: str, request: dict) -> Reply | None:
        if node == "m2" and request.get("action") == "prune":
            return Reply(stdout=json_mod.dumps({"schema": "brctl.probe/1", "removed": said}) + "\n")
        return None

    world.write("v1")
    up.push(world.ctx(), str(world.src), "v1")
    up.apply(world.ctx())
    world.write("v2")
    up.push(world.ctx(), str(world.src), "v2")
    world.machines.fault = lie
    up.apply(world.ctx())
    last = up.history(world.store, "demo")[-1].detail["pruned"]
    assert "m2" not in last["removed"]
    assert last["errors"]["m2"] == "an answer that does not say which releases it removed"
    assert set(last["errors"]) == {"m2"}  # the others answered as the probe does


def test_a_second_changer_of_the_same_job_is_refused(world) -> None:
    from brctl.core.errors import RefusedError

    world.write("v1")
    with up.exclusive(world.ctx()):  # e.g. a person's push still streaming
        with pytest.raises(RefusedError, match=r"another brctl update .*me@ctl, pid") as info:
            up.apply(world.ctx())
        assert info.value.code is ExitCode.REFUSED
        with pytest.raises(RefusedError):
            up.push(world.ctx(), str(world.src), "v1")
        assert up.status(world.ctx()).exit_code is ExitCode.OK  # reading is never blocked
    assert up.push(world.ctx(), str(world.src), "v1", urgent=True).exit_code is ExitCode.OK


def test_status_probe_failure_is_a_finding_not_incomplete(world) -> None:
    world.machines.fault = lambda node, req: Reply(
        stdout='{"probe_error": "PermissionError: /opt/train"}\n', exit_code=1) \
        if node == "m2" else None
    st = up.status(world.ctx())
    assert st.exit_code is ExitCode.FINDINGS and st.unknown == ["m2"]
    assert "PermissionError" in st.nodes["m2"].error


def test_resuming_cut_transfers_keeps_no_copy_of_the_artifact_per_machine(world, monkeypatch) -> None:
    """After a cut push each machine may hold a partial of its own length. The resume
    must not keep a copy of the artifact's tail per distinct offset: a multi-GB
    artifact times a fleet of resume points is more than the controller's memory."""
    import dataclasses
    import json
    import os
    import tracemalloc

    from brctl.analysis.update import TransferPlan
    from brctl.core.transport import NodeState, Results, RunResult

    world.write("v1")
    (world.src / "blob.bin").write_bytes(os.urandom(2 << 20))
    ctx = world.ctx()
    art = up.update_pack.pack(str(world.src), None, ctx.artifacts)
    base = ctx.targets()[0]
    nodes = [dataclasses.replace(base, name=f"m{i}") for i in range(1, 17)]
    plan = TransferPlan((), {n.name: i * art.size // 16 for i, n in enumerate(nodes)}, {}, ())
    held = []

    def every_machine_in_flight(transport, todo, argv, *, stdin, **kw):
        held.extend(stdin(n) for n in todo)  # as a fan-out of 16 < concurrency holds them
        ok = json.dumps({"staged": True, "already": False}) + "\n"
        return Results([RunResult(n.name, NodeState.OK, 0, ok, "", 0.0) for n in todo])

    monkeypatch.setattr(up, "run_all", every_machine_in_flight)
    tracemalloc.start()
    try:
        out = up.transfer(ctx, nodes, art, "v1", plan)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert {o.state for o in out.values()} == {"staged"}
    assert [len(h) for h in held] == [art.size - plan.send[n.name] for n in nodes]
    assert bytes(held[5]) == art.path.read_bytes()[plan.send["m6"]:]
    assert peak < 2 * art.size, f"{peak} bytes held for a {art.size}-byte artifact"


class Killed(BaseException):
    """Stands in for kill -9: nothing after it runs."""


def test_a_kill_after_the_rollback_is_recorded_leaves_version_and_history_consistent(
        world, monkeypatch) -> None:
    """The job's new version and its history row are written in one transaction before
    the prune fan-out: a kill -9 during the prune leaves both, so a resumed daemon sees
    its rollback done (release_targets says v2) and never rolls back again to v1."""
    from brctl.operations.update.tables import job_state, release_targets

    for v in ("v1", "v2", "v3"):
        world.write(v)
        up.push(world.ctx(), str(world.src), v)
        up.apply(world.ctx())

    def killed(*_a: object, **_k: object) -> None:
        raise Killed()

    monkeypatch.setattr(up, "prune", killed)
    with pytest.raises(Killed):
        up.rollback(world.ctx(), to="v2")
    monkeypatch.undo()
    assert job_state(world.store, "demo").version == "v2"
    row = up.history(world.store, "demo", limit=1)[0]
    assert (row.action, row.version, row.from_version) == ("rollback", "v2", "v3")
    assert release_targets(world.store, "demo").version == "v2"  # the daemon's resume check
    assert [world.current(n) for n in NODES] == ["v2"] * 4
    again = up.rollback(world.ctx(), to="v2")  # what a resumed daemon's step runs
    assert again.version == "v2" and [world.current(n) for n in NODES] == ["v2"] * 4
    assert job_state(world.store, "demo").version == "v2"
    assert [e.version for e in up.history(world.store, "demo", limit=10)
            if e.action == "rollback"] == ["v2", "v2"]


def test_a_tar_artifact_with_the_link_chain_is_refused_before_any_machine_is_asked(
        world, tmp_path: Path) -> None:
    """The issue's chain (each link passes a lexical check; together they reach /etc) in
    a plain ``chain.tar``: exit 2 naming the member, and not one machine contacted."""
    import io
    import tarfile

    chain = tmp_path / "chain.tar"
    with tarfile.open(chain, "w") as tar:
        for name, target in (("x/a/b/c/d/e", "../../../.."), ("x/a/b/c/d/e/l2", "../../../../../etc")):
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
        tar.addfile(tarfile.TarInfo("x/a/b/c/d/e/l2/cron.d/evil"), io.BytesIO(b""))
    with pytest.raises(InputError, match=r"chain\.tar: entry 'x/a/b/c/d/e/l2'") as exc:
        up.push(world.ctx(), str(chain), "v1")
    assert exc.value.code is ExitCode.USAGE  # exit 2
    assert world.machines.requests == [] and not world.root.exists()


def test_a_link_planted_in_the_update_root_refuses_that_machine_like_ckpt_dir(
        world, tmp_path: Path) -> None:
    """R10: a symlink the job planted at <root>/releases is the node state ``refused``
    (exit 4), as the same plant in ckpt.dir is, not a mere failure (exit 1)."""
    canary = tmp_path / "canary"
    canary.mkdir()
    (world.root / "m2").mkdir(parents=True)
    (world.root / "m2" / "releases").symlink_to(canary)
    world.write("v1")
    rep = up.push(world.ctx(), str(world.src), "v1")
    assert rep.nodes["m2"].state == "refused" and rep.exit_code is ExitCode.REFUSED
    assert "/m2/releases is a symlink; not followed" in rep.nodes["m2"].message
    assert {rep.nodes[n].state for n in NODES if n != "m2"} == {"staged"}
    assert list(canary.iterdir()) == []
