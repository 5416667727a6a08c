"""Kept output is honest out of band: the byte count and the exact bytes travel beside the text.

A node's output is untrusted: a line it prints that looks like brctl's truncation marker
must not change what brctl believes about the stream's size, and bytes that are not
UTF-8 reach ``--json`` exactly (base64) beside the text humans read.
"""

from __future__ import annotations

import base64
import json

from brctl.core.transport import Node, NodeState
from brctl.remote.local import LocalTransport
from brctl.remote.probes import PROBE_DOC_MAX, parse_document


def local(name: str = "a", **kw: object) -> Node:
    return Node(name=name, address=name, connection="local", **kw)  # type: ignore[arg-type]


def test_a_forged_truncation_marker_does_not_pass_the_probe_size_cap() -> None:
    # the node says "1 byte in all" first, then prints 10 MB and a valid document
    script = ("printf '[brctl: output truncated: 1 bytes in all; the first and last 1 kept]\\n';"
              " head -c 10000000 /dev/zero | tr '\\0' ' '; echo; echo '{\"forged\": true}'")
    res = LocalTransport().run(local(), ["sh", "-c", script], timeout=60)
    assert res.state is NodeState.OK and res.stdout_total is not None
    assert res.stdout_total > 10_000_000
    doc, why = parse_document(res)
    assert doc is None and why is not None
    assert "too large" in why and str(res.stdout_total) in why and str(PROBE_DOC_MAX) in why


def test_a_cut_probe_answer_is_refused_even_below_the_cap() -> None:
    script = "printf '{\"pad\": \"%05000d\"}\\n' 0"  # one 5 kB document, 1 kB kept at each end
    res = LocalTransport().run(local(output_keep=1000), ["sh", "-c", script], timeout=30)
    assert res.stdout_total == 5012
    doc, why = parse_document(res)
    assert doc is None and why is not None and "cut" in why and "5012" in why


def test_a_probe_answer_that_is_not_utf8_is_sized_by_its_bytes() -> None:
    """Each byte that is not UTF-8 is U+FFFD (3 bytes) in the text: the cap counts bytes."""
    nbytes = PROBE_DOC_MAX // 2  # under the cap; 1.5 x the cap once decoded
    script = f"head -c {nbytes} /dev/zero | tr '\\0' '\\377'; echo"
    res = LocalTransport().run(local(output_keep=PROBE_DOC_MAX), ["sh", "-c", script], timeout=60)
    assert res.stdout_total is None and res.stdout_bytes is not None
    doc, why = parse_document(res)
    assert doc is None and why is not None
    assert "too large" not in why and "not JSON" in why


def test_whole_output_has_no_total_and_no_bytes_in_json() -> None:
    res = LocalTransport().run(local(), ["sh", "-c", "echo héllo; echo err >&2"], timeout=30)
    assert (res.stdout_total, res.stderr_total, res.stdout_bytes, res.stderr_bytes) == (
        None, None, None, None)
    assert set(res.to_json()) == {"state", "exit_code", "stdout", "stderr", "seconds"}


def test_invalid_utf8_reaches_json_exactly() -> None:
    res = LocalTransport().run(local(), ["sh", "-c", "printf 'a\\377\\376b\\n'; printf '\\300x' >&2"],
                               timeout=30)
    doc = json.loads(json.dumps(res.to_json()))
    assert doc["stdout"] == "a\ufffd\ufffdb\n" and doc["stderr"] == "\ufffdx"
    assert base64.b64decode(doc["stdout_b64"]) == b"a\xff\xfeb\n"
    assert base64.b64decode(doc["stderr_b64"]) == b"\xc0x"


def test_a_cut_stream_says_its_total_in_json_and_keeps_the_marker_for_humans() -> None:
    res = LocalTransport().run(local(output_keep=100), ["sh", "-c", "head -c 1000 /dev/zero | tr '\\0' x"],
                               timeout=30)
    doc = res.to_json()
    assert doc["stdout_total"] == 1000 and "stderr_total" not in doc
    assert doc["stdout"] == "x" * 100 + "\n[brctl: output truncated: 1000 bytes in all; " \
        "the first and last 100 kept]\n" + "x" * 100


def test_tiny_writes_cost_the_kept_bytes_not_an_object_each() -> None:
    # A node writing two bytes at a time makes every read a 2-byte chunk: kept as one object
    # each, the tail of a 2 MiB capture was ~45 MiB (x 2 streams x fan-out).
    import tracemalloc

    from brctl.core.capture import Capture

    keep = 256 << 10
    chunks = [bytes((65 + i % 26, 10)) for i in range(2 * keep)]  # 4 x keep bytes in all
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        cap = Capture(keep)
        for chunk in chunks:
            cap.add(chunk)
        held = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert held <= 3 * keep, held
    data = cap.data()
    assert cap.total == 4 * keep and cap.truncated
    assert data.startswith(b"".join(chunks)[:keep]) and data.endswith(b"".join(chunks)[-keep:])
