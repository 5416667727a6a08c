"""``update push`` as root on a tree the job user owns (issue 35, item 1).

The job user may own the release directory (or a link on the way to it) and swap
anything in it at any moment; the controller packs as root and every machine
installs the members readable by all. So: only links of root or the operator are
followed to ``SRC``, members are opened by directory fd with ``O_NOFOLLOW`` and packed
as ``fstat`` says, a member others cannot read is refused (never widened to 0644),
and git's own refusal of a job-owned repository is exit 2 naming the owner.
"""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from brctl.core.errors import InputError
from brctl.operations.update import pack as update_pack

from ..conftest import local_release_world

JOB = 65534  # nobody: a uid that is neither root nor the operator


@pytest.fixture(autouse=True)
def _root() -> None:
    if os.geteuid() != 0:
        if os.environ.get("BRCTL_REQUIRE_INTEGRATION") == "1":
            pytest.fail("these tests chown files to a job user: they need root")
        pytest.skip("needs root (chown to a job user)")


def _secret(tmp_path: Path) -> Path:
    """A root-only directory holding a root-only key, as /root/.ssh."""
    d = tmp_path / "rootonly"
    d.mkdir(mode=0o700)
    (d / "id_ed25519").write_text("PRIVATE KEY\n")
    (d / "id_ed25519").chmod(0o600)
    return d


def _job_link(link: Path, target: Path) -> Path:
    link.symlink_to(target)
    os.lchown(link, JOB, JOB)
    return link


def _names(data: bytes) -> dict[str, int]:
    import io
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: m.mode for m in tar.getmembers()}


def test_a_job_owned_link_at_src_is_refused_naming_it(brctl, tmp_path: Path) -> None:
    inv, _ = local_release_world(tmp_path)
    link = _job_link(tmp_path / "release", _secret(tmp_path))
    res = brctl("-i", inv, "update", "push", link, "-V", "v1")
    assert res.exit_code == 2, res.stdout + res.stderr
    assert f"{link} is a symlink owned by nobody (uid {JOB})" in res.stderr
    assert "Traceback" not in res.stderr
    assert not list(tmp_path.glob("nodes/*/releases/v1"))  # nothing shipped


def test_a_job_owned_link_on_the_way_to_src_is_refused(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    secret = _secret(tmp_path)
    (secret / "rel").mkdir()
    (secret / "rel" / "train.py").write_text("x\n")
    _job_link(home / "link", secret)
    with pytest.raises(InputError, match=f"{home}/link is a symlink owned by nobody"):
        update_pack.pack(str(home / "link" / "rel"), None, tmp_path / "store")


def test_a_link_of_root_is_followed_and_the_source_names_the_real_path(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (real / "train.py").write_text("x\n")
    (tmp_path / "rootlink").symlink_to(real)  # root's own link: the operator's
    art = update_pack.pack(str(tmp_path / "rootlink"), None, tmp_path / "store")
    assert art.source == f"dir:{real}"


@pytest.mark.parametrize("member, mode", [("id_ed25519", 0o600), ("keys", 0o700),
                                          ("group.cfg", 0o640)])
def test_a_member_others_cannot_read_is_refused_not_widened(
        tmp_path: Path, member: str, mode: int) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("x\n")
    if member == "keys":
        (src / member).mkdir()
        (src / member / "a").write_text("a\n")
    else:
        (src / member).write_text("secret\n")
    (src / member).chmod(mode)
    with pytest.raises(InputError, match=f"entry '{member}': others cannot read it "
                                         f"\\(mode {mode:04o}\\)"):
        update_pack.pack(str(src), None, tmp_path / "store")


def test_a_hard_link_to_a_root_only_key_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    os.chown(src, JOB, JOB)
    try:
        os.link(_secret(tmp_path) / "id_ed25519", src / "key")
    except OSError as exc:  # protected_hardlinks does not stop root; a bind mount might
        pytest.skip(f"cannot hard link here: {exc}")
    with pytest.raises(InputError, match="entry 'key': others cannot read it"):
        update_pack.pack(str(src), None, tmp_path / "store")


def test_readable_members_keep_the_deterministic_normalised_modes(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "train.py").write_text("x\n")
    (src / "run.sh").write_text("#!/bin/sh\n")
    (src / "run.sh").chmod(0o4775)
    (src / "l.py").symlink_to("pkg/train.py")
    first = update_pack.pack_directory(src)
    assert _names(first) == {"l.py": 0o755, "pkg": 0o755, "pkg/train.py": 0o644,
                             "run.sh": 0o755}
    assert update_pack.pack_directory(src) == first  # same tree, same bytes


def test_a_member_swapped_for_a_link_after_the_listing_is_not_read_through(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job swaps ``train.py`` for a link to root's key between listing and open."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("x\n")
    key = _secret(tmp_path) / "id_ed25519"
    key.chmod(0o644)  # readable: only the O_NOFOLLOW open stops it
    listing = update_pack._listing

    def swap_after_listing(dir_fd: int) -> list[tuple[str, os.stat_result]]:
        entries = listing(dir_fd)
        if (src / "train.py").is_file() and not (src / "train.py").is_symlink():
            (src / "train.py").unlink()
            (src / "train.py").symlink_to(key)
        return entries

    monkeypatch.setattr(update_pack, "_listing", swap_after_listing)
    with pytest.raises(InputError, match=r"entry 'train.py'.*symlink"):
        update_pack.pack_directory(src)


def test_a_fifo_swapped_in_does_not_hang_the_packer(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("x\n")
    listing = update_pack._listing

    def swap_after_listing(dir_fd: int) -> list[tuple[str, os.stat_result]]:
        entries = listing(dir_fd)
        if not (src / "train.py").is_fifo():
            (src / "train.py").unlink()
            os.mkfifo(src / "train.py")
        return entries

    monkeypatch.setattr(update_pack, "_listing", swap_after_listing)
    with pytest.raises(InputError, match=r"entry 'train.py'.*FIFO"):
        update_pack.pack_directory(src)


def test_a_tarball_behind_a_job_link_or_hard_linked_from_root_is_refused(
        brctl, tmp_path: Path) -> None:
    inv, src = local_release_world(tmp_path)
    secret = _secret(tmp_path)
    with tarfile.open(secret / "backup.tgz", "w:gz") as tar:
        tar.add(src, arcname="rel")
    (secret / "backup.tgz").chmod(0o600)
    link = _job_link(tmp_path / "rel.tgz", secret / "backup.tgz")
    res = brctl("-i", inv, "update", "push", link, "-V", "v1")
    assert res.exit_code == 2 and f"{link} is a symlink owned by nobody" in res.stderr
    jobdir = tmp_path / "jobdir"
    jobdir.mkdir()
    os.chown(jobdir, JOB, JOB)
    os.link(secret / "backup.tgz", jobdir / "rel.tgz")
    res = brctl("-i", inv, "update", "push", jobdir / "rel.tgz", "-V", "v1")
    assert res.exit_code == 2 and "a root file with 2 links" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
    assert not list(tmp_path.glob("nodes/*/releases/v1"))


def test_git_s_refusal_of_a_job_owned_repository_names_the_owner(
        brctl, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inv, _ = local_release_world(tmp_path)
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "no-gitconfig"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "train.py").write_text("x\n")
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "one"]):
        subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                        *args], check=True, capture_output=True)
    subprocess.run(["chown", "-R", f"{JOB}:{JOB}", str(repo)], check=True)
    res = brctl("-i", inv, "update", "push", repo, "--rev", "HEAD", "-V", "g1")
    assert res.exit_code == 2, res.stdout + res.stderr
    assert f"owned by nobody (uid {JOB})" in res.stderr and "safe.directory" in res.stderr
    assert "git config --global" not in res.stderr  # brctl does not tell root to trust it
    assert "Traceback" not in res.stderr


def test_a_tree_past_update_max_bytes_is_refused_naming_the_member(brctl, tmp_path: Path) -> None:
    """trust-core #4: every member was read whole into memory, with no bound: a job user's
    tree of 500 GB made root's controller (or the daemon beside it) run out of memory."""
    import yaml

    inv, src = local_release_world(tmp_path)
    doc = yaml.safe_load(inv.read_text())
    doc["update"]["max_bytes"] = 16384
    inv.write_text(yaml.safe_dump(doc))
    (src / "weights.bin").write_bytes(os.urandom(20000))
    res = brctl("-i", inv, "update", "push", src, "-V", "v1")
    assert res.exit_code == 2, res.stdout + res.stderr
    assert "entry 'weights.bin' (20000 bytes) takes the release past update.max_bytes " \
           "(16384 bytes)" in res.stderr
    assert "Traceback" not in res.stderr
    assert not list(tmp_path.glob("nodes/*/releases/v1"))


def test_a_sparse_member_is_refused_naming_it(tmp_path: Path) -> None:
    """A sparse file costs the job user nothing and root reads it whole (holes as zeros)."""
    src = tmp_path / "src"
    (src / "data").mkdir(parents=True)
    (src / "train.py").write_text("print(1)\n")
    with open(src / "data" / "huge.bin", "wb") as fh:
        fh.truncate(64 << 20)
    with pytest.raises(InputError, match=r"entry 'data/huge.bin' is sparse \(67108864 bytes"):
        update_pack.pack_directory(src, max_bytes=1 << 40)


def test_a_mount_inside_the_tree_is_refused_naming_it(tmp_path: Path) -> None:
    """trust-core #11: the walk crossed filesystems: a job user's FUSE mount in the tree
    serves root whatever it likes (growing sizes, reads that never return). A tmpfs here."""
    src = tmp_path / "src"
    (src / "lib" / "mnt").mkdir(parents=True)
    (src / "train.py").write_text("print(1)\n")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0755", "tmpfs",
                           str(src / "lib" / "mnt")], capture_output=True, text=True)
    if done.returncode != 0:
        if os.environ.get("BRCTL_REQUIRE_INTEGRATION") == "1":
            pytest.fail(f"mount: {done.stderr.strip()}")
        pytest.skip(f"mount: {done.stderr.strip()}")
    try:
        (src / "lib" / "mnt" / "served.py").write_text("print('from the mount')\n")
        with pytest.raises(InputError, match=r"entry 'lib/mnt' is on another filesystem"):
            update_pack.pack_directory(src)
    finally:
        subprocess.run(["umount", "-l", str(src / "lib" / "mnt")], check=False)
