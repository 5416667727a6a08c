"""Issue 35, item 4 through the CLI, with Slurm's client commands as PATH shims printing
the fixtures of tests/fixtures/slurm/ (written from each release's data_parser): on Slurm
>= 23.11 brctl used to drop every job and say "Slurm has no job N" (exit 2), and daemon
run exited 2 at start. Runs without Slurm; 22.05 is checked live in
tests/integration/test_slurm_job.py."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.unit.test_slurm_json import FIXTURES, PARSERS, RELEASE, fixture

Brctl = Callable[..., Any]


def _shims(tmp_path: Path, parser: str, jobs: dict[str, Any]) -> dict[str, str]:
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    nodes = FIXTURES / f"nodes-{parser}.json"
    (bin_dir / "squeue").write_text(
        "#!/bin/sh\n"
        f'[ "$1" = --version ] && {{ echo "slurm {RELEASE[parser]}"; exit 0; }}\n'
        f'case " $* " in *" --json "*) cat {tmp_path / "jobs.json"}; exit 0;; esac\n'
        'echo "squeue: unexpected $*" >&2; exit 1\n')
    (bin_dir / "scontrol").write_text(
        "#!/bin/sh\n"
        '[ "$1 $2" = "show hostnames" ] && { echo node01; echo node02; exit 0; }\n'
        f"grep -v '^#' {nodes}\n")
    for tool in ("squeue", "scontrol"):
        (bin_dir / tool).chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


def _inventory(tmp_path: Path) -> Path:
    path = tmp_path / "inventory.yaml"
    path.write_text("nodes:\n  - name: node[01-04]\n    connection: local\n"
                    "job:\n  slurm: {job: 8}\n")
    return path


@pytest.mark.parametrize("parser", [p for p in PARSERS if p != "v0.0.38"])
def test_each_release_resolves_the_job(parser: str, tmp_path: Path, brctl: Brctl) -> None:
    env = _shims(tmp_path, parser, fixture("squeue", parser))
    res = brctl("-i", _inventory(tmp_path), "--json", "nodes", env=env)
    assert res.exit_code == 0, res.stdout + res.stderr
    doc = res.json
    assert (doc["job"]["members"], doc["job"]["state"]) == (["node01", "node02"], "RUNNING")


def test_an_unreadable_entry_is_exit_3_naming_field_and_parser(tmp_path: Path, brctl: Brctl) -> None:
    jobs = fixture("squeue", "v0.0.40")
    jobs["jobs"][0]["job_state"] = {"current": ["RUNNING"]}  # a shape brctl does not know
    env = _shims(tmp_path, "v0.0.40", jobs)
    res = brctl("-i", _inventory(tmp_path), "nodes", env=env)
    assert res.exit_code == 3, res.stderr
    assert "field 'job_state'" in res.stderr and "data parser v0.0.40" in res.stderr
    assert "Traceback" not in res.stderr and "has no" not in res.stderr
    doc = brctl("-i", _inventory(tmp_path), "--json", "nodes", env=env).json
    assert doc["schema"] == "brctl.error/1" and doc["exit"] == 3


FLOODING_SQUEUE = """#!{python}
import os, sys, time
sent = 0
while sent < (64 << 20):  # a user with very many jobs: far more than brctl parses
    sys.stdout.buffer.write(b"x" * (64 << 10))
    sys.stdout.buffer.flush()
    sent += 64 << 10
    with open({progress!r}, "ab") as fh:  # one byte per chunk written
        fh.write(b".")
time.sleep(3600)
"""


def test_squeue_output_is_bounded_while_it_is_read(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """trust-slurm #2: ``capture_output=True`` buffered all of squeue's output before the
    ``_MAX_OUTPUT`` check, so the cap bounded nothing (and the answer came at the timeout).
    Now brctl stops reading, and kills squeue, one chunk past the cap."""
    import sys

    from brctl.config.slurm import SlurmSection
    from brctl.core.errors import IncompleteError
    from brctl.operations.slurm import job as slurm_job

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    progress = tmp_path / "sent"
    squeue = bin_dir / "squeue"
    squeue.write_text(FLOODING_SQUEUE.format(python=sys.executable, progress=str(progress)))
    squeue.chmod(0o755)
    monkeypatch.setattr(slurm_job, "_MAX_OUTPUT", 1 << 20)
    slurm = slurm_job.Slurm(SlurmSection(timeout=60.0),
                            environ={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    with pytest.raises(IncompleteError, match=r"squeue: more than 1 MiB of output"):
        slurm.run("squeue", "-h")
    assert progress.stat().st_size * (64 << 10) < 4 << 20  # stopped reading: not 64 MiB
