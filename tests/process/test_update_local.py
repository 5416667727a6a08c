"""``brctl update`` end to end on ``connection: local`` machines (real probe processes, no ssh)."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def local_inv(tmp_path: Path) -> Path:
    """examples/local.yaml with its update root moved under tmp_path."""
    doc = yaml.safe_load((ROOT / "examples" / "local.yaml").read_text())
    marker = tmp_path / "restarted"
    doc["update"] = {"root": str(tmp_path / "nodes" / "{node}")}
    doc["job"]["restart_command"] = ["sh", "-c", f"echo {{version}} {{nnodes}} >> {marker}"]
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _current(tmp_path: Path, node: str) -> str:
    return (tmp_path / "nodes" / node / "current").readlink().name


def test_push_apply_status_history_json(brctl, state_dir, local_inv: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("print(1)\n")
    res = brctl("-i", local_inv, "--json", "update", "push", src, "--version", "v1",
                "--window", "2h")
    assert res.exit_code == 0, res.stderr
    doc = res.json
    assert doc["schema"] == "brctl.update.push/1"
    assert doc["pending"]["window_s"] == 7200 and not doc["urgent"]
    assert {n["state"] for n in doc["nodes"].values()} == {"staged"}
    assert list(doc["nodes"]) == ["local1", "local2", "local3", "local4"]
    res = brctl("-i", local_inv, "--json", "update", "apply")
    assert res.exit_code == 0 and res.json["schema"] == "brctl.update.apply/1"
    assert res.json["outcome"] == "ok"
    assert all(_current(tmp_path, f"local{i}") == "v1" for i in range(1, 5))
    (src / "train.py").write_text("print(2)\n")
    res = brctl("-i", local_inv, "update", "push", src, "--version", "v2", "--urgent")
    assert res.exit_code == 0, res.stdout + res.stderr
    assert "restart hook: exit 0" in res.stdout
    assert (tmp_path / "restarted").read_text() == "v2 4\n"
    res = brctl("-i", local_inv, "--json", "update", "rollback")
    assert res.exit_code == 0 and res.json["version"] == "v1"
    st = brctl("-i", local_inv, "--json", "update", "status")
    assert st.exit_code == 0 and st.json["version"] == "v1" and st.json["drift"] == []
    hist = brctl("-i", local_inv, "--json", "update", "history")
    events = hist.json["events"]
    assert [(e["action"], e["version"], e["outcome"]) for e in events] == [
        ("push", "v1", "ok"), ("apply", "v1", "ok"), ("push", "v2", "ok"), ("apply", "v2", "ok"),
        ("rollback", "v1", "ok")]
    assert all(len(e["sha256"]) == 64 and e["who"] and e["machines"] for e in events)
    text = brctl("-i", local_inv, "update", "history")
    assert text.exit_code == 0 and "rollback" in text.stdout


def test_status_drift_exit_1(brctl, state_dir, local_inv: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for v in ("v1", "v2"):
        (src / "train.py").write_text(f"print({v!r})\n")
        assert brctl("-i", local_inv, "update", "push", src, "-V", v).exit_code == 0
        assert brctl("-i", local_inv, "update", "apply").exit_code == 0
    link = tmp_path / "nodes" / "local3" / "current"
    link.unlink()
    link.symlink_to("releases/v1")
    res = brctl("-i", local_inv, "update", "status")
    assert res.exit_code == 1
    assert "local3" in res.stdout and "DRIFT" in res.stdout and "local[1-2,4]" in res.stdout
    assert brctl("-i", local_inv, "--json", "update", "status").json["drift"] == ["local3"]


def test_push_a_git_revision(brctl, state_dir, local_inv: Path, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                        *args], check=True, capture_output=True)

    git("init", "-q")
    (repo / "train.py").write_text("committed\n")
    git("add", "train.py")
    git("commit", "-qm", "one")
    (repo / "train.py").write_text("dirty, not committed\n")
    res = brctl("-i", local_inv, "--json", "update", "push", repo, "--rev", "HEAD",
                "--version", "g1")
    assert res.exit_code == 0, res.stderr
    assert res.json["source"].startswith(f"git:{repo}@")
    staged = tmp_path / "nodes" / "local2" / "releases" / "g1" / "train.py"
    assert staged.read_text() == "committed\n"
    again = brctl("-i", local_inv, "--json", "update", "push", repo, "--rev", "HEAD",
                  "--version", "g1")  # git archive is deterministic: same sha, nothing sent
    assert again.json["sha256"] == res.json["sha256"] and again.json["bytes_sent"] == 0
    bad = brctl("-i", local_inv, "update", "push", repo, "--rev", "no-such-rev", "-V", "g2")
    assert bad.exit_code == 2 and "no-such-rev" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.parametrize("args, match", [
    (["update", "push", "/nonexistent/src", "-V", "v1"], "/nonexistent/src: no such file"),
    (["update", "push", ".", "-V", "../x"], "--version '../x'"),
    (["update", "push", ".", "-V", "v1", "--window", "soon"], "--window 'soon'"),
    (["update", "rollback"], "no earlier release"),
    (["update", "rollback", "--to", "v9"], "never pushed"),
])
def test_bad_input_exit_2(brctl, state_dir, local_inv, args, match) -> None:
    res = brctl("-i", local_inv, *args)
    assert res.exit_code == 2 and match in res.stderr and "Traceback" not in res.stderr


def test_bad_root_placeholder_names_the_key(brctl, state_dir, tmp_path: Path) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text("nodes: [{name: a, connection: local}]\nupdate: {root: '/x/{host}'}\n")
    res = brctl("-i", inv, "update", "status")
    assert res.exit_code == 2 and "update.root" in res.stderr and "{host}" in res.stderr


def test_not_a_tarball(brctl, state_dir, local_inv, tmp_path: Path) -> None:
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not a tar")
    res = brctl("-i", local_inv, "update", "push", junk, "-V", "v1")
    assert res.exit_code == 2 and "not a readable tar archive" in res.stderr


def _evil_tar(path: Path) -> Path:
    """The issue's link chain: each link passes a lexical check, together they reach /etc."""
    with tarfile.open(path, "w:gz" if path.suffix == ".tgz" else "w") as tar:
        for name, target in [("x/a/b/c/d/e", "../../../.."), ("x/a/b/c/d/e/l2", "../../../../../etc")]:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
        info = tarfile.TarInfo("x/a/b/c/d/e/l2/cron.d/evil")
        tar.addfile(info, io.BytesIO(b""))
    return path


@pytest.mark.parametrize("name", ["evil.tgz", "chain.tar"])
def test_hostile_tarball_is_refused_before_any_node_sees_it(
        brctl, state_dir, local_inv: Path, tmp_path: Path, name: str) -> None:
    res = brctl("-i", local_inv, "update", "push", _evil_tar(tmp_path / name), "-V", "v1")
    assert res.exit_code == 2 and "Traceback" not in res.stderr
    assert f"{name}: entry 'x/a/b/c/d/e/l2'" in res.stderr and "symlink" in res.stderr
    assert not (tmp_path / "nodes").exists()  # no machine was contacted


def test_git_revision_with_a_link_to_a_directory_is_refused(
        brctl, state_dir, local_inv: Path, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "train.py").write_text("x\n")
    (repo / "lib").symlink_to("pkg")
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "one"]):
        subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                        *args], check=True, capture_output=True)
    res = brctl("-i", local_inv, "update", "push", repo, "--rev", "HEAD", "-V", "g1")
    assert res.exit_code == 2 and f"{repo}@HEAD: entry 'lib': symlink to 'pkg'" in res.stderr
    res = brctl("-i", local_inv, "update", "push", repo, "-V", "d1")  # the directory: same rule
    assert res.exit_code == 2 and f"{repo}: entry 'lib': symlink to 'pkg'" in res.stderr
    assert not (tmp_path / "nodes").exists()


def test_hand_updates_are_in_the_audit_trail_and_announced(brctl, state_dir, local_inv: Path,
                                                           tmp_path: Path) -> None:
    import json
    import sys

    from brctl.operations.ledger.state import DaemonState
    from brctl.state import Store

    doc = yaml.safe_load(local_inv.read_text())
    pages = tmp_path / "pages.jsonl"
    doc.setdefault("daemon", {})["notify_command"] = [
        sys.executable, "-c", "import sys; open(sys.argv[1],'a').write(sys.stdin.read()+'\\n')",
        str(pages)]
    local_inv.write_text(yaml.safe_dump(doc))
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("print(1)\n")
    assert brctl("-i", local_inv, "update", "push", src, "-V", "v1", "--dry-run").exit_code == 0
    assert not pages.exists()  # a dry run announces nothing
    assert brctl("-i", local_inv, "update", "push", src, "-V", "v1", "--urgent",
                 "--by", "erin").exit_code == 0
    sent = [json.loads(x) for x in pages.read_text().splitlines()]
    assert [(p["kind"], p["detail"]["action"], p["detail"]["operator"]) for p in sent][:2] == [
        ("update", "push", "erin"), ("update", "apply", "erin")]
    store = Store(state_dir)
    try:
        found = [e for e in DaemonState(store, "demo").events() if e["kind"] == "update"]
    finally:
        store.close()
    assert found and all(e["detail"]["operator"] == "erin" for e in found)
    assert found[0]["nodes"] == ["local1", "local2", "local3", "local4"]
    hist = brctl("-i", local_inv, "--json", "update", "history").json["events"]
    assert {e["who"] for e in hist} == {"erin"}
