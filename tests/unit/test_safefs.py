"""brctl.diagnostics.safefs on real files: names, no symlink ever followed, StrictModes chain.

Attacks are planted as a job user would: symlinks to a "root-only" canary directory,
FIFOs, hard links, and a directory swapped for a symlink between two steps.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from brctl.diagnostics import safefs
from brctl.diagnostics.safefs import NotRegular, SymlinkRefused, UnsafeName

NOBODY = 65534


@pytest.fixture
def canary(tmp_path: Path) -> Path:
    """A directory standing for /etc: nothing in it may be read, written or removed."""
    d = tmp_path / "canary"
    d.mkdir()
    (d / "shadow").write_text("secret")
    return d


def _snapshot(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): p.read_text() if p.is_file() else "<dir>"
            for p in sorted(d.rglob("*"))}


@pytest.mark.parametrize("name", ["step_1", "a b", ".hidden", "..x", "x..", "-rf", "ü"])
def test_check_component_accepts_plain_names(name: str) -> None:
    assert safefs.check_component(name) == name


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "/", "a\0b", "../../victim"])
def test_check_component_refuses_and_names_the_bad_name(name: str) -> None:
    with pytest.raises(UnsafeName) as exc:
        safefs.check_component(name)
    assert repr(name) in str(exc.value)
    assert isinstance(exc.value, ValueError)


@pytest.mark.parametrize("path", ["a", "a/b/c.pt", "step_1/optim/rank0.bin", "..a/b.."])
def test_check_relpath_accepts_normal_relative_paths(path: str) -> None:
    assert safefs.check_relpath(path) == path


@pytest.mark.parametrize("path", ["", ".", "..", "/etc/passwd", "a/../b", "../x", "a/..",
                                  "a//b", "a/./b", "a/", "./a", "a\0b"])
def test_check_relpath_refuses_escapes_and_unnormalised(path: str) -> None:
    with pytest.raises(UnsafeName) as exc:
        safefs.check_relpath(path)
    assert repr(path) in str(exc.value)


def test_open_dir_refuses_a_symlink_at_any_component(tmp_path: Path, canary: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "link").symlink_to(canary)
    (tmp_path / "top").symlink_to(tmp_path / "a")
    with pytest.raises(SymlinkRefused, match="link"):
        safefs.open_dir(str(tmp_path / "a" / "link"))
    with pytest.raises(SymlinkRefused, match="top"):
        safefs.open_dir(str(tmp_path / "top" / "link"))
    base = safefs.open_dir(str(tmp_path))
    try:
        with pytest.raises(SymlinkRefused, match=r"\./a/link"):
            safefs.open_dir("a/link", base)
        with pytest.raises(UnsafeName):
            safefs.open_dir("a/../..", base)
        (tmp_path / "file").write_text("x")
        with pytest.raises(SymlinkRefused, match="not a directory"):
            safefs.open_dir("file", base)
    finally:
        os.close(base)
    with pytest.raises(UnsafeName):
        safefs.open_dir("relative/without/fd")
    with pytest.raises(UnsafeName):
        safefs.open_dir(str(tmp_path) + "/a/../a")


def test_a_dir_fd_stays_on_the_checked_directory_after_a_swap(tmp_path: Path, canary: Path) -> None:
    """The job renames the opened step away and puts a symlink to /etc in its place."""
    step = tmp_path / "step_1"
    step.mkdir()
    fd = safefs.open_dir(str(step))
    try:
        step.rename(tmp_path / "moved")
        step.symlink_to(canary)
        wfd = safefs.open_file(fd, "new.bin", os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(wfd, b"data")
        os.close(wfd)
        assert os.listdir(fd) == ["new.bin"]
    finally:
        os.close(fd)
    assert _snapshot(canary) == {"shadow": "secret"}
    assert (tmp_path / "moved" / "new.bin").read_bytes() == b"data"


def test_open_file_reads_regular_files_only(tmp_path: Path, canary: Path) -> None:
    (tmp_path / "ok").write_text("fine")
    (tmp_path / "link").symlink_to(canary / "shadow")
    os.mkfifo(tmp_path / "fifo")  # an open for reading would block forever
    (tmp_path / "sub").mkdir()
    fd = safefs.open_dir(str(tmp_path))
    try:
        rfd = safefs.open_file(fd, "ok")
        assert os.read(rfd, 10) == b"fine"
        os.close(rfd)
        with pytest.raises(SymlinkRefused, match="link"):
            safefs.open_file(fd, "link")
        with pytest.raises(NotRegular, match="FIFO"):
            safefs.open_file(fd, "fifo")
        with pytest.raises((NotRegular, IsADirectoryError)):
            safefs.open_file(fd, "sub")
        with pytest.raises(UnsafeName):
            safefs.open_file(fd, "../canary/shadow")
    finally:
        os.close(fd)


def test_creating_never_reuses_an_existing_name(tmp_path: Path, canary: Path) -> None:
    (tmp_path / "planted").symlink_to(canary / "shadow")
    fd = safefs.open_dir(str(tmp_path))
    old = os.umask(0)
    try:
        with pytest.raises(FileExistsError):
            safefs.open_file(fd, "planted", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with pytest.raises(ValueError, match="mode"):
            safefs.open_file(fd, "new", os.O_WRONLY | os.O_CREAT)
        nfd = safefs.open_file(fd, "new", os.O_WRONLY | os.O_CREAT, 0o640)
        os.close(nfd)
    finally:
        os.umask(old)
        os.close(fd)
    assert (tmp_path / "new").stat().st_mode & 0o7777 == 0o640  # exact, umask 0 or not
    assert _snapshot(canary) == {"shadow": "secret"}


def test_open_path_refuses_a_symlinked_parent(tmp_path: Path, canary: Path) -> None:
    (tmp_path / "step").mkdir()
    (tmp_path / "step" / "optim").symlink_to(canary)
    fd = safefs.open_dir(str(tmp_path))
    try:
        with pytest.raises(SymlinkRefused, match="optim"):
            safefs.open_path(fd, "step/optim/shadow")
        with pytest.raises(SymlinkRefused):
            safefs.open_path(fd, "step/optim/x", os.O_WRONLY | os.O_CREAT, 0o600)
    finally:
        os.close(fd)
    assert _snapshot(canary) == {"shadow": "secret"}


def test_make_dir_refuses_a_planted_symlink_and_a_swap_after_mkdir(
    tmp_path: Path, canary: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fd = safefs.open_dir(str(tmp_path))
    try:
        (tmp_path / "planted").symlink_to(canary)
        with pytest.raises(SymlinkRefused):
            safefs.make_dir(fd, "planted", exist_ok=True)
        with pytest.raises(FileExistsError):
            safefs.make_dir(fd, "planted")
        made = safefs.make_dir(fd, "fresh", 0o700)
        os.close(made)
        assert (tmp_path / "fresh").stat().st_mode & 0o777 == 0o700
        deep = safefs.make_dirs(fd, "fresh/a/b")
        os.close(deep)
        assert (tmp_path / "fresh" / "a" / "b").is_dir()

        real_mkdir = os.mkdir

        def mkdir_then_swap(name: str, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
            real_mkdir(name, mode, dir_fd=dir_fd)  # the job wins the race right after mkdir
            os.rename(name, "gone", src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            os.symlink(str(canary), name, dir_fd=dir_fd)

        monkeypatch.setattr(os, "mkdir", mkdir_then_swap)
        with pytest.raises(SymlinkRefused, match="racy"):
            safefs.make_dir(fd, "racy")
    finally:
        os.close(fd)
    assert _snapshot(canary) == {"shadow": "secret"}


def test_walk_lists_regular_files_and_reports_everything_else(tmp_path: Path, canary: Path) -> None:
    tree = tmp_path / "step_1"
    (tree / "optim").mkdir(parents=True)
    (tree / "model.pt").write_text("m")
    (tree / "optim" / "rank0.bin").write_text("o")
    (tree / ".brctl-manifest.json").write_text("{}")
    (tree / "etc").symlink_to(canary)
    (tree / "optim" / "shadow").symlink_to(canary / "shadow")
    os.mkfifo(tree / "pipe")
    os.link(canary / "shadow", tree / "hard")  # root's file, hard-linked into a job tree
    if os.geteuid() == 0:
        for d in (tree, tree / "optim"):
            os.chown(d, NOBODY, NOBODY)  # the job's tree
    fd = safefs.open_dir(str(tree))
    try:
        walk = safefs.walk_files(fd, exclude=frozenset({".brctl-manifest.json"}))
    finally:
        os.close(fd)
    skipped = {"etc": "symlink; not followed", "optim/shadow": "symlink; not followed",
               "pipe": "FIFO"}
    if os.geteuid() == 0:  # root's file in the job's tree
        skipped["hard"] = "a root file with 2 links in a directory of nobody (uid 65534); not read"
    assert dict(walk.skipped) == skipped
    assert walk.files == sorted(["model.pt", "optim/rank0.bin"] + (["hard"] if os.geteuid() else []))


def _st(uid: int, mode: int, nlink: int = 1) -> os.stat_result:
    """A stat result with just what ``foreign_file`` reads."""
    return os.stat_result((mode, 1, 1, nlink, uid, uid, 0, 0, 0, 0))


@pytest.mark.parametrize("file, directory, refused", [
    # a directory only root can write: whatever is there, root put there
    (_st(0, 0o100600, 2), _st(0, 0o40755), None),
    (_st(NOBODY, 0o100600, 2), _st(0, 0o40700), None),
    # the directory owner's own files, however many links
    (_st(NOBODY, 0o100600, 3), _st(NOBODY, 0o40755), None),
    (_st(NOBODY, 0o100600, 1), _st(NOBODY, 0o40777), None),
    # the job's directory: a hard link to a root file or another user's; a root-only
    # file left there with one link once its original name was removed
    (_st(0, 0o100600, 2), _st(NOBODY, 0o40755), "a root file with 2 links in a directory of"),
    (_st(1234, 0o100644, 2), _st(NOBODY, 0o40755), "a file of uid 1234 with 2 links"),
    (_st(0, 0o100600, 1), _st(NOBODY, 0o40755), "a root file others cannot read (mode 0600)"),
    (_st(0, 0o100644, 1), _st(NOBODY, 0o40755), None),  # readable by all anyway
    # a colleague's private file linked into the job's directory and kept with one name
    (_st(1234, 0o100600, 1), _st(NOBODY, 0o40755), "a file of uid 1234 others cannot read"),
    (_st(1234, 0o100644, 1), _st(NOBODY, 0o40755), None),
    # a root-owned directory others can write (a 0775 ckpt.dir, a 1777 log dir): root's
    # file with links is refused, the job's own too (its owner is not the dir's)
    (_st(0, 0o100600, 2), _st(0, 0o40775), "in a root directory others can write (mode 0775)"),
    (_st(0, 0o100600, 2), _st(0, 0o41777), "in a root directory others can write (mode 1777)"),
    (_st(NOBODY, 0o100600, 2), _st(0, 0o41777), "with 2 links in a root directory"),
    (_st(0, 0o100600, 1), _st(0, 0o41777), "a root file others cannot read"),
    # ... and a private file there is the job user's own, or a colleague's: root would
    # copy a colleague's checkpoint to the job (the same 0775 group may write there)
    (_st(NOBODY, 0o100600, 1), _st(0, 0o41777), "not the job user's"),
    (_st(1234, 0o100600, 1), _st(0, 0o40775), "a file of uid 1234 others cannot read (mode 0600)"
                                              " in a root directory others can write (mode 0775)"),
    (_st(1234, 0o100644, 1), _st(0, 0o40775), None),
])
def test_foreign_file_is_the_one_rule_for_files_read_as_root(
        file: os.stat_result, directory: os.stat_result, refused: str | None) -> None:
    why = safefs.foreign_file(file, directory)
    assert (why is None) if refused is None else (refused in (why or "")), why


@pytest.mark.parametrize("file, directory, refused", [
    # the job user's own private file in a root directory others can write: its own
    (_st(NOBODY, 0o100600, 1), _st(0, 0o41777), None),
    (_st(NOBODY, 0o100600, 1), _st(0, 0o40775), None),
    # a colleague's beside it is not, nor a root file, nor the job's with a second link
    (_st(1234, 0o100600, 1), _st(0, 0o40775), "a file of uid 1234 others cannot read"),
    (_st(0, 0o100600, 1), _st(0, 0o40775), "a root file others cannot read"),
    (_st(NOBODY, 0o100600, 2), _st(0, 0o40775), "with 2 links"),
    # the job user is no one's owner in a directory of a third user
    (_st(NOBODY, 0o100600, 1), _st(1234, 0o40755), "a file of nobody (uid 65534) others cannot"),
])
def test_foreign_file_admits_the_job_users_private_files_only_in_a_shared_root_directory(
        file: os.stat_result, directory: os.stat_result, refused: str | None) -> None:
    why = safefs.foreign_file(file, directory, job_uid=NOBODY)
    assert (why is None) if refused is None else (refused in (why or "")), why


@pytest.fixture
def root_canary() -> Iterator[Path]:
    """A root-only file on the filesystem of ``/run`` or ``/var/lib`` (a hard link needs
    one filesystem), with a private directory to plant links beside it."""
    if os.geteuid() != 0:
        pytest.skip("planting root files and hard links needs root")
    base = next((p for p in ("/run", "/var/lib") if os.path.isdir(p)
                 and safefs.unsafe_owner_chain(p) is None), None)
    if base is None:
        pytest.skip("no root-owned directory to work under")
    path = Path(tempfile.mkdtemp(prefix="brctl-safefs-", dir=base))
    (path / "shadow").write_text("root only")
    (path / "shadow").chmod(0o600)
    try:
        yield path
    finally:
        shutil.rmtree(path)


@pytest.mark.parametrize("mode", [0o775, 0o1777])
def test_a_hard_link_in_a_root_directory_others_can_write_is_not_listed_nor_read(
        root_canary: Path, mode: int) -> None:
    """Audit R1: a root-owned 0775 ckpt.dir (the job's group may write it) or a 1777 dir
    where fs.protected_hardlinks is 0: the job can link a root-only file there. Its owner
    (root) being the directory's owner must not make it the directory's own file."""
    shared = root_canary / "shared"
    shared.mkdir()
    shared.chmod(mode)
    os.link(root_canary / "shadow", shared / "a.pt")
    (shared / "b.pt").write_text("the job's")
    os.chown(shared / "b.pt", NOBODY, NOBODY)
    fd = safefs.open_dir(str(shared))
    try:
        walk = safefs.walk_files(fd)
        with pytest.raises(safefs.ForeignFile, match=f"with 2 links in a root directory others "
                           f"can write \\(mode {mode:04o}\\)"):
            safefs.open_read(fd, "a.pt")
        os.close(safefs.open_read(fd, "b.pt"))
    finally:
        os.close(fd)
    assert walk.files == ["b.pt"]
    assert [p for p, _ in walk.skipped] == ["a.pt"]
    with pytest.raises(OSError, match="a root file with 2 links"):
        safefs.open_job_file(str(shared / "a.pt"))
    # in a directory only root can write, the same link is root's own doing: read
    shared.chmod(0o755)
    os.close(safefs.open_job_file(str(shared / "a.pt")))


def test_remove_tree_unlinks_links_and_never_follows_them(tmp_path: Path, canary: Path) -> None:
    victim = tmp_path / "staging"
    (victim / "a" / "b").mkdir(parents=True)
    (victim / "a" / "b" / "f").write_text("x")
    (victim / "etc").symlink_to(canary)
    (victim / "a" / "shadow").symlink_to(canary / "shadow")
    fd = safefs.open_dir(str(tmp_path))
    try:
        safefs.remove_tree(fd, "staging")
        (tmp_path / "link").symlink_to(canary)
        with pytest.raises(SymlinkRefused):
            safefs.remove_tree(fd, "link")
    finally:
        os.close(fd)
    assert not victim.exists()
    assert _snapshot(canary) == {"shadow": "secret"}


@pytest.fixture
def safe_base() -> Iterator[Path]:
    """A root-owned 0700 directory whose every parent is root-owned and not writable by others.

    Not under /tmp: /tmp is world-writable (sticky or not, OpenSSH's rule refuses it).
    """
    if os.geteuid() != 0:
        pytest.skip("ownership checks need root")
    base = next((p for p in ("/run", "/var/lib", "/root") if os.path.isdir(p)
                 and safefs.unsafe_owner_chain(p) is None), None)
    if base is None:
        pytest.skip("no root-owned directory to work under")
    path = Path(tempfile.mkdtemp(prefix="brctl-safefs-", dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path)


def test_owner_chain_passes_a_root_owned_chain(safe_base: Path) -> None:
    (safe_base / "backup").mkdir(mode=0o700)
    assert safefs.unsafe_owner_chain(str(safe_base / "backup")) is None
    assert safefs.unsafe_owner_chain("/") is None


def test_owner_chain_names_the_path_and_its_owner(safe_base: Path) -> None:
    job = safe_base / "job"
    (job / "backup").mkdir(parents=True)
    os.chown(job, NOBODY, NOBODY)
    reason = safefs.unsafe_owner_chain(str(job / "backup"))
    assert reason is not None and str(job) in reason and "uid 65534" in reason
    assert safefs.unsafe_owner_chain(str(job / "backup"), allowed_uids=(0, NOBODY)) is None
    os.chown(job, 0, 0)
    os.chmod(job, 0o775)
    reason = safefs.unsafe_owner_chain(str(job / "backup"))
    assert reason == f"{job} is group/other writable (mode 0775)"


def test_owner_chain_refuses_sticky_world_writable_dirs_like_openssh(tmp_path: Path) -> None:
    reason = safefs.unsafe_owner_chain(str(tmp_path))
    assert reason is not None and "group/other writable" in reason


def test_sticky_ok_accepts_a_sticky_dir_only_for_entries_of_allowed_owners(tmp_path: Path) -> None:
    # /tmp is 1777: others may add names there, never rename or remove ours.
    mine = tmp_path / "inv.yaml"
    mine.write_text("x")
    assert safefs.unsafe_owner_chain(str(mine), sticky_ok=True) is None
    os.chown(mine, NOBODY, NOBODY)
    reason = safefs.unsafe_owner_chain(str(mine), sticky_ok=True)
    assert reason is not None and "uid 65534" in reason
    loose = tmp_path / "loose"
    loose.mkdir()
    os.chmod(loose, 0o777)  # world writable without the sticky bit: anyone may swap entries
    reason = safefs.unsafe_owner_chain(str(loose), sticky_ok=True)
    assert reason == f"{loose} is group/other writable (mode 0777)"


def test_owner_chain_follows_only_root_owned_symlinks_and_checks_the_target(
    safe_base: Path, tmp_path: Path
) -> None:
    (safe_base / "real").mkdir()
    (safe_base / "root-link").symlink_to(safe_base / "real")
    assert safefs.unsafe_owner_chain(str(safe_base / "root-link")) is None
    (safe_base / "rel-link").symlink_to("real")
    assert safefs.unsafe_owner_chain(str(safe_base / "rel-link")) is None
    (safe_base / "job-link").symlink_to(safe_base / "real")
    os.chown(safe_base / "job-link", NOBODY, NOBODY, follow_symlinks=False)
    reason = safefs.unsafe_owner_chain(str(safe_base / "job-link"))
    assert reason is not None and "symlink owned by" in reason and "job-link" in reason
    (safe_base / "to-tmp").symlink_to(tmp_path)
    reason = safefs.unsafe_owner_chain(str(safe_base / "to-tmp"))
    assert reason is not None and "/tmp" in reason
    (safe_base / "loop").symlink_to(safe_base / "loop")
    assert "too many levels" in (safefs.unsafe_owner_chain(str(safe_base / "loop")) or "")
    assert "No such file" in (safefs.unsafe_owner_chain(str(safe_base / "missing")) or "")


def test_resolve_path_refuses_a_root_symlink_the_job_hard_linked_into_its_dir(
        safe_base: Path, canary: Path) -> None:
    """Where fs.protected_hardlinks is 0 the job user can hard link any root-owned symlink
    of the filesystem (``/var/run -> /run``) into its own directory: the link is still
    root's, but the operator never put it on the way to ``ckpt.dir``."""
    (safe_base / "operators-link").symlink_to(canary)  # root's, somewhere root keeps it
    job = safe_base / "job"
    job.mkdir()
    os.chown(job, NOBODY, NOBODY)
    os.link(safe_base / "operators-link", job / "ckpt", follow_symlinks=False)
    assert os.lstat(job / "ckpt").st_uid == 0
    with pytest.raises(SymlinkRefused, match="hard link"):
        safefs.resolve_path(str(job / "ckpt"), (0,))
    assert "hard link" in (safefs.unsafe_owner_chain(str(job / "ckpt"), (0, NOBODY)) or "")


def test_resolve_path_follows_only_trusted_links(safe_base: Path) -> None:
    (safe_base / "nvme" / "ckpt").mkdir(parents=True)
    (safe_base / "local").symlink_to(safe_base / "nvme")  # the operator's, root-owned
    assert safefs.resolve_path(str(safe_base / "local" / "ckpt")) == str(safe_base / "nvme" / "ckpt")
    (safe_base / "job").symlink_to("/etc")
    os.chown(safe_base / "job", NOBODY, NOBODY, follow_symlinks=False)
    with pytest.raises(SymlinkRefused, match="symlink owned by"):
        safefs.resolve_path(str(safe_base / "job"))
    with pytest.raises(FileNotFoundError):
        safefs.resolve_path(str(safe_base / "missing" / "x"))
