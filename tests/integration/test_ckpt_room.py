"""A backup that does not fit (issue 35, item 3), on real small filesystems.

A job user's sparse file (holes cost it nothing) was written out dense by root on
the backup peer, past quotas and the root reserve, until the peer's checkpoint
filesystem was full, and the failed receive left its full-size temp file there.
Now the peer is asked for room before the first byte (every byte still to copy,
plus ``ckpt.backup_margin``), a failed receive removes its temp file, a killed
one's is swept at the next ``prepare``, and the receiver's cause (ENOSPC) is named.

Filesystems: a tmpfs with ``size=`` (the fill and sparse cases) and an ext4 image
on a loop device (the root reserve: what root could still write is not room).
Without root or where the kernel refuses the mount, skipped; under
``BRCTL_REQUIRE_INTEGRATION=1`` (CI, root) that is a failure.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from brctl.diagnostics import ckptfiles, ckptmove, ckptspace
from tests.kits.waiting import wait_for
from tests.process.test_ckpt_local import make_step, write_inventory


def _cannot(why: str) -> None:
    if os.environ.get("BRCTL_REQUIRE_INTEGRATION") == "1":
        pytest.fail(f"integration tests required but cannot run: {why}")
    pytest.skip(why)


@pytest.fixture
def mount() -> Iterator[Callable[..., Path]]:
    """``mount(path, kind, size)``: a fresh filesystem at ``path``; unmounted after the test."""
    mounted: list[tuple[Path, str | None]] = []

    def make(path: Path, kind: str = "tmpfs", size: str = "8m") -> Path:
        if os.geteuid() != 0:
            _cannot("needs root to mount a filesystem")
        path.mkdir(parents=True, exist_ok=True)
        loop = None
        if kind == "tmpfs":
            argv = ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)]
        else:
            image = path.parent / f".{path.name}.img"
            subprocess.run(["truncate", "-s", size, str(image)], check=True)
            made = subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "50", str(image)],
                                  capture_output=True, text=True)  # half the blocks for root
            if made.returncode != 0:
                _cannot(f"mkfs.ext4: {made.stderr.strip()}")
            setup = subprocess.run(["losetup", "--find", "--show", str(image)],
                                   capture_output=True, text=True)
            if setup.returncode != 0:
                _cannot(f"losetup: {setup.stderr.strip()}")
            loop = setup.stdout.strip()
            argv = ["mount", "-t", "ext4", loop, str(path)]
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            if loop:
                subprocess.run(["losetup", "-d", loop], check=False)
            _cannot(f"{' '.join(argv)}: {done.stderr.strip()}")
        mounted.append((path, loop))
        os.chmod(path, 0o755)
        return path

    try:
        yield make
    finally:
        for path, loop in reversed(mounted):
            subprocess.run(["umount", "-l", str(path)], check=False)
            if loop:
                subprocess.run(["losetup", "-d", loop], check=False)


def _partials(root: Path) -> list[str]:
    return [str(p) for p in root.rglob(".brctl-partial-*")]


@pytest.fixture
def tmp_path(trusted_tmp: Path) -> Path:
    """Node roots outside /tmp: the default backup root must pass StrictModes."""
    return trusted_tmp


def test_a_sparse_step_that_does_not_fit_is_refused_before_the_first_byte(
        brctl: Any, tmp_path: Path, mount: Callable[..., Path]) -> None:
    peer = mount(tmp_path / "n4", "tmpfs", "8m")  # n1's backup peer
    inv = write_inventory(tmp_path)
    for n in ("n1", "n2", "n3", "n4"):
        make_step(tmp_path, n, "step_100")
    with open(tmp_path / "n1" / "ckpt" / "step_100" / "huge.bin", "wb") as fh:
        fh.truncate(64 << 20)  # 64 MiB of holes (8x the peer): they cost the job user nothing
    before = shutil.disk_usage(peer).free
    res = brctl("-i", inv, "--json", "ckpt", "backup")
    copies = {c["owner"]: c for c in res.json["copies"]}
    assert res.exit_code == 4, res.stdout + res.stderr
    assert copies["n1"]["state"] == "refused" and copies["n1"]["dest"] == "n4"
    why = copies["n1"]["error"]
    assert f"n4: no room for n1's step: needs {(64 << 20) + 2 * 2976} bytes" in why, why
    assert "has " in why and "free" in why
    assert shutil.disk_usage(peer).free >= before - (64 << 10)  # the step dir, no data
    assert _partials(peer) == []
    assert {c["state"] for o, c in copies.items() if o != "n1"} == {"ok"}


def test_a_receive_that_runs_out_of_room_names_enospc_and_leaves_nothing(
        tmp_path: Path, mount: Callable[..., Path]) -> None:
    ckpt = mount(tmp_path / "fs", "tmpfs", "1m") / "ckpt"
    ckpt.mkdir()
    staged = ckptmove.handle({"op": "stage", "dir": str(ckpt)})
    data = os.urandom(2 << 20)
    out = io.BytesIO()
    ckptmove.main([json.dumps({
        "op": "receive", "area": "staging", "dir": str(ckpt), "staging": staged["staging"],
        "staging_id": staged["staging_id"], "step": "step_1",
        "files": [{"path": "step_1/big.pt", "size": len(data), "mode": 0o640,
                   "sha256": hashlib.sha256(data).hexdigest()}]})], io.BytesIO(data), out)
    doc = json.loads(out.getvalue())
    assert str(doc["probe_error"]).startswith("ENOSPC: "), doc
    assert _partials(ckpt) == []  # the filesystem as found
    assert shutil.disk_usage(ckpt).used < (256 << 10)


def test_the_next_prepare_sweeps_what_a_killed_receive_left(tmp_path: Path) -> None:
    req = {"dir": str(tmp_path / "ckpt"), "source": "n1", "step": "step_1"}
    (tmp_path / "ckpt").mkdir()
    first = ckptfiles.handle({**req, "op": "prepare"})
    step = Path(first["root"]) / "n1" / "step_1"
    (step / "optim").mkdir()
    for where in (step, step / "optim"):
        (where / ".brctl-partial-0123456789ab").write_bytes(b"x" * 4096)
    (step / "kept.pt").write_bytes(b"a shard already here")
    again = ckptfiles.handle({**req, "op": "prepare"})
    assert again["ok"] is True and _partials(step) == []
    assert (step / "kept.pt").exists()


def test_the_root_reserve_is_not_room(tmp_path: Path, mount: Callable[..., Path]) -> None:
    """ext4 keeps blocks for root (-m): root could write there, but a backup must not."""
    fs = mount(tmp_path / "ext4", "ext4", "16m")
    ckpt = fs / "ckpt"
    ckpt.mkdir()
    stat = os.statvfs(fs)
    reserve = (stat.f_bfree - stat.f_bavail) * stat.f_frsize
    assert reserve > 4 << 20
    req = {"dir": str(ckpt), "source": "n1", "step": "step_1", "margin": 0}
    fits = ckptfiles.handle({**req, "op": "prepare", "need": stat.f_bavail * stat.f_frsize // 2})
    assert fits["ok"] is True
    doc = ckptfiles.handle({**req, "op": "prepare",
                            "need": stat.f_bavail * stat.f_frsize + reserve // 2})
    assert doc["ok"] is False and doc["no_room"]["free"] <= stat.f_bavail * stat.f_frsize


def test_a_killed_receive_of_an_older_step_does_not_block_the_next_backup(
        tmp_path: Path, mount: Callable[..., Path]) -> None:
    """trust-core #7: prepare swept partials only below the new step's dir and only commit
    pruned incomplete older steps: a receive of step_1 killed -9 mid-file left the peer
    full, step_2's room check failed, step_2 never committed, and so on for good."""
    peer = mount(tmp_path / "n4", "tmpfs", "8m")
    ckpt = peer / "ckpt"
    ckpt.mkdir()
    req = {"dir": str(ckpt), "source": "n1", "margin": 0}
    first = ckptfiles.handle({**req, "op": "prepare", "step": "step_1", "need": 6 << 20})
    assert first["ok"] is True, first
    data = os.urandom(6 << 20)
    receive = {**req, "op": "receive", "area": "backup", "step": "step_1",
               "files": [{"path": "step_1/big.pt", "size": len(data), "mode": 0o640,
                          "sha256": hashlib.sha256(data).hexdigest()}]}
    proc = subprocess.Popen([sys.executable, "-m", "brctl.diagnostics.ckptmove",
                             json.dumps(receive)], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, cwd=Path(__file__).parents[2])
    try:
        assert proc.stdin is not None
        proc.stdin.write(data[:5 << 20])
        proc.stdin.flush()
        def most_arrived() -> bool:  # most of it is on the peer, the receive still running
            assert proc.poll() is None, "the receive ended before the kill"
            return sum(os.path.getsize(p) for p in _partials(peer)) >= 4 << 20

        wait_for(most_arrived, "4 MiB of the step on the peer", 30, every=0.02)
    finally:
        proc.kill()
        proc.wait()
    assert _partials(peer) and shutil.disk_usage(peer).free <= 4 << 20  # < 5 MiB: full
    second = ckptfiles.handle({**req, "op": "prepare", "step": "step_2", "need": 5 << 20})
    assert second["ok"] is True, second
    assert _partials(peer) == []
    area = Path(second["root"]) / "n1"
    assert sorted(p.name for p in area.iterdir()) == ["step_2"]


def test_the_partial_sweep_walks_a_tree_deeper_than_the_recursion_limit(tmp_path: Path) -> None:
    """trust-core #9: sweep_partials recursed once per level: a copied step deeper than the
    recursion limit (lowered here to 100, the tree 300 deep) was a RecursionError at every
    prepare. It holds no fd per level either (the fd limit lowered here to 64)."""
    top = tmp_path / "deep"
    top.mkdir()
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(300):
            os.mkdir("d", dir_fd=fd)
            sub = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = sub
        os.close(os.open(".brctl-partial-0123456789ab", os.O_WRONLY | os.O_CREAT, 0o600,
                         dir_fd=fd))
    finally:
        os.close(fd)
    (top / "d" / ".brctl-partial-ba9876543210").write_bytes(b"x")
    (top / "d" / "kept.pt").write_bytes(b"x")
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = sys.getrecursionlimit()
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
    sys.setrecursionlimit(100)
    try:
        assert ckptspace.sweep_partials(fd) == 2
    finally:
        sys.setrecursionlimit(limit)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        os.close(fd)
    assert (top / "d" / "kept.pt").exists() and _partials(top) == []
