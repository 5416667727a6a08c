"""Xid parsing and classification on real-format kernel-log lines."""

from __future__ import annotations

import pytest

from brctl.diagnostics.xid import XID_TABLE, classify, parse_xid_line, parse_xid_lines

DMESG = """\
[    5.123456] nvidia: loading out-of-tree module taints kernel.
[ 1234.567890] NVRM: Xid (PCI:0000:3b:00): 79, pid=2271, name=python3, GPU has fallen off the bus.
[ 1234.600000] NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.
[ 2001.000001] NVRM: Xid (PCI:0000:86:00): 13, pid=9001, name=pt.py, Graphics Exception
"""

JOURNAL = (
    "2025-03-10T12:00:01+0000 gpu007 kernel: NVRM: Xid (PCI:0000:b7:00): 48, pid='<unknown>', "
    "name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the "
    "framebuffer at partition 0, subpartition 0.\n"
)
SYSLOG = (
    "Mar 10 12:00:02 gpu007 kernel: [ 99.1] NVRM: Xid (PCI:0000:b7:00): 94, pid=4242, "
    "name=python, Contained: SM (0x1). RST: No, D-RST: No\n"
)
OLD_DRIVER = "[  77.5] NVRM: Xid (0000:03:00): 31, Ch 00000010, engmask 00000101, intr 10000000\n"
DMESG_T = "[Mon Mar 10 12:00:03 2025] NVRM: Xid (PCI:0000:3b:00): 74, pid=1, name=x, fatal\n"
KMSG = "3,8812,1234567890,-;NVRM: Xid (PCI:0000:3b:00): 95, pid=7, name=t, Uncontained: FBHUB.\n"


def test_dmesg_lines() -> None:
    events = parse_xid_lines(DMESG)
    assert [(e.pci, e.code) for e in events] == [("0000:3b:00", 79), ("0000:86:00", 13)]
    e = events[0]
    assert e.timestamp == "1234.567890"
    assert e.pid == "2271" and e.process == "python3"
    assert e.message == "GPU has fallen off the bus."


def test_journal_quoted_pid_and_iso_time() -> None:
    (e,) = parse_xid_lines(JOURNAL)
    assert e.code == 48 and e.pci == "0000:b7:00"
    assert e.timestamp == "2025-03-10T12:00:01+0000"
    assert e.pid == "<unknown>" and e.process == "<unknown>"
    assert e.message.startswith("An uncorrectable double bit error")


def test_syslog_old_driver_dmesg_t_and_kmsg() -> None:
    (s,) = parse_xid_lines(SYSLOG)
    assert (s.code, s.timestamp, s.pid) == (94, "Mar 10 12:00:02", "4242")
    (o,) = parse_xid_lines(OLD_DRIVER)
    assert (o.pci, o.code, o.pid) == ("0000:03:00", 31, None)
    assert o.message.startswith("Ch 00000010")
    (t,) = parse_xid_lines(DMESG_T)
    assert t.timestamp == "Mon Mar 10 12:00:03 2025"
    (k,) = parse_xid_lines(KMSG)
    assert (k.code, k.timestamp) == (95, "1234.567890")


@pytest.mark.parametrize("line", [
    "", "random line", "NVRM: Xid", "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, x",
    "NVRM: Xid (PCI:zz): 79, oops",
])
def test_non_xid_lines(line: str) -> None:
    assert parse_xid_line(line) is None


XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus."


@pytest.mark.parametrize("line", [
    # a job's own log line, as syslog stores it: the job user wrote it, not the kernel
    f"Mar 10 12:00:02 gpu007 train[4242]: {XID79}",
    f"2025-03-10T12:00:01+0000 gpu007 python3[17]: see {XID79}",
    # another kernel message quoting a name the user chose (a file, a device label)
    f"[ 12.5] EXT4-fs warning: comm tar: file /home/u/{XID79}",
    f"4,17,99,-;audit: name=\"{XID79}\"",
    # a /dev/kmsg record that is not the kernel's (facility user: written by a tool)
    f"12,8812,1234567890,-;{XID79}",
])
def test_an_xid_quoted_inside_another_message_is_not_an_event(line: str) -> None:
    """Only a line the kernel wrote as an Xid is one: a hostile job could otherwise get a
    healthy machine evicted by printing an Xid where the kernel log picks it up."""
    assert parse_xid_line(line) is None


@pytest.mark.parametrize("code", [48, 63, 64, 74, 79, 92, 94, 95, 119, 120])
def test_hardware_codes_evict(code: int) -> None:
    assert classify(code).evicts


@pytest.mark.parametrize("code", [13, 31, 43, 45])
def test_application_codes_never_evict(code: int) -> None:
    c = classify(code)
    assert c.kind == "application" and not c.evicts and c.why


def test_unknown_code() -> None:
    c = classify(9999)
    assert c.kind == "unknown" and not c.evicts and "not in brctl's table" in c.why


def test_table_is_complete() -> None:
    for code, (kind, name, why) in XID_TABLE.items():
        assert kind in ("evict", "application") and name and why, code
