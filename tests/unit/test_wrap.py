"""What ``brctl.remote.wrap`` builds on the controller, whatever the machine runs."""

from __future__ import annotations

import ast
import binascii
import gc
import threading
import time
import zlib
from collections.abc import Iterator
from typing import Any

import pytest

from brctl.remote import wrap


@pytest.fixture
def thread_switches_in_gc() -> Iterator[None]:
    """A collection every few allocations, each letting another thread run (as a
    finalizer written in Python may): what a busy fan-out does between its threads."""
    threshold = gc.get_threshold()
    switch = lambda *_: time.sleep(0)  # noqa: E731
    gc.callbacks.append(switch)
    gc.set_threshold(50)
    try:
        yield
    finally:
        gc.callbacks.remove(switch)
        gc.set_threshold(*threshold)


@pytest.mark.usefixtures("thread_switches_in_gc")
def test_every_thread_of_a_fan_out_builds_the_line_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # The first fan-out builds the reaper's source in all its threads together; CPython
    # 3.11's ast.parse is not reentrant across threads (its depth counter is shared) and
    # failed the command with "SystemError: AST constructor recursion depth mismatch".
    failures: list[BaseException] = []
    parses = 0
    parse = ast.parse

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal parses
        parses += 1
        return parse(*args, **kwargs)

    monkeypatch.setattr(ast, "parse", counted)

    def build(start: threading.Barrier) -> None:
        start.wait()
        try:
            wrap.shell_line("python3", ["true"], 60.0)
        except BaseException as e:
            failures.append(e)

    for _ in range(2):
        wrap._program.cache_clear()
        start = threading.Barrier(8)
        threads = [threading.Thread(target=build, args=(start,)) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert failures == []
    assert parses == 2  # once per fan-out, not once per thread


def test_what_travels_through_a_login_shell_survives_fish_s_single_quotes() -> None:
    # fish reads \\ and \' inside single quotes as one character: the reaper's program, sent
    # as a quoted argument, must hold neither (a split("\\") in its source, sent as it was,
    # once made every command on a fish node a syntax error).
    travels = wrap.program()
    assert "\\" not in travels and "'" not in travels
    compile(travels, "reaper", "exec")
    packed = travels.split('"')[1]
    assert zlib.decompress(binascii.a2b_base64(packed)).decode() == wrap._source()
    assert len(travels) < len(wrap._source()) / 2
