"""NVIDIA Xid events: parse kernel-log lines and classify each code (evict or not).

Node-side safe (standard library only): the health probe parses kernel logs on
the node with it, and ``diagnose`` reuses it on collected logs as evidence.

Responsibilities:

- ``parse_xid_lines(text)``: every ``NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU
  has fallen off the bus.`` line in dmesg / journal / kern.log / ``/dev/kmsg``
  text, as ``XidEvent(pci, code, message, timestamp, pid, process)``.
- ``classify(code)``: the documented table ``XID_TABLE`` below. ``evict`` means
  the machine must leave the job (the GPU, its memory or its links are
  faulty, or the driver needs a GPU reset / node reboot before the GPU can be
  trusted again). ``application`` means the error is caused by the program
  running on the GPU (illegal address, killed context): it never evicts a
  machine (ByteRobust: a user-code failure is rolled back, not evicted).
  Anything else is ``unknown``: reported, never a confident eviction signal.

Sources for the table: NVIDIA's "XID Errors" catalogue (docs.nvidia.com/deploy/
xid-errors), DCGM/NVSentinel handling of Xid 74/79/94/95, and the ByteRobust
paper's "GPU lost / GPU memory error" real-time eviction class.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

EVICT = "evict"
APPLICATION = "application"
UNKNOWN = "unknown"


@dataclass(frozen=True)
class XidClass:
    """How brctl treats one Xid code: ``kind`` is evict | application | unknown."""

    code: int
    kind: str
    name: str
    why: str

    @property
    def evicts(self) -> bool:
        """A confident hardware signal: the machine must leave the job."""
        return self.kind == EVICT


# code: (kind, short name, why that kind). Keep each "why" one line: it is shown to on-call.
XID_TABLE: dict[int, tuple[str, str, str]] = {
    13: (APPLICATION, "Graphics Engine Exception",
         "an illegal instruction/address in a kernel; the program, not the GPU"),
    31: (APPLICATION, "GPU memory page fault",
         "an illegal memory access by the program (MMU fault)"),
    43: (APPLICATION, "GPU stopped processing",
         "the driver reset a channel after the program's fault; the GPU is fine"),
    45: (APPLICATION, "Preemptive cleanup",
         "contexts torn down because the process was killed or a prior error"),
    48: (EVICT, "Double Bit ECC Error",
         "an uncorrectable DRAM ECC error: GPU memory is corrupt"),
    61: (EVICT, "Internal micro-controller breakpoint/warning",
         "GPU firmware (PMU) fault; needs a GPU reset"),
    62: (EVICT, "Internal micro-controller halt",
         "GPU firmware (PMU) halted; needs a GPU reset"),
    63: (EVICT, "ECC page retirement or row remapping recording event",
         "a memory row was retired/remapped; takes effect only after a GPU reset"),
    64: (EVICT, "ECC page retirement or row remapper recording failure",
         "a bad memory row could not be retired/remapped; the GPU must be replaced or reset"),
    74: (EVICT, "NVLink Error",
         "an NVLink link error (signal integrity, ECC parity or hardware failure)"),
    79: (EVICT, "GPU has fallen off the bus",
         "the GPU no longer answers on PCIe; only a reboot or repair brings it back"),
    92: (EVICT, "High single-bit ECC error rate",
         "memory is degrading fast; an uncorrectable error is likely next"),
    94: (EVICT, "Contained ECC error",
         "an uncorrectable ECC error was contained; the GPU needs a reset"),
    95: (EVICT, "Uncontained ECC error",
         "an uncorrectable ECC error escaped containment; every process on the GPU is suspect"),
    119: (EVICT, "GSP RPC timeout",
          "the GPU System Processor stopped answering; needs a GPU reset"),
    120: (EVICT, "GSP error",
          "the GPU System Processor faulted; needs a GPU reset"),
    121: (EVICT, "C2C link error",
          "the chip-to-chip (Grace-Hopper) link failed"),
    140: (EVICT, "Unrecovered ECC error",
          "an ECC error the driver could not recover"),
    154: (EVICT, "GPU recovery action changed",
          "the driver asks for a GPU reset or node reboot (see the recovery action)"),
}

# Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.
# Older drivers omit "PCI:" and the pid/name fields: Xid (0000:03:00): 13, 0001 ...
# Numbers are bounded: int() refuses thousands of digits, and a job's log may hold anything.
_XID_RE = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\):"
    r"\s*(?P<code>\d{1,9})(?!\d)\s*,?\s*(?P<rest>.*)$"
)
_PID_RE = re.compile(r"^pid='?(?P<pid>[^,' ]*)'?,\s*(?:name=(?P<name>[^,]*),\s*)?")
# Timestamps in front of the message: dmesg "[12345.678]", dmesg -T "[Mon Mar 10 12:00:01 2025]",
# ISO (journalctl -o short-iso, rsyslog high-precision) and classic syslog "Mar 10 12:00:01".
_TS_RES = (
    re.compile(r"^\s*\[\s*(?P<ts>\d+\.\d+)\]"),
    re.compile(r"^\s*\[(?P<ts>\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]"),
    re.compile(r"^(?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?)"),
    re.compile(r"^(?P<ts>\w{3} +\d+ \d\d:\d\d:\d\d)"),
)


@dataclass(frozen=True)
class XidEvent:
    """One Xid line from a kernel log.

    Attributes:
        pci: the GPU's PCI address as printed (e.g. ``0000:3b:00``).
        code: the Xid number.
        message: the rest of the line after the code (pid/name removed).
        timestamp: the line's timestamp as written, if it has one.
        pid: the process the driver blamed, if printed.
        process: that process's name, if printed.
    """

    pci: str
    code: int
    message: str
    timestamp: Optional[str] = None
    pid: Optional[str] = None
    process: Optional[str] = None

    def to_json(self) -> dict[str, object]:
        """A plain dict for JSON documents."""
        return {"pci": self.pci, "code": self.code, "message": self.message,
                "timestamp": self.timestamp, "pid": self.pid, "process": self.process}


def parse_xid_line(line: str) -> Optional[XidEvent]:
    """The Xid event on one kernel-log line, or None when the line has none."""
    if "Xid" not in line:  # cheap pre-filter: logs are large, Xid lines rare
        return None
    m = _XID_RE.search(line)
    if m is None or not _from_the_kernel(line[: m.start()]):
        return None
    rest = m.group("rest").strip()
    pid = process = None
    pm = _PID_RE.match(rest)
    if pm is not None:
        pid = pm.group("pid") or None
        process = (pm.group("name") or "").strip() or None
        rest = rest[pm.end():]
    return XidEvent(
        pci=m.group("pci").lower(),
        code=int(m.group("code")),
        message=rest.strip(),
        timestamp=_timestamp(line[: m.start()]),
        pid=pid,
        process=process,
    )


def parse_xid_lines(text: str) -> list[XidEvent]:
    """Every Xid event in ``text`` (any mix of dmesg, journal, syslog and kmsg lines), in order."""
    events = []
    for line in text.splitlines():
        event = parse_xid_line(line)
        if event is not None:
            events.append(event)
    return events


_KMSG_RE = re.compile(r"^(?P<pri>\d{1,20}),(?P<seq>\d{1,20}),(?P<usec>\d{1,20}),[^;]*;")


# What may stand before "NVRM: Xid" on a line the kernel wrote: nothing, a /dev/kmsg header,
# a dmesg timestamp, or a syslog/journal prefix ending in "kernel: ". A Xid quoted inside
# another message (a file name, a process's own log line) must not evict a machine.
_KERNEL_PREFIX = re.compile(
    r"^(?:\s*|\d{1,20},\d{1,20},\d{1,20},[^;]*;|\s*\[[^\]]*\]\s*|.*\bkernel: (?:\[\s*\d+\.\d+\]\s*)?)$")


def _from_the_kernel(prefix: str) -> bool:
    """``prefix`` (what precedes the Xid) is a kernel message's own: for a /dev/kmsg
    record also its facility, 0 (records that root's tools write there are LOG_USER)."""
    if _KERNEL_PREFIX.match(prefix) is None:
        return False
    km = _KMSG_RE.match(prefix)
    return km is None or int(km.group("pri")) >> 3 == 0


def _timestamp(prefix: str) -> Optional[str]:
    km = _KMSG_RE.match(prefix)
    if km is not None:  # /dev/kmsg record: microseconds since boot, shown like dmesg
        usec = int(km.group("usec"))
        return f"{usec // 1_000_000}.{usec % 1_000_000:06d}"
    for regex in _TS_RES:
        m = regex.search(prefix)
        if m is not None:
            return m.group("ts")
    return None


def classify(code: int) -> XidClass:
    """How brctl treats Xid ``code`` (see ``XID_TABLE``); unlisted codes are ``unknown``."""
    entry = XID_TABLE.get(code)
    if entry is None:
        return XidClass(code, UNKNOWN, f"Xid {code}",
                        "not in brctl's table: report it, do not evict on it alone")
    kind, name, why = entry
    return XidClass(code, kind, name, why)
