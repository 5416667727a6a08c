"""Fan-out threads that need the same identity file wait for one load of it (the same
jump host: ``tests/integration/test_jump_faults.py``)."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import paramiko
import pytest

from brctl.remote.ssh_connect import Connector


def test_an_identity_file_is_loaded_once_for_all_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # cryptography checks an RSA key as it loads it (50-400 ms with the GIL held): every
    # fan-out thread reaching auth at once loaded it again (31 loads of one 4096-bit key).
    path = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    loads = 0
    load = paramiko.PKey.from_path

    def slow_load(*args: Any, **kwargs: Any) -> paramiko.PKey:
        nonlocal loads
        loads += 1
        time.sleep(0.05)  # as a big RSA key's check: the other threads arrive meanwhile
        return load(*args, **kwargs)

    monkeypatch.setattr(paramiko.PKey, "from_path", slow_load)
    connector = Connector(connect_rate=100.0, connect_retries=0, keepalive=0)
    got: list[paramiko.PKey] = []
    start = threading.Barrier(16)

    def auth() -> None:
        start.wait()
        got.append(connector.pkey(str(path)))

    threads = [threading.Thread(target=auth) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert loads == 1
    assert len(got) == 16 and len({id(k) for k in got}) == 1
