"""Inventory errors like a compiler: a fixed-seed fuzz of invalid inventories.

Each mutation of a valid inventory is built to be invalid (a typo'd key, a wrong
type, a value out of range, a key written twice, bytes that are not UTF-8, broken
YAML, a bad node set, a job that does not fit its machines). Every one must exit 2,
name the file and the line (``inv.yaml:12:``, but in an empty file), show no
traceback: never 0, never 70. In-process through ``brctl.cli.app.run`` (the console
script's entry), and one case of each kind through a real ``python -m brctl``.
"""

from __future__ import annotations

import copy
import random
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

SEED = 16
BASE: dict[str, Any] = {
    "ssh": {"user": "root", "port": 22, "connect_timeout": 10, "command_timeout": 600,
            "fanout": 8, "host_key_policy": "strict", "proxy_jump": None},
    "nodes": [
        {"name": "gpu[01-04]", "address": "10.0.0.[1-4]", "gpus": 2, "connection": "local",
         "labels": {"rack": "r1"}, "env": {"A": "1"}},
        {"name": "cpu1", "gpus": 0, "connection": "local"},
    ],
    "standby": [{"name": "spare1", "gpus": 2, "connection": "local"}],
    "job": {"name": "j", "nodes": "gpu[01-04]", "tp": 2, "pp": 2, "order": "tp-cp-ep-dp-pp",
            "process_match": "train"},
    "health": {"checks": ["ecc", "disk"], "disk_paths": ["/"], "timeout": 30,
               "disk_warn_free_percent": 10},
    "update": {"root": "/opt/train"},
}

# (key path, invalid value): wrong types and values out of range, each refused.
BAD_VALUES: list[tuple[tuple[Any, ...], Any]] = [
    (("ssh", "port"), 0), (("ssh", "port"), 70000), (("ssh", "port"), -22), (("ssh", "port"), "ssh"),
    (("ssh", "port"), [22]), (("ssh", "port"), True), (("ssh", "connect_timeout"), 0),
    (("ssh", "connect_timeout"), -1), (("ssh", "command_timeout"), 0),
    (("ssh", "command_timeout"), "long"), (("ssh", "fanout"), 0), (("ssh", "fanout"), 1.5),
    (("ssh", "host_key_policy"), "yolo"), (("ssh", "host_key_policy"), 1),
    (("ssh", "user"), ["root"]), (("ssh", "user"), {"a": 1}), (("ssh",), [1, 2]),
    (("ssh",), "root"), (("nodes",), "gpu01"), (("nodes",), {"name": "x"}), (("nodes",), []),
    (("nodes", 0, "gpus"), -1), (("nodes", 0, "gpus"), "eight"), (("nodes", 0, "gpus"), 2.5),
    (("nodes", 0, "gpus"), None), (("nodes", 0, "name"), "gpu[01-"),
    (("nodes", 0, "name"), "gpu[04-01]"), (("nodes", 0, "name"), ["gpu01"]),
    (("nodes", 0, "address"), "10.0.0.[1-3]"), (("nodes", 0, "address"), "10.0.0.[1-"),
    (("nodes", 0, "connection"), "telnet"), (("nodes", 0, "labels"), ["r1"]),
    (("nodes", 0, "labels", "rack"), {"x": 1}), (("nodes", 0, "env"), "A=1"),
    (("nodes", 0, "env", "A"), [1]), (("nodes", 0, "port"), 0), (("nodes", 0, "port"), 65536),
    (("nodes", 0, "connect_timeout"), 0), (("nodes", 0, "command_timeout"), -3),
    (("nodes", 1, "name"), "gpu01"), (("standby", 0, "name"), "gpu02"),
    (("standby",), "spare1"), (("job",), "j"), (("job",), ["j"]), (("job", "nodes"), "gpu[01-09]"),
    (("job", "nodes"), "nope1"), (("job", "nodes"), "cpu1"), (("job", "tp"), 0),
    (("job", "tp"), 3), (("job", "tp"), 5), (("job", "pp"), 3), (("job", "pp"), -1),
    (("job", "tp"), "2"), (("job", "ep"), 3), (("job", "cp"), 0), (("job", "order"), "dp-tp"),
    (("job", "process_match"), "("), (("job", "process_match"), "[a-"),
    (("job", "evict_command"), "drain {nod}"), (("job", "restart_command"), {"argv": 7}),
    (("job", "restart_command"), "run 'unclosed"), (("health",), ["ecc"]),
    (("health", "checks"), ["ecc", "gpu_temp"]), (("health", "checks"), "ecc"),
    (("health", "disk_paths"), ["relative/path"]), (("health", "timeout"), 0),
    (("health", "disk_warn_free_percent"), 140), (("health", "disk_warn_free_percent"), -1),
    (("health", "throttle_status"), "panic"), (("health", "temperature_margin_c"), -5),
    (("update",), "/opt/train"), (("update", "root"), ["/opt"]),
]
# Text-level breakage: YAML syntax, encodings, top-level shapes.
BROKEN_TEXTS: list[bytes] = [
    b"", b"[]\n", b"- 1\n- 2\n", b"just a string\n", b"42\n", b"nodes: [\n", b"nodes:\n\t- name: a\n",
    b"nodes:\n  - name: a\n   gpus: 2\n", b"nodes: {name: a\n", b"\xff\xfe\x00n\x00o\x00",
    b"nodes:\n  - name: a\x00\n", b"nodes:\n  - name: 'a\n", b"nodes: *anchor\n",
    b"nodes:\n  - name: a\n    gpus: !!python/object:os.system 1\n", b"%YAML 9.9\n---\nnodes: []\n",
    b"nodes:\n  - {name: a, name: b}\n", b"\xef\xbb\xbf\xef\xbb\xbfnodes: []\n",
]


def _set(doc: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    target: Any = doc
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value


def _typo(key: str, rng: random.Random, known: set[str]) -> str:
    """A misspelling of ``key`` that is no known key (a real-world slip)."""
    while True:
        i = rng.randrange(len(key))
        kind = rng.choice("dswi")
        if kind == "d" and len(key) > 1:
            out = key[:i] + key[i + 1:]
        elif kind == "s" and i + 1 < len(key):
            out = key[:i] + key[i + 1] + key[i] + key[i + 2:]
        elif kind == "w":
            out = key[:i] + rng.choice("abcdefghijklmnopqrstuvwxyz_") + key[i + 1:]
        else:
            out = key[:i] + rng.choice("aeiou_") + key[i:]
        if out and out not in known:
            return out


def _mappings(doc: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], dict[str, Any]]]:
    if isinstance(doc, dict):
        yield path, doc
        for k, v in doc.items():
            yield from _mappings(v, (*path, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _mappings(v, (*path, i))


FREE_FORM = {"labels", "env"}  # mappings whose keys are the user's own


def mutations() -> list[tuple[str, bytes]]:
    rng = random.Random(SEED)
    base_text = yaml.safe_dump(BASE, sort_keys=False)
    out: list[tuple[str, bytes]] = []
    for path, value in BAD_VALUES:
        doc = copy.deepcopy(BASE)
        _set(doc, path, value)
        out.append((f"value {path}={value!r}", yaml.safe_dump(doc, sort_keys=False).encode()))
    maps = [(p, m) for p, m in _mappings(BASE) if not (p and p[-1] in FREE_FORM)]
    for n in range(60):  # an unknown key: a typo of a real one, anywhere
        path, mapping = maps[n % len(maps)]
        key = rng.choice(sorted(mapping))
        doc = copy.deepcopy(BASE)
        target: Any = doc
        for step in path:
            target = target[step]
        target[_typo(key, rng, set(mapping) | {"address", "port", "user"})] = target.pop(key)
        out.append((f"typo at {path}.{key}", yaml.safe_dump(doc, sort_keys=False).encode()))
    lines = base_text.splitlines(keepends=True)
    keyed = [i for i, line in enumerate(lines) if ":" in line and not line.lstrip().startswith("-")]
    for n in range(40):  # a key written twice (the second line copied right after the first)
        i = keyed[(n * 7) % len(keyed)]
        text = "".join([*lines[:i + 1], lines[i], *lines[i + 1:]])
        out.append((f"duplicate line {i + 1}", text.encode()))
    for n in range(30):  # bytes that are not UTF-8, somewhere in the file
        raw = bytearray(base_text.encode())
        raw.insert(rng.randrange(len(raw)), rng.choice([0xFF, 0xFE, 0xC3, 0x80, 0xED]))
        out.append((f"non-UTF-8 #{n}", bytes(raw)))
    out += [(f"broken text #{i}", text) for i, text in enumerate(BROKEN_TEXTS)]
    return out


CASES = mutations()


def test_the_fuzz_has_enough_cases_and_the_base_is_valid(brctl: Callable[..., Any],
                                                         tmp_path: Path) -> None:
    assert len(CASES) >= 200
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump(BASE))
    r = brctl("-i", base, "nodes")
    assert r.exit_code == 0, r.stderr


@pytest.mark.parametrize("chunk", range(4))
def test_every_invalid_inventory_exits_2_naming_the_file(brctl: Callable[..., Any],
                                                        tmp_path: Path, chunk: int) -> None:
    failures = []
    for n, (what, data) in enumerate(CASES):
        if n % 4 != chunk:
            continue
        path = tmp_path / f"inv{n}.yaml"
        path.write_bytes(data)
        r = brctl("-i", path, "nodes")
        if r.exit_code != 2 or str(path) not in r.stderr or "Traceback" in r.stderr:
            failures.append(f"{what}: exit {r.exit_code}: {r.stderr.strip()[:300]}")
        elif data.strip() and not re.search(rf"{re.escape(str(path))}:\d+:", r.stderr):
            failures.append(f"{what}: no line named: {r.stderr.strip()[:300]}")
    assert not failures, "\n".join(failures)


# A job whose sizes do not divide its GPUs (8 here): found when the topology is built,
# after loading, and still named like a compiler: file, line and the key at fault.
TOPOLOGY: list[tuple[dict[str, Any], str]] = [
    ({"tp": 3}, "job.tp"), ({"tp": 5}, "job.tp"), ({"tp": 1, "pp": 3}, "job.pp"),
    ({"tp": 2, "cp": 3}, "job.cp"), ({"ep": 3}, "job.ep"), ({"order": "dp-tp"}, "job.order"),
]


@pytest.mark.parametrize(("change", "key"), TOPOLOGY)
def test_a_job_that_does_not_divide_names_file_line_and_key(
        brctl: Callable[..., Any], tmp_path: Path, change: dict[str, Any], key: str) -> None:
    import json

    doc = copy.deepcopy(BASE)
    doc["job"].update(change)
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    r = brctl("-i", path, "nodes", "--json")
    assert r.exit_code == 2
    err = json.loads(r.stdout)
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1)
                if text.strip().startswith(f"{key.split('.')[1]}:"))
    assert (err["key"], err["line"]) == (key, line), err
    assert re.search(rf"{re.escape(str(path))}:{line}: {re.escape(key)}: ", r.stderr), r.stderr


def test_one_case_of_each_kind_through_the_real_process(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    kinds = ("value ", "typo ", "duplicate ", "non-UTF-8 ", "broken text ")
    picked = [next(c for c in CASES if c[0].startswith(k)) for k in kinds]
    for n, (what, data) in enumerate(picked):
        path = tmp_path / f"inv{n}.yaml"
        path.write_bytes(data)
        r = subprocess.run([sys.executable, "-m", "brctl", "-i", str(path), "nodes"],
                           capture_output=True, text=True, timeout=120,
                           env={**os.environ, "BRCTL_STATE": str(tmp_path / "state")})
        assert r.returncode == 2 and str(path) in r.stderr, (what, r.returncode, r.stderr)
        assert "Traceback" not in r.stderr and r.stdout == "", what
