"""The probe bootstrap's checks on a local node (real processes): what runs, and what is refused."""

from __future__ import annotations

import ctypes.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from brctl.core.transport import Node, NodeState
from brctl.remote.local import LocalTransport
from brctl.remote.probes import ProbeRunner, declared_paths

NOBODY = 65534


def _job_owned(path: Path, text: str, mode: int = 0o644) -> Path:
    """A file the job user (nobody) owns, in a directory of root's (a partial chown -R)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    os.chown(path, NOBODY, NOBODY)
    return path


def _probe(module: str, request: dict[str, Any], **kw: Any) -> Any:
    node = Node(name="n", address="n", connection="local", **kw)
    return ProbeRunner(LocalTransport()).run([node], module, request)["n"]


def _run(tmp_path: Path, **kw: Any) -> Any:
    return _probe("brctl.diagnostics.sysinfo", {}, **kw)


def test_declared_paths_keep_order_and_drop_empty_entries() -> None:
    node = Node(name="n", address="n", env={"PYTHONPATH": "/a::/b:"})
    assert declared_paths(node) == ["/a", "/b"]
    assert declared_paths(Node(name="n", address="n")) == []


def test_a_group_writable_entry_is_refused_before_its_code_runs(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w')\n")
    site.chmod(0o775)
    res = _run(tmp_path, env={"PYTHONPATH": str(site)})
    assert res.run.state is NodeState.REFUSED and not (tmp_path / "ran").exists()
    assert res.error == (f"refused: PYTHONPATH entry {site}: {site} is group/other writable "
                         "(mode 0775); not run as root (set job.user to run it as the job's user)")
    site.chmod(0o755)
    assert _run(tmp_path, env={"PYTHONPATH": str(site)}).ok and (tmp_path / "ran").exists()


def test_a_relative_entry_is_refused_and_a_missing_one_ignored(tmp_path: Path) -> None:
    res = _run(tmp_path, env={"PYTHONPATH": "lib"})
    assert res.run.state is NodeState.REFUSED and "'lib' is not an absolute path" in (res.error or "")
    assert _run(tmp_path, env={"PYTHONPATH": str(tmp_path / "missing")}).ok


def test_a_missing_interpreter_is_a_failure_not_a_refusal(tmp_path: Path) -> None:
    res = _run(tmp_path, python=str(tmp_path / "no-python"))
    assert res.run.state is NodeState.FAILED and "not found" in (res.error or "")


def test_job_user_does_not_allow_code_another_user_can_write(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    os.chown(site, 1234, 1234)  # neither root, nor us, nor the job user
    res = _run(tmp_path, env={"PYTHONPATH": str(site)}, job_user="nobody")
    assert res.run.state is NodeState.REFUSED
    assert "uid 1234" in (res.error or "") and "not even the job user 'nobody'" in (res.error or "")
    res = _run(tmp_path, job_user="no-such-user-here")
    assert res.run.state is NodeState.REFUSED and "no such user" in (res.error or "")


def _inventory(tmp_path: Path) -> Path:
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump({"nodes": [{"name": "n", "connection": "local"}]}))
    return path


def test_an_inventory_others_can_write_is_refused(tmp_path: Path, brctl: Any) -> None:
    path = _inventory(tmp_path)
    assert brctl("-i", path, "nodes").exit_code == 0  # ours, under a sticky /tmp: fine
    path.chmod(0o666)
    res = brctl("-i", path, "nodes")
    assert res.exit_code == 2
    assert f"inventory {path}: refused: {path} is group/other writable (mode 0666)" in res.stderr
    path.chmod(0o644)
    os.chown(path, NOBODY, NOBODY)
    res = brctl("-i", path, "nodes")
    assert res.exit_code == 2 and "is owned by nobody (uid 65534)" in res.stderr


def test_job_user_must_be_a_user_name(tmp_path: Path, brctl: Any) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump({"nodes": [{"name": "n", "connection": "local"}],
                                    "job": {"nodes": "n", "user": "a b"}}))
    res = brctl("-i", path, "nodes")
    assert res.exit_code == 2 and "job.user" in res.stderr


def test_job_user_is_set_on_every_machine(tmp_path: Path) -> None:
    from brctl.load.inventory import load_inventory

    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump({"nodes": [{"name": "n[1-2]", "connection": "local"}],
                                    "standby": [{"name": "s1", "connection": "local"}],
                                    "job": {"nodes": "n[1-2]", "user": "nobody"}}))
    inv = load_inventory(path)
    assert {n.job_user for n in inv.nodes.values()} == {"nobody"}
    assert inv.job is not None and inv.job.user == "nobody"


def test_a_refused_machine_is_exit_4_in_diagnose_stacks_and_replay(tmp_path: Path, brctl: Any) -> None:
    """A safety refusal outranks an unanswered machine (4 > 3) in every command, not only
    health: a cron script must tell 'brctl would not act there' from 'no answer'."""
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump({
        "nodes": [{"name": "bad", "connection": "local", "env": {"PYTHONPATH": "lib"}},
                  {"name": "good", "connection": "local"}],
        "job": {"nodes": "bad,good", "process_match": "never-matches-anything-here"}}))
    books = tmp_path / "books"
    books.mkdir()
    (books / "eud-only.yaml").write_text(
        "name: eud-only\nsymptom: test\nmatch: [{log: never-in-these-logs}]\n"
        "stages: [{name: eud}]\n")
    res = brctl("-i", path, "--json", "diagnose", "--playbooks", books, "--symptom", "eud-only")
    assert res.exit_code == 4, res.stdout + res.stderr
    assert "not an absolute path" in res.json["incomplete"]["bad"]
    res = brctl("-i", path, "--json", "stacks")
    assert res.exit_code == 4, res.stdout + res.stderr
    res = brctl("-i", path, "--json", "replay")  # the preflight: no round runs
    assert res.exit_code == 4, res.stdout + res.stderr
    assert res.json["verdict"] == "incomplete" and "not an absolute path" in res.json["preflight"]["bad"]


def test_a_job_writable_startup_file_in_a_root_entry_is_refused(tmp_path: Path) -> None:
    """Audit R5: the entry is root's 0755, but Python runs its sitecustomize.py (and
    .pth, usercustomize, their bytecode) by itself: a job-owned or world-writable one is
    refused like a job-writable entry, before it runs."""
    site = tmp_path / "site"
    startup = _job_owned(site / "sitecustomize.py", f"open({str(tmp_path / 'ran')!r}, 'w')\n", 0o666)
    res = _run(tmp_path, env={"PYTHONPATH": str(site)})
    assert res.run.state is NodeState.REFUSED and not (tmp_path / "ran").exists()
    assert res.error == (f"refused: PYTHONPATH entry {site}: {startup} is owned by nobody (uid 65534) "
                         "(Python runs it at startup); not run as root (set job.user to run it "
                         "as the job's user)")
    os.chown(startup, 0, 0)
    res = _run(tmp_path, env={"PYTHONPATH": str(site)})
    assert res.run.state is NodeState.REFUSED and "is group/other writable (mode 0666)" in (res.error or "")
    startup.chmod(0o644)
    pth = site / "evil.pth"
    pth.write_text("import os\n")
    pth.chmod(0o646)
    res = _run(tmp_path, env={"PYTHONPATH": str(site)})
    assert res.run.state is NodeState.REFUSED and f"{pth} is group/other writable" in (res.error or "")
    pth.unlink()
    cache = site / "__pycache__"
    cache.mkdir()
    (cache / "sitecustomize.cpython-311.pyc").write_bytes(b"")
    os.chown(cache / "sitecustomize.cpython-311.pyc", NOBODY, NOBODY)
    res = _run(tmp_path, env={"PYTHONPATH": str(site)})
    assert res.run.state is NodeState.REFUSED and "sitecustomize.cpython-311.pyc is owned by nobody" in (
        res.error or "")
    (cache / "sitecustomize.cpython-311.pyc").unlink()
    assert _run(tmp_path, env={"PYTHONPATH": str(site)}).ok and (tmp_path / "ran").exists()


def test_startup_files_lists_what_python_runs_from_a_directory(tmp_path: Path) -> None:
    from brctl.diagnostics.isolate import startup_files

    for name in ("sitecustomize.py", "usercustomize.py", "a.pth", "b.pth", "train.py"):
        (tmp_path / name).write_text("")
    (tmp_path / "sitecustomize").mkdir()
    (tmp_path / "sitecustomize" / "__init__.py").write_text("")
    (tmp_path / "__pycache__").mkdir()
    for name in ("sitecustomize.cpython-311.pyc", "train.cpython-311.pyc"):
        (tmp_path / "__pycache__" / name).write_bytes(b"")
    assert [Path(p).name for p in startup_files(str(tmp_path))] == [
        "a.pth", "b.pth", "sitecustomize", "sitecustomize.py", "usercustomize.py", "__init__.py",
        "__pycache__", "sitecustomize.cpython-311.pyc"]


def test_every_form_of_a_startup_module_in_a_root_entry_is_checked(tmp_path: Path) -> None:
    """Python imports ``sitecustomize`` from bytecode with no source beside it (and from an
    extension module, or a package's other files): a job-owned one in a root 0755 entry
    ran as root."""
    import py_compile

    site = tmp_path / "site"
    site.mkdir()
    src = tmp_path / "src.py"
    src.write_text(f"open({str(tmp_path / 'ran')!r}, 'w')\n")
    pyc = site / "sitecustomize.pyc"
    py_compile.compile(str(src), cfile=str(pyc), doraise=True)
    os.chown(pyc, NOBODY, NOBODY)
    res = _run(tmp_path, env={"PYTHONPATH": str(site)})
    assert res.run.state is NodeState.REFUSED and not (tmp_path / "ran").exists(), res
    assert f"{pyc} is owned by nobody" in (res.error or "")
    pyc.unlink()
    package = site / "sitecustomize"
    package.mkdir()
    (package / "__init__.py").write_text("from . import hook\n")
    (package / "hook.py").write_text(src.read_text())
    os.chown(package / "hook.py", NOBODY, NOBODY)
    res = _run(tmp_path, env={"PYTHONPATH": str(site)})
    assert res.run.state is NodeState.REFUSED and not (tmp_path / "ran").exists(), res
    assert f"{package / 'hook.py'} is owned by nobody" in (res.error or "")


def test_a_directory_a_pth_file_adds_is_checked_like_an_entry(tmp_path: Path) -> None:
    """A root-owned ``.pth`` in the interpreter's site-packages (an editable install) adds a
    job-writable directory to ``sys.path``; Python then imports ``sitecustomize`` from it."""
    import subprocess
    import sys

    venv = tmp_path / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python3*/site-packages"))
    job = tmp_path / "job-src"
    job.mkdir()
    os.chown(job, NOBODY, NOBODY)
    (job / "sitecustomize.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w')\n")
    (site / "__editable__.proj.pth").write_text(f"# editable\n{job}\n")
    res = _run(tmp_path, python=str(venv / "bin" / "python"))
    assert res.run.state is NodeState.REFUSED and not (tmp_path / "ran").exists(), res
    assert f"{job} is owned by nobody" in (res.error or "")
    os.chown(job, 0, 0)
    assert _run(tmp_path, python=str(venv / "bin" / "python")).ok and (tmp_path / "ran").exists()


def test_the_declared_loader_and_path_entries_are_checked_kept_and_applied(tmp_path: Path) -> None:
    """LD_LIBRARY_PATH: the directory and every file in it (the loader may load any);
    LD_PRELOAD files; relative entries refused; missing ones dropped before the check."""
    lib = tmp_path / "lib"
    _job_owned(lib / "libfoo.so.1", "")
    res = _run(tmp_path, env={"LD_LIBRARY_PATH": f"{tmp_path}/missing:{lib}"})
    assert res.run.state is NodeState.REFUSED
    assert f"LD_LIBRARY_PATH entry {lib}: {lib}/libfoo.so.1 is owned by nobody" in (res.error or "")
    assert "the loader may load it" in (res.error or "")
    os.chown(lib / "libfoo.so.1", 0, 0)
    hwcaps = _job_owned(lib / "glibc-hwcaps" / "x86-64-v3" / "libfoo.so.1", "")
    res = _run(tmp_path, env={"LD_LIBRARY_PATH": str(lib)})
    assert f"LD_LIBRARY_PATH entry {lib}: {hwcaps} is owned by nobody" in res.run.stdout, res
    os.chown(hwcaps, 0, 0)
    os.chown(lib / "libfoo.so.1", NOBODY, NOBODY)
    res = _run(tmp_path, env={"LD_PRELOAD": f"libc.so.6 {lib}/libfoo.so.1"})
    assert res.run.state is NodeState.REFUSED
    assert f"LD_PRELOAD file {lib}/libfoo.so.1:" in (res.error or "")
    for key in ("LD_LIBRARY_PATH", "PATH", "LD_PRELOAD"):
        res = _run(tmp_path, env={key: "rel/x.so"})
        assert res.run.state is NodeState.REFUSED
        what = "file" if key == "LD_PRELOAD" else "entry"
        assert f"{key} {what} 'rel/x.so' is not an absolute path" in (res.error or ""), res
    os.chown(lib / "libfoo.so.1", 0, 0)
    (lib / "libfoo.so.1").unlink()
    res = _run(tmp_path, env={"LD_LIBRARY_PATH": f"{tmp_path}/missing:{lib}", "BRCTL_T": "x"})
    assert res.ok, res


def test_usable_env_drops_what_does_not_exist_and_keeps_bare_preloads(tmp_path: Path) -> None:
    from brctl.diagnostics.declared_env import deferred_env, env_code, usable_env

    env = usable_env({"PATH": f"/usr/bin::{tmp_path}/gone", "LD_PRELOAD": f"libz.so.1 {tmp_path}/gone.so",
                      "LD_LIBRARY_PATH": f"{tmp_path}:", "CUDA_VISIBLE_DEVICES": "0"})
    assert env == {"PATH": "/usr/bin", "LD_PRELOAD": "libz.so.1", "LD_LIBRARY_PATH": str(tmp_path),
                   "CUDA_VISIBLE_DEVICES": "0"}
    assert env_code(env) == [("PATH", "PATH entry", "/usr/bin"),
                             ("LD_LIBRARY_PATH", "LD_LIBRARY_PATH entry", str(tmp_path))]
    assert deferred_env(env) == {"LD_PRELOAD": "libz.so.1", "LD_LIBRARY_PATH": str(tmp_path)}


def test_a_program_a_probe_runs_by_name_must_pass_the_rule_too(tmp_path: Path) -> None:
    """A root-owned PATH directory may hold a file the job user owns (a partial chown -R):
    the probe would run it as root. dcgmi here; py-spy and dmesg are found the same way."""
    bin_ = tmp_path / "bin"
    dcgmi = _job_owned(bin_ / "dcgmi", f"#!/bin/sh\nid -u > {tmp_path}/ran\necho '{{}}'\n", 0o755)
    node = Node(name="n", address="n", connection="local", env={"PATH": f"{bin_}:/usr/bin:/bin"})
    res = ProbeRunner(LocalTransport()).run([node], "brctl.diagnostics.dcgm", {"level": "1"})["n"]
    assert res.run.state is NodeState.REFUSED and not (tmp_path / "ran").exists(), res
    assert f"program {dcgmi}: {dcgmi} is owned by nobody (uid {NOBODY})" in (res.error or "")
    os.chown(dcgmi, 0, 0)
    res = ProbeRunner(LocalTransport()).run([node], "brctl.diagnostics.dcgm", {"level": "1"})["n"]
    assert res.ok and res.document["argv"][0] == str(dcgmi), res
    assert (tmp_path / "ran").read_text().strip() == "0"


def test_sitecustomize_sees_the_probe_s_argv_in_process_and_in_stage_2(tmp_path: Path) -> None:
    """As Python sets sys.argv before site runs: [module, *args] whichever interpreter runs
    the probe (it was the bootstrap's own argv when the probe ran in the bootstrap's process)."""
    import subprocess
    import sys

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        f"import sys\nopen({str(tmp_path / 'argv')!r}, 'a').write(repr(sys.argv) + '\\n')\n")
    venv = tmp_path / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    for python in ("python3", str(venv / "bin" / "python")):
        node = Node(name="n", address="n", connection="local", python=python,
                    env={"PYTHONPATH": str(site)})
        assert ProbeRunner(LocalTransport()).run([node], "brctl.diagnostics.sysinfo", {})["n"].ok
    seen = (tmp_path / "argv").read_text().splitlines()
    assert seen == ["['brctl.diagnostics.sysinfo']"] * 2, seen


def _libm() -> str:
    found = [p for p in ("/lib/x86_64-linux-gnu/libm.so.6", "/usr/lib64/libm.so.6") if os.path.exists(p)]
    if not found:
        pytest.skip("no x86-64 libm.so.6 to copy")
    return found[0]


def test_a_symlinked_glibc_hwcaps_directory_is_walked_too(tmp_path: Path) -> None:
    """The loader follows a linked glibc-hwcaps: a job-owned library below it (a partial
    chown -R) was loaded by the probe's interpreter, exec'd as root (helper review)."""
    lib, hw = tmp_path / "lib", tmp_path / "hw"
    lib.mkdir()
    (hw / "x86-64-v2").mkdir(parents=True)
    job_libm = hw / "x86-64-v2" / "libm.so.6"
    shutil.copy(_libm(), job_libm)  # a working libm: the job user's real payload would be its own
    os.chown(job_libm, NOBODY, NOBODY)
    (lib / "glibc-hwcaps").symlink_to(hw)
    probe = subprocess.run(["/lib64/ld-linux-x86-64.so.2", "--help"], capture_output=True, text=True)
    if "x86-64-v2 (supported, searched)" not in probe.stdout:
        pytest.skip("this loader does not search glibc-hwcaps/x86-64-v2")
    debug = tmp_path / "ld-debug"
    res = _probe("brctl.diagnostics.sysinfo", {}, env={
        "LD_LIBRARY_PATH": str(lib), "LD_DEBUG": "libs", "LD_DEBUG_OUTPUT": str(debug)})
    loaded = [p.name for p in tmp_path.glob("ld-debug.*")
              if f"calling init: {lib}/glibc-hwcaps/x86-64-v2/libm.so.6" in p.read_text()]
    assert not loaded, f"job-owned {job_libm} loaded as root by {loaded}: {res}"
    assert res.run.state is NodeState.REFUSED, res


def test_a_sticky_ld_library_path_entry_is_refused(tmp_path: Path) -> None:
    """Anyone may add a name to a sticky (1777) directory after the check lists it, and the
    loader looks names up there for the probe's whole life (libffi.so.8 on `import ctypes`):
    a library directory others can write is refused, sticky or not (helper review)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    early = _job_owned(shared / "libffi.so.8", "")  # there at the listing: refused
    res = _probe("brctl.diagnostics.sysinfo", {}, env={"LD_LIBRARY_PATH": str(shared)})
    assert res.run.state is NodeState.REFUSED and "the loader may load it" in (res.error or "")
    early.unlink()  # the same file a moment later (after the listing) is loaded: only timing differs
    res = _probe("brctl.diagnostics.sysinfo", {}, env={"LD_LIBRARY_PATH": str(shared)})
    assert res.run.state is NodeState.REFUSED, res


def test_find_library_does_not_run_a_job_owned_gcc_as_root(tmp_path: Path) -> None:
    """health's NVML check without pynvml asked ctypes.util.find_library whether the driver's
    library is there, which (ldconfig not knowing it) runs `gcc`, `ld`, `objdump` found on
    PATH: a job-owned gcc in a root-owned directory ran as root (helper review)."""
    if ctypes.util._findSoname_ldconfig("nvidia-ml"):  # type: ignore[attr-defined]
        pytest.skip("ldconfig knows libnvidia-ml here: find_library runs no compiler")
    if subprocess.run(["python3", "-I", "-c", "import pynvml"], capture_output=True).returncode == 0:
        pytest.skip("pynvml is importable: sample_nvml does not call find_library")
    bin_ = tmp_path / "bin"
    ran = tmp_path / "ran"
    _job_owned(bin_ / "gcc", f"#!/bin/sh\nid -u >> {ran}\nexit 1\n", 0o755)
    res = _probe("brctl.diagnostics.health_probe", {"checks": ["nvml"]},
                 env={"PATH": f"{bin_}:/usr/bin:/bin"})
    assert not ran.exists() or "0" not in ran.read_text().split(), f"job-owned gcc ran as root: {res}"


def _env_seen(tmp_path: Path, env: dict[str, str]) -> tuple[Any, str | None]:
    """Run sysinfo with ``env`` plus a root-owned PYTHONPATH whose sitecustomize records
    the probe process's LD_*, LOCPATH and TMPDIR variables and time zone name; (the result, what it saw or None)."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    seen = tmp_path / "seen"
    (site / "sitecustomize.py").write_text(
        "import os, time\n"
        f"open({str(seen)!r}, 'w').write(repr({{k: v for k, v in os.environ.items() "
        "if k.startswith('LD_') or k in ('LOCPATH', 'TMPDIR')}) + ' tz=' + time.tzname[0])\n")
    res = _probe("brctl.diagnostics.sysinfo", {}, env={**env, "PYTHONPATH": str(site)})
    return res, seen.read_text() if seen.exists() else None


def test_a_dangling_link_in_a_library_directory_does_not_refuse_the_machine(tmp_path: Path) -> None:
    """A root-owned dangling link in a declared library directory (a stale libfoo.so after
    an uninstall or driver upgrade, a dev link whose target is not installed) cannot be
    loaded, and nobody but root can create its target in a root-owned directory: the
    machine was refused ('No such file or directory'), as root and as job.user alike
    (helper review)."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libstale.so").symlink_to("libstale.so.1")  # target in the same root-owned dir
    res = _probe("brctl.diagnostics.sysinfo", {}, env={"LD_LIBRARY_PATH": str(lib)})
    assert res.ok, res.error


def test_a_lib_token_in_ld_preload_is_not_silently_dropped(tmp_path: Path) -> None:
    """glibc expands $LIB / $PLATFORM / $ORIGIN in LD_PRELOAD and LD_LIBRARY_PATH
    (multilib setups write LD_PRELOAD=/usr/$LIB/libjemalloc.so.2). ``usable_env`` takes
    the text as a path, finds it missing and drops it without a word: the probe (and every
    program it starts) ran without the preload, without a word; now it is refused, saying
    why (helper review)."""
    res, _ = _env_seen(tmp_path, {"LD_PRELOAD": "/usr/$LIB/libm.so.6"})
    assert res.run.state is NodeState.REFUSED, res
    assert "'/usr/$LIB/libm.so.6' uses a loader token: write the path out" in (res.error or "")


def test_a_semicolon_in_ld_library_path_is_a_separator_as_for_the_loader(tmp_path: Path) -> None:
    """glibc splits LD_LIBRARY_PATH on ':' and ';'. '/a;/b' is taken as one missing path and
    dropped: neither directory was checked nor applied (helper review)."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    res, seen = _env_seen(tmp_path, {"LD_LIBRARY_PATH": f"{a};{b}"})
    assert res.ok, res.error
    assert seen is not None and str(a) in seen and str(b) in seen, seen


def test_job_user_command_with_loader_vars_does_not_need_env_on_the_declared_path(
        tmp_path: Path) -> None:
    """``_as_user`` takes setpriv from the login PATH, but the ``env`` that sets the loader's
    variables after it is looked up by setpriv on the *declared* PATH (os.environ was
    updated): a declared PATH without /usr/bin (a conda env's bin and CUDA's) fails every
    job-user run that also declares an LD_* variable ('env: No such file'); the same
    without LD_* works. Now `env` comes from the login PATH too (helper review)."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "python3").symlink_to(sys.executable)  # a conda env's bin: python3, no env
    node = Node(name="n", address="n", connection="local", job_user="nobody",
                python=sys.executable,
                env={"PATH": str(bin_), "LD_LIBRARY_PATH": "/usr/lib"})
    runner = ProbeRunner(LocalTransport())
    assert runner.run([node], "brctl.diagnostics.sysinfo", {})["n"].ok  # bundle cached
    res = LocalTransport().run(node, runner.as_job_user(node, ["/usr/bin/id", "-u"]), timeout=60)
    assert res.state is NodeState.OK and res.stdout.strip() == "65534", (res.stdout, res.stderr)


def test_a_declared_time_zone_applies_where_the_probe_runs_in_the_bootstrap_s_process(
        tmp_path: Path) -> None:
    """The bootstrap's interpreter read the login TZ when it started; the declared one (it
    may name a file: checked, and set only for the program exec'd next) reaches the probe,
    which then runs in stage 2, as every child of it would see it."""
    res, seen = _env_seen(tmp_path, {"TZ": "BRT-9"})
    assert res.ok and seen is not None and seen.endswith(" tz=BRT"), (res, seen)


def test_glibc_variables_naming_job_writable_places_are_refused_as_root(tmp_path: Path) -> None:
    """glibc ignores these in setuid programs: they make a program load code (GCONV_PATH's
    modules, GETCONF_DIR's programs), parse data (LOCPATH's locales, TZDIR's zones, NLSPATH's
    catalogs, HOSTALIASES) or write where they say (MALLOC_TRACE, LD_DEBUG_OUTPUT, TMPDIR).
    Declared in a node's env they reached root's interpreter and programs unchecked."""
    loc, tmp, getconf = tmp_path / "loc", tmp_path / "tmp", tmp_path / "getconf"
    for d in (loc, tmp, getconf):
        d.mkdir()
        os.chown(d, NOBODY, NOBODY)
    modules = _job_owned(tmp_path / "gconv" / "gconv-modules", "")  # root's directory, job's file
    paris = _job_owned(tmp_path / "zones" / "Europe" / "Paris", "")  # deep in the tree
    aliases = _job_owned(tmp_path / "hosts.aliases", "")
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # sticky: others may create the name root then writes to
    cases = {
        "LOCPATH": (f"/usr/share/i18n:{loc}", f"LOCPATH entry {loc}: {loc} is owned by nobody"),
        "GCONV_PATH": (str(modules.parent), f"GCONV_PATH entry {modules.parent}: {modules} is owned by nobody"),
        "TZDIR": (str(paris.parent.parent), f"TZDIR entry {paris.parent.parent}: {paris} is owned by nobody"),
        "NLSPATH": (f"{loc}/%L/%N.cat", f"NLSPATH entry {loc}: {loc} is owned by nobody"),
        "GETCONF_DIR": (str(getconf), f"GETCONF_DIR entry {getconf}: {getconf} is owned by nobody"),
        "HOSTALIASES": (str(aliases), f"HOSTALIASES file {aliases}: {aliases} is owned by nobody"),
        "MALLOC_TRACE": (f"{shared}/trace", f"MALLOC_TRACE file {shared}/trace: {shared} is group/other"),
        "LD_DEBUG_OUTPUT": (f"{tmp}/debug", f"LD_DEBUG_OUTPUT file {tmp}/debug: {tmp} is owned by nobody"),
        "TMPDIR": (str(tmp), f"TMPDIR entry {tmp}: {tmp} is owned by nobody"),
    }
    for key, (value, named) in cases.items():
        res = _run(tmp_path, env={key: value})
        assert res.run.state is NodeState.REFUSED, (key, res)
        assert named in (res.error or ""), (key, res.error)
    res = _run(tmp_path, env={"HOSTALIASES": "aliases"})
    assert res.run.state is NodeState.REFUSED, res
    assert "HOSTALIASES file 'aliases' is not an absolute path" in (res.error or ""), res
    os.chown(tmp, 0, 0)
    res, seen = _env_seen(tmp_path, {"LOCPATH": f"{tmp_path}/gone:{tmp}", "TMPDIR": "/tmp"})
    assert res.ok and seen is not None, res.error
    assert f"'LOCPATH': '{tmp}'" in seen and "'TMPDIR': '/tmp'" in seen, seen


def test_glibc_variables_reach_the_job_user_s_probe_and_never_setpriv(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """setpriv runs as root and calls setlocale: a job-owned LOCPATH, the reason the probe
    runs as job.user, must not be parsed by it; set, like LD_*, after it (helper review)."""
    login = tmp_path / "login-bin"
    login.mkdir()
    setpriv = login / "setpriv"
    setpriv.write_text(f"#!/bin/sh\nenv > {tmp_path}/setpriv-env\nexec {shutil.which('setpriv')} \"$@\"\n")
    setpriv.chmod(0o755)
    monkeypatch.setenv("PATH", f"{login}:{os.environ['PATH']}")
    loc = tmp_path / "loc"
    loc.mkdir()
    os.chown(loc, NOBODY, NOBODY)
    res = _run(tmp_path, env={"LOCPATH": str(loc), "GCONV_PATH": str(loc)}, job_user="nobody",
               python="/usr/bin/python3")  # one the job user may run
    assert res.ok and res.document["uid"] == NOBODY, res.error
    env = (tmp_path / "setpriv-env").read_text()
    assert "LOCPATH" not in env and "GCONV_PATH" not in env, env


def test_what_the_review_of_glibc_s_variables_found(tmp_path: Path) -> None:
    """A TZ naming a job-owned file was parsed as root; LD_PROFILE without an output
    directory wrote into /var/tmp as root; '..' in an NLSPATH template or TZ and '/' in a
    locale name reach outside the checked directories; a NUL gave a traceback (helper review)."""
    zone = _job_owned(tmp_path / "job" / "tz", "TZif")
    cases = {
        "TZ": (f":{zone}", f"TZ file {zone}: {zone} is owned by nobody"),
        "LD_PROFILE": ("libc.so.6", "LD_PROFILE's output directory /var/tmp: /var/tmp is group/other"),
        "NLSPATH": ("/usr/share/locale/%L/../../../tmp/%N.cat", "NLSPATH template reaches outside"),
        "LANG": ("../../../tmp/x", "LANG '../../../tmp/x' is a locale name, not a path"),
        "MALLOC_TRACE": ("/var/\0/trace", "env 'MALLOC_TRACE': a NUL byte cannot be passed"),
    }
    for key, (value, named) in cases.items():
        res = _run(tmp_path, env={key: value})
        assert res.run.state is NodeState.REFUSED, (key, res)
        assert named in (res.error or ""), (key, res.error)
    res = _run(tmp_path, env={"TZ": "../../tmp/x"})
    assert res.run.state is NodeState.REFUSED and "outside the zone directory" in (res.error or "")
    # Nowhere to write: nothing is written, nothing refused.
    assert _run(tmp_path, env={"MALLOC_TRACE": f"{tmp_path}/missing/trace"}).ok
    # As the job user, its files may go to /tmp (sticky): nothing of root's is written there.
    res = _run(tmp_path, env={"MALLOC_TRACE": "/tmp/brctl-test-trace"}, job_user="nobody",
               python="/usr/bin/python3")
    assert res.ok and res.document["uid"] == NOBODY, res.error


def test_a_directory_that_cannot_be_listed_is_refused_not_passed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """searched() took an unlistable directory (a non-root ssh user; root on NFS with
    root_squash) for an empty one, so a job-owned file in it passed (helper review)."""
    from brctl.diagnostics import declared_env

    blind = tmp_path / "zones" / "priv"
    blind.mkdir(parents=True)
    listdir = os.listdir

    def denied(path: Any = ".") -> list[str]:
        if str(path) == str(blind):
            raise PermissionError(13, "Permission denied", str(path))
        return listdir(path)

    monkeypatch.setattr(declared_env.os, "listdir", denied)
    reason = declared_env.library_dir(str(blind.parent), (0,), subdirs=None)
    assert reason == f"{blind}: Permission denied: what it holds cannot be checked", reason
