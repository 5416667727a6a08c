"""Files brctl writes on the controller as root, in directories others share (issue 35, item 11).

``stacks --save DIR`` wrote by path (a planted ``job.json`` link in a shared dump
directory made root overwrite its target); ``report -o`` renamed into an unchecked
directory (a job's link on the way sent the page anywhere), and Chromium wrote the
``--png`` itself, by path, through whatever link stood there.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from brctl.core.errors import InputError
from brctl.operations.report import screenshot, write_atomic
from brctl.operations.stacks import save as stacks_save
from tests.process.test_stacks_collect import _saved_job

JOB = 65534


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "etc-cron.d-x"
    victim.write_text("root's file\n")
    return victim


def _saved(tmp_path: Path) -> tuple[list[Any], Any]:
    import json

    src = tmp_path / "src"
    (src / "job.json").parent.mkdir(parents=True, exist_ok=True)
    job = _saved_job(src)
    (src / "job.json").write_text(json.dumps(job))
    return stacks_save.load(src)


def test_stacks_save_never_writes_through_a_planted_link(tmp_path: Path) -> None:
    collections, shape = _saved(tmp_path)
    shared = tmp_path / "dumps"
    shared.mkdir()
    victim = _victim(tmp_path)
    (shared / "job.json").symlink_to(victim)  # the job user's plant in the shared directory
    with pytest.raises(InputError, match=r"job\.json exists; brctl writes only new files"):
        stacks_save.save(shared, collections, shape)
    assert victim.read_text() == "root's file\n"


def test_stacks_save_into_a_planted_node_directory_link_is_refused(tmp_path: Path) -> None:
    collections, shape = _saved(tmp_path)
    shared = tmp_path / "dumps"
    shared.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (shared / "m0").symlink_to(elsewhere)
    with pytest.raises(InputError, match=r"m0.*symlink"):
        stacks_save.save(shared, collections, shape)
    assert list(elsewhere.iterdir()) == []


def test_stacks_save_writes_a_fresh_directory_and_loads_back(tmp_path: Path) -> None:
    collections, shape = _saved(tmp_path)
    stacks_save.save(tmp_path / "new" / "dump", collections, shape)
    again, shape2 = stacks_save.load(tmp_path / "new" / "dump")
    assert shape2 == shape and [sorted(c.nodes) for c in again] == [sorted(c.nodes)
                                                                    for c in collections]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a link owned by a job user)")
def test_report_o_through_a_job_owned_link_on_the_way_is_refused(tmp_path: Path) -> None:
    target_dir = tmp_path / "rootonly"
    target_dir.mkdir(mode=0o700)
    link = tmp_path / "jobdir"
    link.symlink_to(target_dir)
    os.lchown(link, JOB, JOB)
    with pytest.raises(InputError, match="is a symlink owned by nobody"):
        write_atomic(link / "page.html", "<html></html>")
    assert list(target_dir.iterdir()) == []


def test_report_o_replaces_a_link_at_the_name_never_follows_it(tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    (tmp_path / "page.html").symlink_to(victim)
    write_atomic(tmp_path / "page.html", "<html>page</html>")
    assert victim.read_text() == "root's file\n"
    assert not (tmp_path / "page.html").is_symlink()
    assert (tmp_path / "page.html").read_text() == "<html>page</html>"


FAKE_CHROMIUM = """#!{python}
import sys
for arg in sys.argv[1:]:
    if arg.startswith("--screenshot="):
        with open(arg.split("=", 1)[1], "wb") as fh:  # by path, following links, as Chromium
            fh.write(b"\\x89PNG fake")
"""


def test_the_png_is_never_written_by_chromium_through_a_planted_link(tmp_path: Path) -> None:
    chromium = tmp_path / "chromium"
    chromium.write_text(FAKE_CHROMIUM.format(python=sys.executable))
    chromium.chmod(0o755)
    victim = _victim(tmp_path)
    png = tmp_path / "page.png"
    png.symlink_to(victim)
    screenshot(str(chromium), "<html></html>", png, timeout=60)
    assert victim.read_text() == "root's file\n"
    assert not png.is_symlink() and png.read_bytes() == b"\x89PNG fake"
    assert stat.S_ISREG(png.lstat().st_mode)


RACING_CHROMIUM = """#!{python}
import os, sys, urllib.parse, urllib.request
out = os.environ["BRCTL_TEST_OUT_PAGE"]
os.unlink(out)  # the job user's swap, between brctl's rename and Chromium's load
os.symlink(os.environ["BRCTL_TEST_VICTIM"], out)
url = sys.argv[-1]
with open(os.environ["BRCTL_TEST_URL"], "w") as fh:
    fh.write(url)
path = urllib.request.url2pathname(urllib.parse.urlparse(url).path)
with open(path, "rb") as fh:  # by path, following links, as Chromium
    seen = fh.read()
for arg in sys.argv[1:]:
    if arg.startswith("--screenshot="):
        with open(arg.split("=", 1)[1], "wb") as fh:
            fh.write(b"PNG of " + seen)
"""


def test_chromium_loads_a_private_copy_never_the_job_swappable_page(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """trust-core #10: root's Chromium loaded ``-o``'s path; the job user, who may write that
    directory, swapped the page for a link to a root-only file -> a picture of the secret."""
    chromium = tmp_path / "chromium"
    chromium.write_text(RACING_CHROMIUM.format(python=sys.executable))
    chromium.chmod(0o755)
    victim = tmp_path / "id_rsa"
    victim.write_text("SECRET KEY\n")
    shared = tmp_path / "shared"
    shared.mkdir()
    html, png = shared / "r.html", shared / "r.png"
    write_atomic(html, "<html>the page</html>")
    monkeypatch.setenv("BRCTL_TEST_OUT_PAGE", str(html))
    monkeypatch.setenv("BRCTL_TEST_VICTIM", str(victim))
    monkeypatch.setenv("BRCTL_TEST_URL", str(tmp_path / "url"))
    screenshot(str(chromium), "<html>the page</html>", png, timeout=60)
    assert png.read_bytes() == b"PNG of <html>the page</html>"
    url = (tmp_path / "url").read_text()
    assert url.startswith("file://") and str(shared) not in url
    assert url.endswith("/page.html")
