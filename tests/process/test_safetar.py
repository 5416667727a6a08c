"""brctl's own tar member rules (safetar): hostile releases are refused by name, on the node
and on the controller, without ``tarfile.data_filter``; nothing lands outside the release."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from brctl.diagnostics import safetar
from brctl.operations.update.pack import pack_directory

ROOT = Path(__file__).resolve().parents[2]

Spec = tuple  # (name, type, linkname-or-data[, mode[, uid]])


def archive(*specs: Spec) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, extra, *rest in specs:
            info = tarfile.TarInfo(name)
            info.type = kind
            info.mode = rest[0] if rest else (0o755 if kind == tarfile.DIRTYPE else 0o644)
            info.uid = rest[1] if len(rest) > 1 else 0
            data = None
            if kind == tarfile.REGTYPE:
                data = extra.encode()
                info.size = len(data)
            else:
                info.linkname = extra
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def F(name: str, data: str = "x", mode: int = 0o644, uid: int = 0) -> Spec:
    return (name, tarfile.REGTYPE, data, mode, uid)


def D(name: str, mode: int = 0o755) -> Spec:
    return (name, tarfile.DIRTYPE, "", mode)


def L(name: str, target: str) -> Spec:
    return (name, tarfile.SYMTYPE, target)


def H(name: str, target: str) -> Spec:
    return (name, tarfile.LNKTYPE, target)


CHAIN = (D("x"), L("x/a/b/c/d/e", "../../../.."), L("x/a/b/c/d/e/l2", "../../../../../etc"))

HOSTILE = {
    # the chain: a link to a directory, then a link through it
    "chain": (CHAIN, "x/a/b/c/d/e/l2"),
    "chain, link alone": ((L("x/a/b/c/d/e", "../../../.."),), "x/a/b/c/d/e"),
    "chain, second alone": ((L("x/a/b/c/d/e/l2", "../../../../../etc"),), "x/a/b/c/d/e/l2"),
    "absolute name": ((F("/etc/cron.d/evil"),), "/etc/cron.d/evil"),
    "dot-dot name": ((F("a/../../evil"),), "a/../../evil"),
    "absolute symlink": ((L("passwd", "/etc/passwd"),), "passwd"),
    "symlink above the release": ((F("f"), L("a/l", "../../f")), "a/l"),
    "symlink to a directory": ((D("d"), F("d/f"), L("l", "d")), "'l'"),
    "symlink to a symlink": ((F("f"), L("s", "f"), L("t", "s")), "'t'"),
    "symlink to nothing": ((L("l", "missing"),), "'l'"),
    "symlink through a symlink": ((D("d"), F("d/f"), F("f"), L("s", "d/f"), L("l", "s/../f")), "'l'"),
    "symlink through a file": ((F("f"), F("g"), L("l", "f/../g")), "'l'"),
    "file under a symlink": ((F("f"), L("s", "f"), F("s/evil")), "s/evil"),
    "dir under a symlink": ((D("d"), L("s", "d"), D("s/sub")), "s/sub"),
    "hard link outside": ((H("h", "/etc/shadow"),), "h"),
    "hard link above": ((H("h", "../shadow"),), "h"),
    "hard link to a later file": ((H("h", "f"), F("f")), "'h'"),
    "hard link to a directory": ((D("d"), H("h", "d")), "'h'"),
    "fifo": ((("p", tarfile.FIFOTYPE, ""),), "'p'"),
    "char device": ((("mem", tarfile.CHRTYPE, ""),), "'mem'"),
    "block device": ((("sda", tarfile.BLKTYPE, ""),), "'sda'"),
    "file twice": ((F("f"), F("f", "y")), "'f'"),
    "file then dir": ((F("f"), D("f")), "'f'"),
    "symlink then file": ((F("g"), L("f", "g"), F("f")), "'f'"),
}


def _members(data: bytes) -> list[tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return tar.getmembers()


@pytest.mark.parametrize("case", HOSTILE, ids=list(HOSTILE))
def test_hostile_members_are_refused_by_name(case: str) -> None:
    specs, named = HOSTILE[case]
    with pytest.raises(safetar.UnsafeMember) as err:
        safetar.plan(_members(archive(*specs)))
    assert named in str(err.value)


def _probe_without_data_filter(tmp_path: Path, data: bytes) -> tuple[int, dict]:
    """Run the release probe in a fresh interpreter whose tarfile has no data_filter
    (as on Python 3.9.0-3.9.16, 3.10.0-3.10.11, 3.11.0-3.11.3). $BRCTL_TEST_NODE_PYTHON
    picks another interpreter for it (e.g. a pyenv 3.9: the node side's oldest)."""
    request = {"action": "receive", "root": str(tmp_path / "root"), "version": "v1",
               "sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "offset": 0}
    code = ("import sys, tarfile\n"
            "for name in ('data_filter', 'tar_filter'):\n"
            "    if hasattr(tarfile, name): delattr(tarfile, name)\n"
            "from brctl.diagnostics import release\n"
            "assert not hasattr(tarfile, 'data_filter')\n"
            "sys.exit(release.main(sys.argv[1:], sys.stdin.buffer, sys.stdout))\n")
    proc = subprocess.run([os.environ.get("BRCTL_TEST_NODE_PYTHON", sys.executable), "-c", code, json.dumps(request)], input=data,
                          capture_output=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          timeout=60, check=False)
    assert proc.stderr == b"", proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def _canary(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    canary = tmp_path / "canary"
    (canary / "etc").mkdir(parents=True)
    (canary / "etc" / "passwd").write_bytes(b"root:x:0:0\n")
    return canary, {p.name: p.read_bytes() for p in canary.rglob("*") if p.is_file()}


def _aimed_at(canary: Path) -> dict[str, tuple[Spec, ...]]:
    """Hostile releases aimed at the canary: the staging dir is <tmp>/root/releases/.staging-*,
    so four '..' from the release's x/ reach <tmp>."""
    etc = canary / "etc"
    return {
        # each link passes a lexical check; followed, l2 is <tmp>/canary/etc
        "chain": (L("x/a/b/c/d/e", "../../../.."), L("x/a/b/c/d/e/l2", "../../../../canary/etc"),
                  F("x/a/b/c/d/e/l2/pwned", "owned\n")),
        "absolute symlink": (L("passwd", str(etc / "passwd")), F("passwd", "owned\n")),
        "symlink through a symlink": (D("d"), F("d/f"), F("f"), L("s", "d/f"),
                                      L("l", "s/../f")),
        "hard link outside": (H("h", str(etc / "passwd")),),
        "dot-dot name": (F("../../../canary/etc/pwned", "owned\n"),),
        "fifo": ((str(etc / "fifo"), tarfile.FIFOTYPE, ""),),
    }


@pytest.mark.parametrize("case, named", [
    ("chain", "x/a/b/c/d/e"), ("absolute symlink", "'passwd'"),
    ("symlink through a symlink", "'l'"), ("hard link outside", "'h'"),
    ("dot-dot name", "canary/etc/pwned"), ("fifo", "/canary/etc/fifo"),
])
def test_node_refuses_hostile_releases_without_data_filter(tmp_path: Path, case: str,
                                                           named: str) -> None:
    canary, before = _canary(tmp_path)
    code, doc = _probe_without_data_filter(tmp_path, archive(*_aimed_at(canary)[case]))
    assert code == 1 and doc["probe_error"].startswith("artifact entry "), doc
    assert named in doc["probe_error"]
    assert {p.name: p.read_bytes() for p in canary.rglob("*") if p.is_file()} == before
    assert not [p for p in canary.rglob("*") if not p.is_file() and p.name != "etc"]
    assert not list((tmp_path / "root" / "releases").iterdir())  # staging removed, no v1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["canary", "root"]


def test_good_release_extracts_without_data_filter_and_drops_unsafe_bits(tmp_path: Path) -> None:
    data = archive(D("./pkg", 0o2775), F("./pkg/train.py", "print(1)\n", 0o4777, uid=1234),
                   F("run.sh", "#!/bin/sh\n", 0o755), F("secret.cfg", "k\n", 0o640),
                   L("link.py", "pkg/train.py"), L("pkg/up.sh", "../run.sh"),
                   H("pkg/copy.py", "pkg/train.py"), D("empty"))
    code, doc = _probe_without_data_filter(tmp_path, data)
    assert code == 0 and doc["files"] == 4, doc
    rel = tmp_path / "root" / "releases" / "v1"
    mode = lambda p: (rel / p).lstat().st_mode & 0o7777  # noqa: E731
    assert (rel / "pkg" / "train.py").read_text() == "print(1)\n"
    assert mode("pkg/train.py") == 0o755  # setuid and group/other write dropped
    assert mode("pkg") == 0o755 and mode("run.sh") == 0o755 and mode("secret.cfg") == 0o640
    assert (rel / "pkg" / "train.py").stat().st_uid == os.geteuid()  # never the archive's uid
    assert os.readlink(rel / "link.py") == "pkg/train.py" and (rel / "pkg" / "up.sh").read_text()
    copy = rel / "pkg" / "copy.py"
    assert copy.read_text() == "print(1)\n" and not copy.is_symlink()
    assert copy.stat().st_ino != (rel / "pkg" / "train.py").stat().st_ino  # a copy, not a link
    assert (rel / "empty").is_dir()


def test_a_symlink_planted_in_the_destination_is_not_followed(tmp_path: Path) -> None:
    """Extraction is by dir fd with O_NOFOLLOW/O_EXCL: a link swapped in is refused, not used."""
    canary, before = _canary(tmp_path)
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "pkg").symlink_to(canary / "etc")
    (dest / "run.sh").symlink_to(canary / "etc" / "passwd")
    for specs in [(F("pkg/passwd", "owned\n"),), (F("run.sh", "owned\n"),), (D("pkg"),)]:
        data = archive(*specs)
        fd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY)
        try:
            with tarfile.open(fileobj=io.BytesIO(data)) as tar, pytest.raises(OSError):
                safetar.extract(tar, safetar.plan(tar.getmembers()), fd)
        finally:
            os.close(fd)
    assert {p.name: p.read_bytes() for p in canary.rglob("*") if p.is_file()} == before


def test_packed_directories_keep_symlinks_to_files_and_order_does_not_matter(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "z.py").write_text("z\n")
    (src / "a.py").symlink_to("pkg/z.py")  # listed before its target in the archive
    entries = safetar.plan(_members(pack_directory(src)))
    assert [e.kind for e in entries][-1] == safetar.SYMLINK
    assert {"/".join(e.parts): e.kind for e in entries} == {
        "a.py": "symlink", "pkg": "dir", "pkg/z.py": "file"}
