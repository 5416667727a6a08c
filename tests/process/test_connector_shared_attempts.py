"""Fan-out threads that need the same thing of the Connector wait for one attempt at it:
one load of an identity file; one connect to a jump host, whose failure the others get
when they would have tried it the same way (over a real hung bastion:
``tests/integration/test_jump_faults.py``)."""

from __future__ import annotations

import contextlib
import dataclasses
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paramiko
import pytest

from brctl.core.transport import NodeState
from brctl.remote.ssh.config import Endpoint
from brctl.remote.ssh.connect import ConnectError, Connector
from tests.kits.waiting import PATIENCE, scaled, wait_event


def test_an_identity_file_is_loaded_once_for_all_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # cryptography checks an RSA key as it loads it (50-400 ms with the GIL held): every
    # fan-out thread reaching auth at once loaded it again (31 loads of one 4096-bit key).
    path = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    loads = 0
    load = paramiko.PKey.from_path
    connector = Connector(connect_rate=100.0, connect_retries=0, keepalive=0)
    lock_for, asked = connector._lock_for, threading.Condition()
    askers = 0

    def counted(key: tuple[object, ...]) -> threading.Lock:
        nonlocal askers
        with asked:
            askers += 1
            asked.notify_all()
        return lock_for(key)

    def slow_load(*args: Any, **kwargs: Any) -> paramiko.PKey:
        # As a big RSA key's check: the load ends only once every thread has asked for it.
        nonlocal loads
        loads += 1
        with asked:
            assert asked.wait_for(lambda: askers >= 16, scaled(PATIENCE)), f"{askers} of 16 asked"
        return load(*args, **kwargs)

    monkeypatch.setattr(paramiko.PKey, "from_path", slow_load)
    connector._lock_for = counted  # type: ignore[assignment]
    got: list[paramiko.PKey] = []
    errors: list[BaseException] = []

    def auth() -> None:
        try:
            got.append(connector.pkey(str(path)))
        except BaseException as exc:  # re-raised below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=auth, daemon=True) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(scaled(PATIENCE))
    assert not any(t.is_alive() for t in threads) and not errors, errors
    assert loads == 1
    assert len(got) == 16 and len({id(k) for k in got}) == 1


BASTION = Endpoint(label="jump host bastion", host="bastion.invalid", port=22, user="root", identities=(),
                   certificates=(), known_hosts=(), accepted=None, key_names=("bastion.invalid",),
                   policy="strict", connect_timeout=1.0)


class _Live:
    def is_active(self) -> bool:
        return True

    def close(self) -> None:
        pass


def _while_one_attempt_runs(connector: Connector, attempt: Any, first: Endpoint,
                            second: Endpoint) -> dict[str, Any]:
    """``first`` asks and its attempt starts; the attempt ends only once ``second`` has
    asked too (and waits for it): what each got."""
    lock_for = connector._lock_for
    asked = [threading.Event(), threading.Event()]  # first, second

    def counted(key: tuple[object, ...]) -> threading.Lock:
        (asked[1] if asked[0].is_set() else asked[0]).set()
        return lock_for(key)

    def connect(ep: Endpoint) -> Any:
        wait_event(asked[1], "the second caller to ask for the lock")
        return attempt(ep)

    connector._lock_for = counted  # type: ignore[assignment]
    connector._connect = connect  # type: ignore[method-assign]
    got: dict[str, Any] = {}

    def ask(name: str, ep: Endpoint) -> None:
        try:
            got[name] = connector.connection(ep)[0]
        except ConnectError as exc:
            got[name] = exc

    threads = [threading.Thread(target=ask, args=(name, ep)) for name, ep in (("first", first), ("second", second))]
    threads[0].start()
    wait_event(asked[0], "the first caller to ask for the lock")
    threads[1].start()
    for t in threads:
        t.join()
    return got


def test_a_waiter_gets_the_failed_attempt_with_its_kind_when_it_would_have_tried_the_same() -> None:
    attempts: list[Endpoint] = []

    def refused(ep: Endpoint) -> Any:
        attempts.append(ep)
        raise ConnectError(NodeState.UNREACHABLE, "bastion: connection refused", retriable=True)

    got = _while_one_attempt_runs(Connector(connect_rate=1e6, connect_retries=0, keepalive=0),
                                  refused, BASTION, BASTION)
    assert len(attempts) == 1
    assert isinstance(got["second"], ConnectError) and got["second"].message == "bastion: connection refused"
    assert got["second"].retriable  # so its own retry loop backs off and tries again, as the first's


def test_a_waiter_that_would_try_otherwise_tries_itself() -> None:
    # A jump host's Endpoint takes connect_timeout (and identities, policy) from the node
    # behind it: a 60 s node must not get the 1 s node's timeout.
    patient = dataclasses.replace(BASTION, connect_timeout=60.0)

    def timed_out(ep: Endpoint) -> Any:
        if ep.connect_timeout < 10:
            raise ConnectError(NodeState.TIMEOUT, f"no answer within {ep.connect_timeout:g}s")
        return _Live()

    got = _while_one_attempt_runs(Connector(connect_rate=1e6, connect_retries=0, keepalive=0),
                                  timed_out, BASTION, patient)
    assert isinstance(got["first"], ConnectError) and isinstance(got["second"], _Live)


def test_a_connection_made_while_waiting_is_used_not_the_failure_before_it() -> None:
    connector = Connector(connect_rate=1e6, connect_retries=0, keepalive=0)
    live: Any = _Live()
    lock_for = connector._lock_for

    @contextlib.contextmanager
    def meanwhile(key: tuple[object, ...]) -> Iterator[None]:
        # While this caller waited for the lock: one attempt failed, a later one connected.
        connector._failed[key] = (BASTION, ConnectError(NodeState.UNREACHABLE, "reset"))
        connector._conns[key] = live
        with lock_for(key):
            yield

    connector._lock_for = meanwhile  # type: ignore[assignment]
    conn, new = connector.connection(BASTION)
    assert conn is live and not new

